"""A process started by ``multiprocessing`` ends with its parent (``groupwise.runtime.parent_watch``).

Invariants pinned:
- a spawned child that called ``exit_with_parent`` ends within 5 s of its parent's SIGKILL, though it was busy
  (sleeping 600 s), as every learner rank does; one that did not is still running then (the check can fail);
- a process without a ``multiprocessing`` parent has nothing to watch (``exit_with_parent`` returns False).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groupwise.runtime.parent_watch import exit_with_parent

TESTS = Path(__file__).resolve().parent
# The parent: spawns the child, prints its pid once the child is watching, then waits to be killed.
PARENT = """
import multiprocessing as mp, sys, time
import orphan_child
if __name__ == "__main__":
    context = mp.get_context("spawn")
    mine, theirs = context.Pipe()
    child = context.Process(target=getattr(orphan_child, sys.argv[1]), args=(theirs,), daemon=True)
    child.start()
    watching = mine.recv()
    print(child.pid, watching, flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def orphan_lifetime(target: str, limit_s: float) -> float:
    """Seconds the child of a SIGKILLed parent lives on (``limit_s`` when it outlives that; then it is killed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, target], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pid = int(parent.stdout.readline().split()[0])
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    killed = time.monotonic()
    while alive(pid) and time.monotonic() - killed < limit_s:
        time.sleep(0.05)
    lived = time.monotonic() - killed
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        return limit_s
    return lived


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_watching_child_ends_with_its_killed_parent():
    assert orphan_lifetime("watched_sleep", limit_s=5.0) < 5.0
    assert orphan_lifetime("unwatched_sleep", limit_s=2.0) == 2.0  # without the watch it would live on


def test_without_a_multiprocessing_parent_there_is_nothing_to_watch():
    assert exit_with_parent() is False
