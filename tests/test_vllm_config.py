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
  install (``groupwise[vllm]``, ``make test-vllm``), without a traceback, and says that the
  ``generation.vllm.engine_args`` names could not be checked;
- where vllm is installed (here a fake ``vllm.engine.arg_utils`` with EngineArgs/AsyncEngineArgs dataclasses), an
  ``engine_args`` name that is a field of neither is an error naming ``generation.vllm.engine_args.<name>`` (exit 2,
  the closest field suggested), names of either pass, and a vLLM that fails to import makes it a warning only.
"""

from __future__ import annotations

import dataclasses
import sys
import types

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


@pytest.mark.skipif(vllm_unavailable() is None, reason="vllm is installed here: nothing is missing")
def test_engine_args_without_vllm_are_said_to_be_unchecked(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"source": "tiny"}, "run": {"output_dir": str(tmp_path / "runs")},
                                    "generation": {"backend": "vllm", "vllm": {"engine_args": {"no_such_arg": 1}}}}))
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("generation.vllm.engine_args ['no_such_arg'] could not be checked against vLLM's engine arguments "
            "without it either") in err


@dataclasses.dataclass
class FakeEngineArgs:
    model: str = ""
    enable_prefix_caching: bool = False
    quantization: str | None = None


@dataclasses.dataclass
class FakeAsyncEngineArgs(FakeEngineArgs):
    enable_log_requests: bool = False


@pytest.fixture
def fake_vllm(monkeypatch):
    """An installed vLLM as far as the check can tell: its EngineArgs dataclasses, nothing else."""
    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.EngineArgs = FakeEngineArgs
    arg_utils.AsyncEngineArgs = FakeAsyncEngineArgs
    for name, module in {"vllm": types.ModuleType("vllm"), "vllm.engine": types.ModuleType("vllm.engine"),
                         "vllm.engine.arg_utils": arg_utils}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr("groupwise.trainer.backend_checks.vllm_unavailable", lambda: None)
    return arg_utils


def engine_args_config(tmp_path, engine_args: dict):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"source": "tiny"}, "run": {"output_dir": str(tmp_path / "runs")},
                                    "generation": {"backend": "vllm", "vllm": {"engine_args": engine_args}}}))
    return path


def test_unknown_engine_args_are_refused_when_vllm_is_installed(tmp_path, capsys, fake_vllm):
    path = engine_args_config(tmp_path, {"no_such_arg": 1, "enable_prefix_cachin": True, "quantization": "fp8"})
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "generation.vllm.engine_args.no_such_arg" in err and "takes no argument 'no_such_arg'" in err
    assert "generation.vllm.engine_args.enable_prefix_cachin" in err and "did you mean 'enable_prefix_caching'" in err
    assert "engine_args.quantization" not in err and "Traceback" not in err
    assert main(["train", str(path)]) == 2  # before any model loads
    assert "loading the model" not in capsys.readouterr().err
    known = engine_args_config(tmp_path, {"enable_prefix_caching": True, "enable_log_requests": True})
    assert main(["config", "check", str(known)]) == 0


def test_a_vllm_that_does_not_import_leaves_engine_args_unchecked_with_a_warning(tmp_path, capsys, monkeypatch,
                                                                                 fake_vllm):
    del fake_vllm.EngineArgs  # the import of EngineArgs fails, as in a broken install
    path = engine_args_config(tmp_path, {"no_such_arg": 1})
    assert main(["config", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "warning: generation.vllm.engine_args" in err and "could not be checked" in err
    assert "(1 warning(s) above)" in out
