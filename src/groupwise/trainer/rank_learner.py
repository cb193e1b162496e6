"""The learner on one data-parallel rank: the :class:`~groupwise.trainer.learner.Learner`, on this rank's share.

Every rank gets every chunk of the step and keeps its own share of it (:func:`~groupwise.trainer.micro_batches.
rank_rows`: whole groups balanced by tokens; with PPO mini-batches, each mini-batch is split), so the split needs
no coordination. What changes against one process (docs/distributed.md):

* **One normaliser for the step.** Each update's valid-token (or sequence) count and loss sum are summed over the
  ranks; gradients are multiplied by ``world_size / N`` because DDP and FSDP average them (groupwise.trainer.
  data_parallel). So N ranks take one rank's update on the same rows, beyond float rounding.
* **Gradients sync once per update**, in the update's last micro-batch. A streamed step (async mode:
  ``train_chunk`` … ``finish_step``) does not know its last micro-batch until ``finish_step``, so each chunk's
  last micro-batch is held back and run before the next chunk's, or with the sync in ``finish_step``.
* **Equal pass counts.** FSDP gathers parameters in every forward pass, a collective, so every rank runs the same
  number of passes per chunk (and per mini-batch): the counts are all-reduced (max) and a rank with fewer runs
  zero-weight passes on a one-token row (``None`` in a plan) whose gradient is zero.
* **Weights and state from one place.** ``model_state``, ``generator_state`` and ``state_dict`` gather whole
  tensors on every rank (collectives, same order everywhere); rank 0's copy is the one the driver keeps, in
  the one-process layout (a one-rank run resumes from it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from groupwise.algo.loss import valid_count
from groupwise.algo.loss_stats import LossStats
from groupwise.algo.mismatch import MismatchStats
from groupwise.batch import RowBatch
from groupwise.model.completion_scorer import ScoredRows
from groupwise.model.lora import generator_state_dict, is_adapted, load_trained_state_dict, trained_state_dict
from groupwise.trainer.data_parallel import (
    DataParallel,
    full_optimizer_state,
    full_tensors,
    load_full_model_state,
    load_full_optimizer_state,
)
from groupwise.trainer.learner import Learner, LearnerSettings, MicroBatch, _OpenStep, _Update
from groupwise.trainer.micro_batches import rank_rows
from groupwise.trainer.precision import LearnerPrecision

_PAD_ROW = ([0], [0])  # the zero-weight pass of a rank with fewer micro-batches: prompt and completion ids


class RankLearner(Learner):
    """A :class:`Learner` on rank ``parallel.rank`` of a process group (module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        settings: LearnerSettings,
        parallel: DataParallel,
        reference: torch.nn.Module | None = None,
        precision: LearnerPrecision | None = None,
    ):
        self.parallel = parallel
        # Wrapped before the optimizer is made: FSDP2 replaces the parameters by their shards.
        self.wrapped = parallel.wrap(model)
        super().__init__(model, settings, reference=reference, precision=precision)
        self.wrapped.scoring.scorer = self.scorer
        self._held: list[RowBatch | None] = []  # the open chunk's last micro-batch, run in the next sync

    def warm_up(self) -> str:
        """One no-grad pass on every rank (the scorer's path probe runs inside the wrapped forward, where FSDP
        has gathered the root's parameters); the path that scores, for events.log."""
        with torch.no_grad():
            self._pad_pass()
        self._reshard()
        return self.scorer.describe(self.model)

    def _reshard(self) -> None:
        """FSDP: put every parameter back to its shard. The root keeps its gathered parameters after a forward
        pass until the backward pass; a state load in between would meet whole tensors where shards belong."""
        self.parallel.reshard(self.wrapped)

    # --- the hooks ----------------------------------------------------------------------------------------------
    def _micro_batches(self, rows: RowBatch) -> list[MicroBatch]:
        lengths = [len(p) + len(c) for p, c in zip(rows["prompt_ids"], rows["completion_ids"], strict=True)]
        mine = rank_rows(rows.row_group_ids(), lengths, self.parallel.world_size)[self.parallel.rank]
        plan: list[MicroBatch] = list(super()._micro_batches(rows.select(mine))) if mine else []
        count = self.parallel.all_max(len(plan))
        return plan + [None] * (count - len(plan))

    def _train_micro_batches(self, micros: list[MicroBatch]) -> None:
        for micro in [*self._held, *micros[:-1]]:
            with self._gradient_sync(last=False):
                self._backward(micro, prev=None, ref=None)
        self._held = micros[-1:]

    def _optimizer_update(self) -> None:
        for micro in self._held:  # the streamed step's last micro-batch: its backward pass syncs the gradients
            with self._gradient_sync(last=True):
                self._backward(micro, prev=None, ref=None)
        self._held = []
        super()._optimizer_update()

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        return self.parallel.gradient_sync(self.wrapped, enabled=last)

    def _backward(self, micro: MicroBatch, prev: torch.Tensor | None, ref: torch.Tensor | None) -> None:
        if micro is None:
            logprobs, entropy = self._pad_pass()
            (logprobs.sum() * 0.0 + entropy.sum() * 0.0).backward()
            return
        super()._backward(micro, prev, ref)

    def _old_logprobs(self, micro: MicroBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if micro is None:
            self._pad_pass()
            return None, None
        return super()._old_logprobs(micro)

    def _score(self, micro: RowBatch, with_entropy: bool = True) -> ScoredRows:
        logprobs, entropy, mask, padded, real = self.wrapped(
            micro.sequence("prompt_ids"), micro.sequence("completion_ids"), with_entropy
        )
        return ScoredRows(logprobs, entropy, mask, padded, real)

    def _pad_pass(self) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs, entropy, *_ = self.wrapped([_PAD_ROW[0]], [_PAD_ROW[1]], True)
        assert entropy is not None, "the pad pass asks for the entropy"
        return logprobs, entropy

    def _update_totals(self, update: _Update) -> tuple[float, float]:
        local = valid_count(update.masks, self.loss.normalization(self.settings.loss))
        normaliser, loss_sum = self.parallel.all_sum([local, update.loss_sum])
        if normaliser <= 0:
            raise ValueError("the update has no valid tokens on any rank (every mask is zero)")
        return normaliser, loss_sum

    def _grad_scale(self, normaliser: float) -> float:
        return self.parallel.world_size / max(normaliser, 1.0)

    def _clip_gradients(self, params: list[torch.nn.Parameter]) -> float:
        max_norm = self.settings.optimizer.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # FSDP: a sharded norm

    def _step_totals(self, step: _OpenStep) -> tuple[LossStats, MismatchStats, int, int, int]:
        """Statistics and padding summed over the ranks; every rank saw the whole chunks (train_tokens as is)."""
        stats, mismatch = LossStats(), MismatchStats()
        padded = real = 0
        for rank_stats, rank_mismatch, rank_padded, rank_real in self.parallel.gather(
            (step.stats, step.mismatch, step.padded_tokens, step.real_tokens)
        ):
            stats.merge(rank_stats)
            mismatch.merge(rank_mismatch)
            padded += rank_padded
            real += rank_real
        return stats, mismatch, step.train_tokens, padded, real

    # --- whole state, gathered -------------------------------------------------------------------------------
    def model_state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint stores (every weight, or the LoRA adapter), whole, on every rank."""
        return full_tensors(trained_state_dict(self.model))

    def generator_state(self) -> dict[str, torch.Tensor]:
        """The generator's weights (adapters merged), whole, on every rank."""
        return full_tensors(generator_state_dict(self.model))

    def load_model_state(self, state: Mapping[str, torch.Tensor]) -> None:
        if self.parallel.sharding == "fsdp" and not is_adapted(self.model):
            self._reshard()
            load_full_model_state(self.model, state)
        else:
            load_trained_state_dict(self.model, state)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        # Before the first update there is no state to gather (and torch's helper would create it with a step).
        if self.parallel.sharding == "fsdp" and self.optimizer.state:
            state["optimizer"] = full_optimizer_state(self.wrapped.module, self.optimizer)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.parallel.sharding != "fsdp" or not state["optimizer"]["state"]:
            super().load_state_dict(state)
            return
        load_full_optimizer_state(self.wrapped.module, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])

