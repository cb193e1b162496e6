"""Metrics sinks and progress display.

- metrics.jsonl holds one JSON object per step, with exactly the logged values, steps strictly increasing;
  a second log for the last step merges into its line; going back or re-logging a value differently raises.
- Unknown keys and non-numbers are refused with the fix in the message; a key in an open namespace
  (``loss/plugin/<name>``, a plug-in loss's own metric) is accepted for a name of ``[a-z0-9_]`` only; NaN becomes
  null (strict JSON) and is noted in events.log.
- ``truncate_after(step)`` drops later lines so a resumed run continues without gaps or duplicates,
  in metrics.jsonl and in TensorBoard (read back with the event accumulator).
- A torn last line (crash mid-write) is ignored; a corrupted middle line is an error.
- Every key of ``METRIC_KEYS`` and every open namespace is defined exactly once in docs/metrics.md, and nothing
  else is.
- Progress: a rich bar on a terminal; elsewhere (or with progress off) a compact line every N steps with
  the step's figures, the latest held-out accuracy (kept from the last step that had one, or the evaluation
  before training) and an ETA at this session's pace; ``groupwise sft`` prints the same lines with its loss and
  held-out accuracy.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest
from rich.console import Console

from groupwise.run.metric_keys import METRIC_KEYS, METRIC_NAMESPACES
from groupwise.run.metrics import MetricsWriter, read_metrics
from groupwise.run.progress import RunProgress
from groupwise.run.rundir import RunDir

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path, "exp", "a: 1\n", resume=False)


def test_one_line_per_step_with_the_logged_values(run: RunDir) -> None:
    writer = MetricsWriter(run, tensorboard=False)
    logged = {s: {"reward/trained_mean": 0.1 * s, "ds/groups_generated": 3 * s, "ds/gen_rounds": s} for s in (1, 2, 3)}
    for step, metrics in logged.items():
        writer.log(step, metrics)
    lines = run.metrics_path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": s, **m} for s, m in logged.items()]
    assert read_metrics(run.metrics_path) == [{"step": s, **m} for s, m in logged.items()]


def test_same_step_merges_and_backwards_is_refused(run: RunDir) -> None:
    writer = MetricsWriter(run, tensorboard=False)
    writer.log(0, {"eval/accuracy": 0.1})
    writer.log(1, {"step": 1, "loss/total": 2.5})
    writer.log(1, {"eval/accuracy": 0.4})  # end-of-run eval on the last step
    assert read_metrics(run.metrics_path) == [
        {"step": 0, "eval/accuracy": 0.1},
        {"step": 1, "loss/total": 2.5, "eval/accuracy": 0.4},
    ]
    with pytest.raises(ValueError, match="loss/total"):
        writer.log(1, {"loss/total": 9.0})
    with pytest.raises(ValueError, match="step 0 come after step 1"):
        writer.log(0, {"loss/total": 1.0})
    with pytest.raises(ValueError, match="metrics\\['step'\\]"):
        writer.log(2, {"step": 3})


def test_bad_keys_and_values_are_refused(run: RunDir) -> None:
    writer = MetricsWriter(run, tensorboard=False)
    with pytest.raises(ValueError, match="reward/trained_maen.*METRIC_KEYS.*docs/metrics.md"):
        writer.log(1, {"reward/trained_maen": 1.0})
    with pytest.raises(TypeError, match=r"\.item\(\)"):
        writer.log(1, {"loss/total": "1.0"})
    with pytest.raises(ValueError, match="unknown metric key 'loss/plugin/Bad-Name'"):
        writer.log(1, {"loss/plugin/Bad-Name": 1.0})
    with pytest.raises(ValueError, match="unknown metric key 'loss/plugin/'"):
        writer.log(1, {"loss/plugin/": 1.0})
    assert not run.metrics_path.exists()
    writer.log(1, {"loss/plugin/advantage_abs": 0.5})
    assert read_metrics(run.metrics_path) == [{"step": 1, "loss/plugin/advantage_abs": 0.5}]
    run.metrics_path.unlink()
    free = MetricsWriter(run, tensorboard=False, known_keys=None)
    free.log(1, {"custom/thing": 2})
    assert read_metrics(run.metrics_path) == [{"step": 1, "custom/thing": 2}]


def test_non_finite_values_become_null_and_an_event(run: RunDir) -> None:
    writer = MetricsWriter(run, tensorboard=False)
    writer.log(1, {"reward/trained_mean": math.nan, "loss/total": 0.5})
    line = run.metrics_path.read_text()
    assert "NaN" not in line
    assert json.loads(line) == {"step": 1, "reward/trained_mean": None, "loss/total": 0.5}
    assert "reward/trained_mean=nan" in run.events_path.read_text()


def test_truncate_after_resumes_without_gaps_or_duplicates(run: RunDir) -> None:
    writer = MetricsWriter(run, tensorboard=False)
    for step in range(1, 6):
        writer.log(step, {"loss/total": float(step)})
    resumed = MetricsWriter(run, tensorboard=False)
    with pytest.raises(ValueError, match="truncate_after"):
        resumed.log(3, {"loss/total": 30.0})
    assert resumed.truncate_after(2) == 3
    resumed.log(3, {"loss/total": 30.0})
    assert [(r["step"], r["loss/total"]) for r in read_metrics(run.metrics_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert "dropped 3 metrics line(s) after step 2" in run.events_path.read_text()


def test_torn_last_line_is_ignored_but_a_corrupted_middle_line_is_not(tmp_path: Path, caplog) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss/total": 1.0}\n{"step": 2, "loss/to')
    assert read_metrics(path) == [{"step": 1, "loss/total": 1.0}]
    assert "ignoring its torn last line 2" in caplog.text
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)


def test_a_writer_reopening_a_torn_file_drops_the_fragment_before_appending(run: RunDir) -> None:
    run.metrics_path.write_text('{"step": 1, "loss/total": 1.0}\n{"step": 2, "loss/to')
    writer = MetricsWriter(run, tensorboard=False)
    writer.log(2, {"loss/total": 2.0})
    assert read_metrics(run.metrics_path) == [{"step": 1, "loss/total": 1.0}, {"step": 2, "loss/total": 2.0}]
    assert "torn line" in run.events_path.read_text()


def test_events_are_timestamped_lines(run: RunDir) -> None:
    writer = MetricsWriter(run, tensorboard=False)
    writer.event("run started")
    writer.event("two\nlines")
    lines = run.events_path.read_text().splitlines()
    assert len(lines) == 3
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  ", line) for line in lines)
    assert [line.split("  ", 1)[1] for line in lines] == ["run started", "two", "lines"]


def test_tensorboard_holds_the_scalars_and_respects_resume(run: RunDir) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(run, tensorboard=True) as writer:
        for step in range(1, 5):
            writer.log(step, {"reward/trained_mean": step / 10, "ds/gen_rounds": step})
    assert list(run.tensorboard_dir.glob("events.out.tfevents.*"))
    with MetricsWriter(run, tensorboard=True) as writer:
        writer.truncate_after(2)
        writer.log(3, {"reward/trained_mean": 0.9, "ds/gen_rounds": 7})
    accumulator = EventAccumulator(str(run.tensorboard_dir))
    accumulator.Reload()
    reward = [(e.step, round(e.value, 6)) for e in accumulator.Scalars("reward/trained_mean")]
    assert reward == [(1, 0.1), (2, 0.2), (3, 0.9)]
    assert [(e.step, e.value) for e in accumulator.Scalars("ds/gen_rounds")] == [(1, 1), (2, 2), (3, 7)]


def test_every_metric_key_is_defined_exactly_once_in_the_docs() -> None:
    definitions = re.findall(r"^\| `([^`]+)` \|", DOCS.read_text(encoding="utf-8"), flags=re.MULTILINE)
    namespaces = [f"{namespace}<name>" for namespace in METRIC_NAMESPACES]
    counts = {key: definitions.count(key) for key in [*METRIC_KEYS, *namespaces]}
    assert {k: c for k, c in counts.items() if c != 1} == {}
    assert sorted(set(definitions) - set(METRIC_KEYS) - set(namespaces)) == []
    assert len(set(METRIC_KEYS)) == len(METRIC_KEYS)


def _fake_clock(times: list[float]):
    values = iter(times)
    return lambda: next(values)


def test_compact_lines_every_n_steps_when_not_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=300)
    clock = _fake_clock([100.0, 110.0, 120.0, 125.0])  # enter, step 2, step 4, step 5
    figures = {"reward/trained_mean": 0.5, "ds/zero_variance_fraction": 0.25, "ds/gen_rounds": 2.0}
    with RunProgress(5, run_name="exp", print_every=2, console=console, clock=clock) as progress:
        for step in range(1, 6):
            progress.update(step, {"reward/unfiltered_mean": step / 10, "perf/gen_tokens_per_s": 1234.4, **figures})
    started, *lines = out.getvalue().splitlines()
    assert started == "[exp] step 1/5 started"
    assert [line.split(" reward")[0] for line in lines] == ["[exp] step 2/5", "[exp] step 4/5", "[exp] step 5/5"]
    # ETA = elapsed / steps done × steps left: 10 s / 2 × 3 = 15 s; 20 s / 4 × 1 = 5 s; 0 at the end.
    assert [line.rsplit("eta ", 1)[1] for line in lines] == ["0:00:15", "0:00:05", "0:00:00"]
    assert "reward 0.200 (trained 0.500) zero-var 0.25 rounds 2 gen 1234 tok/s" in lines[0]


def test_progress_off_on_a_terminal_prints_lines_and_missing_figures_show_a_dash() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=300)
    with RunProgress(4, start=2, enabled=False, print_every=1, console=console, clock=_fake_clock([0.0, 6.0])) as p:
        p.update(3, {"reward/unfiltered_mean": 0.5})
    assert out.getvalue().strip().splitlines() == [
        "step 3/4 started",  # a resumed run continues with step 3
        "step 3/4 reward 0.500 (trained —) zero-var — rounds — gen — tok/s acc — eta 0:00:06",
    ]


def test_compact_lines_show_the_latest_eval_accuracy() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=300)
    with RunProgress(4, print_every=1, accuracy=0.235, console=console, clock=_fake_clock([0.0] * 5)) as progress:
        progress.update(1, {})
        progress.update(2, {"eval/accuracy": 0.5})
        progress.update(3, {})
        progress.update(4, {"eval/accuracy": None})  # a non-finite value logged as null keeps the last one
    accuracies = [line.split(" acc ")[1].split()[0] for line in out.getvalue().splitlines()[1:]]
    assert accuracies == ["0.235", "0.500", "0.500", "0.500"]


def test_rich_bar_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with RunProgress(5, run_name="exp", console=console) as progress:
        assert progress.use_bar
        progress.update(3, {"reward/unfiltered_mean": 0.125, "ds/gen_rounds": 3})
    text = out.getvalue()
    assert "3/5" in text and "reward 0.125" in text and "rounds 3" in text
    assert "step 3/5" not in text  # no compact line when the bar is shown


def test_sft_prints_the_progress_line_train_has_with_its_loss_and_accuracy(tmp_path, capsys) -> None:
    import yaml

    from groupwise.cli.main import main

    config = {
        "run": {"name": "warm", "output_dir": str(tmp_path), "seed": 0},
        "model": {"source": "tiny", "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                             "intermediate_size": 64, "max_position_embeddings": 32}},
        "data": {"task": "addition", "addition": {"min_digits": 1, "max_digits": 1, "num_eval": 8}},
        "generation": {"max_new_tokens": 4},
        "sft": {"steps": 12, "batch_size": 4, "eval_every": 6},
        "logging": {"progress": False, "tensorboard": False},
    }  # fmt: skip
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["sft", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert lines[0] == "step 1/12 started"
    assert [line.split(" loss ")[0] for line in lines[1:]] == ["step 10/12", "step 12/12"]
    assert all(re.fullmatch(r"step \d+/12 loss \d+\.\d{4} acc \d\.\d{3} eta \d:\d\d:\d\d", line) for line in lines[1:])
