"""A prompt's finished harness sessions as its scored group (or its failure): the one place where a session's
reward is decided.

A session's reward is what its harness returned; a harness that returned ``None`` leaves it to ``reward.function``,
which scores the session's last reply against the prompt's answer as it scores a single-turn completion. A reward
function that fails there is the group's reward failure, charged with the tokens its sessions were served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from groupwise.data.scoring import RewardError, score_completions
from groupwise.harness.runner import HarnessError, SessionResult
from groupwise.harness.samples import session_completion, shared_prompt
from groupwise.types import Completion, GenerationCost, Prompt, attach_cost


def session_rewards(
    results: Sequence[SessionResult], prompt: Prompt, reward_fn: Callable[..., float], kwargs: Mapping[str, Any]
) -> list[float]:
    """Each session's reward: its harness's, or ``reward_fn``'s on its last reply (raises :class:`RewardError`)."""
    unscored = [r for r in results if r.reward is None]
    replies = [Completion((), (), r.session.last_reply or "", "stop", 0) for r in unscored]
    scored = iter(score_completions(reward_fn, prompt, replies, kwargs) if replies else [])
    return [r.reward if r.reward is not None else next(scored) for r in results]


def harness_completions(
    results: list[SessionResult] | HarnessError,
    prompt: Prompt,
    reward_fn: Callable[..., float],
    kwargs: Mapping[str, Any],
    decode: Callable[[Sequence[int]], str],
) -> tuple[tuple[int, ...], list[Completion], list[float]] | RewardError:
    """The group's prompt ids, one completion per session and the raw rewards; or the failure of this prompt."""
    if isinstance(results, HarnessError):
        return results
    try:
        rewards = session_rewards(results, prompt, reward_fn, kwargs)
    except RewardError as error:
        return attach_cost(error, GenerationCost(sum(r.session.counts.served_tokens for r in results)))
    shared = shared_prompt(results)
    completions = [
        session_completion(result, reward, len(shared), decode) for result, reward in zip(results, rewards, strict=True)
    ]
    return shared, completions, rewards
