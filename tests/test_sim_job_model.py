"""The job model's cost formulas and its replicas (``sim.job``; docs/simulator.md).

Invariants pinned:
- the GPU table holds the six GPUs the config accepts, dense BF16 (half the spec sheets' sparse figures); a
  ``custom`` GPU with a table GPU's figures costs the same as it, and ``gpu_spec`` goes with ``custom`` only; a
  job that leaves ``efficiency`` out gets its GPU's fitted constants (H20's), or the defaults on another GPU;
- a decode step is bandwidth-bound with few sequences (weights + KV read) and compute-bound with many on a GPU with
  little FLOP/s per byte (H20), plus the tensor-parallel all-reduces of each running sequence (none at TP 1, over
  NVLink within a node, the network beyond), and the time between events integrates the per-step time exactly, with the
  inverse (steps done by a time) its inverse;
- training costs 4 forward-equivalents per token with gradient checkpointing, 3 without, plus one when the old
  logprobs are recomputed and one for a reference model's forward; its memory is 16 bytes per parameter sharded
  (2 more with a reference) plus one longest sequence's activations; a colocated trainer runs at
  ``colocated_train_mfu`` when set; an update reduces gradients over NVLink within a node and the network beyond;
- completion lengths have the configured median, drift with the weight version and are truncated at the maximum;
- a replica batches continuously: a sequence waits for a free slot, starts when one frees, and each finishes at the
  time the per-step integral gives; a full KV cache preempts the latest sequence, which still finishes;
- a cancelled group reports the tokens its completions had made;
- a weight sync with ``partial_rollout_kv: recompute`` holds a replica ``(2·A·Σc + 2·ℓ·h·Σc²) / (TP·F·μ)`` longer
  than with ``keep`` (a prefill of every running sequence's whole context, the charge the config key documents).
"""

from __future__ import annotations

import asyncio
import math

import pytest

from groupwise.config.job_schema import FITTED_EFFICIENCY, GpuName, JobEfficiencySection, JobSection
from groupwise.sim import job_model, step_time
from groupwise.sim.gpus import GPUS
from groupwise.sim.job_checks import check_cluster, training_memory_issue
from groupwise.sim.job_engine import JobEngine
from groupwise.sim.job_lengths import JobVariates, LengthModel
from groupwise.sim.job_model import JobCosts
from groupwise.sim.virtual_time import run_in_virtual_time


def job(**cluster) -> JobSection:
    return JobSection.model_validate({
        "model": {"params": 7.6e9, "layers": 28, "hidden": 3584, "kv_heads": 4, "head_dim": 128},
        "cluster": {"gpu": "H20", "rollout_gpus": 4, "train_gpus": 4, "tensor_parallel": 4, **cluster},
        "lengths": {"prompt_tokens": 100, "median_tokens": 500, "max_tokens": 2000},
    })  # fmt: skip


def test_the_gpu_table_is_the_configs_and_dense():
    assert set(GPUS) | {"custom"} == set(GpuName.__args__)
    assert GPUS["H100"].bf16_flops == pytest.approx(1979e12 / 2, rel=1e-3)
    assert GPUS["H20"].bf16_flops / GPUS["H20"].memory_bandwidth == pytest.approx(37, rel=0.01)


