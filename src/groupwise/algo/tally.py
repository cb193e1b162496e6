"""`StepTally`: what happened to every group generated for one step, kept outside any RowBatch.

Pre-filter data (every generated group's raw rewards, across all rounds) lives here and only here, so it
can never be sliced against the trained rows (the misaligned-rewards bug, docs/design.md). All reward metrics
use RAW rewards (``Group.raw_rewards``, what the filter sees) except ``reward/trained_shaped_mean``, which uses
the shaped ``Group.rewards`` that advantages use.

Conservation identity (checked by :meth:`StepTally.check_balance`): every group that entered the step —
generated in one of its rounds, or carried in from the previous step — ends in exactly one place::

    groups_generated + carried_in_groups
        == groups_filtered + groups_trained + discarded_valid_groups + carried_out_groups

equivalently ``groups_generated == groups_filtered + groups_trained − carried_in_groups
+ discarded_valid_groups + carried_out_groups``. ``carried_groups`` (the ``ds/carried_groups`` metric)
counts the carried-in groups trained here; it equals ``carried_in_groups`` unless more than P groups were
carried in, in which case the rest are surplus again (carried out or discarded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from groupwise.algo.filter import ZeroVarianceKind
from groupwise.types import Group


def _mean(values: Sequence[float]) -> float:
    """Mean of the values, NaN when there are none (the metric is undefined, not zero)."""
    return math.fsum(values) / len(values) if values else math.nan


@dataclass
class StepTally:
    """Per-step counts and rewards. Fractions are over ``groups_generated`` (this step's rounds only)."""

    generated_raw_rewards: list[list[float]] = field(default_factory=list)
    trained_raw_rewards: list[float] = field(default_factory=list)
    trained_shaped_rewards: list[float] = field(default_factory=list)
    groups_generated: int = 0
    groups_filtered: int = 0
    groups_trained: int = 0
    zero_variance_groups: int = 0
    zero_variance_max: int = 0
    zero_variance_min: int = 0
    gen_rounds: int = 0
    discarded_valid_groups: int = 0
    carried_in_groups: int = 0
    carried_groups: int = 0
    carried_out_groups: int = 0

    def record_round(self) -> None:
        """One generation round started for this step."""
        self.gen_rounds += 1

    def record_generated(
        self, group: Group, zero_variance_kind: ZeroVarianceKind | None, *, filtered: bool | None = None
    ) -> None:
        """A group generated for this step, before filtering.

        ``zero_variance_kind`` is None for a group with variance. ``filtered`` says whether the group was
        dropped; by default a zero-variance group is (pass ``filtered=False`` when dynamic sampling is off:
        the group still counts as zero-variance but is kept).
        """
        dropped = zero_variance_kind is not None if filtered is None else filtered
        self.generated_raw_rewards.append([float(r) for r in group.raw_rewards])
        self.groups_generated += 1
        if zero_variance_kind is not None:
            self.zero_variance_groups += 1
            self.zero_variance_max += int(zero_variance_kind == "max")
            self.zero_variance_min += int(zero_variance_kind == "min")
        if dropped:
            self.groups_filtered += 1

    def record_carried_in(self, num_groups: int) -> None:
        """Groups handed over from the previous step's surplus (generated there, not here)."""
        self.carried_in_groups += num_groups

    def record_trained(self, groups: Sequence[Group], *, carried: int = 0) -> None:
        """The groups trained this step; ``carried`` of them were carried in from the previous step."""
        self.groups_trained += len(groups)
        self.carried_groups += carried
        for group in groups:
            self.trained_raw_rewards.extend(float(r) for r in group.raw_rewards)
            self.trained_shaped_rewards.extend(float(r) for r in group.rewards)

    def record_surplus(self, num_groups: int, *, carried: bool) -> None:
        """Valid groups beyond the step's P: carried out to the next step, or discarded."""
        if carried:
            self.carried_out_groups += num_groups
        else:
            self.discarded_valid_groups += num_groups

    def check_balance(self) -> None:
        """Raise AssertionError with every count unless the conservation identity (module docstring) holds."""
        entered = self.groups_generated + self.carried_in_groups
        ended = self.groups_filtered + self.groups_trained + self.discarded_valid_groups + self.carried_out_groups
        if entered != ended:
            raise AssertionError(
                f"step tally does not balance: generated {self.groups_generated} + carried in "
                f"{self.carried_in_groups} = {entered}, but filtered {self.groups_filtered} + trained "
                f"{self.groups_trained} + discarded {self.discarded_valid_groups} + carried out "
                f"{self.carried_out_groups} = {ended}"
            )

    def metrics(self) -> dict[str, float]:
        """Step metrics. Reward means are NaN when there are no rows (e.g. a step trained only carried groups);
        fractions are 0 when no group was generated.

        ``reward/unfiltered_mean``: raw reward over every row generated for this step, all rounds, carried-in
        groups excluded. ``reward/trained_mean``: raw reward over the trained rows (carried-in included).
        ``reward/trained_shaped_mean``: the same rows' shaped reward.
        """
        generated = max(self.groups_generated, 1)
        return {
            "reward/unfiltered_mean": _mean([r for rewards in self.generated_raw_rewards for r in rewards]),
            "reward/trained_mean": _mean(self.trained_raw_rewards),
            "reward/trained_shaped_mean": _mean(self.trained_shaped_rewards),
            "ds/groups_generated": float(self.groups_generated),
            "ds/groups_filtered": float(self.groups_filtered),
            "ds/groups_trained": float(self.groups_trained),
            "ds/zero_variance_fraction": self.zero_variance_groups / generated,
            "ds/zero_variance_max_fraction": self.zero_variance_max / generated,
            "ds/zero_variance_min_fraction": self.zero_variance_min / generated,
            "ds/gen_rounds": float(self.gen_rounds),
            "ds/discarded_valid_groups": float(self.discarded_valid_groups),
            "ds/carried_groups": float(self.carried_groups),
            "ds/carried_out_groups": float(self.carried_out_groups),
        }
