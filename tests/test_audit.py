"""`groupwise audit`: per-epoch outcomes of every dispatched prompt, and the two violations it must catch.

Invariants pinned:
- each dispatched prompt is counted once per epoch, in the category its lines decide (any `trained` line wins;
  otherwise the last line: filtered, charged, evicted/aborted, failed, discarded, pending); the dataset's other
  prompts are "never dispatched";
- a fabricated duplicate (one prompt trained by two groups in one epoch) is flagged and fails the audit, while the
  same prompt trained once in each of two epochs is fine;
- a fabricated missing fate (a retry or a requeue at resume that nothing follows) is flagged and fails the audit;
  a requeue followed by a trained attempt is fine;
- fate lines naming a prompt the dataset lacks, or a group id naming two prompts, fail the audit;
- the CLI rebuilds the dataset from the run's config.yaml (the simulator's prompts for a simulated run, async and
  sync), prints the table, and exits 0 (clean), 1 (violations) or 2 (not a run directory).
"""

from __future__ import annotations

import pytest
from test_sync_trainer import tiny_config

from groupwise.cli.main import main
from groupwise.data.registry import build_task
from groupwise.run.audit import audit_fates, prompt_outcome
from groupwise.run.fates_file import FatesWriter

DATASET = [f"p{i}" for i in range(6)]


def line(uid: str, fate: str, group_id: int, epoch: int = 0, resolution: str | None = None) -> dict:
    return {
        "group_id": group_id, "prompt_uid": uid, "epoch": epoch, "attempt": 0, "start_version": 0, "fate": fate,
        "step": 0, "resolution": resolution, "detail": "", "mode": "async", "tokens": 0,
    }  # fmt: skip


def clean_lines() -> list[dict]:
    return [
        line("p0", "trained", 0),
        line("p1", "filtered", 1, resolution="replaced"),
        line("p2", "failed", 2, resolution="retried"),
        line("p2", "trained", 3),
        line("p3", "failed", 4, resolution="charged"),
        line("p4", "pending", 5, resolution="requeued"),
        line("p4", "aborted", 6, resolution="uncharged"),
        line("p0", "trained", 7, epoch=1),
    ]


@pytest.mark.parametrize(
    ("lines", "category"),
    [
        ([("filtered", "replaced"), ("trained", None)], "trained"),
        ([("trained", None), ("pending", None)], "trained"),
        ([("filtered", "charged")], "filtered"),
        ([("failed", "retried"), ("failed", "charged")], "charged"),
        ([("failed", "uncharged")], "failed"),
        ([("failed", "fatal")], "failed"),
        ([("evicted", None)], "evicted/aborted"),
        ([("aborted", "charged")], "evicted/aborted"),
        ([("carried", None), ("discarded", None)], "discarded"),
        ([("pending", "requeued"), ("pending", None)], "pending"),
        ([("failed", "retried")], "no fate"),
        ([("trained", None), ("pending", "requeued")], "trained"),
        ([("carried", None)], "no fate"),
    ],
)
def test_the_lines_of_a_prompt_decide_its_category(lines, category):
    assert prompt_outcome([line("p0", fate, i, resolution=res) for i, (fate, res) in enumerate(lines)])[0] == category


def test_a_clean_file_counts_every_prompt_once_per_epoch():
    report = audit_fates(clean_lines(), DATASET)
    assert report.ok, report.format()
    first, second = report.epochs
    expected = {"trained": 2, "filtered": 1, "charged": 1, "evicted/aborted": 1}
    assert first.counts == {c: expected.get(c, 0) for c in first.counts}
    assert (first.dispatched, first.never_dispatched) == (5, 1)
    assert (second.counts["trained"], second.never_dispatched) == (1, 5)  # p0 once in each epoch: not a duplicate
    assert "OK: no prompt trained twice" in report.format()


def test_a_fabricated_duplicate_fails_the_audit():
    report = audit_fates([*clean_lines(), line("p1", "trained", 8)], DATASET)
    assert report.ok and report.trained_twice == 0  # p1 was filtered, then trained once: not a duplicate
    report = audit_fates([*clean_lines(), line("p2", "trained", 9)], DATASET)
    assert not report.ok and report.trained_twice == 1 and report.epochs[0].trained_twice == ["p2 (2x)"]
    assert "epoch 0: trained twice: p2 (2x)" in report.format()


def test_a_fabricated_missing_fate_fails_the_audit():
    retried = audit_fates([*clean_lines(), line("p5", "failed", 10, resolution="retried")], DATASET)
    assert not retried.ok and retried.epochs[0].no_fate == ["p5"]
    requeued = [line_ for line_ in clean_lines() if line_["group_id"] != 6]  # p4's re-dispatch never happened
    report = audit_fates(requeued, DATASET)
    assert not report.ok and report.without_fate == 1 and "dispatched without a fate: p4" in report.format()


def test_lines_that_do_not_belong_to_the_dataset_fail_the_audit():
    unknown = audit_fates([*clean_lines(), line("q9", "trained", 11)], DATASET)
    assert not unknown.ok and unknown.unknown_prompts == ["q9"]
    conflict = audit_fates([*clean_lines(), line("p5", "trained", 0)], DATASET)  # group 0 was p0's
    assert not conflict.ok and conflict.conflicting_groups == [0]


def test_cli_audits_a_run_directory_against_its_config(tmp_path, capsys):
    cfg = tiny_config(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert main(["audit", str(run_dir)]) == 2
    assert "has no config.yaml" in capsys.readouterr().err
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    uids = [p.uid for p in build_task(cfg.data.task, cfg.data, cfg.run.seed).train_prompts()]
    writer = FatesWriter(run_dir / "fates.jsonl")
    for i, uid in enumerate(uids[:3]):
        writer.write(line(uid, "trained", i))
    assert main(["audit", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and f"{len(uids) - 3}" in out.splitlines()[2]  # never dispatched, epoch 0
    writer.write(line(uids[0], "trained", 3))
    assert main(["audit", str(run_dir)]) == 1
    assert f"trained twice: {uids[0]} (2x)" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_cli_audits_a_simulated_run_against_the_simulator_prompts(tmp_path, capsys, mode):
    config = tmp_path / "sim.yaml"
    config.write_text(f"mode: {mode}\nmodel:\n  source: tiny\n" + ("loss:\n  importance_sampling: true\n"
                      if mode == "async" else ""))  # fmt: skip
    overrides = [f"run.output_dir={tmp_path}", "run.name=s", "run.max_steps=4", "logging.tensorboard=false",
                 "sim.num_prompts=100", "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4"]
    assert main(["simulate", str(config), *overrides]) == 0
    capsys.readouterr()
    assert main(["audit", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "100 training prompts" in out and out.rstrip().endswith("every dispatched prompt has a fate")
    assert "unknown prompt" not in out
