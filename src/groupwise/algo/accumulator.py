"""The sync dynamic-sampling accumulator: generation rounds in, exactly P whole groups out.

Each round's scored groups are tallied before filtering; groups with reward variance are kept in round
order (with dynamic sampling off every group is kept). The step is complete once carried-in plus kept
groups reach P. ``max_gen_rounds`` means exactly that many rounds. Usage::

    acc = DynamicSamplingAccumulator(P, GroupFilter(enabled=True), max_gen_rounds=4, on_exhausted="raise",
                                     min_step_batch_fraction=1.0, surplus="carry", carried_in=previous.carry_over)
    while acc.can_generate_more:
        acc.add_round(score(generate(next_prompts(acc.groups_needed))))
    selection = acc.finish()   # raises DynamicSamplingExhausted if short (per on_exhausted)

The filter decides each group once, when its round is added; the selection carries the decision (``filtered``), so
the step's fates are written from it rather than decided again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from groupwise.algo.filter import GroupFilter
from groupwise.algo.reward_shaping import check_finite_rewards
from groupwise.algo.step_size import step_floor
from groupwise.algo.tally import StepTally
from groupwise.types import Group

OnExhausted = Literal["raise", "train_short"]
SurplusPolicy = Literal["discard", "carry"]


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling used its rounds without keeping enough groups for the step."""


@dataclass
class StepSelection:
    """The outcome of one step: ``trained`` (carried-in groups first, then kept ones in round order),
    ``surplus`` (kept beyond P), ``filtered`` (dropped by the filter, in round order), and the step's
    tally. ``carry_over`` is what the next step's accumulator
    takes as ``carried_in``: the surplus under ``surplus="carry"``, else nothing (the surplus was discarded
    and is only returned so its fate can be recorded)."""

    trained: list[Group]
    surplus: list[Group]
    surplus_carried: bool
    filtered: list[Group]
    tally: StepTally

    @property
    def carry_over(self) -> list[Group]:
        return list(self.surplus) if self.surplus_carried else []


