"""The learner: a policy and its optimizer. One RL step is exactly one optimizer step.

A step may be assembled from several chunks (the async controller streams them): ``begin`` happens at the
first chunk, each chunk adds raw loss *sums* to the gradients, and :meth:`Learner.finish_step` divides the
gradients by the step's global normaliser (valid tokens, or sequences) before clipping and stepping. So a step
trained in chunks equals the same step trained at once (invariant 6 in docs/design.md).

``prev_logprobs`` (π_old) are the current logprobs, detached: weights do not change inside a step (one
optimizer step per RL step), so a separate no-grad forward would compute the same numbers at twice the cost.
The importance weight ``exp(prev − generation)`` still corrects staleness and engine/trainer mismatch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from groupwise.algo.loss import LossStats, policy_loss
from groupwise.batch import RowBatch
from groupwise.model.logprobs import completion_logprobs
from groupwise.rows import pad_right
from groupwise.trainer.finite import NonFiniteTrainingError, check_finite_step


@dataclass(frozen=True)
class LearnerSettings:
    """What the learner needs from the run config (``loss``, ``optimizer``, sampling temperature)."""

    loss: Mapping[str, Any]
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    eps: float
    warmup_steps: int
    schedule: str
    min_lr_ratio: float
    max_grad_norm: float | None
    micro_batch_rows: int
    total_steps: int
    temperature: float

    @classmethod
    def from_config(cls, cfg: Any) -> LearnerSettings:
        opt = cfg.optimizer
        return cls(
            loss=cfg.loss.model_dump(),
            lr=opt.lr,
            betas=tuple(opt.betas),
            weight_decay=opt.weight_decay,
            eps=opt.eps,
            warmup_steps=opt.warmup_steps,
            schedule=opt.schedule,
            min_lr_ratio=opt.min_lr_ratio,
            max_grad_norm=opt.max_grad_norm,
            micro_batch_rows=opt.micro_batch_rows,
            total_steps=cfg.run.max_steps,
            temperature=cfg.generation.temperature,
        )


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Learning-rate factor at optimizer step ``step`` (0-based).

    Warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps``. Then with ``p = (step − warmup) /
    max(1, total − warmup)`` clamped to [0, 1]: constant ``1``; linear ``1 − (1 − m)·p``; cosine
    ``m + (1 − m)·(1 + cos(π p))/2``, where ``m = min_lr_ratio``.
    """
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


class Learner:
    """Owns the policy's parameters, the optimizer and the LR schedule; counts weight versions."""

    def __init__(self, model: torch.nn.Module, settings: LearnerSettings, reference: torch.nn.Module | None = None):
        self.model = model
        self.reference = reference
        self.settings = settings
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
            eps=settings.eps,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_multiplier(
                s,
                warmup_steps=settings.warmup_steps,
                total_steps=settings.total_steps,
                schedule=settings.schedule,
                min_lr_ratio=settings.min_lr_ratio,
            ),
        )
        self.version = 0
        self._stats: LossStats | None = None
        self._normaliser = 0.0
        self._loss_sum = 0.0
        self._train_tokens = 0
        self._train_seconds = 0.0

    @property
    def step_open(self) -> bool:
        return self._stats is not None

    def train_chunk(self, rows: RowBatch) -> None:
        """Forward/backward one chunk of whole groups; gradients accumulate until :meth:`finish_step`."""
        start = time.perf_counter()
        if self._stats is None:
            self.optimizer.zero_grad(set_to_none=True)
            self._stats = LossStats()
            self._normaliser = 0.0
            self._loss_sum = 0.0
            self._train_tokens = 0
            self._train_seconds = 0.0
        self.model.train()
        device = next(self.model.parameters()).device
        for micro in rows.iter_slices(self.settings.micro_batch_rows):
            stats, loss_sum, normaliser, tokens = self._micro_batch(micro, device)
            self._stats.merge(stats)
            self._loss_sum += loss_sum
            self._normaliser += normaliser
            self._train_tokens += tokens
        self._train_seconds += time.perf_counter() - start

    def _micro_batch(self, micro: RowBatch, device: torch.device) -> tuple[LossStats, float, float, int]:
        loss_cfg = self.settings.loss
        # Entropy is always computed: `loss/entropy` is the collapse alarm for small models.
        logprobs, entropy, mask = completion_logprobs(
            self.model, micro["prompt_ids"], micro["completion_ids"], self.settings.temperature, with_entropy=True
        )
        width = logprobs.shape[1]
        generation = pad_right(micro["generation_logprobs"], width).to(device)
        ref = None
        if loss_cfg["kl_coef"] > 0:
            if self.reference is None:
                raise RuntimeError("loss.kl_coef > 0 but the learner has no reference model (model.reference)")
            with torch.no_grad():
                ref, _, _ = completion_logprobs(
                    self.reference, micro["prompt_ids"], micro["completion_ids"], self.settings.temperature
                )
        loss, stats = policy_loss(
            logprobs,
            logprobs.detach(),
            generation,
            micro["advantage"].to(device),
            mask,
            epsilon_low=loss_cfg["epsilon_low"],
            epsilon_high=loss_cfg["epsilon_high"],
            dual_clip_c=loss_cfg["dual_clip_c"],
            normalization=loss_cfg["normalization"],
            denominator=1.0,
            kl_coef=loss_cfg["kl_coef"],
            ref_logprobs=ref,
            kl_input_clamp=loss_cfg["kl_input_clamp"],
            kl_output_clamp=loss_cfg["kl_output_clamp"],
            importance_sampling=loss_cfg["importance_sampling"],
            is_truncation=loss_cfg["is_truncation"],
            is_ratio_min=loss_cfg["is_ratio_min"],
            is_ratio_max=loss_cfg["is_ratio_max"],
            entropy=entropy,
            entropy_coef=loss_cfg["entropy_coef"],
        )
        loss.backward()
        tokens = int(mask.sum().item())
        normaliser = float(tokens) if loss_cfg["normalization"] == "token_level" else float(mask.shape[0])
        return stats, float(loss.detach()), normaliser, tokens

    def finish_step(self) -> dict[str, float]:
        """Divide the accumulated gradients by the step's normaliser, clip, take one optimizer step."""
        if self._stats is None:
            raise RuntimeError("finish_step called with no open step: train at least one chunk first")
        start = time.perf_counter()
        scale = 1.0 / max(self._normaliser, 1.0)
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:
            p.grad.mul_(scale)
        max_norm = self.settings.max_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
        try:  # before the optimizer step: a NaN gradient must never reach the weights
            check_finite_step(self._loss_sum / max(self._normaliser, 1.0), float(grad_norm), self.version)
        except NonFiniteTrainingError:
            self.optimizer.zero_grad(set_to_none=True)
            self._stats = None
            raise
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        seconds = self._train_seconds + time.perf_counter() - start
        metrics = self._stats.as_metrics(total_loss=self._loss_sum / max(self._normaliser, 1.0))
        metrics.setdefault("loss/kl", 0.0)  # no reference model: the KL term is off (docs/metrics.md)
        metrics.update(
            {
                "optim/grad_norm": float(grad_norm),
                "optim/lr": lr,
                "perf/train_seconds": seconds,
                "perf/train_tokens_per_s": self._train_tokens / seconds if seconds > 0 else 0.0,
                "perf/train_tokens": float(self._train_tokens),
            }
        )
        self._stats = None
        return metrics

    def train_step(self, rows: RowBatch) -> dict[str, float]:
        """A whole step at once (the sync loop): one chunk, one optimizer step."""
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