def test_decode_is_bandwidth_bound_for_few_sequences_and_compute_bound_for_many():
    costs = JobCosts.from_job(job())
    read = lambda b, c: (costs.weight_bytes + c * costs.kv_bytes) / costs.replica_bandwidth  # noqa: E731
    compute = lambda b, c: (2 * costs.active_params * b + 4 * 28 * 3584 * c) / costs.replica_flops  # noqa: E731
    tau = 2 * 28 * 2 * (4 - 1) / 4 * 3584 * 2 / (900e9 / 2)  # TP 4 all-reduces per sequence, within the node
    assert costs.tp_seconds_per_sequence == pytest.approx(tau)
    one = job_model.decode_step_seconds(1, 600, costs)
    assert one == pytest.approx(costs.decode_overhead_s + tau + read(1, 600)) and read(1, 600) > compute(1, 600)
    many = job_model.decode_step_seconds(512, 512 * 600, costs)
    assert many == pytest.approx(costs.decode_overhead_s + 512 * tau + compute(512, 512 * 600))
    assert compute(512, 512 * 600) > read(512, 512 * 600)
    assert costs.kv_bytes == 2 * 28 * 4 * 128 * 2
    assert JobCosts.from_job(job(tensor_parallel=1, rollout_gpus=1)).tp_seconds_per_sequence == 0
    across = JobCosts.from_job(job(tensor_parallel=16, rollout_gpus=16))  # beyond a node: the 50 GB/s network
    assert across.tp_seconds_per_sequence == pytest.approx(2 * 28 * 2 * 15 / 16 * 3584 * 2 / 50e9)


@pytest.mark.parametrize("running,context", [(1, 100.0), (64, 64 * 300.0), (900, 900 * 2000.0)])
def test_the_time_between_events_integrates_the_per_step_time(running, context):
    costs = JobCosts.from_job(job())
    steps = 400
    summed = sum(job_model.decode_step_seconds(running, context + (j + 0.5) * running, costs) for j in range(steps))
    seconds = step_time.seconds_for(steps, running, context, costs)
    assert seconds == pytest.approx(summed, rel=1e-4)  # the midpoint sum of a piecewise-linear integrand
    assert step_time.steps_within(seconds, running, context, costs) == pytest.approx(steps, rel=1e-9)
    assert step_time.steps_within(seconds / 3, running, context, costs) < steps / 2


def test_training_passes_and_update_communication():
    base = job()
    costs = JobCosts.from_job(base)
    flops = costs.sequence_forward_flops(400)
    assert flops == pytest.approx(2 * 7.6e9 * 500 + 2 * 28 * 3584 * 500**2)
    assert costs.chunk_train_seconds(flops, 500, epochs=1) == pytest.approx(4 * flops / (4 * 148e12 * costs.train_mfu))
    plain = JobSection.model_validate({**base.model_dump(), "training": {"gradient_checkpointing": False,
                                                                          "recompute_old_logprobs": True}})
    assert JobCosts.from_job(plain).chunk_train_seconds(flops, 500, epochs=2) == pytest.approx(
        (3 * 2 + 1) * flops / (4 * 148e12 * costs.train_mfu))  # fmt: skip
    efficiency = {**base.efficiency.model_dump(), "colocated_train_mfu": costs.train_mfu / 2}
    separate = JobSection.model_validate({**base.model_dump(), "efficiency": efficiency})
    colocated = JobSection.model_validate({**separate.model_dump(), "cluster": {**base.cluster.model_dump(),
                                                                                 "colocated": True}})  # fmt: skip
    assert JobCosts.from_job(separate).chunk_train_seconds(flops, 500, 1) == costs.chunk_train_seconds(flops, 500, 1)
    assert JobCosts.from_job(colocated).chunk_train_seconds(flops, 500, 1) == pytest.approx(
        2 * costs.chunk_train_seconds(flops, 500, 1))  # a colocated trainer at its own MFU  # fmt: skip
    reference = JobSection.model_validate({**base.model_dump(), "training": {"reference_forward": True}})
    assert JobCosts.from_job(reference).chunk_train_seconds(flops, 500, epochs=1) == pytest.approx(
        (4 + 1) * flops / (4 * 148e12 * costs.train_mfu))  # fmt: skip
    gpu = GPUS["H20"]
    in_node = job_model.update_seconds(7.6e9, 8, gpu, 50e9)
    across = job_model.update_seconds(7.6e9, 16, gpu, 50e9)
    assert in_node == pytest.approx(6 * 7.6e9 * 7 / 8 / 900e9 + 32 * 7.6e9 / (8 * 4000e9))
    assert across > 10 * in_node
    assert job_model.update_seconds(7.6e9, 1, gpu, 50e9) == pytest.approx(32 * 7.6e9 / 4000e9)


