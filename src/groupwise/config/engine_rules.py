"""Cross-field rules of the built-in engine's decode step: what ``generation.projections`` needs.

The built-in engine's keys under another backend are refused in :mod:`groupwise.config.rules`
(``BUILTIN_ENGINE_KEYS``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.checks import rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


@rule("generation", "model")
def forced_projections_need_their_step(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """generation.projections other than auto needs generation.fast_decode (the projections are the fast step's);
    onednn needs model.dtype float32 and a model.device that can be the CPU."""
    kind = cfg.generation.projections
    if kind == "auto":
        return
    if not cfg.generation.fast_decode:
        yield ConfigIssue(
            "generation.projections", kind,
            "the projections are the fast decode step's, which generation.fast_decode: false turns off",
            "remove generation.projections, or set generation.fast_decode: true",
        )
    if kind != "onednn":
        return
    if cfg.model.dtype != "float32":
        yield ConfigIssue(
            "generation.projections", kind, f"oneDNN projections need float32 weights, not model.dtype "
            f"'{cfg.model.dtype}'", "set model.dtype: float32, or generation.projections: auto",
        )
    if cfg.model.device == "cuda":
        yield ConfigIssue(
            "generation.projections", kind, "oneDNN projections run on a CPU, not model.device 'cuda'",
            "set generation.projections: auto (dense on a GPU), or model.device: cpu",
        )
