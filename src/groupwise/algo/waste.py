"""Wasted generation, counted: what every attempt cost and where it ended, per step and for the whole run.

An attempt's cost (:class:`groupwise.types.GenerationCost`) is its completion tokens and the generation seconds
attributed to it. A generator call serves several groups at once, so its wall time ``T`` is split among them pro
rata by completion tokens (:func:`split_call_seconds`)::

    seconds_i = T · n_i / Σ_j n_j        (n_i: completion tokens of group i in the call; T / k each if Σ n = 0)

so the shares of one call add up to ``T``. Each cost enters a :class:`GenerationAccount` twice: once as
*generated* when the generator hands it back (a group, a failed attempt, or a cancelled one once the generator
has stopped working on it), and once as *settled* when its fate is decided — ``trained``, ``pending`` (held when
the run stopped), or one of the waste fates :data:`WASTE_FATES`. Hence, for the run and at any step boundary::

    generated = trained + Σ waste fates + pending + held (buffered, carried, selected but not yet trained)

and at the end of a run, when everything held has been settled as ``pending``, ``held = 0``. The account keeps
both the run's totals and those since the last step closed (:meth:`GenerationAccount.step_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Fates whose generation is wasted: dropped by the filter, discarded (sync surplus), failed (the attempt raised:
#: infrastructure, or its reward), aborted (cancelled in flight as stale), evicted (buffered but never selectable).
WASTE_FATES = ("filtered", "discarded", "failed", "aborted", "evicted")
#: The waste fates each mode can produce (a key appears only where it can be measured, docs/metrics.md).
SYNC_WASTE_FATES = ("filtered", "discarded")
ASYNC_WASTE_FATES = ("filtered", "failed", "aborted", "evicted")
SETTLED_FATES = ("trained", "pending", *WASTE_FATES)


def split_call_seconds(seconds: float, tokens: Sequence[int]) -> list[float]:
    """A call's ``seconds`` split among its groups pro rata by their completion ``tokens`` (evenly if none)."""
    if not tokens:
        return []
    whole = sum(tokens)
    if whole <= 0:
        return [seconds / len(tokens)] * len(tokens)
    return [seconds * n / whole for n in tokens]


