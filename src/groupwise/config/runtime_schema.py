"""Where the components run (``runtime``) and the throughput simulator's model (``sim``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from groupwise.config.base import Section
from groupwise.config.job_schema import JobSection, PlanSection


class RaySection(Section):
    """Ray placement (``runtime.backend: ray`` only; with ``embedded`` every key must keep its default)."""

    address: str = ""
    """Cluster to join: ``""`` = start a local cluster, ``auto`` = the running one, or ``host:port``."""
    num_generation_workers: int = Field(1, ge=1)
    """Generation actors (≥ 1)."""
    cpus_per_generation_worker: float = Field(0.5, ge=0)
    """CPUs reserved per generation actor (≥ 0; fractions allowed)."""
    gpus_per_generation_worker: float = Field(0.0, ge=0)
    """GPUs reserved per generation actor (≥ 0; fractions share a GPU)."""
    learner_cpus: float = Field(0.5, ge=0)
    """CPUs reserved for the learner actor (≥ 0); for each rank's actor with ``learner.num_ranks`` > 1."""
    learner_gpus: float = Field(0.0, ge=0)
    """GPUs reserved for the learner actor (≥ 0); for each rank's actor with ``learner.num_ranks`` > 1 (NCCL
    needs a whole GPU per rank)."""


class RuntimeSection(Section):
    """Process layout."""

    backend: Literal["embedded", "ray"] = "embedded"
    """``embedded`` = every component in this process (default; needs no Ray); ``ray`` = actors on a Ray
    cluster (install the ``ray`` extra)."""
    ray: RaySection = Field(default_factory=RaySection)
    """Ray placement (``backend: ray`` only)."""
    stall_timeout_s: float = Field(1800.0, gt=0)
    """Wall-clock seconds a run may go without progress before it stops with ``RunStalled`` (> 0): async, no group
    committed or filtered, no optimizer step and no generation call returning; sync, a generation round not
    returning. The controller's state goes to ``events.log`` first. Evaluation and checkpoint writing count
    against it (a step end is not progress). ``groupwise simulate`` ignores it (``sim.max_virtual_seconds``). With
    continuous batching on the embedded runtime, an answer awaited from a generation stream that has had nothing to
    do for 10 s (a lost answer) stops the run as ``RunStalled`` then, whatever this is (a fixed bound:
    docs/fates-and-resume.md)."""


class SimSection(Section):
    """The cost and learning model of ``groupwise simulate`` (virtual time, no model). Other commands ignore it."""

    rollout_slots: int = Field(64, ge=1)
    """Completions the simulated engine generates concurrently (≥ 1)."""
    length_median_tokens: float = Field(256.0, gt=0)
    """Median completion length in tokens (> 0); lengths are log-normal."""
    length_p99_over_p50: float = Field(8.0, ge=1)
    """Ratio of the 99th-percentile to the median completion length (≥ 1; 1 = every completion the same length)."""
    prefill_s: float = Field(0.05, ge=0)
    """Seconds to prefill one prompt (≥ 0)."""
    per_token_s: float = Field(0.01, ge=0)
    """Seconds per generated token per slot (≥ 0)."""
    train_s_per_token: float = Field(0.0002, ge=0)
    """Trainer seconds per completion token (≥ 0)."""
    weight_sync_s: float = Field(1.0, ge=0)
    """Seconds to push new weights to the generators (≥ 0)."""
    weight_sync_drains: bool = False
    """Whether a weight sync first waits until every completion the engine accepted has ended, as an engine with
    one copy of the weights must when ``async.partial_rollouts`` is ``off``; ``false`` (default) lets them finish
    under their old weights while the sync goes on. Async mode with ``partial_rollouts: off`` only."""
    infra_failure_rate: float = Field(0.0, ge=0, le=1)
    """Probability that one rollout attempt fails for infrastructure reasons (0 ≤ p ≤ 1); it fails part-way
    through its generation (uniformly) and is retried with backoff per ``async.rollout_failure``."""
    data_failure_rate: float = Field(0.0, ge=0, le=1)
    """Probability that one rollout attempt fails for data reasons (0 ≤ p ≤ 1); it fails when scored, after
    its whole generation."""
    straggler_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a rollout attempt is a straggler (0 ≤ p ≤ 1): every completion of it runs
    ``straggler_factor`` times slower."""
    straggler_factor: float = Field(5.0, ge=1)
    """How many times longer a straggler takes (≥ 1)."""
    difficulty_spread: float = Field(2.0, ge=0)
    """Standard deviation of prompt difficulty in logits (≥ 0); wider = more all-wrong and all-right groups."""
    learning_rate_groups: float = Field(2000.0, gt=0)
    """Groups trained until the success logit rises by 1 (> 0); only groups with reward variance count (a
    zero-variance group has zero advantage and teaches nothing)."""
    initial_success_logit: float = -1.0
    """Success logit of a prompt of average difficulty before any training (any real; −1 ≈ 27 % correct)."""
    num_prompts: int = Field(2000, ge=1)
    """Distinct simulated prompts (≥ 1)."""
    max_virtual_seconds: float = Field(1.0e7, gt=0)
    """A simulated run still going after this many virtual seconds stops with ``SimulationTimeout`` (> 0; a
    guard against a hang, never reached by a healthy run of sensible length)."""
    write_fates: bool = True
    """Write ``fates.jsonl`` (the fate of every generated group or dispatched attempt, as a real run of the same
    mode does); turn off for runs of millions of groups."""
    job: JobSection | None = None
    """A real training job (model, GPUs, lengths; ``docs/simulator.md``): every cost comes from it instead of the
    toy cost keys above, which must then keep their defaults; ``null`` (default) = the toy model."""
    plan: PlanSection | None = None
    """The grid ``groupwise plan`` sweeps (needs ``job``); ``null`` = the default grid."""

    @model_serializer(mode="wrap")
    def _omit_unset_job(self, handler: SerializerFunctionWrapHandler) -> Any:  # Any: what pydantic's serializer gave
        """``job`` and ``plan`` are left out of a dump while null, so a config written before they existed
        resolves (``config show``, a run's ``config.yaml``) to the same YAML as before; it loads back equal."""
        data = handler(self)
        if isinstance(data, dict):
            for key in ("job", "plan"):
                if data.get(key, 0) is None:
                    del data[key]
        return data
