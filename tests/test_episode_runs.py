"""Whole runs with multi-turn episodes: both loops, the config rules, and what the run records.

Invariants pinned:
- a sync run and an async run (ready_first, dynamic sampling) on the ``guess_number`` environment finish, and
  every trained row's reward is what the environment gives when its recorded turns are replayed into a fresh
  environment; each row's environment tokens are its ``env_spans`` and the model tokens its episode counted;
- an async episode run killed in the middle of a checkpoint resumes from the previous one and ends with every
  prompt accounted for once (audit), every row still replaying to its reward;
- the learner trains only the model's tokens: ``perf/train_tokens`` is the sum of the rows' sampled tokens, and
  the async step's accounting balances (groups trained + dropped = P);
- ``episode/*`` metrics describe the trained episodes (turn counts, how each ended, the share solved and the turns
  the solved ones took);
- ``groupwise audit --replay-episodes`` replays every trained episode into a fresh environment and finds a row
  whose recorded turns do not give its answers and rewards; an environment that raises while replayed is a
  mismatch of each row, naming the call (exit 1, no traceback);
- the environment's tokens get no gradient: changing their recorded logprobs changes nothing, while training
  them as if sampled would change the gradient;
- episodes train with LoRA adapters and on two data-parallel learner ranks: both runs finish, every row
  replays to its reward, the trained tokens are the model's, and the audit passes;
- config mistakes about episodes are all reported at once by ``config check`` (exit 2), naming each key;
- a sync run stopped by its environment (in step 1 or later) gives every dispatched prompt a fate: the failing
  one ``failed``/``fatal`` with the error, the rest of its round ``pending``; ``audit`` passes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from test_learner import run_step

from groupwise.batch import RowBatch
from groupwise.cli.main import main
from groupwise.config import config_from_dict
from groupwise.environments.guess_number import GuessNumberEnvironment
from groupwise.episodes.record import EpisodeRecord
from groupwise.rows import build_rows
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_components, build_session
from groupwise.types import Prompt

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data" / "guess_number"
TINY = {"vocab": "full", "num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 256}  # fmt: skip


def episode_config(tmp_path: Path, mode: str = "sync", **sections):
    data = {
        "mode": mode,
        "run": {"name": mode, "output_dir": str(tmp_path / "runs"), "seed": 2, "max_steps": 2},
        "model": {"source": "tiny", "tiny": TINY},
        "data": {"task": "jsonl", "jsonl": {"train_path": str(DATA / "train.jsonl"),
                                            "eval_path": str(DATA / "eval.jsonl")}},
        "episode": {"environment": "guess_number", "kwargs": {"max_guesses": 3}, "chat_template": "plain",
                    "max_turns": 3, "max_observation_tokens": 48, "max_tokens": 120},
        "generation": {"max_new_tokens": 4},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 4,
                 "dynamic_sampling": {"enabled": False}},
        "logging": {"progress": False},
        "eval": {"num_prompts": 4},
    }  # fmt: skip
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return config_from_dict(data)


def replayed_reward(row: dict, prompt: Prompt) -> float:
    """The reward a fresh environment gives the row's recorded model turns."""
    env = GuessNumberEnvironment(max_guesses=3)
    env.reset(prompt, row["completion_index"])
    record = EpisodeRecord.from_dict(row["episode"])
    return math.fsum(env.step({"role": "assistant", "content": text}).reward for text in record.assistant)


def check_rows(session, step: int) -> list[dict]:
    rows = [json.loads(x) for x in session.run_dir.train_data_path(step).read_text().splitlines()]
    prompts = {p.uid: p for p in session.task.train_prompts()}
    for row in rows:
        record = EpisodeRecord.from_dict(row["episode"])
        assert row["raw_reward"] == replayed_reward(row, prompts[row["prompt_uid"]]) == record.reward
        env_tokens = sum(length for _, length in row["env_spans"])
        assert len(row["completion_ids"]) - env_tokens == record.model_tokens
        assert env_tokens == record.env_tokens and 1 <= record.turns <= 3
        for start, length in row["env_spans"]:  # environment tokens carry no sampling logprob
            assert row["generation_logprobs"][start:start + length] == [0.0] * length
    return rows


