"""A sync run whose policy outgrew its data: ``grpo.dynamic_sampling.stop_when_exhausted`` ends it as finished.

The reward here turns constant after the first steps (every group all right), so dynamic sampling cannot fill a
step. Invariants pinned:
- with ``stop_when_exhausted: true`` the command exits 0 and says it stopped before ``run.max_steps`` and why; the
  run ends after its last trained step, whose policy is saved (``final/``, a checkpoint of that step) and
  evaluated; ``events.log`` names the step that was not trained and the zero-variance counts; the unfilled
  step's groups are all ``filtered``; every dispatched prompt has exactly one fate (``groupwise audit``);
- ``--resume`` with a larger ``run.max_steps`` continues from that checkpoint, draws none of the stopped step's
  prompts again, and stops the same way while the reward stays constant; the audit still holds;
- without it (the default) the same run fails (exit 1, the error named) and saves no ``final/``; its unfilled
  step's groups are ``filtered`` there too;
- a group carried into the step that stops stays carried: after its ``carried`` line, one ``pending`` line,
  "carried at the end", written after the last checkpoint (so a resume trains it), and no line from the unfilled
  step (scripted rewards on the sync loop itself);
- the key belongs to the sync loop: async mode refuses it, naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import scripted_rewards
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.run.fates_file import FatesWriter, read_fates
from groupwise.trainer.sync_loop import DS_STOPPED, SyncLoop, TrainerState, record_carried_at_end

pytestmark = pytest.mark.numerics

MAX_STEPS = 6


def write_config(tmp_path: Path, name: str, stop: bool) -> Path:
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        "model: {source: tiny, tiny: {num_layers: 1, hidden_size: 32, num_heads: 2, intermediate_size: 64, "
        "max_position_embeddings: 32}}\n"
        f"run: {{name: {name}, output_dir: {tmp_path / 'runs'}, max_steps: {MAX_STEPS}, seed: 3}}\n"
        "data: {task: addition, addition: {num_eval: 8}}\n"
        "grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 4, "
        f"dynamic_sampling: {{max_gen_rounds: 2, stop_when_exhausted: {str(stop).lower()}}}}}\n"
        "reward: {function: 'scripted_rewards:constant_after_calls', kwargs: {calls: 48}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {num_prompts: 8}\n"
        "checkpoint: {every: 2, keep_last: 5}\n",
        encoding="utf-8",
    )
    return config


def fate_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "fates.jsonl").read_text(encoding="utf-8").splitlines()]


def trained_steps(run: Path) -> list[int]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [row["step"] for row in map(json.loads, lines) if "loss/total" in row]


def test_a_run_without_signal_left_stops_as_finished_and_resumes(tmp_path, capsys):
    scripted_rewards.CALLS.clear()
    config = write_config(tmp_path, "stops", stop=True)
    assert main(["train", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"stopped before run.max_steps={MAX_STEPS}: dynamic sampling found too few groups" in out
    run = tmp_path / "runs" / "stops"
    steps = trained_steps(run)
    last = steps[-1]
    assert steps == list(range(1, last + 1)) and 1 <= last < MAX_STEPS
    assert (run / "final" / "config.json").is_file() and (run / "checkpoints" / f"step_{last}").is_dir()
    events = (run / "events.log").read_text(encoding="utf-8")
    assert f"step {last + 1} not trained: dynamic sampling kept 0 of 4 groups" in events
    assert f"the run ends after step {last}" in events and f"eval at step {last}" in events
    unfilled = [line for line in fate_lines(run) if line["step"] == last]  # fates index steps from 0
    assert unfilled and {line["fate"] for line in unfilled} == {"filtered"}
    assert main(["audit", str(run)]) == 0
    capsys.readouterr()

    calls = len(scripted_rewards.CALLS)
    assert main(["train", str(config), f"run.max_steps={MAX_STEPS + 2}", "--resume"]) == 0
    assert "stopped before run.max_steps" in capsys.readouterr().out
    assert trained_steps(run) == steps and len(scripted_rewards.CALLS) > calls  # it generated, trained nothing
    draws = [(line["prompt_uid"], line["epoch"]) for line in fate_lines(run)]
    assert len(draws) == len(set(draws)), "a prompt was dispatched again after the stop"
    assert main(["audit", str(run)]) == 0


def test_without_it_the_same_run_fails(tmp_path, capsys):
    scripted_rewards.CALLS.clear()
    config = write_config(tmp_path, "fails", stop=False)
    assert main(["train", str(config)]) == 1
    assert "DynamicSamplingExhausted" in capsys.readouterr().err
    run = tmp_path / "runs" / "fails"
    assert not (run / "final").exists()
    last = trained_steps(run)[-1]
    unfilled = [line for line in fate_lines(run) if line["step"] == last]
    assert unfilled and {line["fate"] for line in unfilled} == {"filtered"}


def test_async_mode_refuses_it_by_name():
    with pytest.raises(ConfigError, match="grpo.dynamic_sampling.stop_when_exhausted has no effect in mode async"):
        config_from_dict({"mode": "async", "grpo": {"dynamic_sampling": {"stop_when_exhausted": True}}})


def test_a_group_carried_into_the_stopped_step_stays_carried(tmp_path):
    cfg = config_from_dict({
        "model": {"source": "tiny"}, "loss": {"importance_sampling": True},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2,
                 "dynamic_sampling": {"batch_multiplier": 2.0, "max_gen_rounds": 1, "surplus": "carry",
                                      "min_step_batch_fraction": 1.0, "stop_when_exhausted": True}},
    })  # fmt: skip
    # Step 1 keeps p0, p1 and p2 (one more than P: p2 is carried), filters p3; step 2's round is all right, so
    # its pool holds only the carried p2, under the floor of 2.
    rewards = {"p0": (0.0, 1.0), "p1": (1.0, 0.0), "p2": (0.0, 1.0), **{f"p{i}": (1.0, 1.0) for i in range(3, 8)}}
    rollouts = ScriptedRollouts(group_size=2, script={uid: [Outcome(rewards=r)] for uid, r in rewards.items()})
    fates, state = FatesWriter(tmp_path / "fates.jsonl"), TrainerState()
    loop = SyncLoop(cfg.grpo, make_loader(8), rollouts, RecordingTrainer(), state, fates=fates)
    assert run_virtual(lambda: loop.run(5)) == "no_signal" and state.step == 1
    assert "kept 1 of 2 groups" in loop.no_signal
    record_carried_at_end(fates, state)  # what run_sync does after the final checkpoint
    lines: dict[str, list[tuple]] = {}
    for line in read_fates(fates.path):
        lines.setdefault(line["prompt_uid"], []).append((line["fate"], line["step"], line.get("detail")))
    assert lines["p2"] == [("carried", 0, ""), ("pending", 1, "carried at the end")]  # nothing from step 2
    assert all(len(lines[f"p{i}"]) == 1 and lines[f"p{i}"][0][0] == "filtered" for i in range(3, 8))
    assert lines["p0"] == lines["p1"] == [("trained", 0, "")]
    assert DS_STOPPED not in {detail for per in lines.values() for _, _, detail in per}
