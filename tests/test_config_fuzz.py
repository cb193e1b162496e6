"""The config fuzz tier (bench/config_fuzz.py): hostile configs and data files through ``groupwise config check``.

Invariants pinned, for every mutation class (YAML bounds, duplicate keys, YAML 1.1 numbers, bad run names, seeds and
paths, bad JSONL lines, broken rewards, more prompts per step than the dataset, hostile JSONL input (deep nesting,
lone surrogates, huge integers), values whose training arithmetic overflows, what ``train`` used to refuse only
after ``config check`` passed (verifier kwargs, unreadable answers, /proc, CUDA, broken or custom-code model
folders), settings that make training meaningless, random values at valid keys):
- the outcome is exit 0 or a clean error (exit 2, no traceback, the expected key named), never a traceback, never a
  hang (each case has a 60 s alarm: a busy machine must not make a slow case look like a hang); ``train`` may
  also stop with a named runtime failure (exit 1);
- a case of a class that must be refused is never silently accepted (exit 0, or a train that started).

The default tier runs 40 hypothesis-drawn cases in process (the dict-level mutation test of valid configs lives in
tests/test_config_load.py). The slow tier runs 400 cases in process, 20 as real ``groupwise config check``
processes and 10 as real ``groupwise train`` processes (a refused train must leave no run directory).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from bench_modules import load_bench_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = load_bench_module("config_fuzz.py")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FUZZ.CLASSES), st.integers(0, 2**32))
def test_a_fuzzed_config_is_accepted_or_refused_cleanly(kind, seed):
    with tempfile.TemporaryDirectory(prefix="groupwise-fuzz-") as tmp:
        case = FUZZ.make_case(kind, random.Random(seed), Path(tmp))
        outcome, output = FUZZ.run_in_process(case, Path(tmp), timeout_s=60)
    assert outcome in FUZZ.ACCEPTABLE, f"{case.kind} [{case.variant[:80]}]: {outcome}\n{output[-3000:]}"


def test_the_counts_table_adds_up():
    case = FUZZ.Case("seed", "2^64", "")
    results = [(case, "clean error"), (case, "traceback"), (FUZZ.Case("value", "x", "", must_refuse=False), "ok")]
    table = FUZZ.counts_table(results)
    assert "| seed | 2 | 0 | 1 | 0 | 0 | 1 | 0 | 0 |" in table
    assert "| **all** | 3 | 1 | 1 | 0 | 0 | 1 | 0 | 0 |" in table
    assert FUZZ.bad_outcomes(results) == 1
    assert FUZZ.classify(case, 0, "") == "silently accepted" and FUZZ.classify(case, None, "") == "hang"
    assert FUZZ.classify(case, 1, "") == "silently accepted" and FUZZ.classify(case, 3, "") == "traceback"
    assert FUZZ.classify(FUZZ.Case("value", "x", "", must_refuse=False), 1, "the run failed") == "run failed"
    assert FUZZ.classify(FUZZ.Case("seed", "", "", key="run.seed"), 2, "run.name: got") == "unnamed"


@pytest.mark.slow
def test_the_slow_tier_finds_no_traceback_hang_or_silent_acceptance():
    results = FUZZ.fuzz(cases=400, processes=20, seed=1, timeout_s=60)
    results += FUZZ.fuzz(cases=0, processes=10, seed=2, timeout_s=120, command="train")
    assert FUZZ.bad_outcomes(results) == 0, FUZZ.counts_table(results)
