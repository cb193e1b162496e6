"""What a plan recommends and how sure it is: the error band, the star, the verdict sentence, the warnings.

The band comes from the calibration (``bench/sim_calibration.py``, ``docs/simulator.md``): the speed-ups over sync
the job model predicted for published runs against the published ones. A plan's speed-up ``S`` is then read as
``S·e^(±r)``, ``r`` the root-mean-square log error. The star is advice: it goes to a setting only when its mode
beats the other mode's best by more than the band (``S_best / S_other > e^r``); otherwise the plan says it cannot
tell sync from async on this job. Within the winning mode the fastest setting is starred, speed-ups within
:data:`TIE` of each other broken by the smaller wasted share of generated tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from groupwise.config.job_schema import JobSection
    from groupwise.sim.plan import PlanRow

#: Speed-ups closer than this (relative) are a tie, broken by the wasted share.
TIE = 0.01
#: A model is of the calibrated family when its size is within this factor of a calibrated one.
SIZE_FACTOR = 2.0


@dataclass(frozen=True)
class Calibration:
    """What the fitted constants were checked on: the GPUs, the models (dense sizes), and the log errors
    ``ln(predicted / published)`` of the speed-ups over sync."""

    gpus: tuple[str, ...]
    dense_params: tuple[float, ...]
    speedup_log_errors: tuple[float, ...]


#: verl's fully-async Qwen2.5-Math-7B runs on H20 (docs/simulator.md, "Calibration against published runs"):
#: speed-ups over sync at 16:16, 32:32 and 64:64 GPUs, predicted 1.05, 1.18, 1.43, published 2.66, 1.92, 2.35.
VERL_H20 = Calibration(
    gpus=("H20",), dense_params=(7.62e9,),
    speedup_log_errors=(math.log(1.05 / 2.66), math.log(1.18 / 1.92), math.log(1.43 / 2.35)),
)  # fmt: skip


def error_band(log_errors: Sequence[float]) -> float:
    """``r = √(mean(ln(predicted / published)²))``: a speed-up ``S`` stands for ``S·e^(−r) … S·e^(r)``."""
    return math.sqrt(sum(e * e for e in log_errors) / len(log_errors))


def half_width(speedup: float, band: float) -> float:
    """Half the width of ``S·e^(±r)``: ``S·(e^r − e^(−r)) / 2`` (``≈ S·r`` for a small band)."""
    return speedup * (math.exp(band) - math.exp(-band)) / 2


def star(rows: Sequence[PlanRow], band: float) -> PlanRow | None:
    """The row to recommend among ``rows`` (finished, speed-ups marked), or None when the best sync and the best
    async rows are within ``band`` of each other (the model cannot tell the modes apart on this job)."""
    done = [r for r in rows if r.speedup is not None]
    if not done:
        return None
    by_mode = {mode: max((r.speedup or 0.0 for r in done if r.point.mode == mode), default=None)
               for mode in ("sync", "async")}  # fmt: skip
    best = max(r.speedup or 0.0 for r in done)
    other = [s for s in by_mode.values() if s is not None and s < best]
    mode_best = {m for m, s in by_mode.items() if s == best}
    if len(mode_best) > 1 or (other and best / max(other) <= math.exp(band)):
        return None
    return fastest_of(done)


def fastest_of(rows: Sequence[PlanRow]) -> PlanRow | None:
    """The row with the highest speed-up, those within :data:`TIE` of it broken by the smaller wasted share."""
    best = max((r.speedup or 0.0 for r in rows), default=None)
    if best is None:
        return None
    tied = [r for r in rows if (r.speedup or 0.0) >= best * (1 - TIE)]
    return min(tied, key=lambda r: (r.waste_fraction or 0.0, -(r.speedup or 0.0)))


def verdict(rows: Sequence[PlanRow], band: float) -> str:
    """One sentence a user can act on: the starred setting, its speed-up over sync and the band's half-width, or
    why nothing is starred."""
    done = [r for r in rows if r.speedup is not None and not r.screened]
    chosen = next((r for r in done if r.best), None)
    asyncs = [r for r in done if r.point.mode == "async"]
    fastest = fastest_of(asyncs)
    if chosen is not None and chosen.point.mode == "async":
        s = chosen.speedup or 0.0
        return f"{chosen.point.verdict_name}: {s:.2f}× sync, ± {half_width(s, band):.2f}×."
    if fastest is None:
        return "sync: no async setting finished."
    s = fastest.speedup or 0.0
    odds = f"the fastest async setting ({fastest.point.verdict_name}) is {s:.2f}× sync, ± {half_width(s, band):.2f}×"
    if chosen is not None:
        return f"sync, colocated: {odds}."
    return (f"no recommendation: {odds}, within the error band (× e^±{band:.2f}) of sync, so the model cannot tell "
            "which is faster on this job.")  # fmt: skip


def calibration_warnings(job: JobSection, calibration: Calibration = VERL_H20) -> list[str]:
    """What in ``job`` lies outside what ``calibration`` was checked on: another GPU, a mixture-of-experts model,
    or a dense model more than :data:`SIZE_FACTOR` times smaller or larger than every calibrated one."""
    warnings = []
    if job.cluster.gpu not in calibration.gpus:
        warnings.append(f"the GPU {job.cluster.gpu} is outside the calibrated GPUs ({', '.join(calibration.gpus)}): "
                        "its efficiency constants are an assumption")  # fmt: skip
    m = job.model
    if m.active_params is not None and m.active_params < m.params:
        warnings.append("a mixture-of-experts model is outside the calibrated models (dense only)")
    elif not any(p / SIZE_FACTOR <= m.params <= p * SIZE_FACTOR for p in calibration.dense_params):
        sizes = ", ".join(f"{p / 1e9:.1f}B" for p in calibration.dense_params)
        warnings.append(f"a {m.params / 1e9:.1f}B-parameter model is outside the calibrated sizes ({sizes} dense, "
                        f"within {SIZE_FACTOR:g}×)")  # fmt: skip
    return warnings


def lengths_note(job: JobSection, source: str | None) -> str:
    """Where the plan's completion lengths come from: ``source`` (a run they were read from) or the job's own
    assumption, which every prediction depends on."""
    lengths = job.lengths
    drift = "" if lengths.final_median_tokens is None else f" → {lengths.final_median_tokens:,.0f}"
    described = (f"median {lengths.median_tokens:,.0f}{drift} tokens over {lengths.drift_steps:,} steps, p99/p50 "
                 f"{lengths.p99_over_p50:g}, at most {lengths.max_tokens:,}")  # fmt: skip
    if source is not None:
        return f"Lengths: median and drift read from {source} ({described}; the spread p99/p50 assumed)."
    return (f"Lengths: assumed, not measured ({described}); every time above scales with them — pass "
            "--lengths-from RUN_DIR to read them from a run's metrics.jsonl.")


def plan_notes(job: JobSection, rows: Sequence[PlanRow], band: float, lengths_source: str | None) -> list[str]:
    """The lines printed under the table: the verdict, then each warning, then where the lengths come from."""
    lines = [f"Verdict: {verdict(rows, band)}"]
    lines.extend(f"Warning: {w}." for w in calibration_warnings(job))
    lines.append(lengths_note(job, lengths_source))
    return lines
