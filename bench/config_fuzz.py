"""Config fuzzing: hostile configs and data through ``groupwise config check`` and ``train``, counted by outcome.

    .venv/bin/python bench/config_fuzz.py                                # 600 cases in process + 60 processes
    .venv/bin/python bench/config_fuzz.py --cases 40 --processes 0       # about what tests/test_config_fuzz.py runs
    .venv/bin/python bench/config_fuzz.py --record bench/RESULTS.md      # also append a "Config fuzz" section

Every case starts from a valid tiny config and applies one mutation class, chosen round-robin
(``bench/config_fuzz_cases.py`` lists them). A case of every class but ``value`` must be refused. Outcomes: **ok**
(exit 0), **clean error** (exit 2, no traceback, the expected key named), **run failed** (``train`` only: exit 1, a
run that started and stopped with a named runtime failure), **unnamed** (exit 2 without the key), **traceback** (an
exception escaped, "Traceback" printed, or another exit code), **silently accepted** (a case that must be refused
started or passed), **hang** (past ``--timeout``). The goal is zero in the last four. ``--processes N`` runs N cases
as real ``groupwise`` processes, and ``--train`` runs ``groupwise train`` instead of ``config check`` for those (a
refused case must leave no run directory).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import date
from pathlib import Path

from config_fuzz_cases import CLASSES, Case, make_case, write_case

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("ok", "clean error", "run failed", "unnamed", "traceback", "silently accepted", "hang")
ACCEPTABLE = ("ok", "clean error", "run failed")


def classify(case: Case, code: int | None, output: str) -> str:
    """The outcome of one case from its exit code (None: it hung) and everything it printed."""
    if code is None:
        return "hang"
    if code not in (0, 1, 2) or "Traceback" in output:
        return "traceback"
    if code in (0, 1):  # 1: train started and stopped with a named runtime failure (dynamic sampling exhausted, say)
        return "silently accepted" if case.must_refuse else ("ok" if code == 0 else "run failed")
    return "clean error" if case.key is None or case.key in output else "unnamed"


class _Hang(BaseException):
    pass


def run_in_process(case: Case, workdir: Path, timeout_s: float, command: str = "check") -> tuple[str, str]:
    """Run ``groupwise config check`` (or ``train``) through ``main`` in this process; ``(outcome, output)``."""
    from groupwise.cli.main import main

    config = write_case(case, workdir)
    args = ["config", "check", str(config)] if command == "check" else ["train", str(config)]
    out, err = io.StringIO(), io.StringIO()

    def on_alarm(signum, frame):
        raise _Hang()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    code: int | None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*args, *case.overrides])
    except _Hang:
        code = None
    except BaseException as exc:  # an exception escaping main is what a user would see as a traceback
        code, err = -1, io.StringIO(f"Traceback (escaped main): {type(exc).__name__}: {exc}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    output = out.getvalue() + err.getvalue()
    return classify(case, code, output), output


def run_as_process(case: Case, workdir: Path, timeout_s: float, command: str = "check") -> tuple[str, str]:
    """Run a real ``groupwise`` process; a refused ``train`` case must also leave no run directory."""
    config = write_case(case, workdir)
    args = ["config", "check", str(config)] if command == "check" else ["train", str(config)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    try:
        result = subprocess.run([sys.executable, "-m", "groupwise.cli", *args, *case.overrides], cwd=workdir,
                                env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "hang", ""
    output = result.stdout + result.stderr
    outcome = classify(case, result.returncode, output)
    if command == "train" and result.returncode == 2 and (workdir / "runs" / "fuzz").exists():
        outcome, output = "traceback", output + "\n(a refused train left its run directory)"
    return outcome, output


def fuzz(cases: int, processes: int, seed: int, timeout_s: float, command: str = "check",
         classes: tuple[str, ...] = CLASSES) -> list[tuple[Case, str]]:
    """Run ``cases`` cases in process and ``processes`` as real processes, over ``classes`` in turn; every
    (case, outcome)."""
    rng = random.Random(f"config-fuzz|{seed}")
    results: list[tuple[Case, str]] = []
    for index in range(cases + processes):
        kind = classes[index % len(classes)]
        with tempfile.TemporaryDirectory(prefix="groupwise-fuzz-") as tmp:
            workdir = Path(tmp)
            case = make_case(kind, rng, workdir)
            runner = run_in_process if index < cases else run_as_process
            outcome, output = runner(case, workdir, timeout_s, command if index >= cases else "check")
        results.append((case, outcome))
        if outcome not in ACCEPTABLE:
            print(f"case {index} {case.kind} [{case.variant[:60]!r}]: {outcome}\n{output[-2000:]}", flush=True)
    return results


def counts_table(results: list[tuple[Case, str]]) -> str:
    by_kind: dict[str, Counter] = {}
    for case, outcome in results:
        by_kind.setdefault(case.kind, Counter())[outcome] += 1
    header = "| class | tried | " + " | ".join(OUTCOMES) + " |"
    lines = [header, "|" + "---|" * (len(OUTCOMES) + 2)]
    total: Counter = Counter()
    for kind in CLASSES:
        counter = by_kind.get(kind, Counter())
        total.update(counter)
        lines.append(f"| {kind} | {sum(counter.values())} | " + " | ".join(str(counter[o]) for o in OUTCOMES) + " |")
    lines.append(f"| **all** | {sum(total.values())} | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    return "\n".join(lines)


def bad_outcomes(results: list[tuple[Case, str]]) -> int:
    return sum(outcome not in ACCEPTABLE for _, outcome in results)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return "CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=600, help="cases run in this process (config check)")
    parser.add_argument("--processes", type=int, default=60, help="cases run as real groupwise processes")
    parser.add_argument("--train", action="store_true", help="the processes run `groupwise train`, not config check")
    parser.add_argument("--classes", default=",".join(CLASSES), help="comma-separated mutation classes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before a case counts as a hang (default 30; 180 with --train, which imports "
                        "torch and trains a step in each process)")
    parser.add_argument("--record", type=Path, default=None, help="append a Config fuzz section to this file")
    args = parser.parse_args(argv)
    start = time.monotonic()
    classes = tuple(args.classes.split(","))
    unknown = sorted(set(classes) - set(CLASSES))
    if unknown:
        parser.error(f"unknown classes {unknown}; choose from {', '.join(CLASSES)}")
    timeout = args.timeout if args.timeout is not None else (180.0 if args.train else 30.0)
    results = fuzz(args.cases, args.processes, args.seed, timeout, "train" if args.train else "check", classes)
    table = counts_table(results)
    print(table)
    print(f"{len(results)} cases in {time.monotonic() - start:.0f} s; unnamed, tracebacks, silently accepted or hangs: "
          f"{bad_outcomes(results)}")
    if args.record is not None:
        command = "python bench/config_fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with args.record.open("a", encoding="utf-8") as handle:
            handle.write(f"\n## Config fuzz ({date.today().isoformat()})\n\nCommand: `{command}`  \n"
                         f"Machine: {os.cpu_count()}-core {_cpu_model()}, no GPU.\n\n{table}\n")
    return 0 if bad_outcomes(results) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