def test_a_sync_run_trains_episodes_and_records_what_each_did(tmp_path, capsys, monkeypatch):
    session = build_session(episode_config(tmp_path))
    run_sync(session)
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        rows = check_rows(session, record["step"])
        model_tokens = sum(EpisodeRecord.from_dict(r["episode"]).model_tokens for r in rows)
        assert record["perf/train_tokens"] == model_tokens
        ends = sum(record[f"episode/end_{end}_fraction"] for end in ("done", "max_turns", "token_budget"))
        assert math.isclose(ends, 1.0)
        turns = [EpisodeRecord.from_dict(r["episode"]).turns for r in rows]
        assert record["episode/turns_max"] == max(turns)
        assert math.isclose(record["episode/turns_mean"], sum(turns) / len(turns))
        solved = [t for t, r in zip(turns, rows, strict=True) if r["raw_reward"] >= 1.0]
        assert math.isclose(record["episode/solved_fraction"], len(solved) / len(rows))
        assert record.get("episode/solved_turns_mean") == (sum(solved) / len(solved) if solved else None)
    evals = [r for r in read_metrics(session.run_dir.metrics_path) if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]
    assert all(("eval/solved_turns_mean" in r) == (r["eval/accuracy"] > 0) for r in evals)
    # groupwise audit --replay-episodes: every trained episode replays into a fresh environment...
    run_dir = str(session.run_dir.path)
    assert main(["audit", "--replay-episodes", run_dir]) == 0
    assert f"episodes: {2 * 2 * 4} replayed into a fresh environment, 0 mismatch(es)" in capsys.readouterr().out
    # ...and a row that says a turn earned what it did not is found.
    path = session.run_dir.train_data_path(1)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0]["episode"]["step_rewards"][0] += 1.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["audit", "--replay-episodes", run_dir]) == 1
    assert "step_1.jsonl:1 (prompt" in capsys.readouterr().out
    # An environment that raises while replayed: each row names the call, exit 1, no traceback.
    monkeypatch.setattr(GuessNumberEnvironment, "step", lambda self, message: 1 / 0)
    assert main(["audit", "--replay-episodes", run_dir]) == 1
    out, err = capsys.readouterr()
    assert "0 replayed" not in out and "sample 0): turn 1: step() failed: ZeroDivisionError: division by zero" in out
    assert "Traceback" not in out + err


