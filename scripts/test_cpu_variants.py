"""Run the numerics tests under CPU settings other CI machines may have, and list what breaks.

    python scripts/test_cpu_variants.py [--python .venv/bin/python] [--baseline] [--variant NAME ...] [-- PYTEST ARGS]

CI runs on whichever machine is free (AMD EPYC with AVX2, Intel Xeon with AVX-512), and torch picks its kernels
per machine. A test that compares floats exactly between two computations whose batch composition, padding or
kernels differ can pass on one and fail on the other. This script reruns the tests marked ``numerics`` (not
``slow``) with settings that change the kernels on this machine:

* ``isa-default``: ``ATEN_CPU_CAPABILITY=default``, ATen's plain (non-vectorised) kernels instead of the
  machine's best (AVX2 / AVX-512); the script checks that torch reports the change;
* ``blas-compatible``: ``MKL_CBWR=COMPATIBLE``, MKL's conditional-numerical-reproducibility mode, another
  matrix-multiply code path;
* ``threads-2``: two intra-op threads instead of the suite's one (``GROUPWISE_TEST_THREADS=2``, read by
  ``tests/conftest.py``), which changes how reductions are split.

It prints one table row per setting and the tests that failed under it. Exit code 0 when every setting passed.
A failure here that ``make test`` does not show is a comparison that depends on the CPU: compare token ids
exactly and floats with a stated tolerance, unless the claim is bit-exactness on identical inputs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "isa-default": {"ATEN_CPU_CAPABILITY": "default"},
    "blas-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "threads-2": {"GROUPWISE_TEST_THREADS": "2"},
}
BASELINE = {"baseline": {}}
CAPABILITY = "import torch; print(torch.backends.cpu.get_cpu_capability())"


def run_variant(python: str, name: str, settings: dict[str, str], pytest_args: list[str]) -> dict:
    env = {**os.environ, **settings}
    capability = subprocess.run([python, "-c", CAPABILITY], env=env, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        command = [python, "-m", "pytest", "-q", "-m", "numerics and not slow", "-p", "no:cacheprovider",
                   f"--junitxml={report}", *pytest_args]  # fmt: skip
        print(f"== {name}: {' '.join(f'{k}={v}' for k, v in settings.items()) or '(as configured)'}", flush=True)
        start = time.monotonic()
        subprocess.run(command, env=env, cwd=ROOT, check=False)
        seconds = time.monotonic() - start
        cases = ET.parse(report).getroot().iter("testcase") if report.exists() else []
        failed, passed, skipped = [], 0, 0
        for case in cases:
            test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(test_id)
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    return {"name": name, "settings": settings, "capability": capability.stdout.strip(), "passed": passed,
            "skipped": skipped, "failed": failed, "seconds": seconds}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the environment to test")
    parser.add_argument("--baseline", action="store_true", help="also run once as configured, for comparison")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="only these settings")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest after --, e.g. -- -k engine")
    args = parser.parse_args()
    chosen = {name: VARIANTS[name] for name in (args.variant or VARIANTS)}
    if args.baseline:
        chosen = {**BASELINE, **chosen}
    results = [run_variant(args.python, name, settings, args.pytest_args) for name, settings in chosen.items()]
    print("\n| setting | environment | torch CPU capability | passed | skipped | failed | seconds |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        environment = " ".join(f"{k}={v}" for k, v in r["settings"].items()) or "(as configured)"
        print(f"| {r['name']} | {environment} | {r['capability']} | {r['passed']} | {r['skipped']} | "
              f"{len(r['failed'])} | {r['seconds']:.0f} |")  # fmt: skip
    for r in results:
        wanted = r["settings"].get("ATEN_CPU_CAPABILITY")
        if wanted is not None and r["capability"].lower() != wanted:
            print(f"\nwarning: {r['name']} asked for ATEN_CPU_CAPABILITY={wanted} but torch reports {r['capability']}")
    broken = [r for r in results if r["failed"]]
    for r in broken:
        print(f"\nfailed under {r['name']}:")
        for test_id in r["failed"]:
            print(f"  {test_id}")
    if not broken:
        print("\nno exact comparison broke under any setting")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
