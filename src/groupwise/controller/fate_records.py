"""Fates: where every dispatched prompt attempt ended (invariant 4 in docs/design.md, made auditable).

Each reserved slot (one attempt at one prompt; its id is the group id) gets exactly one :class:`FateRecord`:

* ``trained`` — selected for ``step``;
* ``filtered`` — zero-variance under dynamic sampling; ``resolution`` says what happened to its dispatch
  slot: ``replaced`` (a spare prompt took over), ``charged`` (a loss charged to ``step``) or ``uncharged``;
* ``failed`` — the attempt raised; ``retried`` (another attempt of the same prompt follows), ``replaced``,
  ``charged``, ``uncharged``, or ``fatal`` (the run stopped on it);
* ``evicted`` — a ready group no sampler could select any more (``step`` = trainer version then);
* ``aborted`` — an in-flight attempt cancelled as stale at weight sync (``charged`` / ``uncharged``);
* ``pending`` — still in flight or buffered when the run ended; with resolution ``requeued``: in flight at the
  checkpoint a run resumed from, so its prompt was dispatched again (a later attempt carries its fate).

Not a slot's fate: ``skipped_no_signal`` — a draw the prompt source skipped before dispatch because the prompt's
recent groups all had zero variance (``data.skip_no_signal``; ``detail`` gives that history). No slot was reserved,
so ``group_id`` and ``start_version`` are None, nothing is charged, and it costs no generation. Distinct from the
failure budget's skipped prompts (``async.rollout_failure.max_skipped_prompts``), which are ``failed`` attempts.

The one record not tied to a slot: a prompt backing off after a ``failed``/``retried`` attempt when the run stops
has no attempt running and no slot reserved; it gets ``pending`` with ``group_id`` and ``start_version`` None, so
its last line settles it.

``epoch`` is the loader epoch the prompt came from (None when the prompt source does not say). ``tokens`` and
``gen_seconds`` are the attempt's generation cost (:mod:`groupwise.algo.waste`): what the generator spent on it,
whatever its fate (0 for an attempt still in flight when the run stopped, or one whose work a resume discarded);
``as_dict`` (a ``fates.jsonl`` line) leaves the seconds out, a wall-clock measurement that would make the file
differ between identical runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from groupwise.algo.waste import GenerationAccount
from groupwise.data.signal_history import SkippedDraw

Fate = Literal["trained", "filtered", "failed", "evicted", "aborted", "pending", "skipped_no_signal"]
Resolution = Literal["retried", "replaced", "charged", "uncharged", "fatal", "requeued"]
TERMINAL_RESOLUTIONS = frozenset({"replaced", "charged", "uncharged", "fatal"})


@dataclass(frozen=True)
class FateRecord:
    group_id: int | None  # None: a slot-less record (a prompt waiting to retry when the run stopped)
    prompt_uid: str
    attempt: int
    start_version: int | None  # None with group_id None: no attempt was running
    fate: Fate
    step: int | None = None
    resolution: Resolution | None = None
    detail: str = ""
    epoch: int | None = None
    tokens: int = 0
    gen_seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "group_id": self.group_id,
            "prompt_uid": self.prompt_uid,
            "attempt": self.attempt,
            "start_version": self.start_version,
            "fate": self.fate,
            "step": self.step,
            "resolution": self.resolution,
            "detail": self.detail,
            "epoch": self.epoch,
            "tokens": self.tokens,
        }


def skipped_record(draw: SkippedDraw) -> FateRecord:
    """The ``skipped_no_signal`` record of a draw skipped before dispatch (no slot, no attempt, no cost)."""
    return FateRecord(None, draw.prompt_uid, 0, None, "skipped_no_signal", detail=draw.detail, epoch=draw.epoch)


class FateCounts:
    """In-memory tally of fate records: per fate, and per (fate, resolution); ``generation`` sums their costs (and
    the dispatch slots add what the generator handed back, settled or not)."""

    def __init__(self) -> None:
        self.by_fate: Counter[str] = Counter()
        self.by_resolution: Counter[tuple[str, str | None]] = Counter()
        self.total = 0
        self.generation = GenerationAccount()

    def add(self, record: FateRecord) -> None:
        self.total += 1
        self.by_fate[record.fate] += 1
        self.by_resolution[(record.fate, record.resolution)] += 1
        self.generation.settled(record.fate, record.tokens, record.gen_seconds)

    def __getitem__(self, fate: str) -> int:
        return self.by_fate[fate]

    def __repr__(self) -> str:
        return ", ".join(f"{fate} {n}" for fate, n in sorted(self.by_fate.items())) or "none"

    def state_dict(self) -> dict[str, object]:
        """The counts as JSON-able data (a resumed run keeps counting where the checkpoint stopped)."""
        return {
            "total": self.total,
            "by_resolution": [[fate, res, n] for (fate, res), n in sorted(self.by_resolution.items(), key=str)],
            "generation": self.generation.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.by_fate.clear()
        self.by_resolution.clear()
        for fate, resolution, n in state["by_resolution"]:
            self.by_resolution[(fate, resolution)] += n
            self.by_fate[fate] += n
        self.total = int(state["total"])
        self.generation = GenerationAccount()
        if "generation" in state:  # absent in checkpoints written before costs were counted: they start at 0
            self.generation.load_state_dict(state["generation"])

    def as_dict(self) -> dict[str, int]:
        out = {f"fates/{fate}": n for fate, n in sorted(self.by_fate.items())}
        for (fate, resolution), n in sorted(self.by_resolution.items(), key=str):
            if resolution is not None:
                out[f"fates/{fate}/{resolution}"] = n
        return out