def test_lengths_median_drift_and_truncation():
    section = job().lengths.model_copy(update={"final_median_tokens": 1000.0, "drift_steps": 100})
    model = LengthModel(section)
    assert [model.median(v) for v in (0, 50, 100, 500)] == [500, 750, 1000, 1000]
    variates = JobVariates(seed=3)
    early = sorted(model.lengths(variates.normals(20_001), 0))
    assert early[10_000] == pytest.approx(500, rel=0.03)
    late = sorted(model.lengths(variates.normals(20_001), 100))
    assert late[10_000] == pytest.approx(1000, rel=0.03) and max(late) == 2000


def _run(engine_job: JobSection, groups: list[list[int]], cancel_after: float | None = None):
    costs = JobCosts.from_job(engine_job)
    out: dict = {}

    async def main():
        loop = asyncio.get_running_loop()
        engine = JobEngine(costs, poll_s=1e-9, track_versions=False, finish_quantum=0.0)  # every event on time
        tickets = [engine.submit(lengths, loop.time()) for lengths in groups]
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            out["made"] = engine.cancel(tickets[-1], loop.time())
            tickets = tickets[:-1]
        out["done"] = await asyncio.gather(*(t.future for t in tickets))
        out["engine"] = engine

    run_in_virtual_time(main, 1e9)
    return costs, out


def test_a_replica_batches_continuously_with_exact_finish_times():
    section = job(max_seqs_per_replica=2)
    costs, out = _run(section, [[100, 300], [200]])
    prefill = job_model.prefill_seconds(100, 0, costs)  # each group's prompt, once per replica
    # [0, prefill]: group 1 prefills; two sequences decode 100 steps; then the third waits for that slot.
    t1 = prefill + step_time.seconds_for(100, 2, 2 * 100, costs)
    c = 200  # after the finish: the 300-token sequence holds 200 tokens of context
    t_start = t1 + job_model.prefill_seconds(100, 0, costs)
    # the second group's sequence joins: both decode until the long one ends at its 300th token (200 steps on)
    t3 = t_start + step_time.seconds_for(200, 2, c + 100, costs)
    assert out["done"][0] == pytest.approx(t3, rel=1e-9)
    assert out["done"][1] == pytest.approx(t3, rel=1e-9)  # both end at the same step: 200 tokens from t_start
    assert out["engine"].preemptions == 0


def test_a_full_kv_cache_preempts_and_every_sequence_still_finishes():
    section = job(memory_fraction=0.1)  # 4 × 96 GB × 0.1 − 15.2 GB of weights: ~ 400k tokens of KV cache
    costs = JobCosts.from_job(section)
    assert 0 < costs.kv_capacity < 256 * 2100
    _, out = _run(section, [[2000] * 16 for _ in range(16)])  # 256 × 2,100 tokens > the cache
    assert out["engine"].preemptions > 0 and len(out["done"]) == 16 and all(math.isfinite(t) for t in out["done"])


def test_a_cancelled_group_reports_the_tokens_it_had_made():
    section = job()
    costs, out = _run(section, [[1000, 1000]], cancel_after=0.5)
    prefill = job_model.prefill_seconds(100, 0, costs)
    made = 2 * step_time.steps_within(0.5 - prefill, 2, 200, costs)
    assert out["made"] == pytest.approx(made, rel=1e-9) and 0 < out["made"] < 2000


def _finish_after_sync(reprefill: bool, at: float = 0.5, sync_s: float = 1.0) -> tuple[JobCosts, float]:
    costs = JobCosts.from_job(job())
    out: dict = {}

    async def main():
        loop = asyncio.get_running_loop()
        engine = JobEngine(costs, poll_s=1e-9, track_versions=False, finish_quantum=0.0)
        ticket = engine.submit([1000, 1000], loop.time())
        await asyncio.sleep(at)
        engine.pause(loop.time(), sync_s, None, reprefill=reprefill)
        out["done"] = await ticket.future

    run_in_virtual_time(main, 1e9)
    return costs, out["done"]