@dataclass
class CostSums:
    """Tokens and seconds generated, and settled by fate."""

    generated_tokens: int = 0
    generated_seconds: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)

    def add_generated(self, tokens: int, seconds: float) -> None:
        self.generated_tokens += tokens
        self.generated_seconds += seconds

    def add_settled(self, fate: str, tokens: int, seconds: float) -> None:
        self.tokens[fate] = self.tokens.get(fate, 0) + tokens
        self.seconds[fate] = self.seconds.get(fate, 0.0) + seconds
        self.groups[fate] = self.groups.get(fate, 0) + 1

    def waste_tokens(self, fates: Iterable[str] = WASTE_FATES) -> int:
        return sum(self.tokens.get(fate, 0) for fate in fates)

    def waste_seconds(self, fates: Iterable[str] = WASTE_FATES) -> float:
        return sum(self.seconds.get(fate, 0.0) for fate in fates)

    def as_dict(self) -> dict[str, Any]:
        return {
            "generated_tokens": self.generated_tokens,
            "generated_seconds": self.generated_seconds,
            "tokens": dict(sorted(self.tokens.items())),
            "seconds": dict(sorted(self.seconds.items())),
            "groups": dict(sorted(self.groups.items())),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostSums:
        return cls(
            generated_tokens=int(data["generated_tokens"]),
            generated_seconds=float(data["generated_seconds"]),
            tokens={k: int(v) for k, v in data["tokens"].items()},
            seconds={k: float(v) for k, v in data["seconds"].items()},
            groups={k: int(v) for k, v in data["groups"].items()},
        )


class GenerationAccount:
    """The run's generation costs, and those since the last step closed (see the module docstring)."""

    def __init__(self) -> None:
        self.run = CostSums()
        self.step = CostSums()

    def generated(self, tokens: int, seconds: float) -> None:
        """The generator handed back an attempt that cost ``tokens`` and ``seconds``."""
        self.run.add_generated(tokens, seconds)
        self.step.add_generated(tokens, seconds)

    def settled(self, fate: str, tokens: int, seconds: float) -> None:
        """An attempt's fate was decided (any fate: only :data:`SETTLED_FATES` are counted; interim lines such as
        a sync ``carried`` group are settled later)."""
        if fate in SETTLED_FATES:
            self.run.add_settled(fate, tokens, seconds)
            self.step.add_settled(fate, tokens, seconds)

    def step_metrics(self, waste_fates: Sequence[str]) -> dict[str, float]:
        """The ``waste/*`` metrics of the step that just closed (per-step values for ``waste_fates``, the run's
        totals so far), then a fresh per-step count. ``waste/cumulative_fraction`` = the run's wasted tokens ÷
        its generated tokens (0 while nothing was generated)."""
        step, run = self.step, self.run
        metrics = {f"waste/{fate}_tokens": float(step.tokens.get(fate, 0)) for fate in waste_fates}
        metrics.update({f"waste/{fate}_gen_seconds": step.seconds.get(fate, 0.0) for fate in waste_fates})
        run_waste = run.waste_tokens(waste_fates)
        metrics.update({
            "waste/tokens": float(step.waste_tokens(waste_fates)),
            "waste/gen_seconds": step.waste_seconds(waste_fates),
            "waste/generated_tokens": float(step.generated_tokens),
            "waste/generated_gen_seconds": step.generated_seconds,
            "waste/cumulative_tokens": float(run_waste),
            "waste/cumulative_gen_seconds": run.waste_seconds(waste_fates),
            "waste/cumulative_generated_tokens": float(run.generated_tokens),
            "waste/cumulative_fraction": run_waste / run.generated_tokens if run.generated_tokens else 0.0,
        })  # fmt: skip
        self.step = CostSums()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"run": self.run.as_dict(), "step": self.step.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run = CostSums.from_dict(state["run"])
        self.step = CostSums.from_dict(state["step"])

    def totals(self) -> dict[str, Any]:
        """The run's totals as flat numbers (summaries, the end-of-run event): generated, trained, pending, wasted
        (and per waste fate), the wasted share of generated tokens."""
        run = self.run
        out: dict[str, Any] = {
            "generated_tokens": run.generated_tokens,
            "generated_gen_seconds": run.generated_seconds,
            "trained_tokens": run.tokens.get("trained", 0),
            "pending_tokens": run.tokens.get("pending", 0),
            "wasted_tokens": run.waste_tokens(),
            "wasted_gen_seconds": run.waste_seconds(),
            "waste_fraction": run.waste_tokens() / run.generated_tokens if run.generated_tokens else 0.0,
        }
        for fate in WASTE_FATES:
            out[f"{fate}_tokens"] = run.tokens.get(fate, 0)
            out[f"{fate}_gen_seconds"] = run.seconds.get(fate, 0.0)
        return out


def describe_totals(totals: dict[str, Any]) -> str:
    """One line for ``events.log``: generated tokens, where they went, and the wasted share."""
    parts = [f"{fate} {totals[f'{fate}_tokens']}" for fate in WASTE_FATES if totals[f"{fate}_tokens"]]
    wasted = f"wasted {totals['wasted_tokens']} ({totals['waste_fraction']:.1%}: {', '.join(parts) or 'none'})"
    return (
        f"generation: {totals['generated_tokens']} completion tokens in {totals['generated_gen_seconds']:.1f} s; "
        f"trained {totals['trained_tokens']}, {wasted}, pending {totals['pending_tokens']}; "
        f"{totals['wasted_gen_seconds']:.1f} s of generation wasted"
    )
