"""The spare pool is refilled whenever a dispatch slot needs a spare, not only from the dispatch loop.

Pinned: with a gated sampler (``in_order`` looking 2 steps ahead) and most groups filtered by dynamic sampling,
the rollout pump spends most of its time parked at the sampler's gate, where its dispatch loop takes nothing from
the loader. A slot that finds the pool empty then diverts the next loader batch into it itself, so every step
fills (trained = P, nothing charged) while the data lasts; a step closes short (a charged loss) only once the
loader is really exhausted, and every prompt the loader gave out has one settled outcome (none lost, none twice).
"""

from __future__ import annotations

import zlib

from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual
from fakes.settings import controller_settings, failure_settings

from groupwise.config import sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.fate_records import FateRecord
from groupwise.controller.ledger import StepBelowFloorError
from groupwise.run.audit import audit_fates

G, P = 2, 4


def mostly_filtered(uid: str, attempt: int) -> Outcome:
    """About 4 in 5 prompts give a zero-variance group (filtered); latency varies so slots finish out of order."""
    h = zlib.crc32(uid.encode())
    return Outcome(latency=1.0 + h % 3, rewards=(1.0, 1.0) if h % 5 else None)


def run(n_prompts: int, max_steps: int | None, floor_fraction: float = 0.5):
    settings = controller_settings(
        prompts_per_step=P, group_size=G, sampler=sampler_config("in_order", max_lookahead_versions=2),
        failure=failure_settings(on_dropped_prompt="replace", max_replacement_attempts=64,
                                replacement_reserve_prompts=1, min_step_batch_fraction=floor_fraction),
        max_buffered_rollouts=16, max_inflight_prompts=16, dynamic_sampling=True, max_steps=max_steps,
    )  # fmt: skip
    fates: list[FateRecord] = []
    loader = make_loader(n_prompts)
    charged_with_data_left: list[str] = []

    def on_fate(record: FateRecord) -> None:
        fates.append(record)
        if record.resolution in ("charged", "uncharged") and not loader.exhausted:
            charged_with_data_left.append(record.prompt_uid)

    trainer = RecordingTrainer()
    rollouts = ScriptedRollouts(group_size=G, outcome_fn=mostly_filtered)
    controller = build_controller(settings, loader, rollouts, trainer, on_fate=on_fate)
    try:
        summary = run_virtual(controller.run)
    except StepBelowFloorError:
        summary = None  # a step below its floor at the very end of the data: a named stop, allowed there only
    assert charged_with_data_left == []  # a loss is charged only once the loader has nothing left
    return summary, fates, trainer


def test_a_slot_refills_the_pool_while_the_pump_waits_at_the_gate():
    summary, fates, trainer = run(n_prompts=2000, max_steps=30)
    assert summary is not None and summary.steps_trained == 30
    assert [len(uids) for uids in trainer.uids_per_step().values()] == [P] * 30
    assert all(record.charged == 0 for record in summary.ledger_history)
    assert sum(record.replaced for record in summary.ledger_history) >= 30  # spares stood in, again and again


def test_a_step_closes_short_only_when_the_data_is_exhausted():
    summary, fates, trainer = run(n_prompts=120, max_steps=None, floor_fraction=0.25)
    trained = sorted(trainer.uids_per_step())
    assert len(trained) >= 5  # ~24 groups survive filtering: at least 5 whole steps before the data runs out
    # Every step before the last one trained whole; only a step that ran out of data may be short.
    assert all(len(trainer.uids_per_step()[step]) == P for step in trained[:-1])
    report = audit_fates([{**record.as_dict(), "mode": "async"} for record in fates], [f"p{i}" for i in range(120)])
    assert report.ok, report.format()
