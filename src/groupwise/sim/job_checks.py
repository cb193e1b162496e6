"""What ``groupwise simulate`` and ``groupwise plan`` refuse in a ``sim.job`` before simulating anything, every
problem at once (each names the key, the value, the rule and the fix)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from groupwise.config import ConfigIssue
from groupwise.config.base import changed_fields
from groupwise.config.runtime_schema import SimSection
from groupwise.sim.gpus import GPU_NAMES, GPUS, cluster_gpu
from groupwise.sim.job_model import (
    TRAIN_MEMORY_FRACTION,
    kv_bytes_per_token,
    kv_capacity_tokens,
    train_gpus_needed,
    train_memory_bytes,  # fmt: skip
)

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.config.job_schema import JobSection

#: The toy model's cost and failure keys: with ``sim.job`` the job model decides every cost and injects no failure.
TOY_KEYS = ("rollout_slots", "length_median_tokens", "length_p99_over_p50", "prefill_s", "per_token_s",
            "train_s_per_token", "weight_sync_s", "infra_failure_rate", "data_failure_rate", "straggler_rate",
            "straggler_factor")  # fmt: skip


def episode_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """The simulator models single-turn generation (a completion's length, no environment): a multi-turn job is
    refused naming the key that makes it one, never simulated as if it were single-turn."""
    ep = cfg.episode
    driven = [("episode.environment", ep.environment), ("episode.harness", ep.harness),
              ("episode.harness_command", ep.harness_command)]  # fmt: skip
    return [
        ConfigIssue(key, value, "the simulator models single-turn completions; an episode's turns, its environment's "
                    "latency and its context growing turn by turn are not modelled, so the result would describe "
                    "another job", f"remove {key} to simulate the single-turn job, or measure the episodic job with "
                    "groupwise train")
        for key, value in driven if value is not None
    ]  # fmt: skip


def check_job(cfg: RunConfig, train_gpus: int | None = None) -> list[ConfigIssue]:
    """Every issue of ``cfg.sim.job`` with the rest of the config (none when there is no job); the training memory
    is checked on ``train_gpus`` GPUs (``None``: the job's ``cluster.train_gpus``)."""
    job = cfg.sim.job
    if job is None:
        if cfg.sim.plan is None:
            return []
        return [ConfigIssue("sim.plan", cfg.sim.plan.model_dump(mode="json"), "sim.plan is the grid groupwise plan "
                            "sweeps over a job, but sim.job is not set (a key with no effect is an error)",
                            "describe the job under sim.job, or remove sim.plan")]  # fmt: skip
    toy = SimSection.model_validate({key: getattr(cfg.sim, key) for key in TOY_KEYS})
    issues = [
        ConfigIssue(path, value, f"{path} has no effect with sim.job: the job model derives every cost from the job "
                    "and injects no failure (a key with no effect is an error)",
                    f"remove {path}, or remove sim.job to use the toy model")
        for path, value in changed_fields(toy, "sim")
    ]  # fmt: skip
    issues.extend(check_cluster(job, cfg.mode))
    issues.extend(check_lengths(job))
    layout_issues = check_layout(job, job.cluster.train_gpus)
    issues.extend(layout_issues)
    if gpu_spec_issue(job) is None and not layout_issues:
        issue = training_memory_issue(job, train_gpus or job.cluster.train_gpus, uses_reference(cfg))
        issues.extend([issue] if issue is not None else [])
    return issues


def uses_reference(cfg: RunConfig) -> bool:
    """Whether the job trains with a reference model: ``training.reference_forward``, or when unset
    ``loss.kl_coef > 0``."""
    job = cfg.sim.job
    reference = None if job is None else job.training.reference_forward
    return cfg.loss.kl_coef > 0 if reference is None else reference


def training_memory_issue(job: JobSection, gpus: int, reference: bool) -> ConfigIssue | None:
    """The training state and activations (:func:`~groupwise.sim.job_model.train_memory_bytes`, at the layout's
    tensor-parallel size) fit in ``TRAIN_MEMORY_FRACTION`` of each of the ``gpus`` training GPUs; if not, the issue
    names the GPU count, the tensor-parallel size and the GPUs of the table that would hold them."""
    m, c = job.model, job.cluster
    gpu = cluster_gpu(c)
    tokens = job.lengths.prompt_tokens + job.lengths.max_tokens
    checkpointing = job.training.gradient_checkpointing
    tp = job.train_layout.tensor_parallel

    def need_at(tensor_parallel: int) -> float:
        return train_memory_bytes(m.params, gpus, tokens, m.layers, m.hidden, checkpointing, reference,
                                  tensor_parallel)  # fmt: skip

    need = need_at(tp)
    usable = TRAIN_MEMORY_FRACTION * gpu.memory_bytes
    if need <= usable:
        return None
    activations = train_memory_bytes(0.0, 1, tokens, m.layers, m.hidden, checkpointing, False, tp)
    fewest = train_gpus_needed(m.params, usable, activations, reference)
    fixes = [f"train on at least {fewest} {c.gpu} GPUs" if fewest is not None else
             "shorten lengths.max_tokens (one longest sequence's activations do not fit)"]  # fmt: skip
    wider = [t for t in (2, 4, 8) if t > tp and gpus % (t * job.train_layout.pipeline_parallel) == 0
             and need_at(t) <= usable]  # fmt: skip
    if wider:
        fixes.append(f"set sim.job.train_layout.tensor_parallel: {wider[0]} (the activations split {wider[0]} ways)")
    bigger = [g.name for g in GPUS.values() if need <= TRAIN_MEMORY_FRACTION * g.memory_bytes]
    fixes.append(f"a GPU with more memory ({', '.join(bigger)} at {gpus})" if bigger else "a smaller model")
    return ConfigIssue(
        "sim.job.cluster.train_gpus", gpus, f"{gpus} {c.gpu} GPUs ({gpu.memory_bytes / 1e9:.0f} GB, "
        f"{TRAIN_MEMORY_FRACTION:.0%} usable) cannot train a {m.params / 1e9:.1f}B-parameter model: its weights, "
        f"gradients and Adam state{' and a reference model' if reference else ''} sharded over {gpus} GPUs and the "
        f"activations of one {tokens:,}-token sequence (split over tensor_parallel = {tp}) need {need / 1e9:.0f} GB "
        "on each", " or ".join(fixes),
    )  # fmt: skip


def check_layout(job: JobSection, gpus: int) -> list[ConfigIssue]:
    """``sim.job.train_layout`` on ``gpus`` training GPUs: ``tensor × pipeline`` divides them (times
    ``data_parallel`` equals them when given), at most one stage per layer, expert parallelism on an MoE only and
    dividing the data-parallel size, micro-batches only with a pipeline."""
    layout, m, issues = job.train_layout, job.model, []
    model_parallel = layout.tensor_parallel * layout.pipeline_parallel
    key = "sim.job.train_layout"
    if gpus % model_parallel:
        issues.append(ConfigIssue(
            f"{key}.tensor_parallel", layout.tensor_parallel, f"tensor_parallel × pipeline_parallel = "
            f"{layout.tensor_parallel} × {layout.pipeline_parallel} = {model_parallel} must divide the {gpus} "
            "training GPUs (each data-parallel replica is one tensor × pipeline grid)",
            f"choose sizes whose product divides {gpus}, or train on a multiple of {model_parallel} GPUs",
        ))  # fmt: skip
    elif layout.data_parallel is not None and layout.data_parallel * model_parallel != gpus:
        issues.append(ConfigIssue(
            f"{key}.data_parallel", layout.data_parallel, f"data × tensor × pipeline parallel = "
            f"{layout.data_parallel} × {layout.tensor_parallel} × {layout.pipeline_parallel} must equal "
            f"sim.job.cluster.train_gpus = {gpus}",
            f"set data_parallel: {gpus // model_parallel}, or leave it null (derived)",
        ))  # fmt: skip
    if layout.pipeline_parallel > m.layers:
        issues.append(ConfigIssue(f"{key}.pipeline_parallel", layout.pipeline_parallel, f"a pipeline stage holds at "
                                  f"least one of the model's {m.layers} layers", f"use at most {m.layers} stages"))
    if layout.micro_batches is not None and layout.pipeline_parallel == 1:
        issues.append(ConfigIssue(f"{key}.micro_batches", layout.micro_batches, "micro-batches only size the "
                                  "pipeline's idle share; at pipeline_parallel 1 the key has no effect (a key with no "
                                  "effect is an error)", "remove it, or set pipeline_parallel above 1"))  # fmt: skip
    if m.experts_per_token is not None and m.active_params is None:
        issues.append(ConfigIssue("sim.job.model.experts_per_token", m.experts_per_token, "experts_per_token "
                                  "describes a mixture of experts, but active_params is not set (a dense model)",
                                  "set sim.job.model.active_params, or remove experts_per_token"))  # fmt: skip
    if layout.expert_parallel > 1:
        data_parallel = layout.data_parallel or max(1, gpus // model_parallel)
        if m.active_params is None or m.experts_per_token is None:
            issues.append(ConfigIssue(f"{key}.expert_parallel", layout.expert_parallel, "expert parallelism spreads "
                                      "an MoE's experts, and its all-to-all sends each token to its top-k experts: "
                                      "it needs sim.job.model.active_params and experts_per_token",
                                      "set both for an MoE, or expert_parallel: 1 for a dense model"))  # fmt: skip
        elif data_parallel % layout.expert_parallel:
            issues.append(ConfigIssue(f"{key}.expert_parallel", layout.expert_parallel, f"the experts are spread "
                                      f"within a data-parallel group, so expert_parallel must divide data_parallel "
                                      f"= {data_parallel}", "choose a divisor of data_parallel"))  # fmt: skip
    return issues


def check_lengths(job: JobSection) -> list[ConfigIssue]:
    """``lengths.max_tokens`` at least the median completion length (``median_tokens``, and ``final_median_tokens``
    when the median drifts): a cap below the median truncates more than half of the completions, so the simulated
    lengths would be the cap's, not the log-normal the section describes."""
    lengths = job.lengths
    medians = {"sim.job.lengths.median_tokens": lengths.median_tokens,
               "sim.job.lengths.final_median_tokens": lengths.final_median_tokens}  # fmt: skip
    over = {key: median for key, median in medians.items() if median is not None and median > lengths.max_tokens}
    if not over:
        return []
    named = " and ".join(f"{key} = {median:g}" for key, median in over.items())
    return [ConfigIssue(
        "sim.job.lengths.max_tokens", lengths.max_tokens,
        f"the completion cap is below the median completion length ({named}): more than half of the completions "
        "would be cut at the cap, so the lengths simulated would not be the ones described",
        f"raise sim.job.lengths.max_tokens to at least {max(over.values()):g} (it caps the completion alone, not "
        "prompt + completion), or lower the median",
    )]  # fmt: skip


def check_cluster(job: JobSection, mode: str) -> list[ConfigIssue]:
    """The cluster against the mode and the model: colocation, replicas, memory."""
    c, issues = job.cluster, []
    if c.colocated and mode != "sync":
        issues.append(ConfigIssue(
            "sim.job.cluster.colocated", True, "colocated GPUs take turns between generating and training, which "
            "only the sync loop does; the async controller generates while it trains",
            "set sim.job.cluster.colocated: false with separate rollout_gpus and train_gpus, or mode: sync",
        ))  # fmt: skip
    if c.colocated and c.rollout_gpus != c.train_gpus:
        issues.append(ConfigIssue(
            "sim.job.cluster.train_gpus", c.train_gpus, f"colocated means the same GPUs generate and train, but "
            f"rollout_gpus is {c.rollout_gpus}", f"set sim.job.cluster.train_gpus: {c.rollout_gpus}",
        ))  # fmt: skip
    if c.rollout_gpus % c.tensor_parallel:
        nearest = max(1, c.rollout_gpus // c.tensor_parallel) * c.tensor_parallel
        issues.append(ConfigIssue(
            "sim.job.cluster.rollout_gpus", c.rollout_gpus, f"rollout GPUs form replicas of tensor_parallel = "
            f"{c.tensor_parallel} GPUs each, and {c.rollout_gpus} is not a multiple of it",
            f"use a multiple of {c.tensor_parallel} (e.g. {nearest})",
        ))  # fmt: skip
    m = job.model
    kv = kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim, m.dtype_bytes)
    if issue := gpu_spec_issue(job):
        return [*issues, issue]  # no GPU figures: nothing below can be checked
    gpu = cluster_gpu(c)
    capacity = kv_capacity_tokens(gpu, c.tensor_parallel, c.memory_fraction, m.params * m.dtype_bytes, kv)
    longest = job.lengths.prompt_tokens + job.lengths.max_tokens
    if capacity < longest:
        issues.append(ConfigIssue(
            "sim.job.cluster.tensor_parallel", c.tensor_parallel, f"a replica of {c.tensor_parallel} {c.gpu} "
            f"({gpu.memory_bytes / 1e9:.0f} GB each, memory_fraction {c.memory_fraction}) holds the "
            f"{m.params * m.dtype_bytes / 1e9:.1f} GB of weights and KV cache for {max(capacity, 0):,} tokens, fewer "
            f"than one longest sequence (prompt_tokens + max_tokens = {longest:,})",
            "raise tensor_parallel or memory_fraction, choose a GPU with more memory, or lower lengths.max_tokens",
        ))  # fmt: skip
    return issues


def gpu_spec_issue(job: JobSection) -> ConfigIssue | None:
    """``cluster.gpu_spec`` is given exactly when ``cluster.gpu`` is ``custom``."""
    c = job.cluster
    if c.gpu == "custom" and c.gpu_spec is None:
        return ConfigIssue("sim.job.cluster.gpu_spec", None, "gpu: custom needs the GPU's figures",
                           "give sim.job.cluster.gpu_spec: {bf16_tflops, memory_gb, memory_tbytes_per_s, "
                           f"nvlink_gbytes_per_s}}, or name a GPU of the table ({', '.join(GPU_NAMES)})")  # fmt: skip
    if c.gpu != "custom" and c.gpu_spec is not None:
        return ConfigIssue("sim.job.cluster.gpu_spec", c.gpu_spec.model_dump(), f"gpu_spec describes a custom GPU, "
                           f"but gpu is {c.gpu}, whose figures come from the table (a key with no effect is an error)",
                           "remove sim.job.cluster.gpu_spec, or set sim.job.cluster.gpu: custom")  # fmt: skip
    return None
