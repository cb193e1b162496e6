"""``sim.job``: a training job described in the terms its owner knows — the model, the GPUs, the lengths — for the
simulator's job model (``docs/simulator.md``), and ``sim.plan``: the settings ``groupwise plan`` sweeps.

With ``sim.job`` set, ``groupwise simulate`` and ``groupwise plan`` derive every cost from it (decode steps of
continuous-batching replicas, prefill, training FLOPs, optimizer updates, weight syncs) instead of the toy cost
keys of ``sim`` (``rollout_slots``, ``per_token_s``, ...), which must then keep their defaults. The four numbers
of ``sim.job.efficiency`` are the model's only fitted constants (``bench/sim_calibration.py`` fits them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from groupwise.config.base import Section

GpuName = Literal["A100", "H100", "H200", "H20", "B200", "GB200", "custom"]


class JobGpuSpecSection(Section):
    """A GPU the table does not have, from its spec sheet (``cluster.gpu: custom``): dense figures, no sparsity."""

    bf16_tflops: float = Field(gt=0)
    """Dense BF16 tensor-core throughput in TFLOP/s (> 0; half a sheet's "with sparsity" figure)."""
    memory_gb: float = Field(gt=0)
    """HBM capacity in GB (> 0)."""
    memory_tbytes_per_s: float = Field(gt=0)
    """HBM bandwidth in TB/s (> 0)."""
    nvlink_gbytes_per_s: float = Field(gt=0)
    """GPU-to-GPU bandwidth inside a node in GB/s (> 0; NVLink total, both directions)."""


class JobModelSection(Section):
    """The policy as the cost model sees it: a decoder-only transformer (MoE through ``active_params``)."""

    params: float = Field(gt=0)
    """Parameters (> 0; e.g. ``7.6e9``): the weights' size, what the optimizer updates and a weight sync sends."""
    active_params: float | None = Field(None, gt=0)
    """Parameters a token goes through (> 0; an MoE's active parameters); ``null`` = ``params`` (dense)."""
    layers: int = Field(ge=1)
    """Transformer layers (≥ 1): the KV cache and attention FLOPs."""
    hidden: int = Field(ge=1)
    """Hidden size (≥ 1): attention FLOPs per token of context."""
    kv_heads: int = Field(ge=1)
    """Key/value heads (≥ 1; fewer than query heads with grouped-query attention): the KV cache."""
    head_dim: int = Field(ge=1)
    """Dimension of one attention head (≥ 1): the KV cache."""
    dtype_bytes: int = Field(2, ge=1)
    """Bytes per weight and per KV-cache value (≥ 1; 2 = BF16)."""
    experts_per_token: int | None = Field(None, ge=1)
    """Experts each token is routed to (≥ 1; an MoE's top-k): the expert-parallel all-to-all's bytes; ``null`` =
    dense. Required with ``train_layout.expert_parallel`` above 1."""


class JobClusterSection(Section):
    """The GPUs: how many generate, how many train, their type (``src/groupwise/sim/gpus.py`` has the table)."""

    gpu: GpuName
    """GPU type: ``A100``, ``H100``, ``H200``, ``H20``, ``B200``, ``GB200`` (dense BF16 FLOP/s, HBM size and
    bandwidth from the spec sheets), or ``custom`` with ``gpu_spec``."""
    gpu_spec: JobGpuSpecSection | None = None
    """The figures of a ``custom`` GPU (required with it, refused with a table GPU)."""
    rollout_gpus: int = Field(ge=1)
    """GPUs that generate (≥ 1; a multiple of ``tensor_parallel``)."""
    train_gpus: int = Field(ge=1)
    """GPUs that train (≥ 1)."""
    colocated: bool = False
    """Generation and training take turns on the same GPUs (``mode: sync`` only; ``rollout_gpus`` must equal
    ``train_gpus``); ``false`` = two separate pools."""
    tensor_parallel: int = Field(1, ge=1)
    """GPUs per rollout replica (≥ 1): the weights and the KV cache are split over them."""
    max_seqs_per_replica: int = Field(256, ge=1)
    """Sequences one replica decodes at once at most (≥ 1; vLLM's ``max_num_seqs``)."""
    memory_fraction: float = Field(0.9, gt=0, le=1)
    """Share of a replica's GPU memory for its weights and KV cache (0 < f ≤ 1; vLLM's
    ``gpu_memory_utilization``)."""
    network_gbytes_per_s: float = Field(50.0, gt=0)
    """Network bandwidth per GPU between nodes in GB/s (> 0; 50 = 400 Gb/s): gradient reduction, weight sync."""


class JobLengthsSection(Section):
    """Prompt and completion lengths. Completions are log-normal, truncated at ``max_tokens``, and their median may
    drift linearly with the weight version that generates them (responses grow over a reasoning run)."""

    prompt_tokens: int = Field(256, ge=1)
    """Tokens of one prompt (≥ 1)."""
    median_tokens: float = Field(1000.0, gt=0)
    """Median completion length under weight version 0, in tokens (> 0)."""
    final_median_tokens: float | None = Field(None, gt=0)
    """Median reached at version ``drift_steps`` (> 0), linearly from ``median_tokens``; ``null`` = no drift."""
    drift_steps: int = Field(1000, ge=1)
    """Weight versions over which the median drifts (≥ 1); constant after."""
    p99_over_p50: float = Field(8.0, ge=1)
    """Ratio of the 99th-percentile to the median completion length before truncation (≥ 1)."""
    max_tokens: int = Field(4096, ge=1)
    """Hard maximum completion length (≥ 1): a longer draw is truncated to it, as the engine's length cap does."""


class JobTrainingSection(Section):
    """What one training pass costs besides the forward and backward of every token (mini-batches and epochs
    come from ``optimizer.mini_batches_per_step`` and ``optimizer.epochs_per_step``)."""

    recompute_old_logprobs: bool = False
    """Run a forward pass over the step's tokens before the updates, to recompute the old policy's logprobs (as
    trainers that do not take them from the generator do); ``false`` = the generator's logprobs are used."""
    gradient_checkpointing: bool = True
    """Recompute each layer's forward during the backward: 8 instead of 6 FLOPs per parameter per token."""
    reference_forward: bool | None = None
    """Run a frozen reference policy's forward over the step's tokens (a KL penalty to it) and hold its BF16
    weights on the training GPUs; ``null`` = when the run's ``loss.kl_coef`` is above 0."""


class JobTrainLayoutSection(Section):
    """How the training GPUs split the model (``cluster.train_gpus = data × tensor × pipeline parallel``). Every
    layout keeps the weights, gradients and Adam state sharded over all the training GPUs (FSDP over the data-parallel
    groups); the layout adds its communication and splits the activations (``docs/simulator.md``, "Training")."""

    data_parallel: int | None = Field(None, ge=1)
    """Data-parallel replicas of the (tensor × pipeline)-parallel model (≥ 1); ``null`` = ``train_gpus /
    (tensor_parallel · pipeline_parallel)``. ``groupwise plan`` derives it at each split, so leave it ``null`` there."""
    tensor_parallel: int = Field(1, ge=1)
    """GPUs each layer's matrices are split over (≥ 1; with sequence parallelism, so the activations split too):
    four all-reduces of the activations per layer per forward and backward."""
    pipeline_parallel: int = Field(1, ge=1)
    """Pipeline stages the layers are split into (≥ 1, at most ``model.layers``): idle time
    ``(pp − 1) / (m + pp − 1)`` of each update with ``m`` micro-batches."""
    expert_parallel: int = Field(1, ge=1)
    """GPUs an MoE's experts are spread over within the data-parallel group (≥ 1, dividing ``data_parallel``; above
    1 only with ``model.active_params`` and ``model.experts_per_token``): an all-to-all of each token's activations
    per MoE layer, to its experts and back."""
    micro_batches: int | None = Field(None, ge=1)
    """Micro-batches per optimizer update of each pipeline (≥ 1; ``pipeline_parallel`` above 1 only); ``null`` = one
    sequence per micro-batch, ``⌈P · G / (K · data_parallel)⌉``."""


class JobWeightSyncSection(Section):
    """What a weight sync costs: ``fixed_s + weight bytes / bandwidth``."""

    fixed_s: float = Field(2.0, ge=0)
    """Seconds per sync besides the transfer (≥ 0): pausing and resuming the engines, bookkeeping."""
    gbytes_per_s: float | None = Field(None, gt=0)
    """Transfer bandwidth in GB/s (> 0); ``null`` = ``cluster.network_gbytes_per_s``, or the GPU's NVLink when
    ``colocated`` (the weights are resharded inside the node)."""


class JobEfficiencySection(Section):
    """The fitted constants: every other number of the job model comes from the spec sheet or the job."""

    train_mfu: float = Field(0.35, gt=0, le=1)
    """Share of the GPUs' peak BF16 FLOP/s a training pass achieves (0 < f ≤ 1)."""
    colocated_train_mfu: float | None = Field(None, gt=0, le=1)
    """``train_mfu`` of a trainer colocated with the engines (``cluster.colocated``: the sync point of a plan), whose
    memory is shared with the sleeping engine and whose parameters and optimizer state are offloaded between
    phases (0 < f ≤ 1); ``null`` = ``train_mfu``."""
    inference_mfu: float = Field(0.5, gt=0, le=1)
    """Share of peak FLOP/s of prefill and of a compute-bound decode step (0 < f ≤ 1)."""
    decode_bandwidth_efficiency: float = Field(0.7, gt=0, le=1)
    """Share of peak HBM bandwidth of a bandwidth-bound decode step (weights + KV cache read) (0 < f ≤ 1)."""
    decode_step_overhead_s: float = Field(0.003, ge=0)
    """Seconds every decode step costs besides its FLOPs or bytes (≥ 0): kernel launches, tensor-parallel
    all-reduces, scheduling."""


#: The efficiency constants fitted per GPU type, which a job on that GPU gets when it leaves ``efficiency`` out:
#: H20's by ``bench/sim_calibration.py`` on verl's synchronous runs (``docs/simulator.md``). No other GPU has a
#: fitted set yet; a job on one gets :class:`JobEfficiencySection`'s defaults (and a plan warns).
FITTED_EFFICIENCY: dict[str, dict[str, float]] = {
    "H20": {"train_mfu": 0.537, "inference_mfu": 0.2177, "decode_bandwidth_efficiency": 0.5862,
            "decode_step_overhead_s": 0.0029},
}  # fmt: skip


class JobSection(Section):
    """A training job for the simulator's job model (``docs/simulator.md``)."""

    model: JobModelSection
    """The policy (required)."""
    cluster: JobClusterSection
    """The GPUs (required)."""
    lengths: JobLengthsSection = Field(default_factory=JobLengthsSection)
    """Prompt and completion lengths."""
    training: JobTrainingSection = Field(default_factory=JobTrainingSection)
    """Training passes."""
    train_layout: JobTrainLayoutSection = Field(default_factory=JobTrainLayoutSection)
    """How the training GPUs split the model: data, tensor, pipeline and expert parallel sizes."""
    weight_sync: JobWeightSyncSection = Field(default_factory=JobWeightSyncSection)
    """Weight syncs."""
    efficiency: JobEfficiencySection = Field(default_factory=JobEfficiencySection)
    """The fitted constants; left out = the GPU's fitted set (H20's) where there is one, else the defaults."""

    @model_validator(mode="after")
    def _gpu_constants(self) -> JobSection:
        """A job that leaves ``efficiency`` out gets its GPU's fitted constants (:data:`FITTED_EFFICIENCY`)."""
        fitted = FITTED_EFFICIENCY.get(self.cluster.gpu)
        if "efficiency" not in self.model_fields_set and fitted is not None:
            self.efficiency = JobEfficiencySection.model_validate(fitted)
        return self


PlanMode = Literal["sync", "async"]
PlanSampler = Literal["in_order", "ready_first", "windowed"]
PlanPartial = Literal["off", "continue"]


def _all_modes() -> list[PlanMode]:
    return ["sync", "async"]


def _all_samplers() -> list[PlanSampler]:
    return ["in_order", "ready_first", "windowed"]


def _all_partial() -> list[PlanPartial]:
    return ["off", "continue"]


class PlanSection(Section):
    """The grid ``groupwise plan`` sweeps (every combination; sync is one point, colocated on all the GPUs)."""

    modes: list[PlanMode] = Field(default_factory=_all_modes, min_length=1)
    """Modes to try (at least one)."""
    samplers: list[PlanSampler] = Field(default_factory=_all_samplers, min_length=1)
    """Async samplers to try (at least one of ``in_order``, ``ready_first``, ``windowed``)."""
    windows: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [1, 2], min_length=1)
    """Staleness windows to try, in weight versions (each ≥ 0): ``max_lookahead_versions`` for ``in_order``,
    ``max_staleness_versions`` for the others."""
    partial_rollouts: list[PlanPartial] = Field(default_factory=_all_partial, min_length=1)
    """``async.partial_rollouts`` values to try."""
    rollout_fractions: list[Annotated[float, Field(gt=0, lt=1)]] = Field(default_factory=lambda: [0.5], min_length=1)
    """Shares of the GPUs (``rollout_gpus + train_gpus``) that generate in async mode, each in (0, 1); rounded to
    whole replicas."""
    steps: int | None = Field(30, ge=1)
    """Steps simulated per finalist (≥ 1): the run's ``run.max_steps`` steps are represented by this many, with
    what changes over the run by weight version — the length drift (``job.lengths.drift_steps``) and the learning
    curve (``sim.learning_rate_groups``, in groups) — scaled by ``steps / run.max_steps``; ``null`` = every step."""
    screen_steps: int | None = Field(6, ge=1)
    """Steps every point is first simulated for (≥ 1, compressed like ``steps``): the sync point and the
    ``finalists`` fastest async points are then simulated again for ``steps``, and only they can be starred;
    ``null`` = no screening (every point for ``steps``)."""
    finalists: int = Field(3, ge=1)
    """Async points the screen passes on to the full simulation (≥ 1)."""
    sync_tensor_parallel: int | None = Field(None, ge=1)
    """GPUs per rollout replica at the sync point (≥ 1; a colocated engine often shards wider, its memory shared
    with the trainer's); ``null`` = ``job.cluster.tensor_parallel``, as the async points."""
    sync_memory_fraction: float | None = Field(None, gt=0, le=1)
    """The rollout engine's share of GPU memory at the sync point (0 < f ≤ 1; vLLM's ``gpu_memory_utilization``,
    lower when colocated); ``null`` = ``job.cluster.memory_fraction``."""
    sync_train_layout: JobTrainLayoutSection | None = None
    """The trainer's layout at the sync point (on all the GPUs; a colocated trainer often splits the model
    differently from a separate one); ``null`` = ``job.train_layout``, as the async points."""

    @field_validator("partial_rollouts", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:  # Any: pydantic's raw input, before validation
        """YAML reads a bare ``off`` as false; here it means ``off``."""
        return ["off" if item is False else item for item in value] if isinstance(value, list) else value


def default_plan() -> PlanSection:
    """The grid ``groupwise plan`` sweeps when ``sim.plan`` is not set."""
    return PlanSection.model_validate({})
