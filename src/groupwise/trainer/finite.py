"""The non-finite guard: a step whose loss or gradient is NaN or infinite never reaches the optimizer.

One optimizer step on a NaN gradient makes every weight NaN, and everything after it (checkpoints, ``final/``,
evaluation) would carry them while the run reports success. :func:`check_finite_step` runs in
``Learner.finish_step`` after the gradients are complete and before ``optimizer.step()``, so the weights stay the
last finite ones; the run then stops with :class:`NonFiniteTrainingError` (exit code 1, nothing saved after it).
Finite gradients can still produce non-finite weights (a learning rate of 1e30, say), so before a checkpoint or
``final/`` is written, :func:`check_finite_weights` looks at every tensor: non-finite weights are never saved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


class NonFiniteTrainingError(FloatingPointError):
    """A step's loss or gradient norm is NaN or infinite; its optimizer step was not taken."""


def check_finite_step(loss: float, grad_norm: float, step: int) -> None:
    """Raise :class:`NonFiniteTrainingError` unless ``loss`` and ``grad_norm`` are both finite.

    ``grad_norm`` is the global L2 norm of all gradients (``clip_grad_norm_``'s return value), NaN or inf as soon
    as one gradient element is; ``step`` is the optimizer step (weight version) being taken, for the message.
    """
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    raise NonFiniteTrainingError(
        f"optimizer step {step}: the loss is {loss} and the gradient norm {grad_norm}; the step was not taken and "
        "the weights are those of the last finite step (nothing was saved after it). Usual causes: a generation "
        "temperature so low that logits / temperature overflow, a learning rate so high that the weights "
        "diverged, or rewards of extreme magnitude"
    )


def check_finite_weights(state: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise :class:`NonFiniteTrainingError` naming the first floating-point tensor of ``state`` with a NaN or an
    infinity, before ``what`` (a checkpoint, the final policy) is written with it."""
    for name, tensor in state.items():
        if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise NonFiniteTrainingError(
                f"parameter {name!r} holds NaN or infinite values, so {what} was not written (the newest complete "
                "checkpoint, if any, is unchanged). An optimizer step with finite gradients produced them: lower "
                "optimizer.lr, or set optimizer.max_grad_norm"
            )
