"""The job model's training layout (``sim.job.train_layout``; docs/simulator.md, "Training").

Invariants pinned, each on a hand-computed case:
- a pipeline of ``pp`` stages and ``m`` micro-batches idles ``(pp − 1)/(m + pp − 1)`` of an update, and a chunk's
  compute takes ``1/(1 − bubble)`` as long;
- tensor parallelism costs each GPU ``τ/(DP · PP)`` per token per forward or backward pass (two all-reduces of the
  activations per layer), three passes per update with gradient checkpointing, two without, one per extra forward;
- an MoE's expert all-to-all sends ``2·k·h·b·(EP − 1)/EP`` bytes per token per layer, over the GPU's share of the
  tokens, NVLink within a node, the network beyond; nothing at ``EP = 1``;
- an optimizer update reduces each data-parallel group's ``N/(TP·PP)`` share; the default layout (all data
  parallel) costs exactly what the model charged before it had a layout;
- the memory check splits the activations by the tensor-parallel size and, when a wider one would fit, names it;
- the layout is validated: the product equals ``train_gpus``, stages at most the layers, expert parallelism on an
  MoE only and dividing the data-parallel size, micro-batches only with a pipeline — each error naming its key;
- a pipelined layout's micro-batches default to one sequence each, ``⌈P·G/(K·DP)⌉``, and ``groupwise plan``
  derives the data-parallel size at each point (a given one is refused); the sync point may have its own layout.
"""

from __future__ import annotations

import pytest

from groupwise.config import config_from_dict
from groupwise.config.job_schema import JobSection
from groupwise.sim import job_model
from groupwise.sim.gpus import GPUS
from groupwise.sim.job_checks import check_layout, training_memory_issue
from groupwise.sim.job_model import JobCosts, TrainLayout
from groupwise.sim.plan import plan_issues, plan_points, point_config
from groupwise.sim.workload import resolved_job

QWEN_7B = {"params": 7.6e9, "layers": 28, "hidden": 3584, "kv_heads": 4, "head_dim": 128}
MOE_30B = {"params": 30e9, "active_params": 3e9, "experts_per_token": 8, "layers": 48, "hidden": 2048,
           "kv_heads": 4, "head_dim": 128}  # fmt: skip
NVLINK_ONE_WAY = 900e9 / 2


def job(
    model: dict | None = None,
    train_gpus: int = 16,
    gpu: str = "H20",
    lengths: dict | None = None,
    training: dict | None = None,
    **layout,
) -> JobSection:
    return JobSection.model_validate({
        "model": model or QWEN_7B,
        "cluster": {"gpu": gpu, "rollout_gpus": 8, "train_gpus": train_gpus, "tensor_parallel": 4},
        "lengths": lengths or {"prompt_tokens": 100, "median_tokens": 500, "max_tokens": 2000},
        "training": training or {}, "train_layout": layout,
    })  # fmt: skip


def test_the_pipeline_bubble_and_its_share_of_a_chunk():
    assert job_model.pipeline_bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert job_model.pipeline_bubble_fraction(1, 8) == 0
    flat = JobCosts.from_job(job(tensor_parallel=1, pipeline_parallel=1))
    piped = JobCosts.from_job(job(pipeline_parallel=4, micro_batches=8))
    assert piped.train_layout == TrainLayout(data_parallel=4, pipeline_parallel=4, micro_batches=8)
    assert piped.train_comm_per_token == 0  # TP 1: no all-reduce
    assert piped.chunk_train_seconds(1e15, 0, 1) == pytest.approx(flat.chunk_train_seconds(1e15, 0, 1) * 11 / 8)


def test_tensor_parallel_all_reduces_per_token_and_pass():
    costs = JobCosts.from_job(job(tensor_parallel=2, pipeline_parallel=2, micro_batches=100))  # DP = 4
    tau = 2 * 28 * 2 * (2 - 1) / 2 * 3584 * 2 / NVLINK_ONE_WAY
    assert costs.train_comm_per_token == pytest.approx(tau / (4 * 2))
    compute = costs.chunk_train_seconds(1e15, 0, 1)
    assert costs.chunk_train_seconds(1e15, 10_000, 1) - compute == pytest.approx(3 * 10_000 * tau / 8)
    plain = JobCosts.from_job(job(training={"gradient_checkpointing": False, "recompute_old_logprobs": True},
                                  tensor_parallel=2, pipeline_parallel=2, micro_batches=100))  # fmt: skip
    assert plain.chunk_train_seconds(0.0, 10_000, 2) == pytest.approx((2 * 2 + 1) * 10_000 * tau / 8)


def test_the_expert_all_to_all_within_a_node_and_beyond():
    within = JobCosts.from_job(job(MOE_30B, train_gpus=8, expert_parallel=8))  # DP 8, TP 1: one node
    per_token = 48 * 2 * 8 * 2048 * 2 * (8 - 1) / 8 / 8 / NVLINK_ONE_WAY
    assert within.train_comm_per_token == pytest.approx(per_token)
    across = JobCosts.from_job(job(MOE_30B, train_gpus=32, expert_parallel=16))  # DP 32, EP 16: two nodes
    assert across.train_comm_per_token == pytest.approx(48 * 2 * 8 * 2048 * 2 * (15 / 16) / 32 / 50e9)
    assert JobCosts.from_job(job(MOE_30B, train_gpus=8)).train_comm_per_token == 0


