"""Fuzz round: drive the real controller through randomised schedules and simulated runs, and count the outcomes.

    .venv/bin/python bench/fuzz.py                                   # 2,000 controller + 2,000 simulator examples
    .venv/bin/python bench/fuzz.py --controller 250 --sim 300        # the size of the CI tiers
    .venv/bin/python bench/fuzz.py --record bench/RESULTS.md         # also append a "Fuzz" section there

The scenarios and checks are those of the test suite's fuzz tiers (``tests/test_controller_fuzz.py``: scripted
latencies, filters, data and infra failures and failing optimizer steps over every sampler; ``tests/test_sim_fuzz.py``:
the simulator's workloads). Hypothesis generates the examples (no shrinking, no example database); each one is
classified by the module's ``classify``:

* **completed** — the run finished, every invariant held;
* **clean error** — it stopped with a named error (a floor broken, a failure budget spent, weight_fifo's stall, ...);
* **traceback** — any other exception: a bug;
* **silently accepted** — it finished (or stopped) but its records are wrong: an unbalanced ledger, a ``trained``
  fate for a step whose optimizer step never ran, a group trained twice;
* **hang** — it ran into its virtual-time bound (or stalled with a sampler that must not stall);
* **data lost** — a dispatched attempt or prompt without its fate.

The goal is zero in the last four columns. Examples of each finding are printed (``--show``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ("completed", "clean error", "traceback", "false record", "hang", "data lost")
FINDINGS = ("traceback", "false record", "hang", "data lost")
TIERS = {"controller": "test_controller_fuzz.py", "sim": "test_sim_fuzz.py"}


def load_tier(name: str) -> Any:
    """Import a fuzz module of the test suite (its ``scenarios`` strategy and ``classify``)."""
    tests = REPO / "tests"
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))  # the fakes package
    spec = importlib.util.spec_from_file_location(f"groupwise_fuzz_{name}", tests / TIERS[name])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_tier(name: str, examples: int, seed: int, show: int) -> tuple[Counter[str], list[str], float]:
    """Classify ``examples`` hypothesis examples of one tier: (counts, shown findings, seconds)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    module = load_tier(name)
    counts: Counter[str] = Counter()
    shown: list[str] = []

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(module.scenarios())
    def classify(scenario: Any) -> None:
        outcome = module.classify(scenario)
        counts[outcome] += 1
        if outcome in FINDINGS and len(shown) < show:
            shown.append(f"{name}: {outcome}: {scenario!r}"[:2000])

    start = time.perf_counter()
    classify()
    return counts, shown, time.perf_counter() - start


def table(rows: dict[str, Counter[str]]) -> str:
    header = "| tier | tried | completed | clean errors | tracebacks | silently accepted | hangs | data lost |"
    lines = [header, "|" + "---|" * 8]
    for name, counts in rows.items():
        cells = [str(counts[column]) for column in COLUMNS]
        lines.append(f"| {name} | {sum(counts.values())} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--controller", type=int, default=2000, help="examples of the scripted-controller tier")
    parser.add_argument("--sim", type=int, default=2000, help="examples of the simulator tier")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=5, help="findings printed per tier")
    parser.add_argument("--record", type=Path, default=None, help="append a Fuzz section to this markdown file")
    args = parser.parse_args(argv)
    rows: dict[str, Counter[str]] = {}
    total_s = 0.0
    for name, examples in (("controller", args.controller), ("sim", args.sim)):
        if examples <= 0:
            continue
        counts, shown, seconds = run_tier(name, examples, args.seed, args.show)
        rows[name], total_s = counts, total_s + seconds
        print(f"{name}: {dict(counts)} in {seconds:.0f} s", flush=True)
        for line in shown:
            print("  " + line)
    text = table(rows)
    print(text)
    if args.record is not None:
        command = "python bench/fuzz.py " + " ".join(sys.argv[1:] if argv is None else argv)
        with args.record.open("a", encoding="utf-8") as handle:
            handle.write(f"\n## Fuzz round ({date.today().isoformat()})\n\nCommand: `{command}`  \nMachine: 2-core "
                         f"CPU, no GPU, shared with other jobs ({total_s:.0f} s).\n\n{text}\n")  # fmt: skip
    return 0 if not any(counts[f] for counts in rows.values() for f in FINDINGS) else 1


if __name__ == "__main__":
    sys.exit(main())
