"""``generation.backend: vllm`` in the config: what it refuses, and a missing package, all before any model loads.

Invariants pinned (none of them needs vLLM installed):
- the built-in engine's keys (``generation.cuda_graphs``, ``fast_decode``) are refused under vllm, and the
  ``generation.vllm`` keys under any other backend;
- partial rollouts under vllm need ``async.partial_rollout_kv: keep`` (vLLM keeps the running rows' KV cache across
  a weight load, it cannot recompute it), which is the default there (``recompute`` under the built-in engine;
  an explicit ``recompute`` under vllm is refused), and one learner process;
- ``generation.vllm.engine_args`` may not set what the backend sets itself; ``kv_cache_gib`` is refused on an
  explicit CUDA device and ``gpu_memory_utilization`` on the CPU;
- ``groupwise simulate`` refuses ``generation.backend`` (its engine is a cost model);
- where vllm is not installed, ``config check`` exits 2 with an error naming ``generation.backend`` and the
  install (``groupwise[vllm]``, ``make test-vllm``), without a traceback.
"""

from __future__ import annotations

import pytest
import yaml

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.optional_packages import vllm_unavailable

BASE = {"model": {"source": "tiny"}, "generation": {"backend": "vllm"}}
ASYNC = {**BASE, "mode": "async", "generation": {"backend": "vllm", "continuous_batching": True},
         "loss": {"importance_sampling": True}, "async": {"partial_rollouts": "continue"}}  # fmt: skip


def refused(data: dict) -> dict[str, str]:
    """Key path -> the rules of every issue the config raises about it (one line each)."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    rules: dict[str, str] = {}
    for issue in info.value.errors:
        rules[issue.path] = f"{rules.get(issue.path, '')}{issue.rule}\n"
    return rules


def test_the_builtin_engine_keys_are_refused_under_vllm():
    issues = refused({**BASE, "generation": {"backend": "vllm", "cuda_graphs": "off", "fast_decode": False}})
    assert "built-in engine" in issues["generation.cuda_graphs"]
    assert "built-in engine" in issues["generation.fast_decode"]


def test_vllm_keys_are_refused_under_another_backend():
    issues = refused({"model": {"source": "tiny"}, "generation": {"vllm": {"max_num_seqs": 8}}})
    assert "generation.backend 'builtin'" in issues["generation.vllm.max_num_seqs"]


def test_partial_rollouts_under_vllm_keep_the_kv_cache():
    issues = refused({**ASYNC, "async": {"partial_rollouts": "continue", "partial_rollout_kv": "recompute"}})
    assert "does not recompute" in issues["async.partial_rollout_kv"]
    cfg = config_from_dict({**ASYNC, "async": {"partial_rollouts": "continue", "partial_rollout_kv": "keep"}})
    assert cfg.async_.partial_rollout_kv == "keep"


def test_the_kv_default_follows_the_backend():
    vllm = config_from_dict(ASYNC)  # partial_rollout_kv left out: the value vLLM can do
    assert vllm.async_.partial_rollout_kv == "keep"
    assert config_from_dict(yaml.safe_load(vllm.to_yaml())) == vllm  # the resolved config loads back the same
    builtin = config_from_dict({**ASYNC, "generation": {"continuous_batching": True}})
    assert builtin.async_.partial_rollout_kv == "recompute"
    off = config_from_dict({**ASYNC, "async": {"partial_rollouts": "off"}})  # no row spans a sync: nothing to keep
    assert off.async_.partial_rollout_kv == "recompute"


def test_vllm_trains_with_one_learner_process():
    assert "learner.num_ranks" in refused({**BASE, "learner": {"num_ranks": 2}})


def test_engine_args_may_not_set_what_the_backend_sets():
    def with_args(engine_args: dict) -> dict:
        return {**BASE, "generation": {"backend": "vllm", "vllm": {"engine_args": engine_args}}}

    issues = refused(with_args({"seed": 3, "quantization": "fp8"}))
    assert "['seed']" in issues["generation.vllm.engine_args"]
    cfg = config_from_dict(with_args({"quantization": "fp8"}))
    assert cfg.generation.vllm.engine_args == {"quantization": "fp8"}


def test_device_specific_engine_keys():
    cuda = refused({"model": {"source": "tiny", "device": "cuda"},
                    "generation": {"backend": "vllm", "vllm": {"kv_cache_gib": 4}}})  # fmt: skip
    assert "CPU engine" in cuda["generation.vllm.kv_cache_gib"]
    cpu = refused({"model": {"source": "tiny", "device": "cpu"},
                   "generation": {"backend": "vllm", "vllm": {"gpu_memory_utilization": 0.8}}})  # fmt: skip
    assert "no effect" in cpu["generation.vllm.gpu_memory_utilization"]


@pytest.mark.skipif(vllm_unavailable() is None, reason="vllm is installed here: nothing is missing")
def test_a_missing_vllm_package_is_a_config_error_naming_the_install(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, "run": {"output_dir": str(tmp_path / "runs")}}))
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "generation.backend" in err and "groupwise[vllm]" in err and "make test-vllm" in err
    assert "Traceback" not in err


def test_the_simulator_says_the_backend_has_no_effect():
    from groupwise.sim.run import check_engine_keys

    issues = check_engine_keys(config_from_dict(BASE))
    assert [issue.path for issue in issues] == ["generation.backend"] and "cost model" in issues[0].rule