def test_a_sync_with_kv_recompute_charges_a_prefill_of_every_running_context():
    costs, keep = _finish_after_sync(reprefill=False)
    _, recompute = _finish_after_sync(reprefill=True)
    steps = step_time.steps_within(0.5 - job_model.prefill_seconds(100, 0, costs), 2, 200, costs)
    context = 100 + steps  # each of the two sequences: its prompt and the tokens made by the sync
    prefill = (2 * costs.active_params * 2 * context + 2 * costs.layers * costs.hidden * 2 * context**2)
    assert recompute - keep == pytest.approx(prefill / costs.replica_flops, rel=1e-6)


def test_a_custom_gpu_costs_what_its_figures_say():
    h100 = {"bf16_tflops": 989, "memory_gb": 80, "memory_tbytes_per_s": 3.35, "nvlink_gbytes_per_s": 900}
    table, custom = JobCosts.from_job(job(gpu="H100")), JobCosts.from_job(job(gpu="custom", gpu_spec=h100))
    assert custom.gpu.name == "custom" and custom.gpu.bf16_flops == pytest.approx(table.gpu.bf16_flops)
    for field in ("kv_capacity", "replica_flops", "replica_bandwidth", "update_s", "sync_s"):
        assert getattr(custom, field) == pytest.approx(getattr(table, field)), field
    (missing,) = check_cluster(job(gpu="custom"), "async")
    assert missing.path == "sim.job.cluster.gpu_spec" and "memory_tbytes_per_s" in missing.fix
    (extra,) = check_cluster(job(gpu="H100", gpu_spec=h100), "async")
    assert extra.path == "sim.job.cluster.gpu_spec" and "no effect" in extra.rule


def test_training_memory_is_the_sharded_state_and_one_sequences_activations():
    need = job_model.train_memory_bytes(70e9, 8, 4096, 80, 8192, checkpointing=True, reference=False)
    assert need == pytest.approx(16 * 70e9 / 8 + 4096 * 8192 * (2 * 80 + 34))
    with_reference = job_model.train_memory_bytes(70e9, 8, 4096, 80, 8192, checkpointing=True, reference=True)
    assert with_reference - need == pytest.approx(2 * 70e9 / 8)
    no_checkpoints = job_model.train_memory_bytes(0.0, 8, 4096, 80, 8192, checkpointing=False, reference=False)
    assert no_checkpoints == pytest.approx(34 * 4096 * 8192 * 80)
    activations = 4096 * 8192 * (2 * 80 + 34)
    assert job_model.train_gpus_needed(70e9, 72e9, activations, False) == math.ceil(16 * 70e9 / (72e9 - activations))
    assert job_model.train_gpus_needed(70e9, 1e9, activations, False) is None


def test_an_moe_trains_every_parameter_but_computes_with_the_active_ones():
    moe = JobSection.model_validate({**job().model_dump(), "model": {**job().model.model_dump(), "params": 30e9,
                                                                        "active_params": 3e9}})  # fmt: skip
    dense = JobSection.model_validate({**job().model_dump(), "model": {**job().model.model_dump(), "params": 3e9}})
    issue = training_memory_issue(moe, 4, reference=False)  # 16 · 30e9 / 4 = 120 GB > 0.9 · 96 GB
    assert issue is not None and "30.0B-parameter model" in issue.rule and "at least 6 H20" in issue.fix
    assert training_memory_issue(dense, 4, reference=False) is None
    assert JobCosts.from_job(moe).sequence_forward_flops(400) == JobCosts.from_job(dense).sequence_forward_flops(400)


def test_a_job_without_efficiency_gets_its_gpus_fitted_constants():
    assert job().efficiency.model_dump() == {**FITTED_EFFICIENCY["H20"], "colocated_train_mfu": None}
    assert job(gpu="H100").efficiency == JobEfficiencySection()
    mine = JobSection.model_validate({**job().model_dump(), "efficiency": {"train_mfu": 0.4}})
    assert mine.efficiency.train_mfu == 0.4 and mine.efficiency.inference_mfu == JobEfficiencySection().inference_mfu
