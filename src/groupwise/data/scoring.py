"""Score one prompt's completions with a reward function, loudly.

A reward function that raises, or returns NaN, an infinity, a non-number or a number beyond
±:data:`MAX_ABS_REWARD`, is a bug in the verifier or the data; turning it into a 0 would silently train on
wrong signal. So every such case becomes a :class:`RewardError` naming the reward function, the prompt uid
and the completion index, with the original exception chained. "Raises" includes any ``BaseException`` but
``KeyboardInterrupt`` (the user's Ctrl-C): a verifier that calls ``sys.exit()`` must not end the run with exit
status 0 as if it had finished.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from groupwise.data.rewards import RewardFn
from groupwise.types import Completion, Prompt

#: The largest reward magnitude accepted. Group statistics square reward differences, step means sum rewards over
#: many groups, and advantages train in float32 (at most 3.4e38): beyond this they overflow (``math.fsum`` raises
#: ``OverflowError``, a float32 column holds inf) far from the reward that caused it.
MAX_ABS_REWARD = 1e30
#: A completion (or an episode) is *correct*, *solved*, when its raw reward is at least this: the verifiers'
#: full-credit value. Held-out accuracy and ``episode/solved_*`` count by it.
CORRECT_REWARD = 1.0


class RewardError(RuntimeError):
    """A reward function failed or returned something that is not a finite real number."""

    def __init__(self, message: str, prompt_uid: str, completion_index: int) -> None:
        super().__init__(message)
        self.prompt_uid = prompt_uid
        self.completion_index = completion_index

    def __reduce__(self) -> tuple[type[RewardError], tuple[str, str, int], dict[str, Any]]:
        # rebuilt from its fields when it crosses a process (a Ray generation worker returns it to the driver),
        # with the attributes set on it since (the generation cost of the attempt whose reward failed)
        return (type(self), (str(self), self.prompt_uid, self.completion_index), dict(self.__dict__))


def score_completions(
    reward_fn: RewardFn,
    prompt: Prompt,
    completions: Sequence[Completion],
    kwargs: Mapping[str, Any] | None = None,
) -> list[float]:
    """Raw rewards ``[float(reward_fn(prompt, c, **kwargs)) for c in completions]``, each checked finite."""
    kwargs = dict(kwargs or {})
    name = getattr(reward_fn, "__name__", repr(reward_fn))
    rewards: list[float] = []
    for index, completion in enumerate(completions):
        try:
            value = reward_fn(prompt, completion, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit and the like too: see the module docstring
            raise RewardError(
                f"reward function {name!r} raised {type(exc).__name__}: {exc} "
                f"(prompt {prompt.uid!r}, completion {index}, text {completion.text[:80]!r})",
                prompt.uid,
                index,
            ) from exc
        rewards.append(_checked_reward(value, name, prompt.uid, index))
    return rewards


def _checked_reward(value: object, name: str, prompt_uid: str, index: int) -> float:
    if not isinstance(value, numbers.Real):
        hint = " (call .item() on a tensor)" if hasattr(value, "item") else ""
        raise RewardError(
            f"reward function {name!r} returned {value!r} of type {type(value).__name__} for prompt "
            f"{prompt_uid!r}, completion {index}; it must return a real number{hint}",
            prompt_uid,
            index,
        )
    try:
        reward = float(value)
    except OverflowError:  # an int too large for a float
        reward = math.inf if isinstance(value, int) and value > 0 else -math.inf
    if not math.isfinite(reward) or abs(reward) > MAX_ABS_REWARD:
        raise RewardError(
            f"reward function {name!r} returned {reward} for prompt {prompt_uid!r}, completion {index}; "
            f"rewards must be finite and within ±{MAX_ABS_REWARD:g} (the reward statistics and the float32 "
            "training columns overflow beyond that)",
            prompt_uid,
            index,
        )
    return reward
