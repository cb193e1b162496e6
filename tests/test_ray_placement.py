"""Placement rules of the Ray runtime, checked without a cluster (pure functions; Ray must be importable).

Invariants pinned:
- a request no single node can hold is *infeasible* and named with the config key to lower; a set of requests
  that fits each node but not the free total is *busy*; requests that fit give no reason (Ray would otherwise
  keep them pending for ever);
- the defaults (learner + one worker at 0.5 CPU each) fit a 2-CPU machine and leave a whole CPU free;
- a CUDA ``model.device`` with no GPUs reserved is a config error naming every key to change;
- a round is split over workers in contiguous, non-empty, near-equal shards that cover every prompt once, in
  order (so groups come back in the order they were asked for).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from groupwise.config import ConfigError, config_from_dict  # noqa: E402
from groupwise.runtime.ray.cluster import ActorResources, run_resources, unschedulable_reasons  # noqa: E402
from groupwise.runtime.ray.pool import split_evenly  # noqa: E402
from groupwise.runtime.ray.session import check_device_resources  # noqa: E402


def worker(index: int, cpus: float, gpus: float = 0.0) -> ActorResources:
    return ActorResources(f"generation worker {index}", cpus, gpus, "runtime.ray.cpus_per_generation_worker",
                          "runtime.ray.gpus_per_generation_worker")  # fmt: skip


TINY = {"source": "tiny"}
TWO_NODES = [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0}]


def test_request_larger_than_every_node_is_infeasible_and_names_the_key():
    reasons = unschedulable_reasons([worker(0, 6.0)], TWO_NODES, {"CPU": 8.0, "GPU": 1.0})
    assert len(reasons) == 1
    assert "generation worker 0 asks for 6 CPU" in reasons[0] and "largest have 4 CPU" in reasons[0]
    assert "lower runtime.ray.cpus_per_generation_worker or" in reasons[0]  # only the key that is too large


def test_gpu_request_fits_only_the_node_that_has_one():
    assert unschedulable_reasons([worker(0, 1.0, 1.0)], TWO_NODES, {"CPU": 8.0, "GPU": 1.0}) == []
    reasons = unschedulable_reasons([worker(0, 1.0, 2.0)], TWO_NODES, {"CPU": 8.0, "GPU": 2.0})
    assert len(reasons) == 1 and "2 GPU" in reasons[0]
    assert "lower runtime.ray.gpus_per_generation_worker or" in reasons[0]
    # 4 CPU and 1 GPU each exist, but not on one node
    reasons = unschedulable_reasons([worker(0, 4.0, 1.0)], [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 4.0}], {"CPU": 6.0})
    assert len(reasons) == 1 and "cpus_per_generation_worker / runtime.ray.gpus_per_generation_worker" in reasons[0]


def test_requests_beyond_the_free_total_are_busy():
    requests = [worker(i, 3.0) for i in range(3)]  # each fits a node; 9 CPUs in all
    reasons = unschedulable_reasons(requests, TWO_NODES, {"CPU": 8.0, "GPU": 1.0})
    assert len(reasons) == 1 and "reserves 9 CPU" in reasons[0] and "8 free (8 in total)" in reasons[0]
    # one of them on a cluster where other jobs hold 6 CPUs
    busy = unschedulable_reasons(requests[:1], TWO_NODES, {"CPU": 2.0})
    assert len(busy) == 1 and "2 free (8 in total; other actors or jobs hold the rest)" in busy[0]
    assert unschedulable_reasons(requests[:2], TWO_NODES, {"CPU": 8.0}) == []


def test_default_sizes_fit_two_cpus_and_leave_one_free():
    cfg = config_from_dict({"model": TINY, "runtime": {"backend": "ray"}})
    requests = run_resources(cfg.runtime.ray)
    assert [r.role for r in requests] == ["learner", "generation worker 0"]
    assert unschedulable_reasons(requests, [{"CPU": 2.0}], {"CPU": 2.0}) == []
    assert sum(r.cpus for r in requests) <= 1.0  # a default Ray task (1 CPU) can still run


def test_cuda_device_without_gpus_is_a_config_error_naming_each_key():
    runtime = {"backend": "ray", "ray": {"learner_gpus": 1}}
    cfg = config_from_dict({"model": {**TINY, "device": "cuda"}, "runtime": runtime})
    with pytest.raises(ConfigError) as caught:
        check_device_resources(cfg)
    assert [issue.path for issue in caught.value.errors] == ["runtime.ray.gpus_per_generation_worker"]
    check_device_resources(config_from_dict({"model": {**TINY, "device": "auto"}, "runtime": {"backend": "ray"}}))


@pytest.mark.parametrize(("count", "parts"), [(1, 1), (5, 1), (5, 2), (7, 3), (2, 4), (8, 4)])
def test_split_covers_every_prompt_once_in_order(count, parts):
    shards = split_evenly(count, parts)
    assert [i for shard in shards for i in shard] == list(range(count))
    assert len(shards) == min(count, parts)
    sizes = [len(shard) for shard in shards]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
