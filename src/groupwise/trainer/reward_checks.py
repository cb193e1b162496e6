"""Trial calls of the built-in verifiers at ``config check``: what would otherwise fail at the first reward call of
a run, or after its first step.

The trial completion of a prompt is the prompt's own answer, stopped (``finish_reason: stop``): a text the
verifier must be able to score. Only the built-in verifiers that read the answer themselves are called
(:data:`TRIED`: pure, cheap Python functions); a ``module:function`` reward is never called before the run (it
may count calls, log or pay per call), so only its signature is checked.

- **The first training prompt**, with ``reward.kwargs`` and, when that fails, without them: failing only with
  them names ``reward.kwargs`` (``exact_numeric`` with ``partial_credit: 5.0`` raises on its first call).
- **Every prompt** of both splits: an answer ``exact_numeric`` or ``final_number`` cannot read as a plain number
  (a word, 100,000 digits), a countdown item without its numbers. Listed per split, up to :data:`MAX_LISTED`
  prompts each, naming the data file's key, before anything trains.

Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from groupwise.config import ConfigIssue
from groupwise.data.rewards import RewardFn, countdown, exact_numeric, final_number
from groupwise.data.scoring import RewardError, score_completions
from groupwise.types import Completion, Prompt

if TYPE_CHECKING:
    from groupwise.config import RunConfig

TRIED: tuple[RewardFn, ...] = (exact_numeric, final_number, countdown)
MAX_LISTED = 10


def reward_trial_issues(cfg: RunConfig, reward_fn: RewardFn, splits: Mapping[str, tuple[str, Sequence[Prompt]]]
                        ) -> list[ConfigIssue]:  # fmt: skip
    """The problems trial calls find; ``splits`` is ``{split: (config key of its prompts, prompts)}``."""
    train_key, train = splits["train"]
    if reward_fn not in TRIED or not train:
        return []
    kwargs = dict(cfg.reward.kwargs)
    first = _trial(reward_fn, train[0], kwargs)
    if first is not None and kwargs and _trial(reward_fn, train[0], {}) is None:
        return [ConfigIssue(
            "reward.kwargs", kwargs, f"a trial call of the reward on training prompt {train[0].uid!r} (its own answer "
            f"as the completion) fails with these keyword arguments and works without them: {first}",
            "give reward.kwargs values the reward function accepts (docs/rewards.md lists the built-ins' ranges)",
        )]  # fmt: skip
    return _every_prompt_issues(cfg, reward_fn, kwargs, splits)


def _trial(reward_fn: RewardFn, prompt: Prompt, kwargs: Mapping[str, Any]) -> str | None:
    """None when the reward scores ``prompt``'s own answer; otherwise what went wrong, in one line."""
    answer = Completion(token_ids=(), logprobs=(), text=prompt.answer, finish_reason="stop", weight_version=0)
    try:
        score_completions(reward_fn, prompt, [answer], kwargs)
    except RewardError as exc:
        return " ".join(str(exc).split())
    return None


def _every_prompt_issues(cfg: RunConfig, reward_fn: RewardFn, kwargs: Mapping[str, Any],
                         splits: Mapping[str, tuple[str, Sequence[Prompt]]]) -> list[ConfigIssue]:  # fmt: skip
    issues = []
    for split, (key, prompts) in splits.items():
        failed = [(prompt.uid, problem) for prompt in prompts
                  if (problem := _trial(reward_fn, prompt, kwargs)) is not None]  # fmt: skip
        if not failed:
            continue
        listed = [f"  {uid}: {_cause(problem)}" for uid, problem in failed[:MAX_LISTED]]
        if len(failed) > MAX_LISTED:
            listed.append(f"  ... and {len(failed) - MAX_LISTED} more")
        issues.append(ConfigIssue(
            key, f"{len(failed)} {split} prompt(s)",
            f"reward.function {_name(cfg, reward_fn)} cannot score these prompts even with their own answer as the "
            "completion:\n" + "\n".join(listed),
            "fix those answers (a plain number for exact_numeric, final_number and countdown), or choose a reward "
            "that reads them (reward.function: math_verify, or your own 'module:function')",
        ))
    return issues


def _name(cfg: RunConfig, reward_fn: RewardFn) -> str:
    name = getattr(reward_fn, "__name__", cfg.reward.function)
    return cfg.reward.function if cfg.reward.function == name else f"{cfg.reward.function} ({name})"


def _cause(problem: str) -> str:
    """The verifier's own words from a RewardError message (what it raised), without the prompt it repeats."""
    head, sep, cause = problem.partition(" raised ")
    return (cause if sep else problem).split(" (prompt ")[0][:300]
