"""How long ``groupwise config check`` takes on every shipped example, each in a fresh process.

    .venv/bin/python bench/config_check.py [--repeats 5] [--quick]

Each example is checked ``--repeats`` times by ``python -m groupwise.cli config check FILE`` from the repository
root; the table gives the best and the median wall time, the CPU time of the best run (user + system, the
child's ``resource`` usage), and whether the check imported torch (it should not: a check reads the config, the
task, the reward and the paths, never the model). The target is under 3 s on every example. ``--quick`` checks two
examples once (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 3.0
# Runs the check in the child and says whether torch got imported, on its last line.
CHILD = ("import sys; from groupwise.cli.main import main; code = main(['config', 'check', sys.argv[1]]); "
         "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(code)")  # fmt: skip


def check_once(path: Path) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, the child's torch line) of one check in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(path.relative_to(ROOT))], cwd=ROOT, capture_output=True,
                          text=True, check=False, env=dict(os.environ))  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"config check {path} failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two examples, once each")
    args = parser.parse_args()
    examples = sorted(ROOT.glob("examples/**/*.yaml"))
    if args.quick:
        examples, args.repeats = [ROOT / "examples" / "addition.yaml", ROOT / "examples" / "smollm2_countdown.yaml"], 1
    print(f"| example | best s | median s | CPU s (best run) | torch | under {TARGET_S:g} s |")
    print("|---|---|---|---|---|---|")
    for path in examples:
        runs = [check_once(path) for _ in range(args.repeats)]
        best = min(runs)
        median = statistics.median(wall for wall, _, _ in runs)
        print(f"| {path.relative_to(ROOT)} | {best[0]:.2f} | {median:.2f} | {best[1]:.2f} | {best[2]} | "
              f"{'yes' if best[0] < TARGET_S else 'NO'} |")  # fmt: skip


if __name__ == "__main__":
    main()