def test_an_update_reduces_each_data_parallel_groups_share():
    h20, n = GPUS["H20"], 7.6e9
    adam = 32 * n / (16 * h20.memory_bandwidth)
    layered = job_model.update_seconds(n, 16, h20, 50e9, tensor_parallel=2, pipeline_parallel=2)  # DP 4, TP·DP 8
    assert layered == pytest.approx(6 * n / 4 * (3 / 4) / h20.nvlink_bandwidth + adam)
    flat = job_model.update_seconds(n, 16, h20, 50e9)  # DP 16 spans two nodes: the network
    assert flat == pytest.approx(6 * n * (15 / 16) / 50e9 + adam)
    assert JobCosts.from_job(job()).update_s == pytest.approx(flat)
    assert JobCosts.from_job(job()).train_comm_per_token == 0 and JobCosts.from_job(job()).pipeline_bubble == 0


def test_tensor_parallel_splits_the_activations_and_the_refusal_names_it():
    need = job_model.train_memory_bytes(7.6e9, 8, 4096, 28, 3584, checkpointing=True, reference=False,
                                        tensor_parallel=4)  # fmt: skip
    assert need == pytest.approx(16 * 7.6e9 / 8 + 4096 * 3584 * (2 * 28 + 34) / 4)
    # No checkpointing, 131K-token sequences on 8 H100: 34·T·h·ℓ = 448 GB of activations; split 8 ways they fit.
    long = {"prompt_tokens": 150, "median_tokens": 4000, "max_tokens": 131_072}
    at_1 = job(train_gpus=8, gpu="H100", lengths=long, training={"gradient_checkpointing": False})
    issue = training_memory_issue(at_1, 8, reference=False)
    assert issue is not None and issue.path == "sim.job.cluster.train_gpus"
    assert "set sim.job.train_layout.tensor_parallel: 8" in issue.fix and "tensor_parallel = 1" in issue.rule
    at_8 = job(train_gpus=8, gpu="H100", lengths=long, training={"gradient_checkpointing": False}, tensor_parallel=8)
    assert training_memory_issue(at_8, 8, reference=False) is None


@pytest.mark.parametrize("model,gpus,layout,key,words", [
    (QWEN_7B, 16, {"tensor_parallel": 3}, "tensor_parallel", "must divide the 16"),
    (QWEN_7B, 16, {"data_parallel": 2, "tensor_parallel": 2}, "data_parallel", "set data_parallel: 8"),
    (QWEN_7B, 64, {"pipeline_parallel": 32, "micro_batches": 64}, "pipeline_parallel", "at most 28"),
    (QWEN_7B, 16, {"micro_batches": 4}, "micro_batches", "no effect"),
    (QWEN_7B, 16, {"expert_parallel": 2}, "expert_parallel", "active_params"),
    (MOE_30B, 16, {"tensor_parallel": 2, "expert_parallel": 16}, "expert_parallel", "data_parallel = 8"),
])  # fmt: skip
def test_the_layout_is_validated_naming_the_key(model, gpus, layout, key, words):
    (issue,) = check_layout(job(model, train_gpus=gpus, **layout), gpus)
    assert issue.path == f"sim.job.train_layout.{key}"
    assert words in issue.rule + issue.fix
    assert check_layout(job(model, train_gpus=gpus), gpus) == []


def test_a_dense_model_with_experts_per_token_is_refused():
    (issue,) = check_layout(job({**QWEN_7B, "experts_per_token": 2}), 16)
    assert issue.path == "sim.job.model.experts_per_token"


def run_data(**layout) -> dict:
    return {
        "mode": "async", "model": {"source": "tiny"}, "logging": {"tensorboard": False},
        "run": {"name": "l", "max_steps": 4, "seed": 0}, "optimizer": {"mini_batches_per_step": 4},
        "grpo": {"num_prompts_per_step": 32, "num_generations_per_prompt": 8},
        "loss": {"importance_sampling": True}, "async": {"max_buffered_rollouts": 64},
        "sim": {"num_prompts": 400, "job": {**job().model_dump(), "efficiency": {}, "train_layout": layout}},
    }  # fmt: skip


def test_a_pipelines_micro_batches_default_to_one_sequence_each_and_plan_derives_data_parallel():
    resolved = resolved_job(config_from_dict(run_data(pipeline_parallel=2)))
    assert resolved is not None and resolved.train_layout.micro_batches == 32 * 8 // (4 * 8)  # DP = 16 / 2
    given = resolved_job(config_from_dict(run_data(pipeline_parallel=2, micro_batches=3)))
    assert given is not None and given.train_layout.micro_batches == 3
    issues = plan_issues(config_from_dict(run_data(data_parallel=16)))
    assert [i.path for i in issues] == ["sim.job.train_layout.data_parallel"]
    assert "derived" in issues[0].rule


def test_the_sync_point_of_a_plan_has_its_own_train_layout():
    data = run_data(pipeline_parallel=2)
    data["sim"]["plan"] = {"samplers": ["in_order"], "windows": [1], "partial_rollouts": ["off"],
                           "sync_train_layout": {"tensor_parallel": 4}}  # fmt: skip
    cfg = config_from_dict(data)
    sync, async_ = (point_config(cfg, point) for point in plan_points(cfg)[:2])
    assert sync.sim.job is not None and async_.sim.job is not None
    assert (sync.sim.job.train_layout.tensor_parallel, sync.sim.job.train_layout.pipeline_parallel) == (4, 1)
    assert (async_.sim.job.train_layout.tensor_parallel, async_.sim.job.train_layout.pipeline_parallel) == (1, 2)
    data["sim"]["plan"]["sync_train_layout"] = {"data_parallel": 24}
    (issue,) = plan_issues(config_from_dict(data))
    assert issue.path == "sim.plan.sync_train_layout.data_parallel"
