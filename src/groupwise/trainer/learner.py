"""The learner: a policy and its optimizer. An RL step takes K × E optimizer updates (K = E = 1 by default).

**One update per step** (``optimizer.mini_batches_per_step × epochs_per_step = 1``). A step may arrive in
several chunks (the async controller streams them): each chunk's micro-batches add raw loss *sums* to the
gradients, and :meth:`Learner.finish_step` divides them by the step's normaliser (valid tokens, or sequences:
:func:`~groupwise.algo.loss.global_denominator` over every micro-batch's mask) before clipping and stepping.
So the result does not depend on how the step was chunked or cut into micro-batches, beyond float rounding
(invariant 6 in docs/design.md).
``prev_logprobs`` (π_old) are the current logprobs, detached: the weights do not change inside the step, so a
separate no-grad pass would compute the same numbers at twice the cost. The ratio is then exactly 1 and the
clip never acts; the importance weight ``exp(prev − generation)`` still corrects staleness and the
engine/trainer mismatch.

**PPO mini-batches** (K·E > 1). Chunks are kept until :meth:`finish_step`; the step's groups are split into K
mini-batches of whole groups (:mod:`groupwise.trainer.micro_batches`); the old-policy logprobs of every row are
computed once, under no_grad, with the same micro-batches as training (a different cut would change their
float rounding); then E epochs over the K mini-batches, each mini-batch one optimizer update normalised over
its own tokens. From the second update on the ratio moves away from 1 and the clip acts.

Weight versions count RL steps (one per :meth:`finish_step`), so staleness keeps its meaning; the LR schedule
counts RL steps too: the K·E updates of a step share its learning rate.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from groupwise.algo.loss import global_denominator
from groupwise.algo.loss_menu import BUILTIN_LOSSES
from groupwise.algo.loss_registry import resolve_loss
from groupwise.algo.loss_seam import LossContractError, LossInputs, check_loss_result
from groupwise.algo.loss_stats import LossStats
from groupwise.algo.mismatch import MismatchStats, mismatch_stats, on_policy_tokens
from groupwise.batch import RowBatch
from groupwise.config.algorithm import LossSection, OptimizerSection
from groupwise.model.completion_scorer import CompletionScorer, ScoredRows
from groupwise.rows import pad_right, span_versions, trainable_mask
from groupwise.trainer.finite import NonFiniteTrainingError, check_finite_step
from groupwise.trainer.micro_batches import (
    micro_batches_by_rows,
    micro_batches_by_shared_tokens,
    micro_batches_by_tokens,
    mini_batch_groups,
    padding_fraction,
)
from groupwise.trainer.precision import LearnerPrecision, adamw

if TYPE_CHECKING:
    from groupwise.config import RunConfig


@dataclass(frozen=True)
class LearnerSettings:
    """What the learner needs from the run config: the ``loss`` and ``optimizer`` sections as themselves, the run's
    length (the LR schedule's horizon), the sampling temperature (logprobs are taken at it) and the longest
    completion (``generation.max_new_tokens``: ``dr_grpo``'s constant normaliser). Pydantic sections and scalars,
    so it pickles for the Ray learner actor."""

    loss: LossSection
    optimizer: OptimizerSection
    total_steps: int
    temperature: float
    max_completion_tokens: int | None = None

    @property
    def updates_per_step(self) -> int:
        return self.optimizer.mini_batches_per_step * self.optimizer.epochs_per_step

    @classmethod
    def from_config(cls, cfg: RunConfig) -> LearnerSettings:
        return cls(cfg.loss, cfg.optimizer, cfg.run.max_steps, cfg.generation.temperature,
                   cfg.generation.max_new_tokens)


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Learning-rate factor at RL step ``step`` (0-based).

    Warm-up over ``w = min(warmup_steps, total_steps)`` steps (a warm-up longer than the run is clamped to it, so
    a shortened run still reaches the peak at its last step): ``(step + 1) / w`` for ``step < w``. Then with
    ``p = (step − w) / max(1, total − w)`` clamped to [0, 1]: constant ``1``; linear ``1 − (1 − m)·p``; cosine
    ``m + (1 − m)·(1 + cos(π p))/2``, where ``m = min_lr_ratio``.
    """
    warmup_steps = min(warmup_steps, total_steps)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}; expected constant, linear or cosine")


MicroBatch = RowBatch | None
"""A micro-batch of rows; None only on a data-parallel rank: a zero-weight pass it runs so that every rank runs as
many passes as the busiest (:mod:`groupwise.trainer.rank_learner`)."""


@dataclass
class _Update:
    """Sums over the micro-batches of one optimizer update."""

    masks: list[torch.Tensor] = field(default_factory=list)
    loss_sum: float = 0.0


@dataclass
class _OpenStep:
    """Everything a step accumulates between its first chunk and :meth:`Learner.finish_step`."""

    stats: LossStats = field(default_factory=LossStats)
    mismatch: MismatchStats = field(default_factory=MismatchStats)
    update: _Update = field(default_factory=_Update)
    pending: list[RowBatch] = field(default_factory=list)  # K·E > 1: chunks kept for finish_step
    losses: list[float] = field(default_factory=list)  # normalised loss of each update taken
    grad_norms: list[float] = field(default_factory=list)
    train_tokens: int = 0
    padded_tokens: int = 0
    real_tokens: int = 0
    seconds: float = 0.0


class Learner:
    """Owns the policy's parameters, the optimizer and the LR schedule; counts weight versions."""

    def __init__(
        self,
        model: torch.nn.Module,
        settings: LearnerSettings,
        reference: torch.nn.Module | None = None,
        precision: LearnerPrecision | None = None,
    ):
        self.model = model
        self.reference = reference
        self.settings = settings
        self.loss = resolve_loss(settings.loss.type)
        precision = precision or LearnerPrecision(master_dtype=next(model.parameters()).dtype)
        chunk_tokens = settings.optimizer.logprob_chunk_tokens
        self.scorer = CompletionScorer(
            settings.temperature, chunk_tokens, precision.compute_dtype, settings.optimizer.share_prompts
        )
        self.optimizer = adamw(
            [p for p in model.parameters() if p.requires_grad],
            precision,
            lr=settings.optimizer.lr,
            betas=settings.optimizer.betas,
            weight_decay=settings.optimizer.weight_decay,
            eps=settings.optimizer.eps,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_multiplier(
                s,
                warmup_steps=settings.optimizer.warmup_steps,
                total_steps=settings.total_steps,
                schedule=settings.optimizer.schedule,
                min_lr_ratio=settings.optimizer.min_lr_ratio,
            ),
        )
        self.version = 0
        self._step: _OpenStep | None = None

    @property
    def logprob_path(self) -> str:
        """How the policy's logprobs are computed (chunked or plain, and why), for the run's events.log."""
        return self.scorer.describe(self.model)

    def train_chunk(self, rows: RowBatch) -> None:
        """Add one chunk of whole groups to the open step (K·E = 1: its forward/backward passes run now)."""
        start = time.perf_counter()
        if self._step is None:
            self.optimizer.zero_grad(set_to_none=True)
            self._step = _OpenStep()
        step = self._step
        step.train_tokens += sum(len(c) for c in rows["completion_ids"]) - sum(
            length for spans in _env_spans(rows) for _, length in spans
        )
        if self.settings.updates_per_step == 1:
            self.model.train()
            self._train_micro_batches(self._micro_batches(rows))
        else:
            step.pending.append(rows)
        step.seconds += time.perf_counter() - start

    def finish_step(self) -> dict[str, float]:
        """Take the step's optimizer update(s), advance the LR schedule and the weight version; the step's metrics."""
        if self._step is None:
            raise RuntimeError("finish_step called with no open step: train at least one chunk first")
        start = time.perf_counter()
        step = self._step
        lr = self.optimizer.param_groups[0]["lr"]
        if self.settings.updates_per_step == 1:
            self._optimizer_update()
        else:
            self._ppo_updates(RowBatch.concat(step.pending) if len(step.pending) > 1 else step.pending[0])
        self.scheduler.step()
        self.version += 1
        seconds = step.seconds + time.perf_counter() - start
        self._step = None
        stats, mismatch, train_tokens, padded_tokens, real_tokens = self._step_totals(step)
        metrics = stats.as_metrics(total_loss=sum(step.losses) / len(step.losses)) | mismatch.as_metrics()
        metrics.update(
            {
                "optim/grad_norm": sum(step.grad_norms) / len(step.grad_norms),
                "optim/lr": lr,
                "perf/train_seconds": seconds,
                "perf/train_tokens_per_s": train_tokens / seconds if seconds > 0 else 0.0,
                "perf/train_tokens": float(train_tokens),
                "perf/padding_fraction": padding_fraction(padded_tokens, real_tokens),
            }
        )
        return metrics

    def train_step(self, rows: RowBatch) -> dict[str, float]:
        """A whole step at once: one chunk, then its update(s) (the benchmarks' and tests' step; the loops feed
        chunks as groups arrive and close the step with :meth:`finish_step`)."""
        self.train_chunk(rows)
        return self.finish_step()

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])

    # --- the passes -------------------------------------------------------------------------------------------
    def _micro_batches(self, rows: RowBatch) -> list[MicroBatch]:
        """``rows`` cut into micro-batches: by rows, or packed under the token budget, each prompt's rows together
        when the scorer shares prompts (micro_batches module)."""
        optimizer = self.settings.optimizer
        if optimizer.micro_batch_tokens is None:
            plan = micro_batches_by_rows(rows.num_rows, optimizer.micro_batch_rows)
            if len(plan) == 1:
                return [rows]
        elif self.scorer.shares_prompts(self.model):
            completions = [len(c) for c in rows.sequence("completion_ids")]
            plan = micro_batches_by_shared_tokens(
                rows.sequence("prompt_ids"), completions, optimizer.micro_batch_tokens, optimizer.micro_batch_rows
            )
        else:
            pairs = zip(rows.sequence("prompt_ids"), rows.sequence("completion_ids"), strict=True)
            lengths = [len(p) + len(c) for p, c in pairs]
            plan = micro_batches_by_tokens(lengths, optimizer.micro_batch_tokens, optimizer.micro_batch_rows)
        return [rows.select(indices) for indices in plan]

    def _backward(self, micro: MicroBatch, prev: torch.Tensor | None, ref: torch.Tensor | None) -> None:
        """Forward one micro-batch, add its loss *sum* to the gradients; ``prev`` None = the current logprobs."""
        step, loss_cfg = self._step, self.settings.loss
        assert step is not None and micro is not None, "an open step; only a data-parallel rank plans empty passes"
        # Every built-in loss asks for the entropy: `loss/entropy` is the collapse alarm for small models.
        scored = self._score(micro, with_entropy=self.loss.declaration.needs_entropy)
        logprobs, mask = scored.logprobs, scored.mask
        device = logprobs.device
        spans = _env_spans(micro)
        if any(spans):  # an episode's environment tokens: no gradient, and out of every count and statistic
            mask = mask & trainable_mask(spans, mask.shape[1]).to(device)
        if ref is None and self.loss.scores_reference(loss_cfg):
            ref = self._reference_logprobs(micro)
        old = logprobs.detach() if prev is None else prev  # π_old: the step's weights, version self.version
        generation = pad_right(micro.sequence("generation_logprobs"), logprobs.shape[1]).to(device)
        inputs = LossInputs(
            logprobs, old, generation, micro.tensor("advantage").to(device), mask, loss_cfg,
            max_completion_tokens=self.settings.max_completion_tokens, ref_logprobs=ref,
            entropy=scored.entropy if self.loss.declaration.needs_entropy else None,
        )  # fmt: skip
        try:  # a plug-in's non-finite loss from finite inputs is its own failure; a built-in's is the model's
            result = check_loss_result(self.loss(inputs), self.loss.name, inputs, self.loss.name not in BUILTIN_LOSSES)
        except LossContractError:
            self._abandon_step()
            raise
        loss = result.loss
        self._run_backward(loss)
        versions = span_versions(micro.sequence("version_spans"), logprobs.shape[1]).to(device)
        step.mismatch.merge(mismatch_stats(old, generation, on_policy_tokens(versions, self.version, mask), mask))
        step.stats.merge(result.stats).merge(LossStats(plugin=dict(result.metrics)))
        step.update.masks.append(mask)
        step.update.loss_sum += float(loss.detach())
        step.padded_tokens += scored.padded_tokens
        step.real_tokens += scored.real_tokens

    # --- hooks a data-parallel rank overrides (groupwise.trainer.rank_learner) --------------------------------
    def _train_micro_batches(self, micros: list[MicroBatch]) -> None:
        """One update's forward/backward passes over a chunk's micro-batches (gradients add up)."""
        for micro in micros:
            self._backward(micro, prev=None, ref=None)

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """Around one micro-batch's passes; ``last`` = the update's last one (when ranks sync gradients)."""
        return contextlib.nullcontext()

    def _score(self, micro: RowBatch, with_entropy: bool = True) -> ScoredRows:
        """The policy's logprobs (entropies) and mask on one micro-batch; under grad when grad is enabled."""
        prompts, completions = micro.sequence("prompt_ids"), micro.sequence("completion_ids")
        return self.scorer.score(self.model, prompts, completions, with_entropy=with_entropy)

    def _run_backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _clip_gradients(self, params: list[torch.nn.Parameter]) -> float:
        """Clip the gradients' global norm to ``max_grad_norm`` (none: ∞); the norm before clipping."""
        max_norm = self.settings.optimizer.max_grad_norm
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf")))

    def _update_totals(self, update: _Update) -> tuple[float, float]:
        """(normaliser, loss sum) of one optimizer update; with data parallelism, over every rank."""
        return global_denominator(update.masks, self.loss.normalization(self.settings.loss)), update.loss_sum

    def _grad_scale(self, normaliser: float) -> float:
        """What the summed gradients are multiplied by: ``1 / normaliser``."""
        return 1.0 / max(normaliser, 1.0)

    def _step_totals(self, step: _OpenStep) -> tuple[LossStats, MismatchStats, int, int, int]:
        """The step's loss and mismatch statistics, trained, padded and real token counts (over every rank, when
        parallel)."""
        return step.stats, step.mismatch, step.train_tokens, step.padded_tokens, step.real_tokens

    def _reference_logprobs(self, micro: RowBatch) -> torch.Tensor:
        if self.reference is None:
            raise RuntimeError(f"loss.type {self.loss.name!r} with loss.kl_coef {self.settings.loss.kl_coef} reads the "
                               "reference policy, but the learner has none (model.reference)")
        with torch.no_grad():
            prompts, completions = micro.sequence("prompt_ids"), micro.sequence("completion_ids")
            return self.scorer.score(self.reference, prompts, completions).logprobs

    def _optimizer_update(self) -> None:
        """Scale the summed gradients by the update's normaliser, clip, step; record loss and grad norm."""
        step = self._step
        assert step is not None
        normaliser, loss_sum = self._update_totals(step.update)
        scale = self._grad_scale(normaliser)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        params = [p for p in self.model.parameters() if p.grad is not None]
        for grad in grads:
            grad.mul_(scale)
        grad_norm = self._clip_gradients(params)
        loss = loss_sum / max(normaliser, 1.0)
        try:  # before the optimizer step: a NaN gradient must never reach the weights
            check_finite_step(loss, grad_norm, self.version)
        except NonFiniteTrainingError:
            self._abandon_step()
            raise
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        step.grad_norms.append(grad_norm)
        step.losses.append(loss)
        step.update = _Update()

    def _abandon_step(self) -> None:
        """Drop the open step and its gradients (the run stops on the error that called this)."""
        self.optimizer.zero_grad(set_to_none=True)
        self._step = None

    def _ppo_updates(self, rows: RowBatch) -> None:
        """K mini-batches × E epochs of updates from old-policy logprobs computed once (module docstring)."""
        settings = self.settings
        self.model.train()
        plans = [
            self._micro_batches(rows.select_groups(groups))
            for groups in mini_batch_groups(rows.group_ids(), settings.optimizer.mini_batches_per_step)
        ]
        with torch.no_grad():
            old = [[self._old_logprobs(micro) for micro in plan] for plan in plans]
        for _ in range(settings.optimizer.epochs_per_step):
            for plan, plan_old in zip(plans, old, strict=True):
                for index, (micro, (prev, ref)) in enumerate(zip(plan, plan_old, strict=True)):
                    with self._gradient_sync(last=index == len(plan) - 1):
                        self._backward(micro, prev=prev, ref=ref)
                self._optimizer_update()

    def _old_logprobs(self, micro: MicroBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """π_old (and the reference's logprobs when the KL term is on) of one micro-batch, before any update."""
        assert micro is not None, "only a data-parallel rank plans empty passes"
        prev = self._score(micro, with_entropy=False).logprobs
        ref = self._reference_logprobs(micro) if self.loss.scores_reference(self.settings.loss) else None
        return prev, ref


def _env_spans(rows: RowBatch) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The rows' ``env_spans`` (:func:`groupwise.rows.env_spans`); rows without the column have none."""
    return rows.sequence("env_spans") if "env_spans" in rows else ()
