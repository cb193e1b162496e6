"""``groupwise report`` and ``groupwise compare`` on synthetic runs.

- report writes report.md and real PNG plots into the FIRST run dir's plots/, for one run and for two
  (overlaid: the second run's colours appear only in the two-run plots); report.md embeds every plot.
- The summary table equals values computed here from the synthetic metrics: steps, start/final/best accuracy
  (with the best one's step), zero-variance fraction over all generated groups, total groups
  generated/trained, wall time.
- How the plots read: paired series of one run have different colours (and dash styles); a noisy per-step
  series is drawn faint with its centred moving mean over it in full colour; whole quantities get integer
  ticks; the legend lies outside the axes.
- A plot whose metrics no run logged is not drawn and the report says so; so is a plot that would be an empty
  frame: the waste plot of runs that wasted no token, compare's fates and throughput plots of runs without group
  counts or step times (no stale PNG of an earlier report is left either); compare lists the plots it wrote.
- compare gives one column per run with counts summed over steps, trained groups/h, staleness
  (group-weighted mean, max), idle fractions from sim/summary.json, tokens generated and wasted (summed), the
  last wasted share, final rewards; a key a run lacks is "—".
- compare writes its PNGs; bad inputs fail with an error naming the directory.
- The wasted-generation plot draws, per run, the cumulative tokens of each waste fate the run logged (in that
  fate's colour) and their sum only when there are two or more; a run without waste/* metrics gets no plot.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib.image import imread

from groupwise.run.metrics import MetricsWriter
from groupwise.run.plots import REWARDS, Series, draw_lines
from groupwise.run.report import run_compare, run_report
from groupwise.run.run_stats import load_run, moving_mean, smoothing_window, start_end_means, trailing_rate
from groupwise.run.rundir import RunDir

SYNC_CONFIG = {"mode": "sync", "run": {"seed": 7},
               "grpo": {"num_generations_per_prompt": 4, "dynamic_sampling": {"enabled": True}}}
ASYNC_CONFIG = {"mode": "async", "run": {"seed": 3},
                "grpo": {"num_generations_per_prompt": 8, "dynamic_sampling": {"enabled": True}},
                "async": {"sampler": {"name": "in_order", "max_lookahead_versions": 1}}}
REPORT_PLOTS = ["reward_vs_step.png", "reward_vs_generated_samples.png", "zero_variance_fraction.png",
                "gen_rounds.png", "eval_accuracy.png", "waste_fraction.png", "waste_tokens.png"]
COMPARE_PLOTS = ["compare_reward_vs_generated.png", "compare_reward_vs_trained.png", "compare_fates.png",
                 "compare_throughput.png", "compare_waste_tokens.png", "compare_waste_fraction.png"]
BLUE, ORANGE, GREEN, RED = (np.array(c) / 255 for c in ((31, 119, 180), (255, 127, 14), (44, 160, 44),
                                                         (214, 39, 40)))  # matplotlib's C0..C3


def make_run(root: Path, name: str, config: dict, steps: dict[int, dict], sim: dict | None = None) -> Path:
    run = RunDir.create(root, name, yaml.safe_dump(config), resume=False)
    writer = MetricsWriter(run, tensorboard=False)
    for step, metrics in steps.items():
        writer.log(step, metrics)
    if sim is not None:
        run.sim_summary_path.parent.mkdir()
        run.sim_summary_path.write_text(json.dumps(sim))
    return run.root


def sync_steps() -> dict[int, dict]:
    steps: dict[int, dict] = {0: {"eval/accuracy": 0.1}}
    for s in range(1, 7):
        steps[s] = {
            "reward/unfiltered_mean": 0.1 * s, "reward/trained_mean": 0.1 * s + 0.2,
            "ds/groups_generated": float(10 + s), "ds/groups_filtered": float(s), "ds/groups_trained": 10.0,
            "ds/zero_variance_fraction": s / (10 + s), "ds/zero_variance_max_fraction": s / (10 + s) / 2,
            "ds/zero_variance_min_fraction": s / (10 + s) / 2, "ds/gen_rounds": float(1 + s % 2),
            "perf/step_seconds": 2.0 + s,
            "waste/filtered_tokens": 10.0 * s, "waste/discarded_tokens": 5.0, "waste/tokens": 10.0 * s + 5,
            "waste/gen_seconds": 0.5, "waste/generated_tokens": 100.0,
            "waste/cumulative_fraction": sum(10 * k + 5 for k in range(1, s + 1)) / (100 * s),
        }
    steps[3]["eval/accuracy"] = 1.0
    steps[6]["eval/accuracy"] = 0.4
    return steps


def async_steps() -> dict[int, dict]:
    staleness = {1: (0.0, 0.0), 2: (0.5, 1.0), 3: (1.0, 2.0), 4: (1.0, 1.0)}
    return {
        s: {
            "reward/unfiltered_mean": 0.2 + 0.05 * s, "reward/trained_mean": 0.3,
            "ds/groups_generated": 9.0, "ds/groups_filtered": 1.0, "ds/groups_trained": 8.0,
            "ds/zero_variance_fraction": 1 / 9,
            "accounting/dropped_groups": float(s == 2), "accounting/replaced_groups": float(s == 3),
            "buffer/evicted_groups": 2.0 * (s == 4), "staleness/mean": staleness[s][0],
            "staleness/max": staleness[s][1], "perf/step_seconds": 1800.0, "perf/trainer_idle_fraction": 0.9,
        }
        for s in range(1, 5)
    }


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Markdown table rows keyed by their first cell."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def assert_real_png(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = imread(path)[..., :3]
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20, f"{path.name} looks blank"
    return pixels


def has_colour(pixels: np.ndarray, colour: np.ndarray) -> bool:
    return bool((np.abs(pixels - colour).max(axis=-1) < 0.02).sum() > 20)


def test_report_of_one_run(tmp_path: Path) -> None:
    run = make_run(tmp_path, "sync-a", SYNC_CONFIG, sync_steps())
    report = run_report([run])
    assert report == run / "report.md"
    text = report.read_text()
    for name in REPORT_PLOTS:
        assert f"](plots/{name})" in text
        assert_real_png(run / "plots" / name)
    # unfiltered and trained rewards in two colours; a second run's colours (C2, C3) are not there
    pixels = assert_real_png(run / "plots" / "reward_vs_step.png")
    assert has_colour(pixels, BLUE) and has_colour(pixels, ORANGE)
    assert not has_colour(pixels, GREEN) and not has_colour(pixels, RED)
    zero_variance_plot = assert_real_png(run / "plots" / "zero_variance_fraction.png")
    assert all(has_colour(zero_variance_plot, c) for c in (BLUE, ORANGE, GREEN)), "all / at max / at min"
    generated = sum(10 + s for s in range(1, 7))
    zero_variance = sum(range(1, 7)) / generated  # filtered == zero-variance groups here
    wall = sum(2 + s for s in range(1, 7))
    assert table_rows(text)["sync-a"] == [
        "6", "0.100", "0.400", "1.000 (step 3)", f"{zero_variance:.3f}", str(generated), "60", f"0:00:{wall:02d}"
    ]


def test_report_of_two_runs_overlays_them_in_the_first_dir(tmp_path: Path) -> None:
    first = make_run(tmp_path, "sync-a", SYNC_CONFIG, sync_steps())
    second = make_run(tmp_path, "async-b", ASYNC_CONFIG, async_steps())
    run_report([first, second])
    rows = table_rows((first / "report.md").read_text())
    assert rows["async-b"] == ["4", "—", "—", "—", f"{4 / 36:.3f}", "36", "32", "2:00:00"]
    assert "sync-a" in rows
    assert not (second / "report.md").exists() and not (second / "plots").exists()
    for name in ["reward_vs_step.png", "reward_vs_generated_samples.png"]:
        pixels = assert_real_png(first / "plots" / name)
        assert all(has_colour(pixels, c) for c in (BLUE, ORANGE, GREEN, RED)), name  # 2 runs × 2 series
    # The second run logged no eval: only the first run's curve is in that plot.
    eval_plot = assert_real_png(first / "plots" / "eval_accuracy.png")
    assert has_colour(eval_plot, BLUE) and not has_colour(eval_plot, ORANGE)


def noisy_run(tmp_path: Path, steps: int = 60) -> Path:
    """A sync run whose per-step rewards alternate around a rising trend (so smoothing changes them)."""
    records = {
        s: {"reward/unfiltered_mean": 0.01 * s + 0.2 * (s % 2), "reward/trained_mean": 0.5 + 0.1 * (s % 3),
            "ds/gen_rounds": float(1 + s % 3), "ds/groups_generated": 8.0, "perf/step_seconds": 1.0}
        for s in range(1, steps + 1)
    }  # fmt: skip
    return make_run(tmp_path, "noisy", SYNC_CONFIG, records)


def test_noisy_series_are_drawn_faint_under_their_moving_mean_in_distinct_colours(tmp_path: Path) -> None:
    run = load_run(noisy_run(tmp_path))
    figure = draw_lines([run], "Reward vs step", "mean reward", REWARDS)
    ax = figure.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 4  # raw + smoothed for each of the two series
    raw = [line for line in lines if line.get_alpha() is not None and line.get_alpha() < 0.5]
    smoothed = [line for line in lines if line not in raw]
    assert len(raw) == 2 and len(smoothed) == 2
    assert len({line.get_color() for line in smoothed}) == 2, "paired series need two colours"
    assert {line.get_linestyle() for line in smoothed} == {"-", "--"}
    window = smoothing_window(60)
    assert window == 12
    unfiltered = [r["reward/unfiltered_mean"] for r in run.records]
    assert list(smoothed[0].get_ydata()) == pytest.approx(moving_mean(unfiltered, window))
    assert list(raw[0].get_ydata()) == unfiltered
    assert "centred mean over 12 steps" in ax.get_title(loc="left")
    # the legend (smoothed lines only) lies below the axes, not on the data
    figure.canvas.draw()
    legend = figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [s.label for s in REWARDS]
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0


def test_whole_quantities_get_integer_ticks(tmp_path: Path) -> None:
    run = load_run(noisy_run(tmp_path, steps=7))
    figure = draw_lines([run], "Generation rounds per step", "rounds", (Series("ds/gen_rounds", ""),),
                        integer_y=True)
    figure.canvas.draw()
    ax = figure.axes[0]
    for ticks in (ax.get_xticks(), ax.get_yticks()):
        assert all(float(t).is_integer() for t in ticks), ticks
    line = ax.get_lines()[0]  # 7 points: too few to smooth, drawn with markers
    assert len(ax.get_lines()) == 1 and line.get_marker() == "o"


def test_moving_mean_and_start_end_means() -> None:
    values = [0.0, 3.0, 6.0, 9.0, 12.0]
    assert moving_mean(values, 3) == [1.5, 3.0, 6.0, 9.0, 10.5]  # centred; the ends average 2 values
    assert moving_mean(values, 1) == values
    assert start_end_means(values, 2) == (1.5, 10.5)
    assert start_end_means([], 3) is None
    assert [smoothing_window(n) for n in (1, 9, 10, 60, 500)] == [1, 1, 2, 12, 25]


def test_plots_without_data_are_skipped_and_said_so(tmp_path: Path) -> None:
    steps = {s: {"reward/unfiltered_mean": 0.5, "ds/groups_generated": 4.0} for s in (1, 2)}
    run = make_run(tmp_path, "bare", {"mode": "sync"}, steps)
    text = run_report([run]).read_text()
    assert_real_png(run / "plots" / "reward_vs_step.png")
    assert not (run / "plots" / "eval_accuracy.png").exists()
    assert not (run / "plots" / "reward_vs_generated_samples.png").exists()  # G unknown
    assert "## Eval accuracy (greedy, held-out)\n\nNo run logged" in text
    assert "no grpo.num_generations_per_prompt in config.yaml): bare" in text


def test_compare_table_values(tmp_path: Path) -> None:
    first = make_run(tmp_path, "sync-a", SYNC_CONFIG, sync_steps())
    sim = {"rollout_idle_fraction": 0.12, "trainer_idle_fraction": 0.3}
    second = make_run(tmp_path, "async-b", ASYNC_CONFIG, async_steps(), sim=sim)
    table = run_compare([first, second])
    rows = table_rows(table)
    assert rows[""] == ["sync-a", "async-b"]
    sync_wall = sum(2 + s for s in range(1, 7))
    expected = {
        "mode": ["sync", "async"],
        "sampler": ["—", "in_order"],
        "knobs": ["—", "max_lookahead_versions=1"],
        "dynamic sampling": ["on", "on"],
        "seed": ["7", "3"],
        "steps": ["6", "4"],
        "groups generated": [str(sum(10 + s for s in range(1, 7))), "36"],
        "groups discarded": ["—", "—"],
        "groups filtered": [str(sum(range(1, 7))), "4"],
        "groups trained": ["60", "32"],
        "groups dropped": ["—", "1"],
        "groups replaced": ["—", "1"],
        "groups evicted": ["—", "2"],
        "groups aborted": ["—", "—"],
        "trained groups/h": [f"{60 / sync_wall * 3600:.3f}", "16.000"],
        "rollout idle fraction": ["—", "0.120"],
        "trainer idle fraction": ["—", "0.300"],  # the simulator summary wins over the step metric
        "staleness mean": ["—", f"{(0 + 0.5 + 1 + 1) / 4:.3f}"],
        "staleness max": ["—", "2"],
        "tokens generated": ["600", "—"],
        "tokens wasted": [str(sum(10 * s + 5 for s in range(1, 7))), "—"],
        "wasted share of tokens": [f"{sum(10 * s + 5 for s in range(1, 7)) / 600:.3f}", "—"],
        "generation seconds wasted": ["3.000", "—"],
        "final reward (unfiltered)": ["0.600", "0.400"],
        "final reward (trained)": ["0.800", "0.300"],
        "final eval accuracy": ["0.400", "—"],
    }
    assert {k: v for k, v in rows.items() if k} == expected
    for name in COMPARE_PLOTS:
        assert_real_png(first / "plots" / name)
    assert has_colour(imread(first / "plots" / "compare_reward_vs_trained.png")[..., :3], ORANGE)


def test_compare_weights_staleness_by_trained_groups(tmp_path: Path) -> None:
    steps = {1: {"staleness/mean": 0.0, "ds/groups_trained": 3.0}, 2: {"staleness/mean": 2.0, "ds/groups_trained": 1.0}}
    run = make_run(tmp_path, "w", {"mode": "async"}, steps)
    assert table_rows(run_compare([run]))["staleness mean"] == [f"{2.0 / 4:.3f}"]


def test_throughput_is_trained_groups_per_hour_over_a_trailing_window() -> None:
    records = [{"step": s, "ds/groups_trained": 10.0 * s, "perf/step_seconds": 1800.0} for s in (1, 2, 3)]
    # Cumulative: 10, 30, 60 groups at 0.5, 1.0, 1.5 h. Window 2 steps: 0→0.5 h, 0→1 h, 0.5→1.5 h.
    assert trailing_rate(records, window=2) == [(0.5, 20.0), (1.0, 30.0), (1.5, 50.0)]


def test_bad_inputs_name_the_problem(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty.*metrics.jsonl"):
        run_report([tmp_path / "empty"])
    with pytest.raises(ValueError, match="no run directories"):
        run_compare([])


def test_the_waste_plot_draws_each_wasted_fate_and_their_sum(tmp_path: Path) -> None:
    from groupwise.run.plots import draw_waste

    sync_run = load_run(make_run(tmp_path, "sync-a", SYNC_CONFIG, sync_steps()))
    one_fate = {s: {"waste/filtered_tokens": 7.0, "waste/tokens": 7.0} for s in (1, 2, 3)}
    async_run = load_run(make_run(tmp_path, "async-b", ASYNC_CONFIG, one_fate))
    bare = load_run(make_run(tmp_path, "bare", SYNC_CONFIG, {1: {"ds/groups_generated": 4.0}}))
    figure = draw_waste([sync_run, bare, async_run])
    assert len(figure.axes) == 2  # the run without waste/* metrics has no panel
    sync_ax, async_ax = figure.axes
    lines = {line.get_label(): line for line in sync_ax.get_lines()}
    assert set(lines) == {"filtered", "discarded", "all wasted"}
    # steps 0 (the eval before training: nothing generated) to 6
    assert list(lines["filtered"].get_ydata()) == [10.0 * s * (s + 1) / 2 for s in range(7)]
    assert list(lines["all wasted"].get_ydata()) == [5.0 * s * (s + 1) + 5.0 * s for s in range(7)]
    assert lines["filtered"].get_color() == "C0" and lines["discarded"].get_color() == "C1"
    assert [line.get_label() for line in async_ax.get_lines()] == ["filtered"]  # one fate: no separate sum
    assert draw_waste([bare]) is None


def test_a_plot_with_nothing_to_show_says_so_instead_of_drawing_an_empty_frame(tmp_path: Path) -> None:
    from groupwise.run.plots import draw_fates, draw_throughput, draw_waste

    no_waste = {s: {"reward/unfiltered_mean": 0.5, "waste/tokens": 0.0, "waste/filtered_tokens": 0.0,
                    "waste/cumulative_fraction": 0.0} for s in (1, 2, 3)}  # fmt: skip
    run = make_run(tmp_path, "frugal", SYNC_CONFIG, no_waste)
    (run / "plots").mkdir()
    (run / "plots" / "waste_tokens.png").write_bytes(b"an older report's plot")
    text = run_report([run]).read_text()
    assert not (run / "plots" / "waste_tokens.png").exists()
    assert ("## Wasted generation by fate (cumulative tokens)\n\nNo run wasted a generated token (`waste/tokens` is 0"
            in text)  # fmt: skip
    assert draw_waste([load_run(run)]) is None
    assert draw_fates([load_run(run)]) is None and draw_throughput([load_run(run)]) is None
    table = run_compare([run])
    assert not (run / "plots" / "compare_fates.png").exists()
    assert not (run / "plots" / "compare_throughput.png").exists()
    listed = table.strip().splitlines()[-1]
    assert listed.startswith(f"plots in {run / 'plots'}/: ") and "compare_fates.png" not in listed
    assert "compare_waste_fraction.png" in listed  # a flat line at zero is something to show
