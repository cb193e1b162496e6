"""The decode step's linear projections ``y = x Wᵀ + b (+ r)``, each weight kept in the layout its kernel reads fastest.

Two kinds, chosen once per decoder by :func:`projection_kind` (oneDNN for float32 on a CPU from a hidden size of
:data:`ONEDNN_MIN_HIDDEN`, dense otherwise):

* **dense** (:class:`DenseProjection`): ``W`` as a contiguous ``[in, out]`` copy multiplied with ``torch.addmm``.
  A refresh copies new values into the same storage, so a CUDA graph captured from a step stays valid.
* **oneDNN** (:class:`OneDnnProjection`, float32 on CPU): ``W`` reordered once into oneDNN's blocked layout and
  multiplied by oneDNN's matmul, bias and residual add fused into the call — the two operators torch's own
  compiler uses for frozen weights on CPU (``torch.ops.mkldnn._reorder_linear_weight`` and
  ``_linear_pointwise``). On a 2-core AMD EPYC (Zen 4), one thread, SmolLM2-135M's projections streamed over its
  30 layers ran at 62 GFLOP/s at 16 rows and 99 at 128 where ``torch.mm`` (MKL) ran at 35 and 71; its LM head
  at 16 rows 55–60 against 23–33. A refresh reorders again (a new storage: fine on the CPU, which has no graphs).

Below that hidden size oneDNN's per-call cost outweighs its kernel: on an Intel Xeon (AVX-512), one thread, the
engine's generate with a weight change before each call (as in a sync loop) took 1.08–1.39× the dense kind's time
at hidden 128 and 256, 0.89–0.94× at 384 (16 and 128 rows, 6 and 48 new tokens; ``bench/projections.py``), and
SmolLM2's decode step 0.73× at 16 rows, 0.96× at 128 (``bench/RESULTS.md``, "Dense projections for small models").

Both compute the same product to float rounding (different blocking), so the decoder's probe against the model's
own forward covers either kind.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from groupwise.generation.compiled_step import onednn_linear

# Rows the oneDNN weight layout is chosen for; any other row count runs on it as well (measured: 1–256 rows).
_ONEDNN_ROWS_HINT = 128
PROJECTION_KINDS = ("auto", "dense", "onednn")
# The smallest hidden size "auto" gives oneDNN projections (module docstring).
ONEDNN_MIN_HIDDEN = 384


class Projection(Protocol):
    """``x Wᵀ + b (+ residual)`` for ``x [B, in]``; :meth:`refresh` takes new values of ``W [out, in]`` and ``b``."""

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor: ...

    def refresh(self, weight: Tensor, bias: Tensor | None) -> None: ...


def onednn_available() -> bool:
    """Whether this torch build has oneDNN and the two operators :class:`OneDnnProjection` calls."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight")
    )


def projection_kind(device: torch.device, dtype: torch.dtype, hidden_size: int, requested: str = "auto") -> str:
    """``"onednn"`` for float32 on a CPU with oneDNN and a hidden size of at least :data:`ONEDNN_MIN_HIDDEN`, else
    ``"dense"``; ``requested`` forces one (``"auto"``: choose). A forced ``"onednn"`` where it cannot run is an
    error naming why."""
    if requested not in PROJECTION_KINDS:
        raise ValueError(f"projections={requested!r} must be 'auto', 'dense' or 'onednn'")
    fits = device.type == "cpu" and dtype == torch.float32 and onednn_available()
    if requested == "onednn" and not fits:
        raise ValueError(f"oneDNN projections need float32 weights on a CPU torch with oneDNN, not {dtype} on {device}")
    if requested == "auto":
        return "onednn" if fits and hidden_size >= ONEDNN_MIN_HIDDEN else "dense"
    return requested


def new_projection(kind: str, weight: Tensor, bias: Tensor | None) -> Projection:
    """A projection of ``kind`` holding its own copy of ``weight [out, in]`` (and ``bias``)."""
    return OneDnnProjection(weight, bias) if kind == "onednn" else DenseProjection(weight, bias)


class DenseProjection:
    """``W`` as a contiguous ``[in, out]`` copy: on CPU a small-batch ``x @ Wᵀ`` with a transposed operand can run
    slower than the same product on a contiguous ``[in, out]`` matrix. Refreshed in place (storage fixed)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight = weight.detach().t().clone(memory_format=torch.contiguous_format)
        self.bias = None if bias is None else bias.detach().clone()

    def refresh(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight.copy_(weight.t())
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias)

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``residual + x·W + b`` (each addend only when given) with one matmul call."""
        if residual is not None and self.bias is not None:
            return torch.addmm(residual + self.bias, x, self.weight)
        if residual is not None or self.bias is not None:
            addend = residual if residual is not None else self.bias
            assert addend is not None
            return torch.addmm(addend, x, self.weight)
        return torch.mm(x, self.weight)


class OneDnnProjection:
    """``W`` in oneDNN's blocked layout, bias and residual fused into the matmul (module docstring)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.refresh(weight, bias)

    def refresh(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _ONEDNN_ROWS_HINT)
        self.bias = None if bias is None else bias.detach().clone()

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        if torch.compiler.is_compiling():  # an opaque call inside a compiled step (groupwise.generation.compiled_step)
            return onednn_linear(x, self.weight, self.bias, residual)
        if residual is None:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.weight, self.bias, "add")


class ParameterProjection:
    """``F.linear`` on the parameter itself, no copy (the dense LM head: often the tied input embedding)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()

    def refresh(self, weight: Tensor, bias: Tensor | None) -> None:
        """Nothing to copy: the views see every in-place change (a rebound parameter rebuilds the decoder)."""

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        out = F.linear(x, self.weight, self.bias)
        return out if residual is None else out.add_(residual)