class DynamicSamplingAccumulator:
    """Collects generation rounds for one sync step (see module docstring); ``group_filter`` is the run's filter
    (``GrpoSection.group_filter``: on or off, tolerance, and the reward range that splits zero-variance groups into
    all-max and all-min)."""

    def __init__(
        self,
        num_prompts_per_step: int,
        group_filter: GroupFilter,
        max_gen_rounds: int,
        on_exhausted: OnExhausted,
        min_step_batch_fraction: float,
        surplus: SurplusPolicy,
        carried_in: Sequence[Group] = (),
    ) -> None:
        if num_prompts_per_step < 1:
            raise ValueError(f"num_prompts_per_step must be >= 1, got {num_prompts_per_step}")
        if max_gen_rounds < 1:
            raise ValueError(f"max_gen_rounds must be >= 1 (it is the exact number of rounds), got {max_gen_rounds}")
        if on_exhausted not in ("raise", "train_short"):
            raise ValueError(f"on_exhausted must be 'raise' or 'train_short', got {on_exhausted!r}")
        if not 0.0 < min_step_batch_fraction <= 1.0:
            raise ValueError(f"min_step_batch_fraction must be in (0, 1], got {min_step_batch_fraction}")
        if surplus not in ("discard", "carry"):
            raise ValueError(f"surplus must be 'discard' or 'carry', got {surplus!r}")
        self.num_prompts_per_step = num_prompts_per_step
        self.group_filter = group_filter
        self.max_gen_rounds = max_gen_rounds
        self.on_exhausted = on_exhausted
        self.min_step_batch_fraction = min_step_batch_fraction
        self.surplus = surplus
        self._carried_in = list(carried_in)
        self._kept: list[Group] = []
        self._filtered: list[Group] = []
        self._seen_ids = {g.group_id for g in self._carried_in}
        self._rounds = 0
        self._finished = False
        self._tally = StepTally()
        self._tally.record_carried_in(len(self._carried_in))

    @property
    def rounds(self) -> int:
        return self._rounds

    @property
    def num_kept(self) -> int:
        """Carried-in plus kept groups so far."""
        return len(self._carried_in) + len(self._kept)

    @property
    def groups_needed(self) -> int:
        """How many more groups must be kept to reach P (0 once complete)."""
        return max(self.num_prompts_per_step - self.num_kept, 0)

    @property
    def is_complete(self) -> bool:
        return self.num_kept >= self.num_prompts_per_step

    @property
    def can_generate_more(self) -> bool:
        return not self._finished and self._rounds < self.max_gen_rounds and not self.is_complete

    def add_round(self, groups: Sequence[Group]) -> None:
        """Tally every group of one scored round, then keep those with variance (all of them if disabled)."""
        if not self.can_generate_more:
            raise RuntimeError(
                f"add_round called when no round may be added (rounds {self._rounds}/{self.max_gen_rounds}, "
                f"kept {self.num_kept}/{self.num_prompts_per_step}, finished={self._finished}); check "
                "can_generate_more before generating"
            )
        self._check_round(groups)
        self._tally.record_round()
        self._rounds += 1
        for group in groups:
            self._seen_ids.add(group.group_id)
            decision = self.group_filter.decide(group.raw_rewards)
            self._tally.record_generated(group, decision.kind, filtered=decision.dropped)
            (self._filtered if decision.dropped else self._kept).append(group)

    @property
    def filtered(self) -> list[Group]:
        """The groups the filter dropped so far, in round order."""
        return list(self._filtered)

    @property
    def unsettled(self) -> list[Group]:
        """The groups not dropped so far (carried-in ones first): what a step that is never trained leaves pending."""
        return self._carried_in + self._kept

    def _check_round(self, groups: Sequence[Group]) -> None:
        """Validate a whole round before recording any of it."""
        counts = Counter(g.group_id for g in groups)
        repeated = sorted(i for i, n in counts.items() if n > 1 or i in self._seen_ids)
        if repeated:
            raise ValueError(
                f"group ids {repeated} were already seen this step; each dispatched group needs its own id"
            )
        for group in groups:
            if self.group_filter.enabled and group.size < 2:
                raise ValueError(
                    f"group {group.group_id} has {group.size} completion(s); dynamic sampling needs G >= 2 "
                    "(a single reward always looks zero-variance)"
                )
            check_finite_rewards(group.raw_rewards, f"group {group.group_id} raw rewards")

    def finish(self) -> StepSelection:
        """Close the step: exactly P groups (or a short step under ``train_short``) plus the surplus."""
        if self._finished:
            raise RuntimeError("finish() was already called for this step; create a new accumulator per step")
        pool = self._carried_in + self._kept
        p = self.num_prompts_per_step
        if len(pool) >= p:
            trained, surplus = pool[:p], pool[p:]
        elif self.on_exhausted == "train_short" and len(pool) >= step_floor(p, self.min_step_batch_fraction):
            trained, surplus = pool, []
        else:
            raise DynamicSamplingExhausted(self._exhausted_message(len(pool)))
        self._finished = True
        self._tally.record_trained(trained, carried=min(len(self._carried_in), len(trained)))
        self._tally.record_surplus(len(surplus), carried=self.surplus == "carry")
        self._tally.check_balance()
        return StepSelection(trained, surplus, self.surplus == "carry", list(self._filtered), self._tally)

    def _shared_other_reward(self, generated: int) -> str:
        """The zero-variance groups whose one reward is neither end of the range (a shaped reward: every episode
        of the group won in the same number of moves), when there are any."""
        t = self._tally
        other = t.zero_variance_groups - t.zero_variance_max - t.zero_variance_min
        if other <= 0:
            return ""
        return f", {other} ({other / generated:.0%}) with another reward shared by the whole group"

    def _exhausted_message(self, kept: int) -> str:
        t = self._tally
        generated = max(t.groups_generated, 1)
        low, high = self.group_filter.reward_low, self.group_filter.reward_high
        floor = step_floor(self.num_prompts_per_step, self.min_step_batch_fraction)
        short_rule = (
            f"on_exhausted=train_short needs at least ceil(P x min_step_batch_fraction) = {floor} groups"
            if self.on_exhausted == "train_short"
            else f"or set on_exhausted=train_short (trains a short step of at least {floor} groups)"
        )
        return (
            f"dynamic sampling kept {kept} of {self.num_prompts_per_step} groups after {self._rounds} of "
            f"max_gen_rounds={self.max_gen_rounds} generation rounds: {t.groups_generated} groups generated, "
            f"{t.zero_variance_groups} zero-variance ({t.zero_variance_groups / generated:.0%}): "
            f"{t.zero_variance_max} all-max ({t.zero_variance_max / generated:.0%}, every completion got "
            f"{high}), {t.zero_variance_min} all-min ({t.zero_variance_min / generated:.0%}, every "
            f"completion got {low}){self._shared_other_reward(generated)}. To fix: raise max_gen_rounds or "
            f"batch_multiplier (more groups per round), {short_rule}; if the policy collapsed (mostly all-max or "
            "all-min) add an entropy bonus (entropy_coef); or use data of a difficulty the policy can sometimes "
            "but not always solve."
        )
