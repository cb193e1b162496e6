"""Async checkpoints: the controller's state, taken at a step boundary, inside the run's atomic checkpoint.

An async checkpoint is the sync one (policy, optimizer + scheduler, RNG states, trainer counters; written by
``groupwise.run.checkpoint`` into a temp dir, manifest, rename) plus:

* ``trainer_state.json``: the loader position **at the step boundary** and ``fates_offset`` (the size of
  ``fates.jsonl`` then: a resume cuts the file back to it, see :mod:`groupwise.run.fates_file`);
* ``extra/controller.json``: :meth:`Controller.state_dict` — spare pool, READY buffered groups with their versions
  and stamps, unsettled dispatch slots, open steps' ledger entries and tallies, the sampler's dispatch cursor and
  whether it stamps, run counters and failure budgets (:mod:`groupwise.controller.snapshot`).

The rollout pump keeps running while the checkpoint is written (in a worker thread), so the loader position, the
controller state and the fates offset are captured together, synchronously on the event loop, by
:func:`boundary_snapshot`; the session writes that snapshot with the weights of the same step.

On resume each unsettled slot's prompt is dispatched again first, under its stamp (so ``in_order`` steps fill
exactly as before and stamps continue from the restored cursor). An attempt that was running when the snapshot was
taken keeps what it had generated (its tokens, their logprobs and versions, recorded by the rollout client at a
token boundary): it continues from there with the same random draws instead of starting over. Prompts of a batch
still waiting at the gate go back to the loader front (or the spare pool front at the end-of-data drain). Nothing
taken from the loader is lost, and nothing trained before the checkpoint is trained again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from groupwise.data.loader import LoadedPrompt, PromptLoader
from groupwise.run.fates_file import FatesWriter
from groupwise.types import LoaderItem, Prompt

CONTROLLER_PIECE = "controller"


class ResumeError(RuntimeError):
    """A checkpoint cannot be resumed the way this run is configured."""


def encode_item(item: LoaderItem) -> dict[str, Any]:
    """A loader item as plain data: the prompt's uid and where the loader yielded it."""
    return {"uid": item.prompt.uid, "epoch": item.epoch, "index_in_epoch": item.index_in_epoch}


class SnapshotSource(Protocol):
    """What :func:`boundary_snapshot` takes of the controller (a ``groupwise.controller.Controller``)."""

    def state_dict(
        self, encode: Callable[[LoaderItem], Any], progress: Callable[[int], dict[str, Any] | None] | None
    ) -> dict[str, Any]: ...


class ItemDecoder:
    """Turns :func:`encode_item` data back into loader items over the run's training prompts."""

    def __init__(self, prompts: Sequence[Prompt]) -> None:
        self._by_uid = {prompt.uid: prompt for prompt in prompts}

    def __call__(self, data: dict[str, Any]) -> LoadedPrompt:
        prompt = self._by_uid.get(data["uid"])
        if prompt is None:
            raise ResumeError(
                f"the checkpoint holds prompt {data['uid']!r}, which the training data no longer has; resume with the "
                "dataset the run started with (same data section and seed)"
            )
        return LoadedPrompt(prompt=prompt, epoch=int(data["epoch"]), index_in_epoch=int(data["index_in_epoch"]))


def boundary_snapshot(
    step: int, controller: SnapshotSource, loader: PromptLoader, fates: FatesWriter,
    progress: Callable[[int], dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """Everything of the async run a checkpoint of ``step`` needs beyond weights and optimizer.

    Call synchronously on the event loop inside ``on_step_end`` (nothing else may run in between), at every step:
    a run that stops at the end of data saves its final checkpoint from the last one. Its cost grows with the
    buffered groups' tokens (copied into plain lists), small next to an RL step. ``step`` is the number of
    optimizer steps done (the checkpoint's step). ``progress`` is the rollout client's record of each running attempt
    by group id (what it generated so far), saved so that attempt continues on resume instead of starting over.
    """
    state = controller.state_dict(encode_item, progress)
    if state["step"] != step:
        raise AssertionError(f"controller snapshot is at step {state['step']}, the checkpoint at step {step}")
    return {
        "step": step,
        # No fsync here (every step, on the event loop): the session fsyncs fates.jsonl when it writes a checkpoint.
        "trainer": {"loader": loader.state_dict(), "fates_offset": fates.offset(sync=False)},
        "extra": {CONTROLLER_PIECE: state},
    }


def controller_state(extra: dict[str, Any] | None) -> dict[str, Any] | None:
    """The controller state of a loaded checkpoint's ``extra`` pieces (None: not an async checkpoint)."""
    return (extra or {}).get(CONTROLLER_PIECE)


def check_sync_resume(extra: dict[str, Any] | None, path: str | Path) -> None:
    """Refuse to resume an async checkpoint in sync mode: its buffered groups and in-flight prompts would be lost."""
    state = controller_state(extra)
    if state is None:
        return
    held = len(state["buffer"]["groups"]) + len(state.get("inflight_slots", [])) + len(state["inflight_prompts"])
    raise ResumeError(
        f"checkpoint {path} was written by an async run (its controller holds {held} buffered groups and unsettled "
        "prompts, which the sync trainer cannot take over); resume it with mode: async"
    )
