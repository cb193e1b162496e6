"""The fast decode step compiled by torch's compiler (``torch.compile``, inductor): where a step is not a CUDA graph.

Why: an eager decode step is ~1,000 operator calls (30 layers × ~30 ops, the head, the draw). Compiled, the
elementwise work between the matmuls (norms, rotary, SiLU, residuals, the softmax, the draw) is fused into a few
generated loops and the Python between the calls is gone; the matmuls stay the library kernels they were.

Two calls the compiler must not look into are custom operators here, run as opaque calls inside the compiled step:

* ``groupwise::onednn_linear`` — a oneDNN projection (:class:`~groupwise.generation.projections.OneDnnProjection`):
  inductor's own lowering of ``mkldnn._linear_pointwise`` rejects a weight packed outside the compiled graph;
* ``groupwise::slot_cache_write`` — the static slots' KV-cache write (:mod:`groupwise.generation.slots`), in place.
  Traced as a plain ``scatter_`` into a step input, the write became a copy of the whole cache per layer (about
  230 ms of a 128-row SmolLM2 step on one core, measured): the compiler keeps a mutated input functional.

Both are the eager code itself (:func:`torch.compiler.is_compiling` picks the operator only while tracing), so the
eager step pays nothing for them.

**When a run compiles** (``generation.compile``): ``on`` always, ``off`` never, ``auto`` when the run plans at
least :data:`AUTO_MIN_DECODE_STEPS` decode steps (``run.max_steps × generation.max_new_tokens``). The first row
bucket compiles with its shapes fixed; the next one compiles again with the row count symbolic, and that program
serves every later bucket but the one-row one (torch's automatic dynamic shapes; a size of 1 is specialised): two
or three compiles of 30–90 s each for SmolLM2-135M on one loaded AMD EPYC core (inductor's on-disk cache makes a
later process's first one ~6 s). On a CPU the compiled step was no faster than the eager one beyond the machine's
noise (``bench/RESULTS.md``, "A compiled decode step"): a shorter run does not repay its compiles. The cost is
logged once per compile, with the run's total so far
(:attr:`~groupwise.generation.step_graphs.StepGraphs.compile_seconds`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

COMPILE_MODES = ("auto", "on", "off")
# Decode steps a run must plan before ``auto`` compiles: 2-3 compiles of 30-90 s, repaid at a saving of a few ms per
# step at best (measured: none beyond the noise, bench/RESULTS.md "A compiled decode step"), need some 10⁵ steps.
AUTO_MIN_DECODE_STEPS = 100_000


def compile_wanted(mode: str, planned_decode_steps: int | None) -> bool:
    """Whether to compile: ``on`` → yes, ``off`` → no, ``auto`` → ``planned_decode_steps ≥ AUTO_MIN_DECODE_STEPS``
    (unknown: no)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r} must be one of {', '.join(COMPILE_MODES)}")
    if mode == "auto":
        return planned_decode_steps is not None and planned_decode_steps >= AUTO_MIN_DECODE_STEPS
    return mode == "on"


def compiled(step: Callable[[], None]) -> Callable[[], None]:
    """``torch.compile(step)`` (inductor), compiled at its first call; shapes fixed, then symbolic rows (module
    docstring)."""
    return torch.compile(step)


@torch.library.custom_op("groupwise::onednn_linear", mutates_args=())
def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None) -> Tensor:
    """``x Wᵀ + b (+ residual)`` by oneDNN on a weight in its blocked layout (``[out, in]`` as torch sees it)."""
    if residual is None:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")


@onednn_linear.register_fake
def _onednn_linear_shape(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("groupwise::slot_cache_write", mutates_args=("keys", "values"))
def slot_cache_write(keys: Tensor, values: Tensor, column_index: Tensor, key: Tensor, value: Tensor) -> None:
    """Write each row's new key/value ``[B, KV, 1, D]`` at its column of ``keys``/``values [B, KV, C, D]``."""
    keys.scatter_(2, column_index, key)
    values.scatter_(2, column_index, value)
