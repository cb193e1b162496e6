"""The install scripts choose PyTorch's build by the machine, without installing anything here.

Invariants pinned (``scripts/install_torch.sh`` run against a fake python that records its pip calls, and a fake
``nvidia-smi``):
- without a CUDA GPU, torch==2.13.0 is installed from PyTorch's CPU wheel index (``--index-url``), and only where
  that install fails (the index cannot be reached) from the configured index, plainly;
- with a CUDA GPU, pip's default build is installed, the CPU index never asked;
- ``scripts/install.sh`` and ``scripts/install_trl.sh`` both install PyTorch through it, before anything else.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def fake_machine(tmp_path: Path, gpu: bool, cpu_index_reachable: bool) -> tuple[Path, Path]:
    """A fake python (logging each call's arguments; a pip install with the CPU index fails unless reachable) and a
    fake nvidia-smi (listing a GPU or failing)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> "{log}"\n'
        f'if [[ "$*" == *"{CPU_INDEX}"* ]]; then exit {0 if cpu_index_reachable else 1}; fi\n'
        "exit 0\n"
    )
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/bash\nexit {0 if gpu else 9}\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return python, log


@pytest.mark.parametrize("gpu, reachable, expected", [
    (False, True, [f"-m pip install -q --retries 1 --timeout 20 --index-url {CPU_INDEX} torch==2.13.0"]),
    (False, False, [f"-m pip install -q --retries 1 --timeout 20 --index-url {CPU_INDEX} torch==2.13.0",
                    "-m pip install -q torch==2.13.0"]),
    (True, True, ["-m pip install -q torch==2.13.0"]),
])  # fmt: skip
def test_pytorch_is_installed_by_the_kind_of_machine(tmp_path, gpu, reachable, expected):
    python, log = fake_machine(tmp_path, gpu, reachable)
    env = {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install_torch.sh"), str(python)], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[:-1] == expected and calls[-1].startswith("-c import torch")  # then it says what it installed
    says = {(False, True): "no CUDA GPU: installed torch==2.13.0 with --index-url",
            (False, False): f"no CUDA GPU, and {CPU_INDEX} cannot be reached: installing torch==2.13.0 from the "
                            "configured index",
            (True, True): "CUDA GPU found: installing pip's default PyTorch build"}[(gpu, reachable)]  # fmt: skip
    assert says in done.stdout


@pytest.mark.parametrize("script", ["install.sh", "install_trl.sh"])
def test_both_environments_install_pytorch_through_the_one_script_first(script):
    lines = (ROOT / "scripts" / script).read_text().splitlines()
    steps = [line for line in lines if not line.startswith("#") and "install" in line]
    assert steps[0] == 'bash "$(dirname "$0")/install_torch.sh" "$venv/bin/python"', steps
