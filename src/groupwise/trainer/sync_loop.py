"""The sync GRPO/DAPO trainer, readable top to bottom (seed 000's system).

Each step: rounds of ``ceil(batch_multiplier × P)`` prompts → G completions each → rewards (raw, scaled,
shaped) → per-group zero-variance filter (dynamic sampling) → accumulate kept groups until P → advantages on
the trained groups → one optimizer step → new weights into the generator → metrics, train data, eval,
checkpoint. With dynamic sampling off it is plain GRPO.

Pre-filter data (every generated row's reward) lives in the step tally, never in the training rows, so the
unfiltered metric cannot be misaligned with what was trained. Every generated group gets a line in fates.jsonl
(trained, filtered, discarded or carried; pending when its step is never trained), written before the step's
checkpoint so a resume rolls the file back to exactly the checkpointed steps.
"""

from __future__ import annotations

import math
import time

from groupwise.algo.accumulator import DynamicSamplingAccumulator, DynamicSamplingExhausted
from groupwise.rows import build_rows, group_row_advantages
from groupwise.run.fates_file import write_sync_step_fates, write_untrained_step_fates
from groupwise.runtime.daemon_worker import DaemonWorker
from groupwise.runtime.watchdog import generate_within_deadline
from groupwise.trainer.session import Session, StepOutcome


def round_size(session: Session) -> int:
    """Prompts per generation round: ``ceil(P × batch_multiplier)`` with dynamic sampling, else ``P``."""
    grpo = session.cfg.grpo
    ds = grpo.dynamic_sampling
    multiplier = ds.batch_multiplier if ds.enabled else 1.0
    return math.ceil(grpo.num_prompts_per_step * multiplier)


def new_accumulator(session: Session) -> DynamicSamplingAccumulator:
    grpo = session.cfg.grpo
    ds = grpo.dynamic_sampling
    return DynamicSamplingAccumulator(
        num_prompts_per_step=grpo.num_prompts_per_step,
        enabled=ds.enabled,
        max_gen_rounds=ds.max_gen_rounds if ds.enabled else 1,
        on_exhausted=ds.on_exhausted,
        min_step_batch_fraction=ds.min_step_batch_fraction,
        surplus=ds.surplus,
        zero_variance_tol=ds.zero_variance_tol,
        carried_in=session.state.carried,
    )


def collect_step(session: Session, step: int) -> StepOutcome | None:
    """Generate rounds until P groups with signal are kept (or the round budget or the data runs out)."""
    accumulator = new_accumulator(session)
    gen_seconds, gen_tokens, data_exhausted = 0.0, 0, False
    generated = []
    # Not `while True`: groups carried in from the previous step may already fill this one (no round needed).
    while accumulator.can_generate_more:
        items = session.loader.take(round_size(session))
        if not items:
            data_exhausted = True
            break
        start = time.perf_counter()
        try:
            groups = _generate_round(session, step, items, accumulator.rounds + 1)
        except Exception as err:  # the earlier rounds' groups will never train: pending, saying why
            _untrained_fates(session, step, generated, f"a generation round failed ({type(err).__name__})", [])
            raise
        gen_seconds += time.perf_counter() - start
        gen_tokens += sum(g.num_completion_tokens for g in groups)
        generated += groups
        accumulator.add_round(groups)
        if accumulator.is_complete or not accumulator.can_generate_more:
            break
    if data_exhausted and not accumulator.is_complete:
        session.events.event(f"step {step}: the data ran out (max_epochs reached) before the step filled; stopping")
        _untrained_fates(session, step, generated, "the data ran out (max_epochs) before the step filled", [])
        return None
    try:
        selection = accumulator.finish()
    except DynamicSamplingExhausted as err:
        reason = "dynamic sampling exhausted its rounds; the run failed"
        _untrained_fates(session, step, generated, reason, session.state.carried)
        session.fail(step, err)
        raise
    return StepOutcome(selection=selection, gen_seconds=gen_seconds, gen_tokens=gen_tokens, generated=generated)


# Sync generation rounds run here, so one that never returns cannot keep the run waiting (runtime.stall_timeout_s).
_GENERATION = DaemonWorker("groupwise-sync-generation")


def _generate_round(session: Session, step: int, items: list, round_number: int) -> list:
    """One round's groups, or :class:`~groupwise.runtime.watchdog.RunStalled` when it does not return in time."""
    ids = session.state.next_group_ids(len(items))

    def describe() -> str:
        uids = [item.prompt.uid for item in items]
        shown = ", ".join(uids[:8]) + (f" and {len(uids) - 8} more" if len(uids) > 8 else "")
        return f"sync step {step}, generation round {round_number}: {len(items)} prompts ({shown}), group ids {ids[0]}+"

    timeout = session.cfg.runtime.stall_timeout_s
    return generate_within_deadline(
        _GENERATION, session.rollouts.generate_groups, (items, ids), timeout, describe, session.events.event
    )


def _untrained_fates(session: Session, step: int, generated: list, reason: str, carried: list) -> None:
    """Fates of a step that is never trained (carried groups: only when run_sync will not write them at the end)."""
    ds = session.cfg.grpo.dynamic_sampling
    write_untrained_step_fates(session.fates, step, generated, carried, ds.enabled, ds.zero_variance_tol, reason)


def train_one_step(session: Session, step: int) -> bool:
    """One RL step = one optimizer step. Returns False when the data ran out before the step could fill."""
    start = time.perf_counter()
    outcome = collect_step(session, step)
    if outcome is None:
        return False
    selection = outcome.selection
    grpo = session.cfg.grpo
    advantages = group_row_advantages(
        selection.trained,
        baseline=grpo.baseline,
        normalize=grpo.normalize_advantages,
        clip_low=grpo.advantage_clip_low,
        clip_high=grpo.advantage_clip_high,
    )
    rows = build_rows(selection.trained, advantages)
    try:
        metrics = session.learner.train_step(rows)
    except Exception as err:  # the step's optimizer step never ran: its groups are pending, saying why
        reason = f"its optimizer step failed ({type(err).__name__})"
        _untrained_fates(session, step, outcome.generated, reason, session.state.carried)
        raise
    ds = grpo.dynamic_sampling
    write_sync_step_fates(
        session.fates, step, outcome.generated, selection.trained, selection.surplus, selection.surplus_carried,
        ds.enabled, ds.zero_variance_tol,
    )  # fmt: skip
    session.publish_weights()
    session.state.carried = selection.carry_over
    session.state.step = step + 1
    metrics.update(selection.tally.metrics())
    metrics.update(outcome.perf_metrics(time.perf_counter() - start))
    session.end_step(step, metrics, rows)
    return True


def run_sync(session: Session) -> None:
    """Train from ``session.state.step`` to ``run.max_steps`` (or until the data runs out)."""
    if session.state.step == 0 and session.cfg.eval.at_start:
        session.evaluate(step=0)
    try:
        with session.progress() as progress:
            while session.state.step < session.cfg.run.max_steps:
                if not train_one_step(session, session.state.step):
                    break
                progress.update(session.state.step, session.last_metrics)
    finally:
        _GENERATION.close(60.0)  # idle, or a stalled call already left to its own thread
    session.finish()
    # After the last checkpoint (a resume rolls these lines back and trains the carried groups after all).
    session.fates.write_groups(session.state.carried, "pending", session.state.step, detail="carried at the end")
