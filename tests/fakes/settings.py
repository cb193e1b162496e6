"""Controller settings as the controller tests write them: conservative failure defaults, a bool for the filter."""

from __future__ import annotations

from typing import Any

from groupwise.algo.filter import GroupFilter
from groupwise.config import RolloutFailureSection
from groupwise.controller.settings import ControllerSettings

# What the controller tests assume unless they say otherwise: shrink on a lost prompt, one replacement attempt and
# a one-prompt reserve when replacing, a step floor of 90% of P (the config's defaults are replace/16/16/0.5).
TEST_FAILURE_DEFAULTS: dict[str, Any] = {
    "on_dropped_prompt": "shrink", "max_replacement_attempts": 1, "replacement_reserve_prompts": 1,
    "min_step_batch_fraction": 0.9,
}  # fmt: skip


def failure_settings(**knobs: Any) -> RolloutFailureSection:
    """The ``async.rollout_failure`` section with :data:`TEST_FAILURE_DEFAULTS` under ``knobs``."""
    return RolloutFailureSection(**{**TEST_FAILURE_DEFAULTS, **knobs})


def controller_settings(**fields: Any) -> ControllerSettings:
    """``ControllerSettings`` with :func:`failure_settings` unless ``failure`` is given; ``dynamic_sampling`` may be
    a bool (the filter on or off, exact) or a :class:`GroupFilter`."""
    fields.setdefault("failure", failure_settings())
    if isinstance(fields.get("dynamic_sampling"), bool):
        fields["dynamic_sampling"] = GroupFilter(enabled=fields["dynamic_sampling"])
    return ControllerSettings(**fields)
