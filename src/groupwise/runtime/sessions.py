"""The training session a config asks for: in this process, on spawned learner ranks, or on Ray.

The choice lives here, above the trainer layer that builds the in-process session, so that the builder never
reaches up into the runtimes that extend it (:mod:`groupwise.runtime.ranked_session`,
:mod:`groupwise.runtime.ray.session`). Ray is imported only when ``runtime.backend: ray`` is chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.trainer.builder import build_session
from groupwise.trainer.session import Session

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.trainer.preflight import Inputs


def build_run_session(
    cfg: RunConfig, *, resume: bool = False, resume_from: Path | None = None, inputs: Inputs | None = None
) -> Session:
    """The session for ``cfg``: Ray actors (``runtime.backend: ray``), ``learner.num_ranks`` spawned learner ranks,
    or everything in this process. Every check that can refuse the run runs before any model loads."""
    if cfg.runtime.backend == "ray":
        from groupwise.runtime.ray.session import build_ray_session

        return build_ray_session(cfg, resume=resume, resume_from=resume_from, inputs=inputs)
    if cfg.learner.num_ranks > 1:
        from groupwise.runtime.ranked_session import build_ranked_session

        return build_ranked_session(cfg, resume=resume, resume_from=resume_from, inputs=inputs)
    return build_session(cfg, resume=resume, resume_from=resume_from, inputs=inputs)
