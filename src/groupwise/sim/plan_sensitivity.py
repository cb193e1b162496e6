"""How a plan's answer moves with the lengths it assumed: the fastest async setting against sync again, with every
completion-length median scaled (``groupwise plan`` without ``--lengths-from``; ``docs/simulator.md``).

For each factor ``k`` the job's ``median_tokens`` and ``final_median_tokens`` become ``k`` times theirs (the cap
``max_tokens`` and the spread unchanged; a factor that would put a median above the cap is left out), and the
sync point and the async point are simulated for ``steps`` steps; the speed-up is the async point's trained
tokens per second over sync's, as in the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from groupwise.config import config_from_dict
from groupwise.config.job_schema import default_plan
from groupwise.sim.plan import PlanPoint, PlanRow, point_row
from groupwise.sim.plan_verdict import fastest_of

if TYPE_CHECKING:
    from groupwise.config import RunConfig

#: The range a plan shows when its lengths are assumed: half and twice them, and as assumed.
FACTORS = (0.5, 1.0, 2.0)


def scaled_lengths(cfg: RunConfig, factor: float) -> RunConfig | None:
    """``cfg`` with the completion-length medians scaled by ``factor``; None when a median would pass the cap."""
    job = cfg.sim.job
    assert job is not None  # groupwise plan refuses a config without one
    lengths = job.lengths
    final = None if lengths.final_median_tokens is None else lengths.final_median_tokens * factor
    if max(lengths.median_tokens * factor, final or 0.0) > lengths.max_tokens:
        return None
    data = cfg.model_dump(mode="json", by_alias=True)
    data["sim"]["job"]["lengths"].update(median_tokens=lengths.median_tokens * factor, final_median_tokens=final)
    return config_from_dict(data)


def speedup_by_length(cfg: RunConfig, sync: PlanPoint, fastest: PlanPoint, steps: int,
                      factors: tuple[float, ...] = FACTORS) -> dict[float, float]:
    """``{factor: speed-up of fastest over sync}`` with the medians scaled by each factor (module docstring)."""
    out: dict[float, float] = {}
    for factor in factors:
        scaled = scaled_lengths(cfg, factor)
        if scaled is None:
            continue
        base, other = point_row(scaled, sync, steps), point_row(scaled, fastest, steps)
        if base.trained_tokens_per_s and other.trained_tokens_per_s and base.error is None and other.error is None:
            out[factor] = other.trained_tokens_per_s / base.trained_tokens_per_s
    return out


def sensitivity_note(fastest: PlanPoint, speedups: dict[float, float], steps: int) -> str:
    """The line under the verdict: the fastest async setting's speed-up at each length factor."""
    at = ", ".join(f"×{k:g} → {s:.2f}×" for k, s in speedups.items())
    return (f"If the lengths are off: {fastest.verdict_name} over sync with the medians scaled {at} "
            f"({steps} simulated steps each).")


def length_notes(cfg: RunConfig, rows: list[PlanRow]) -> list[str]:
    """The sensitivity line for a plan's rows (none without a finished sync row and async finalist): the fastest
    async finalist against sync at :data:`FACTORS`, for ``sim.plan.screen_steps`` steps (``steps`` unscreened)."""
    final = [r for r in rows if r.speedup is not None and not r.screened]
    sync = next((r.point for r in final if r.point.mode == "sync"), None)
    fastest = fastest_of([r for r in final if r.point.mode == "async"])
    if sync is None or fastest is None:
        return []
    grid = cfg.sim.plan or default_plan()
    steps = grid.screen_steps or grid.steps or cfg.run.max_steps or 1
    return [sensitivity_note(fastest.point, speedup_by_length(cfg, sync, fastest.point, steps), steps)]
