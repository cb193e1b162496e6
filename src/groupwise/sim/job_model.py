"""The job model's cost formulas: one pure function per cost, the formula in its docstring (``docs/simulator.md``).

Notation: ``N`` parameters (``A`` active per token; ``A = N`` dense), ``ℓ`` layers, ``h`` hidden size, ``b`` bytes per
value, ``F`` peak dense BF16 FLOP/s and ``W`` HBM bytes/s of one GPU, ``TP`` GPUs per rollout replica (or per
tensor-parallel group of the trainer, whose layout is ``g = DP · TP · PP`` with ``EP`` expert parallel). The fitted
constants are ``train_mfu`` (``colocated_train_mfu`` for a colocated trainer), ``inference_mfu`` (``μ``),
``decode_bandwidth_efficiency`` (``η``) and ``decode_step_overhead_s`` (``o``); every other number comes from the
spec sheet (:mod:`groupwise.sim.gpus`) or the job (``sim.job``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from groupwise.sim.gpus import GpuSpec, cluster_gpu

if TYPE_CHECKING:
    from groupwise.config.job_schema import JobSection

GIGA = 1e9
#: GPUs per node: training on at most this many GPUs reduces gradients over NVLink, beyond it over the network.
GPUS_PER_NODE = 8
#: Bytes per parameter an optimizer update moves across GPUs: FP32 gradients reduce-scattered (4) and BF16
#: parameters all-gathered (2), each about once per GPU in a ring.
UPDATE_COMM_BYTES_PER_PARAM = 6.0
#: Bytes per parameter an Adam step reads and writes in HBM (FP32 master weight, two moments, gradient: read and
#: write), spread over the training GPUs.
ADAM_HBM_BYTES_PER_PARAM = 32.0
#: Bytes per parameter of mixed-precision Adam training: BF16 weights (2) and gradients (2), FP32 master weights
#: (4) and two FP32 moments (8).
TRAIN_STATE_BYTES_PER_PARAM = 16.0
#: Activation bytes of one transformer layer per token per hidden unit in BF16 (Korthikanti et al. 2022,
#: "Reducing Activation Recomputation in Large Transformer Models": 34·s·b·h without the attention scores, which
#: flash attention does not keep).
LAYER_ACTIVATION_BYTES = 34.0
#: Share of a training GPU's memory the trainer can use (the rest: the CUDA context, allocator fragmentation).
TRAIN_MEMORY_FRACTION = 0.9


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> float:
    """KV-cache bytes of one token of context: ``2 · ℓ · kv_heads · head_dim · b`` (a key and a value per layer)."""
    return 2.0 * layers * kv_heads * head_dim * dtype_bytes


def forward_flops(tokens: float, active_params: float, layers: int, hidden: int) -> float:
    """FLOPs of one forward pass over one sequence of ``T`` tokens: ``2·A·T + 2·ℓ·h·T²`` — the matrix products, and
    causal attention (``QKᵀ`` and ``AV``, ``4·ℓ·h`` per token of context, summed over contexts ``0..T``)."""
    return 2.0 * active_params * tokens + 2.0 * layers * hidden * tokens * tokens


def decode_step_seconds(running: int, context: float, job: JobCosts) -> float:
    """One decode step of a replica running ``B`` sequences holding ``C`` tokens of context in all::

        t = o + τ·B + max((N·b + C·kv) / (TP·W·η),  (2·A·B + 4·ℓ·h·C) / (TP·F·μ))

    bandwidth-bound (every weight and the whole KV cache read once) for small batches, compute-bound for large
    ones on a GPU with little FLOP/s per byte (H20); ``τ·B`` the tensor-parallel all-reduces
    (:func:`tp_seconds_per_sequence`)."""
    read = (job.weight_bytes + context * job.kv_bytes) / job.replica_bandwidth
    compute = (2.0 * job.active_params * running + 4.0 * job.layers * job.hidden * context) / job.replica_flops
    return job.decode_overhead_s + job.tp_seconds_per_sequence * running + max(read, compute)


def tp_seconds_per_sequence(tensor_parallel: int, layers: int, hidden: int, dtype_bytes: int,
                            link_bandwidth: float) -> float:
    """Seconds a decode step spends per running sequence in the tensor-parallel all-reduces::

        τ = 2·ℓ · 2·(TP − 1)/TP · h·b / link

    two all-reduces of each sequence's ``h`` activations per layer (after attention and after the MLP), a ring
    sending ``2·(TP − 1)/TP`` of the bytes from each GPU over ``link`` — half the NVLink total (one direction)
    within a node of 8, the network beyond; 0 at TP = 1. Their latency is in the overhead ``o``."""
    return 2.0 * layers * 2.0 * (tensor_parallel - 1) / tensor_parallel * hidden * dtype_bytes / link_bandwidth


def group_link_bandwidth(span: int, gpu: GpuSpec, network_bandwidth: float) -> float:
    """The bytes/s one GPU sends to the others of a collective spanning ``span`` consecutive GPUs: half the NVLink
    total (one direction) within a node of 8, the network beyond."""
    return gpu.nvlink_bandwidth / 2 if span <= GPUS_PER_NODE else network_bandwidth


def prefill_seconds(tokens: float, context_before: float, job: JobCosts) -> float:
    """Prefilling ``n`` tokens after ``c`` in the cache: ``(2·A·n + 2·ℓ·h·((c + n)² − c²)) / (TP·F·μ)``."""
    attention = 2.0 * job.layers * job.hidden * ((context_before + tokens) ** 2 - context_before**2)
    return (2.0 * job.active_params * tokens + attention) / job.replica_flops


def kv_capacity_tokens(gpu: GpuSpec, tensor_parallel: int, memory_fraction: float, weight_bytes: float,
                       kv_bytes: float) -> int:
    """Tokens of context one replica can hold: ``⌊(TP · HBM · memory_fraction − N·b) / kv⌋`` (≤ 0: the weights do
    not fit)."""
    return int((tensor_parallel * gpu.memory_bytes * memory_fraction - weight_bytes) // kv_bytes)


def train_seconds(flops: float, gpus: int, gpu: GpuSpec, mfu: float) -> float:
    """Seconds of ``flops`` of training work on ``gpus`` GPUs: ``flops / (gpus · F · train_mfu)``."""
    return flops / (gpus * gpu.bf16_flops * mfu)


def update_seconds(params: float, gpus: int, gpu: GpuSpec, network_bandwidth: float, tensor_parallel: int = 1,
                   pipeline_parallel: int = 1) -> float:
    """One optimizer update on ``g = DP · TP · PP`` GPUs (the weights sharded over all of them)::

        t = 6·(N / (TP·PP))·(DP − 1)/DP / bandwidth  +  32·N / (g · W)

    each data-parallel group reduce-scatters the gradients and all-gathers the parameters of its ``N / (TP·PP)``
    share — over NVLink when the group sits in one node (``TP · DP ≤ 8``: ranks ordered tensor, then data, then
    pipeline), the network beyond — then the Adam step reads and writes its state in HBM."""
    model_parallel = tensor_parallel * pipeline_parallel
    data_parallel = max(1, gpus // model_parallel)
    bandwidth = gpu.nvlink_bandwidth if tensor_parallel * data_parallel <= GPUS_PER_NODE else network_bandwidth
    comm = UPDATE_COMM_BYTES_PER_PARAM * params / model_parallel * (data_parallel - 1) / data_parallel / bandwidth
    return comm + ADAM_HBM_BYTES_PER_PARAM * params / (gpus * gpu.memory_bandwidth)


def pipeline_bubble_fraction(stages: int, micro_batches: int) -> float:
    """Share of a pipelined update each stage idles (1F1B): ``(pp − 1) / (m + pp − 1)`` with ``m`` micro-batches
    (0 at ``pp = 1``); the update takes ``1 / (1 − bubble) = (m + pp − 1) / m`` times its compute."""
    return (stages - 1) / (micro_batches + stages - 1)


def train_tp_seconds_per_token(data_parallel: int, pipeline_parallel: int, tau: float) -> float:
    """Seconds each training GPU spends per token of the step, per forward or backward pass, in tensor-parallel
    all-reduces: ``τ / (DP · PP)`` — a tensor-parallel group passes ``1/DP`` of the tokens through ``ℓ/PP``
    layers, each with two all-reduces of the activations per pass, the cost ``τ`` of a decode step's all-reduces
    per sequence (:func:`tp_seconds_per_sequence`, with the training group's ``TP`` and link)."""
    return tau / (data_parallel * pipeline_parallel)


def expert_seconds_per_token(layout: TrainLayout, layers: int, hidden: int, dtype_bytes: int, experts_per_token: int,
                             link_bandwidth: float) -> float:
    """Seconds each training GPU spends per token of the step, per forward or backward pass, in the MoE
    all-to-alls::

        ℓ/PP · 2·k·h·b·(EP − 1)/EP / (DP · TP) / link

    each of a GPU's ``1/(DP·TP)`` of the tokens (sequence parallel within a tensor-parallel group) sends its ``h``
    activations to its ``k`` experts and gets them back (dispatch and combine) in each of the stage's ``ℓ/PP``
    layers, ``(EP − 1)/EP`` of them to another GPU; every layer is taken as an MoE layer. 0 at ``EP = 1``."""
    ep = layout.expert_parallel
    bytes_out = 2.0 * experts_per_token * hidden * dtype_bytes * (ep - 1) / ep
    shards = layout.data_parallel * layout.tensor_parallel
    return layers / layout.pipeline_parallel * bytes_out / shards / link_bandwidth


def train_memory_bytes(params: float, gpus: int, tokens: int, layers: int, hidden: int, checkpointing: bool,
                       reference: bool, tensor_parallel: int = 1) -> float:
    """Training memory on each of ``g`` GPUs, the state fully sharded (FSDP over the data-parallel groups of each
    tensor/pipeline shard), one longest sequence of ``T`` tokens::

        16·N/g  (+ 2·N/g with a reference model)  +  T·h·(2·ℓ + 34) / TP  (34·T·h·ℓ / TP without checkpointing)

    BF16 weights and gradients and FP32 master weights and Adam moments (16 bytes per parameter — every
    parameter, an MoE's experts too), a frozen BF16 reference; the activations kept for the backward: each layer's
    BF16 input with gradient checkpointing plus one layer's recomputed activations (about ``34·T·h`` bytes), or
    every layer's without — split ``TP`` ways by tensor (sequence) parallelism. Pipeline parallelism does not
    shrink them: a 1F1B schedule's first stage holds ``PP`` micro-batches of its ``ℓ/PP`` layers (Korthikanti et
    al. 2022), as many layer inputs as one unpipelined sequence."""
    state = (TRAIN_STATE_BYTES_PER_PARAM + (2.0 if reference else 0.0)) * params / gpus
    activations = tokens * hidden * (2.0 * layers + LAYER_ACTIVATION_BYTES if checkpointing
                                     else LAYER_ACTIVATION_BYTES * layers)  # fmt: skip
    return state + activations / tensor_parallel


def train_gpus_needed(params: float, memory: float, activations: float, reference: bool) -> int | None:
    """The fewest GPUs of ``memory`` usable bytes that hold :func:`train_memory_bytes` (``None``: not even with
    the state spread thin, the activations alone do not fit)."""
    room = memory - activations
    if room <= 0:
        return None
    return math.ceil((TRAIN_STATE_BYTES_PER_PARAM + (2.0 if reference else 0.0)) * params / room)


def weight_sync_seconds(weight_bytes: float, bandwidth: float, fixed_s: float) -> float:
    """One weight sync: ``fixed_s + N·b / bandwidth``."""
    return fixed_s + weight_bytes / bandwidth


@dataclass(frozen=True)
class TrainLayout:
    """The training GPUs' split, resolved: ``train_gpus = data_parallel · tensor_parallel · pipeline_parallel``;
    ``micro_batches`` per update of each pipeline (1 when not pipelined)."""

    data_parallel: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    expert_parallel: int = 1
    micro_batches: int = 1

    @classmethod
    def of(cls, job: JobSection) -> TrainLayout:
        """The job's layout (``sim.job.train_layout``), the data-parallel size derived when ``null``; a pipelined
        layout needs ``micro_batches``, which :func:`~groupwise.sim.workload.resolved_job` fills in from the run."""
        layout = job.train_layout
        model_parallel = layout.tensor_parallel * layout.pipeline_parallel
        if layout.pipeline_parallel > 1 and layout.micro_batches is None:
            raise ValueError("a pipelined train_layout needs micro_batches (resolved_job derives them from the run)")
        return cls(data_parallel=layout.data_parallel or max(1, job.cluster.train_gpus // model_parallel),
                   tensor_parallel=layout.tensor_parallel, pipeline_parallel=layout.pipeline_parallel,
                   expert_parallel=layout.expert_parallel, micro_batches=layout.micro_batches or 1)  # fmt: skip


def train_comm_seconds_per_token(job: JobSection, layout: TrainLayout, gpu: GpuSpec, network: float) -> float:
    """Seconds of tensor-parallel all-reduces and expert all-to-alls per token per forward or backward pass
    (:func:`train_tp_seconds_per_token` + :func:`expert_seconds_per_token`), each over NVLink (one direction: half
    its total) while its group fits in a node of 8 — the expert group's ranks are ``TP`` apart — the network
    beyond."""
    m, tp = job.model, layout.tensor_parallel
    tau = tp_seconds_per_sequence(tp, m.layers, m.hidden, m.dtype_bytes, group_link_bandwidth(tp, gpu, network))
    seconds = train_tp_seconds_per_token(layout.data_parallel, layout.pipeline_parallel, tau)
    if layout.expert_parallel > 1 and m.experts_per_token is not None:
        link = group_link_bandwidth(layout.expert_parallel * tp, gpu, network)
        seconds += expert_seconds_per_token(layout, m.layers, m.hidden, m.dtype_bytes, m.experts_per_token, link)
    return seconds


@dataclass(frozen=True)
class JobCosts:
    """Every number the simulated engine and learner need, resolved from ``sim.job`` and the GPU table."""

    gpu: GpuSpec
    params: float
    active_params: float
    layers: int
    hidden: int
    weight_bytes: float
    kv_bytes: float
    replicas: int
    tensor_parallel: int
    max_seqs: int
    kv_capacity: int
    replica_flops: float  # TP · F · inference_mfu
    replica_bandwidth: float  # TP · W · decode_bandwidth_efficiency
    decode_overhead_s: float
    tp_seconds_per_sequence: float  # τ: tensor-parallel all-reduce seconds per running sequence per decode step
    train_gpus: int
    train_layout: TrainLayout
    train_comm_per_token: float  # TP all-reduce and expert all-to-all seconds per token per forward or backward pass
    pipeline_bubble: float  # share of each update a pipeline stage idles
    train_mfu: float
    train_passes: float  # forward-equivalents per update pass: 3, or 4 with gradient checkpointing
    recompute_old_logprobs: bool
    reference_forward: bool
    update_s: float
    sync_s: float
    prompt_tokens: int

    @classmethod
    def from_job(cls, job: JobSection) -> JobCosts:
        gpu = cluster_gpu(job.cluster)
        m, c, e = job.model, job.cluster, job.efficiency
        active = m.active_params if m.active_params is not None else m.params
        weight_bytes = m.params * m.dtype_bytes
        kv = kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim, m.dtype_bytes)
        network = c.network_gbytes_per_s * GIGA
        layout = TrainLayout.of(job)
        sync_bandwidth = (job.weight_sync.gbytes_per_s * GIGA if job.weight_sync.gbytes_per_s is not None
                          else gpu.nvlink_bandwidth if c.colocated else network)  # fmt: skip
        return cls(
            gpu=gpu, params=m.params, active_params=active, layers=m.layers, hidden=m.hidden,
            weight_bytes=weight_bytes, kv_bytes=kv, replicas=c.rollout_gpus // c.tensor_parallel,
            tensor_parallel=c.tensor_parallel, max_seqs=c.max_seqs_per_replica,
            kv_capacity=kv_capacity_tokens(gpu, c.tensor_parallel, c.memory_fraction, weight_bytes, kv),
            replica_flops=c.tensor_parallel * gpu.bf16_flops * e.inference_mfu,
            replica_bandwidth=c.tensor_parallel * gpu.memory_bandwidth * e.decode_bandwidth_efficiency,
            decode_overhead_s=e.decode_step_overhead_s,
            tp_seconds_per_sequence=tp_seconds_per_sequence(
                c.tensor_parallel, m.layers, m.hidden, m.dtype_bytes,
                group_link_bandwidth(c.tensor_parallel, gpu, network)), train_gpus=c.train_gpus,
            train_layout=layout, train_comm_per_token=train_comm_seconds_per_token(job, layout, gpu, network),
            pipeline_bubble=pipeline_bubble_fraction(layout.pipeline_parallel, layout.micro_batches),
            train_mfu=e.colocated_train_mfu if c.colocated and e.colocated_train_mfu is not None else e.train_mfu,
            train_passes=4.0 if job.training.gradient_checkpointing else 3.0,
            recompute_old_logprobs=job.training.recompute_old_logprobs,
            reference_forward=bool(job.training.reference_forward),
            update_s=update_seconds(m.params, c.train_gpus, gpu, network, layout.tensor_parallel,
                                    layout.pipeline_parallel),
            sync_s=weight_sync_seconds(weight_bytes, sync_bandwidth, job.weight_sync.fixed_s),
            prompt_tokens=job.lengths.prompt_tokens,
        )  # fmt: skip

    def sequence_forward_flops(self, completion_tokens: int) -> float:
        """:func:`forward_flops` of one prompt + completion."""
        return forward_flops(self.prompt_tokens + completion_tokens, self.active_params, self.layers, self.hidden)

    def sequences_forward_flops(self, completion_tokens: list[int]) -> float:
        """:func:`forward_flops` summed over sequences: ``2·A·ΣT + 2·ℓ·h·ΣT²`` (``T`` = prompt + completion)."""
        totals = [self.prompt_tokens + n for n in completion_tokens]
        return 2.0 * self.active_params * sum(totals) + 2.0 * self.layers * self.hidden * sum(t * t for t in totals)

    def chunk_train_seconds(self, forward: float, tokens: int, epochs: int) -> float:
        """A chunk of ``tokens`` prompt + completion tokens whose sequences' forward FLOPs sum to ``forward``::

            forward · passes / (g · F · train_mfu) / (1 − bubble)  +  rounds · tokens · comm

        ``epochs`` update passes (forward, backward = 2 forwards, and a recomputed forward with gradient
        checkpointing), plus one forward for the old logprobs when they are recomputed and one for the reference
        policy's logprobs with a reference model; the pipeline's idle share (:func:`pipeline_bubble_fraction`);
        the layout's communication once per forward or backward pass (``rounds``: 3 per update pass with
        checkpointing, 2 without, 1 per extra forward), not overlapped with compute."""
        extra = float(self.recompute_old_logprobs) + float(self.reference_forward)
        passes = self.train_passes * epochs + extra
        rounds = (self.train_passes - 1.0) * epochs + extra
        compute = train_seconds(forward * passes, self.train_gpus, self.gpu, self.train_mfu)
        return compute / (1.0 - self.pipeline_bubble) + rounds * tokens * self.train_comm_per_token
