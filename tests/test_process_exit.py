"""The ``groupwise`` process ends within seconds of its last line, whatever its teardown would wait for.

Invariants pinned:
- a finished command whose interpreter teardown hangs (a thread a library left running and never ends, an exit
  handler that blocks) still ends, with the command's exit code, within ``GROUPWISE_EXIT_GRACE_S`` of its end,
  and everything it printed before reaches its output;
- a command whose teardown is quick ends at once with its code (the watchdog never waits for its grace);
- the console script itself (``groupwise config check``) ends with its code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HANGING_TEARDOWN = """
import atexit, threading, time
from groupwise.abandoned import exit_process
threading.Thread(target=time.sleep, args=(600,), name="a-library-thread").start()  # not a daemon: joined at exit
atexit.register(time.sleep, 600)
print("summary: done", flush=True)
exit_process(3)
"""
QUICK_TEARDOWN = """
from groupwise.abandoned import exit_process
print("summary: done", flush=True)
exit_process(4)
"""


def run_python(code: str, grace_s: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "GROUPWISE_EXIT_GRACE_S": grace_s}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return done, time.perf_counter() - start


@pytest.mark.parametrize("code, grace, exit_code, at_most_s", [
    (HANGING_TEARDOWN, "1", 3, 30.0),  # the teardown would wait 600 s: the grace ends it
    (QUICK_TEARDOWN, "300", 4, 60.0),  # nothing to wait for: it does not sit out the grace
])  # fmt: skip
def test_a_finished_command_ends_within_its_grace_with_its_code(code, grace, exit_code, at_most_s):
    done, seconds = run_python(code, grace)
    assert done.returncode == exit_code, done.stderr
    assert done.stdout == "summary: done\n"
    assert seconds < at_most_s  # the import of groupwise and Python's own start are most of it


def test_the_console_script_ends_with_its_code(tmp_path):
    done = subprocess.run(
        [str(Path(sys.executable).parent / "groupwise"), "config", "check", str(ROOT / "examples" / "addition.yaml")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
