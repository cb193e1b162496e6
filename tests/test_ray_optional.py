"""Ray is optional: everything but the Ray runtime works without it, and choosing it without Ray says how to fix it.

Invariants pinned (run in a subprocess where a meta-path hook makes ``import ray`` fail as if Ray were not
installed):
- every groupwise module outside the ``groupwise.runtime.ray`` subpackage imports, and none of them imports ``ray``;
  so do the subpackage itself and its ``errors`` (what the CLI catches);
- importing the Ray runtime raises ``RayNotInstalledError`` carrying the install command;
- ``groupwise train CONFIG runtime.backend=ray`` exits 2 with the install command, without a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

INSTALL_COMMAND = "pip install 'groupwise[ray]'"

SCRIPT = r"""
import importlib, importlib.abc, io, json, pkgutil, sys, contextlib

class BlockRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, BlockRay())
import groupwise

RAY_RUNTIME = "groupwise.runtime.ray."
names = sorted(m.name for m in pkgutil.walk_packages(groupwise.__path__, "groupwise."))
core = [n for n in names if not n.startswith(RAY_RUNTIME) or n == "groupwise.runtime.ray.errors"]
failed = {}
for name in core:
    try:
        importlib.import_module(name)
    except Exception as err:
        failed[name] = repr(err)
result = {"imported": len(core) - len(failed), "failed": failed, "ray_loaded": "ray" in sys.modules}
try:
    importlib.import_module("groupwise.runtime.ray.session")
    result["ray_runtime_error"] = None
except Exception as err:
    result["ray_runtime_error"] = [type(err).__name__, str(err)]

from groupwise.cli.main import main
stderr = io.StringIO()
with contextlib.redirect_stderr(stderr):
    result["cli_exit"] = main(["train", sys.argv[1], "runtime.backend=ray"])
result["cli_stderr"] = stderr.getvalue()
print(json.dumps(result))
"""


def test_everything_but_the_ray_runtime_works_without_ray(tmp_path):
    config = {
        "run": {"name": "no-ray", "output_dir": str(tmp_path / "runs"), "max_steps": 1},
        "model": {"source": "tiny", "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2}},
        "data": {"task": "addition"},
    }
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(config_file)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}
    assert result["imported"] > 50  # the whole package, not an empty walk
    assert result["ray_loaded"] is False
    error_type, message = result["ray_runtime_error"]
    assert error_type == "RayNotInstalledError" and INSTALL_COMMAND in message
    assert result["cli_exit"] == 2
    assert INSTALL_COMMAND in result["cli_stderr"] and "Traceback" not in result["cli_stderr"]
    assert not (tmp_path / "runs" / "no-ray").exists()  # a refused start leaves nothing behind


def test_ray_extra_is_declared():
    """The install command in the error must actually install Ray."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["ray"]
    assert any(requirement.startswith("ray") for requirement in extra)
    assert not any(requirement.startswith("ray") for requirement in pyproject["project"]["dependencies"])
