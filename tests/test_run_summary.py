"""What ``groupwise train`` and ``groupwise eval`` tell the user when they finish.

Invariants pinned:
- the summary printed at the end of a sync and of an async run states the numbers its metrics.jsonl holds,
  recomputed here from the file: steps, training time (Σ step times), held-out accuracy first → last
  evaluation with the best one and its step, trained and all-rows reward as the means of the first / last W
  steps (W = clamp(steps // 5, 1, 25)), and each group count (generated, trained, filtered, discarded; async also
  dropped, replaced, evicted, aborted) summed over steps; it names final/ and the next commands;
- the run's events.log says which intra-op thread count the run used and why (here: the OMP_NUM_THREADS the test
  session exports);
- the async run prints progress lines too, with the latest held-out accuracy;
- a run without evaluations or without final/ says so instead of inventing numbers;
- ``checkpoint.every: 0`` with ``save_final: false`` writes no checkpoint and no final/; the summary says no
  weights were written, lists only the files the run has, and every command it suggests (for this run and for a
  run with final/) exits 0 on that run directory;
- ``groupwise eval RUN`` prints a table (weights, prompts, accuracy with the count of correct prompts, pass@k)
  whose accuracy is the run's final evaluation of the same weights, and ``--json`` prints the same numbers.
"""

from __future__ import annotations

import json
import os
import re

import yaml
from test_async_runtime import ready_first_async
from test_sync_trainer import tiny_config

from groupwise.cli.main import main
from groupwise.cli.run_summary import format_run_summary
from groupwise.run.metrics import read_metrics
from groupwise.run.run_stats import RunSummary

GROUP_KEYS = {
    "generated": "ds/groups_generated", "trained": "ds/groups_trained", "filtered": "ds/groups_filtered",
    "discarded": "ds/discarded_valid_groups", "dropped": "accounting/dropped_groups",
    "replaced": "accounting/replaced_groups", "evicted": "buffer/evicted_groups",
    "aborted": "buffer/aborted_inflight_groups",
}  # fmt: skip


def write_config(tmp_path, data: dict):
    path = tmp_path / f"{data['run']['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sync_data(tmp_path, name: str = "sum", steps: int = 6) -> dict:
    cfg = tiny_config(tmp_path, run={"name": name, "max_steps": steps}, eval={"every": 2, "num_prompts": 8},
                      logging={"tensorboard": False})  # fmt: skip
    return cfg.model_dump(by_alias=True)


def async_data(tmp_path) -> dict:
    data = ready_first_async(sync_data(tmp_path, name="async-sum", steps=4))
    data["loss"]["importance_sampling"] = True
    return data


def duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def check_summary_against_metrics(out: str, run_dir, mode: str) -> list[dict]:
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = max(r["step"] for r in records)
    wall = sum(r["perf/step_seconds"] for r in records if "perf/step_seconds" in r)
    head = re.search(r"run (\S+) \((\w+)\) finished: (\d+) steps in [\d:]+ \(training ([\d:]+), the sum", out)
    assert head is not None, out
    assert head.groups() == (run_dir.name, mode, str(steps), duration(wall))

    evals = [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
    assert [s for s, _ in evals] == list(range(0, steps + 1, 2))
    best = max(a for _, a in evals)
    best_step = next(s for s, a in evals if a == best)
    accuracy = re.search(r"held-out accuracy\s+(\S+) → (\S+)\s+\(step (\d+) → step (\d+); best (\S+) at step (\d+)\)",
                         out)  # fmt: skip
    assert accuracy is not None, out
    assert accuracy.groups() == (f"{evals[0][1]:.3f}", f"{evals[-1][1]:.3f}", "0", str(steps), f"{best:.3f}",
                                 str(best_step))  # fmt: skip

    window = max(1, min(25, steps // 5))
    for label, key in (("trained", "reward/trained_mean"), ("all rows", "reward/unfiltered_mean")):
        values = [r[key] for r in records if r.get(key) is not None]
        start, end = sum(values[:window]) / window, sum(values[-window:]) / window
        line = re.search(rf"reward \({label}\)\s+(\S+) → (\S+)\s+\(mean over .* of the first / last (\d+) steps\)", out)
        assert line is not None and line.groups() == (f"{start:.3f}", f"{end:.3f}", str(window)), out

    groups = re.search(r"\n  groups\s+(.*)\n", out).group(1)
    shown = {label: int(n) for n, label in (item.split(" ", 1) for item in groups.split(" · "))}
    expected = {
        label: int(sum(r[key] for r in records if key in r))
        for label, key in GROUP_KEYS.items() if any(key in r for r in records)
    }  # fmt: skip
    assert shown == expected
    assert f"trained policy     {run_dir / 'final'}" in out
    assert f"groupwise eval {run_dir}" in out and f"groupwise report {run_dir}" in out
    threads = os.environ["OMP_NUM_THREADS"]  # exported by conftest
    events = (run_dir / "events.log").read_text()
    assert f"cpu threads: {threads} (OMP_NUM_THREADS={threads} from the environment)" in events
    return records


def test_sync_summary_states_what_metrics_jsonl_says(tmp_path, capsys) -> None:
    path = write_config(tmp_path, sync_data(tmp_path))
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    records = check_summary_against_metrics(out, tmp_path / "runs" / "sum", "sync")
    assert {"generated", "trained", "filtered", "discarded"} <= set(re.search(r"groups\s+(.*)", out).group(1).split())
    assert sum(r["ds/groups_filtered"] for r in records if "ds/groups_filtered" in r) > 0


def test_async_summary_counts_its_own_fates_and_shows_progress(tmp_path, capsys) -> None:
    path = write_config(tmp_path, async_data(tmp_path))
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "async-sum"
    records = check_summary_against_metrics(out, run_dir, "async")
    for label in ("dropped", "replaced", "evicted", "aborted"):
        assert re.search(rf"\d+ {label}\b", out), label
    # progress line at the last step, with the accuracy of the latest evaluation before it (step 2)
    step_2_accuracy = next(r["eval/accuracy"] for r in records if r["step"] == 2)
    progress = next(line for line in out.splitlines() if line.startswith("step 4/4"))
    assert f"acc {step_2_accuracy:.3f}" in progress


def test_eval_of_a_run_prints_a_table_and_json_with_its_final_accuracy(tmp_path, capsys) -> None:
    path = write_config(tmp_path, sync_data(tmp_path, name="ev", steps=2))
    assert main(["train", str(path)]) == 0
    run_dir = tmp_path / "runs" / "ev"
    final_accuracy = [r["eval/accuracy"] for r in read_metrics(run_dir / "metrics.jsonl") if "eval/accuracy" in r][-1]
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    table = dict(re.match(r"^(\S.*?)\s{2,}(.*)$", line).groups() for line in capsys.readouterr().out.splitlines())
    assert table["weights"] == f"{run_dir / 'final'}  (the trained policy of run ev)"
    assert table["held-out prompts"].startswith("8  (task addition")
    correct = round(final_accuracy * 8)
    assert table["greedy accuracy"] == f"{final_accuracy:.3f}  ({correct} of 8 correct)"
    assert table["pass@k"].startswith("—  (eval.pass_k is 1")
    assert main(["eval", str(run_dir), "eval.pass_k=2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["weights"] == str(run_dir / "final") and result["num_prompts"] == 8
    assert result["eval/accuracy"] == final_accuracy and 0.0 <= result["eval/pass_at_k"] <= 1.0


def test_a_run_without_evaluations_or_final_says_so(tmp_path) -> None:
    summary = RunSummary(name="bare", mode="sync", steps=3, accuracy=None, final_pass_at_k=None,
                         trained_reward=None, unfiltered_reward=None, zero_variance_fraction=None,
                         wall_seconds=12.0, groups={"generated": 12, "trained": 12})  # fmt: skip
    text = format_run_summary(summary, tmp_path / "bare", command_seconds=20.0)
    assert "run bare (sync) finished: 3 steps in 0:00:20 (training 0:00:12" in text
    assert "held-out accuracy  — (no evaluation ran" in text
    assert "reward (trained)   — (not logged)" in text
    assert "groups             12 generated · 12 trained" in text
    assert "trained policy     not saved (checkpoint.save_final is false and checkpoint.every is 0" in text
    assert "groupwise eval" not in text  # it evaluates final/, which this run does not have


def suggested_commands(out: str) -> list[list[str]]:
    """The commands under the summary's ``next:`` line, as argument lists (the description after them dropped)."""
    lines = out.split("\nnext:\n", 1)[1].splitlines()
    return [line.split("  ")[1].split()[1:] for line in lines if line.startswith("  groupwise ")]


def test_a_run_that_keeps_nothing_writes_no_checkpoint_and_suggests_only_what_works(tmp_path, capsys) -> None:
    data = sync_data(tmp_path, name="nothing", steps=2)
    data["checkpoint"] = {"every": 0, "save_final": False}
    assert main(["train", str(write_config(tmp_path, data))]) == 0
    out = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "nothing"
    assert not (run_dir / "final").exists()
    assert not list(run_dir.glob("checkpoints/step_*"))
    assert "trained policy     not saved (checkpoint.save_final is false and checkpoint.every is 0: no weights" in out
    files = re.search(r"run files\s+\S+/  \((.*)\)", out).group(1).split(", ")
    assert files == ["metrics.jsonl", "events.log", "fates.jsonl", "train_data/"]
    commands = suggested_commands(out)
    assert [command[0] for command in commands] == ["report"]
    for command in commands:
        assert main(command) == 0, command


def test_every_command_the_summary_suggests_works(tmp_path, capsys) -> None:
    data = sync_data(tmp_path, name="kept", steps=2)
    data["checkpoint"] = {"every": 1, "save_final": False}
    assert main(["train", str(write_config(tmp_path, data))]) == 0
    out = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "kept"
    assert f"not saved (checkpoint.save_final is false); the last checkpoint is {run_dir / 'checkpoints' / 'step_2'}" \
        in out
    assert [command[0] for command in suggested_commands(out)] == ["report"]

    data = sync_data(tmp_path, name="final", steps=2)
    assert main(["train", str(write_config(tmp_path, data))]) == 0
    commands = suggested_commands(capsys.readouterr().out)
    assert [command[0] for command in commands] == ["eval", "report"]
    for command in commands:
        assert main(command) == 0, command
