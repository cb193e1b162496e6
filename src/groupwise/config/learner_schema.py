"""How many processes train the policy (``learner``): one, or N data-parallel ranks in one process group."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from groupwise.config.base import Section


class LearnerSection(Section):
    """Data-parallel training (docs/distributed.md). With ``num_ranks: 1`` every other key keeps its default."""

    num_ranks: int = Field(1, ge=1)
    """Learner processes in one ``torch.distributed`` process group (≥ 1; gloo on CPU, NCCL on CUDA, one GPU per
    rank). Each RL step's groups are split across the ranks by whole groups, balanced by tokens, and the loss
    normaliser covers the whole step on every rank, so N ranks take the update one rank would (beyond float
    rounding). ``1`` = one learner (in the run's own process, or one Ray actor). Embedded runtime: the ranks are
    processes the run spawns; Ray: N learner actors, each reserving ``runtime.ray.learner_cpus`` /
    ``learner_gpus``."""
    sharding: Literal["ddp", "fsdp"] = "ddp"
    """``ddp`` = every rank holds the whole model, gradients are all-reduced once per optimizer update
    (``DistributedDataParallel``); ``fsdp`` = parameters, gradients and optimizer state are sharded across the
    ranks (FSDP2 ``fully_shard`` per decoder layer, then the root): for a model whose training state does not
    fit one device. Needs ``num_ranks`` ≥ 2."""
    collective_timeout_s: float = Field(300.0, gt=0)
    """Seconds a rank waits in one collective before it fails (the process-group timeout, > 0), and how long the
    run waits for a rank's reply past the last sign of life of every rank. A rank that dies ends the run within
    about this long, never a hang. Needs ``num_ranks`` ≥ 2."""
