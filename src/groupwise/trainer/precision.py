"""How the learner holds its weights and computes, per device: the one place that knows about CUDA.

* CPU: the weights are held in ``model.dtype`` and computed in it; AdamW is torch's fused CPU kernel (one pass
  over each parameter's weight, gradient and moments instead of a pass per operation: on SmolLM2-135M the learner
  step is 5–7 % faster, the same updates; ``bench/RESULTS.md``).
* CUDA: float32 master weights and float32 AdamW state always; with ``model.dtype: bfloat16`` the forward runs
  under ``torch.autocast(bfloat16)`` (the LM-head logits too, reduced in float32 by the chunked logprobs), so
  the learner gets bfloat16 speed without bfloat16 rounding of its updates. The generator then gets its own
  bfloat16 copy (refreshed at every weight sync), since it must not sample from the float32 masters. AdamW is
  the fused CUDA kernel, attention is PyTorch SDPA (set when the model is loaded).

Chosen over "bfloat16 weights with float32 optimizer state": torch's AdamW keeps its state in the parameter's
dtype, and bfloat16 weights lose small updates (an 8-bit mantissa cannot add ``lr × g`` to ``w`` once it is
below ``w / 256``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from groupwise.model.loading import resolve_dtype


@dataclass(frozen=True)
class LearnerPrecision:
    """``master_dtype``: weights and optimizer state; ``compute_dtype``: autocast dtype (None = no autocast);
    ``fused_adamw``: use the fused AdamW kernel."""

    master_dtype: torch.dtype = torch.float32
    compute_dtype: torch.dtype | None = None
    fused_adamw: bool = False

    @property
    def generator_needs_own_copy(self) -> bool:
        """The generator samples in ``compute_dtype`` from a copy of its own, not from the float32 masters."""
        return self.compute_dtype is not None


def learner_precision(device: torch.device, dtype: str) -> LearnerPrecision:
    """The precision plan for ``model.device`` (resolved) and ``model.dtype`` (see the module docstring)."""
    configured = resolve_dtype(dtype)
    if device.type != "cuda":
        return LearnerPrecision(master_dtype=configured, fused_adamw=True)
    compute = configured if configured != torch.float32 else None
    return LearnerPrecision(master_dtype=torch.float32, compute_dtype=compute, fused_adamw=True)


def adamw(
    params: list[torch.nn.Parameter], precision: LearnerPrecision, lr: float, betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0, eps: float = 1e-8,
) -> torch.optim.AdamW:  # fmt: skip
    """``torch.optim.AdamW`` over ``params``, fused when the plan says so (``fused=None`` keeps torch's default)."""
    fused = True if precision.fused_adamw else None
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps, fused=fused)
