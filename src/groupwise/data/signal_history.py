"""Per-prompt reward history, and the decision to skip a prompt predicted to carry no signal (selective rollout).

A GRPO group whose rewards are all equal has zero advantage everywhere: its generation teaches nothing, and under
dynamic sampling it is filtered and its tokens thrown away. A prompt that gave such a group the last ``history``
times it was generated is likely to give one again, so it is skipped before dispatch — with a probability of
being tried again that grows each time it is skipped, so a prompt whose answer changes as the policy learns comes
back. This is the selective-rollout idea for GRPO published in 2025 (GRESO, "Act Only When It Pays: Efficient
Reinforcement Learning for LLM Reasoning via Selective Rollouts", Zheng et al., arXiv:2506.02177), with its
exploration probability reduced to :func:`retry_probability`.

Each generated group's outcome is classified by the run's own zero-variance rule, :meth:`GroupFilter.decide` (the
filter dynamic sampling uses, on raw rewards with its tolerance): ``mixed`` (it has variance), or one of the
zero-variance kinds ``all_max`` (all correct), ``all_min`` (all wrong), ``uniform`` (another common value).

Every random draw is derived from (run seed, prompt uid, epoch): a prompt is drawn from the stream once per epoch,
so the decision depends on the history and that triple only, never on a global RNG or on how many prompts were
taken before. A resumed run restores the history (:meth:`SignalHistory.state_dict`) and so repeats the decisions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from groupwise.algo.filter import GroupFilter, ZeroVarianceKind
from groupwise.seeding import derive_seed

OUTCOME_NAMES: dict[ZeroVarianceKind | None, str] = {
    None: "mixed", "max": "all_max", "min": "all_min", "other": "uniform"
}  # fmt: skip
ZERO_VARIANCE_OUTCOMES = frozenset(name for kind, name in OUTCOME_NAMES.items() if kind is not None)


def retry_probability(skips: int, base_retry: float, growth: float) -> float:
    """The probability of dispatching a skip-eligible prompt that was skipped ``skips`` times in a row::

        p(s) = min(1, base_retry · growth^s)

    ``p(0) = base_retry`` at its first eligible draw; each skip multiplies it by ``growth`` (> 1), so after
    ``ceil(log(1 / base_retry) / log(growth))`` skips in a row the prompt is dispatched for certain.
    """
    if skips < 0:
        raise ValueError(f"retry_probability: skips must be >= 0, got {skips}")
    if not 0.0 < base_retry <= 1.0 or not growth > 1.0:
        raise ValueError(f"retry_probability needs 0 < base_retry <= 1 and growth > 1, got {base_retry}, {growth}")
    if skips * math.log(growth) >= -math.log(base_retry):  # base · growth^s ≥ 1, without overflowing the power
        return 1.0
    return base_retry * growth**skips


def draw_uniform(seed: int, prompt_uid: str, epoch: int) -> float:
    """A uniform number in [0, 1) for the draw of ``prompt_uid`` in ``epoch``, from the run seed alone."""
    return random.Random(derive_seed("skip_no_signal", seed, prompt_uid, epoch)).random()


@dataclass(frozen=True)
class SkipSettings:
    """``data.skip_no_signal``: a prompt whose last ``history`` outcomes are all in ``kinds`` is skip-eligible;
    retried per :func:`retry_probability`."""

    history: int = 2
    base_retry: float = 0.1
    growth: float = 2.0
    kinds: frozenset[str] = ZERO_VARIANCE_OUTCOMES  # the zero-variance outcomes that predict no signal


@dataclass(frozen=True)
class SkippedDraw:
    """One draw skipped before dispatch, with the history that justified it (a ``skipped_no_signal`` fate)."""

    prompt_uid: str
    epoch: int
    outcomes: tuple[str, ...]  # the prompt's last outcomes, oldest first
    skips: int  # skips in a row, this one included
    retry_probability: float  # the probability of dispatching it this draw, which the draw did not meet
    tokens_saved: int  # estimate: the completion tokens of the prompt's last generated group

    @property
    def detail(self) -> str:
        return (
            f"no signal the last {len(self.outcomes)} times ({', '.join(self.outcomes)}); skipped {self.skips} "
            f"time(s) in a row, retry probability was {self.retry_probability:.4g}"
        )


@dataclass
class PromptRecord:
    """What the history knows of one prompt: its last outcomes, its skips in a row, its last group's tokens."""

    outcomes: list[str] = field(default_factory=list)
    skips: int = 0
    last_tokens: int = 0
    retried: bool = False  # dispatched after at least one skip; its next outcome counts as a retry outcome


class SignalHistory:
    """The per-prompt history of a run and its skip decisions (see the module docstring)."""

    def __init__(self, settings: SkipSettings, group_filter: GroupFilter, seed: int) -> None:
        self.settings = settings
        self.group_filter = group_filter
        self.seed = seed
        self.records: dict[str, PromptRecord] = {}
        self.skipped = 0  # draws skipped over the run
        self.tokens_saved = 0  # their estimated completion tokens
        self.retry_outcomes: dict[str, int] = {}  # outcome of each prompt generated again after a skip

    def decide(self, prompt_uid: str, epoch: int) -> SkippedDraw | None:
        """Skip this draw (a :class:`SkippedDraw`) or dispatch it (None)."""
        record = self.records.get(prompt_uid)
        k = self.settings.history
        if record is None or len(record.outcomes) < k or not self.settings.kinds.issuperset(record.outcomes[-k:]):
            return None
        p = retry_probability(record.skips, self.settings.base_retry, self.settings.growth)
        if draw_uniform(self.seed, prompt_uid, epoch) < p:
            record.retried = record.retried or record.skips > 0
            record.skips = 0
            return None
        record.skips += 1
        self.skipped += 1
        self.tokens_saved += record.last_tokens
        return SkippedDraw(prompt_uid, epoch, tuple(record.outcomes[-k:]), record.skips, p, record.last_tokens)

    def observe(self, prompt_uid: str, raw_rewards: Sequence[float], tokens: int) -> str:
        """Record one generated group's outcome (by the zero-variance filter's own decision); return it."""
        outcome = OUTCOME_NAMES[self.group_filter.decide(raw_rewards).kind]
        record = self.records.setdefault(prompt_uid, PromptRecord())
        record.outcomes = [*record.outcomes, outcome][-self.settings.history :]
        record.last_tokens = tokens
        if record.retried:
            self.retry_outcomes[outcome] = self.retry_outcomes.get(outcome, 0) + 1
            record.retried = False
        return outcome

    def state_dict(self) -> dict[str, Any]:
        return {
            "records": {
                uid: [r.outcomes, r.skips, r.last_tokens, r.retried] for uid, r in sorted(self.records.items())
            },
            "skipped": self.skipped,
            "tokens_saved": self.tokens_saved,
            "retry_outcomes": dict(sorted(self.retry_outcomes.items())),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = {
            uid: PromptRecord(list(outcomes), int(skips), int(tokens), bool(retried))
            for uid, (outcomes, skips, tokens, retried) in state["records"].items()
        }
        self.skipped = int(state["skipped"])
        self.tokens_saved = int(state["tokens_saved"])
        self.retry_outcomes = {k: int(v) for k, v in state["retry_outcomes"].items()}