def test_an_async_run_with_dynamic_sampling_balances_every_step(tmp_path):
    cfg = episode_config(
        tmp_path, "async", grpo={"dynamic_sampling": {"enabled": True}}, eval={"at_start": False, "at_end": False},
        **{"async": {"sampler": {"name": "ready_first", "max_staleness_versions": 1}, "max_buffered_rollouts": 4,
                     "max_inflight_prompts": 4, "partial_rollouts": "off",
                     "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 16}}},
    )  # fmt: skip
    session = build_session(cfg)
    run_async(session)
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["ds/groups_trained"] + record["accounting/dropped_groups"] == 2
        rows = check_rows(session, record["step"])
        for group in {r["group_id"] for r in rows}:  # dynamic sampling kept only groups with signal
            assert len({r["raw_reward"] for r in rows if r["group_id"] == group}) > 1


@pytest.mark.parametrize("sections", [
    {"model": {"lora": {"enabled": True, "rank": 4}}},
    {"learner": {"num_ranks": 2, "sharding": "ddp"}},
], ids=["lora", "two-learner-ranks"])  # fmt: skip
def test_episodes_train_with_lora_and_with_learner_ranks(tmp_path, sections):
    from groupwise.cli.run_prompts import training_uids
    from groupwise.run.audit import audit_run
    from groupwise.runtime.sessions import build_run_session

    session = build_run_session(episode_config(tmp_path, eval={"at_start": False, "at_end": False}, **sections))
    try:
        run_sync(session)
    finally:
        session.close()
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2] and all(r["weight_version"] == r["step"] for r in records)
    for record in records:
        rows = check_rows(session, record["step"])
        assert record["perf/train_tokens"] == sum(EpisodeRecord.from_dict(r["episode"]).model_tokens for r in rows)
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()


class FailsOnPrompt(GuessNumberEnvironment):
    """Guess-the-number (test only) whose ``reset`` raises for the ``fail_at``-th distinct prompt it meets."""

    seen: list[str] = []

    def __init__(self, fail_at: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_at = fail_at

    def reset(self, prompt, sample_index):
        if prompt.uid not in FailsOnPrompt.seen:
            FailsOnPrompt.seen.append(prompt.uid)
        if FailsOnPrompt.seen.index(prompt.uid) == self.fail_at:
            raise RuntimeError("no such game")
        return super().reset(prompt, sample_index)


@pytest.mark.parametrize("fail_at, step", [(0, 0), (2, 1)])
def test_a_sync_run_stopped_by_its_environment_gives_every_dispatched_prompt_a_fate(tmp_path, capsys, fail_at, step):
    from groupwise.episodes.group import EpisodeError
    from groupwise.run.fates_file import read_fates

    FailsOnPrompt.seen = []
    cfg = episode_config(tmp_path, episode={"environment": "test_episode_runs:FailsOnPrompt",
                                            "kwargs": {"max_guesses": 3, "fail_at": fail_at}},
                         eval={"at_start": False})  # fmt: skip
    session = build_session(cfg)
    with pytest.raises(EpisodeError):
        run_sync(session)
    lines = read_fates(session.run_dir.fates_path)
    culprit = FailsOnPrompt.seen[fail_at]
    [failed] = [line for line in lines if line["fate"] == "failed"]
    assert (failed["prompt_uid"], failed["step"], failed["resolution"]) == (culprit, step, "fatal")
    assert failed["detail"] == (f"EpisodeError: environment 'test_episode_runs:FailsOnPrompt' failed in reset() "
                                f"(prompt {culprit!r}, sample 0): RuntimeError: no such game")  # fmt: skip
    [other] = [line for line in lines if line["step"] == step and line["fate"] != "failed"]
    assert other["fate"] == "pending" and other["prompt_uid"] == FailsOnPrompt.seen[fail_at + 1]
    assert other["detail"] == f"step {step} was not trained: a generation round failed (EpisodeError); the run stopped"
    assert [line["fate"] for line in lines if line["step"] < step] == ["trained"] * 2 * step
    assert main(["audit", str(session.run_dir.path)]) == 0, capsys.readouterr()


def killed_in_a_checkpoint_then_resumed(config, monkeypatch):
    """Run ``config(3)`` (async) until the first piece of step 3's checkpoint lands and the process "dies", then
    resume it from step 2 as ``config(4)`` and run it to its end: the resumed session."""
    from groupwise.run import checkpoint

    session = build_session(config(3))
    real_write = checkpoint._write_file_synced

    def die_in_step_3(path, data):
        if ".tmp-step_3" in str(path) and path.name != "trainer_state.json":
            raise RuntimeError("killed mid-checkpoint")
        real_write(path, data)

    monkeypatch.setattr(checkpoint, "_write_file_synced", die_in_step_3)
    with pytest.raises(RuntimeError, match="killed mid-checkpoint"):
        run_async(session)
    monkeypatch.undo()
    resumed = build_session(config(4), resume=True)
    assert resumed.state.step == 2
    run_async(resumed)
    return resumed


def with_column(rows: RowBatch, name: str, values: list) -> RowBatch:
    return RowBatch({**rows.columns, name: values})


def test_an_async_episode_run_killed_mid_checkpoint_resumes_losing_and_doubling_nothing(tmp_path, monkeypatch, capsys):
    from groupwise.cli.run_prompts import training_uids
    from groupwise.run.audit import audit_run

    def config(max_steps: int):
        return episode_config(
            tmp_path, "async", run={"name": "resume", "max_steps": max_steps},
            eval={"at_start": False, "at_end": False}, checkpoint={"every": 1, "keep_last": 3, "save_final": False},
            grpo={"dynamic_sampling": {"enabled": True}}, loss={"importance_sampling": True},
            **{"async": {"sampler": {"name": "in_order", "max_lookahead_versions": 1}, "max_buffered_rollouts": 8,
                         "max_inflight_prompts": 8, "partial_rollouts": "off",
                         "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 16}}},
        )  # fmt: skip

    resumed = killed_in_a_checkpoint_then_resumed(config, monkeypatch)
    run_dir = resumed.run_dir.path
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss/total" in r] == [1, 2, 3, 4]
    report = audit_run(run_dir, training_uids)
    assert report.ok, report.format()
    for step in (1, 2, 3, 4):
        check_rows(resumed, step)
    assert main(["audit", "--replay-episodes", str(run_dir)]) == 0, capsys.readouterr().out


def test_environment_tokens_get_no_gradient(tmp_path):
    from groupwise.config.algorithm import LossSection
    from groupwise.data.loader import LoadedPrompt

    parts = build_components(episode_config(tmp_path))
    prompts = parts.task.train_prompts()[:2]
    groups = parts.rollouts.generate_groups([LoadedPrompt(p, 0, i) for i, p in enumerate(prompts)], [0, 1])
    advantages = [[1.0 - 0.5 * i for i in range(g.size)] for g in groups]
    rows = build_rows(groups, advantages)
    assert any(rows["env_spans"])
    loss = {"loss": LossSection(importance_sampling=True, entropy_coef=0.01)}
    grads, metrics, _ = run_step(parts.policy.model, [rows], **loss)
    shifted = [tuple(lp - 7.0 * (not keep) for lp, keep in zip(row, c.trainable, strict=True))
               for row, c in zip(rows["generation_logprobs"], (c for g in groups for c in g.completions), strict=True)]
    shifted_rows = with_column(rows, "generation_logprobs", shifted)
    grads_shifted, metrics_shifted, _ = run_step(parts.policy.model, [shifted_rows], **loss)
    for got, want in zip(grads_shifted[0], grads[0], strict=True):
        assert torch.equal(got, want)
    timing = ("perf/train_seconds", "perf/train_tokens_per_s")
    assert {k: v for k, v in metrics_shifted.items() if k not in timing} == {
        k: v for k, v in metrics.items() if k not in timing
    }
    assert metrics["perf/train_tokens"] == sum(c.num_tokens for g in groups for c in g.completions)
    all_trained = with_column(rows, "env_spans", [()] * rows.num_rows)
    grads_all, _, _ = run_step(parts.policy.model, [all_trained], **loss)
    assert any(not torch.equal(a, b) for a, b in zip(grads_all[0], grads[0], strict=True))


def config_check(path: Path, capsys) -> tuple[int, str]:
    code = main(["config", "check", str(path)])
    return code, capsys.readouterr().err


def test_config_check_reports_every_episode_mistake_at_once(tmp_path, capsys):
    cfg = {
        "mode": "async", "model": {"source": "tiny"},
        "episode": {"environment": "guess_number", "max_tokens": 10, "max_observation_tokens": 20},
        "reward": {"function": "exact_match"},
        "async": {"partial_rollouts": "continue"}, "runtime": {"backend": "ray"},  # turns in rounds: no mid-turn
    }  # fmt: skip
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, err = config_check(path, capsys)
    assert code == 2, err
    for key in ("reward.function", "episode.max_observation_tokens", "async.partial_rollouts"):
        assert key in err, (key, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("episode, key, says", [
    ({"environment": "no_such_module_xyz:Env"}, "episode.environment", "cannot import module 'no_such_module_xyz'"),
    ({"environment": "guess_number", "kwargs": {"max_guesses": 0}}, "episode.kwargs", "max_guesses must be"),
    ({"max_turns": 2}, "episode.max_turns", "without episode.environment"),
    ({"environment": "guess_number", "chat_template": "role: text"}, "episode.chat_template", "a Jinja chat template"),
    ({"environment": "calculator", "step_timeout_s": 10}, "episode.step_timeout_s",
     "calculator's tools may each run 10 s (tool_timeout_s)"),
    ({"environment": "test_episodes:SlowToMake", "step_timeout_s": 0.3}, "episode.environment",
     "making one environment took longer than episode.step_timeout_s=0.3 s"),
])  # fmt: skip
def test_a_bad_environment_is_refused_before_any_model_loads(tmp_path, capsys, episode, key, says):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"model": {"source": "tiny"}, "episode": episode}))
    code, err = config_check(path, capsys)
    assert code == 2 and key in err and says in err, err
    assert "Traceback" not in err
