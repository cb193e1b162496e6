"""The pure parts of the TRL-matched benchmark (``bench/trl_matched.py`` and ``bench/trl_runner.py``); TRL itself is
not needed (``make test`` runs without ``.venv-trl``).

Invariants pinned:
- both sides get one job: the TRL config the runner builds takes P·G rows per step, G generations, the new-token
  limit, temperature, learning rate, clip ε low/high, AdamW and clipping settings, seed and step count from the
  groupwise config the groupwise run trains with, and follows that config when it changes;
- a groupwise setting TRL's side cannot reproduce (another loss, a KL term, dynamic sampling, LR warm-up) is refused
  by name rather than benchmarked as if matched;
- TRL's reward is the config's groupwise reward (``countdown``, or the task's default ``exact_numeric`` for the tiny
  job's text prompts) on the completion groupwise's engine would hand it (a final EOS ends it and is not in the
  text; no EOS means cut at the limit, which scores 0);
- the tiny job is the default example made matchable: P = 16, G = 8, 6 new tokens, the shipped model directory
  loaded by both sides, its entropy bonus off (TRL has none), nothing else refused;
- the runs are checked for sameness: TRL's prompt token ids must equal groupwise's encoding of the planned prompts,
  and groupwise's trained uids the planned ones, step by step;
- the table's numbers: per side the median over the steps after the warm-up, of every round; the ratio is
  groupwise ÷ TRL; the per-round table has each round's own medians, ratio and load;
- without TRL's environment the driver stops with one message naming how to build it: exit 2, no traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_modules import REPO, load_bench_module

from groupwise.config import load_config
from groupwise.data.rewards import countdown, exact_numeric
from groupwise.types import Completion, Prompt

matched = load_bench_module("trl_matched.py")
runner = load_bench_module("trl_runner.py")
CONFIG = REPO / matched.DEFAULT_CONFIG


def job_for(extra: list[str], warmup: int = 1, steps: int = 3) -> tuple[object, dict]:
    """The groupwise config the bench trains with, and the TRL config the runner would build for it."""
    cfg = load_config(CONFIG, matched.groupwise_overrides(2, 8, warmup + steps, extra))
    plan = matched.plan_prompts(cfg, warmup + steps)
    job = matched.trl_job(cfg, plan, warmup, steps, Path("/model"), REPO / "src")
    return cfg, runner.grpo_config_kwargs(job, "/out")


def test_both_sides_get_the_same_job():
    cfg, trl = job_for([])
    assert (cfg.grpo.num_prompts_per_step, cfg.grpo.num_generations_per_prompt) == (2, 8)
    assert trl["per_device_train_batch_size"] == 16 and trl["num_generations"] == 8
    assert trl["gradient_accumulation_steps"] == trl["steps_per_generation"] == trl["num_iterations"] == 1
    assert cfg.generation.max_new_tokens == trl["max_completion_length"] == 48
    assert cfg.generation.temperature == trl["temperature"] == 1.0
    assert cfg.optimizer.lr == trl["learning_rate"] == 1e-6
    assert (cfg.loss.epsilon_low, cfg.loss.epsilon_high) == (trl["epsilon"], trl["epsilon_high"]) == (0.2, 0.28)
    assert cfg.loss.kl_coef == trl["beta"] == 0.0
    assert cfg.run.seed == trl["seed"] == 0
    assert cfg.run.max_steps == trl["max_steps"] == 4
    assert not cfg.grpo.dynamic_sampling.enabled
    assert cfg.optimizer.warmup_steps == trl["warmup_steps"] == 0
    assert not trl["bf16"] and not trl["gradient_checkpointing"] and not trl["shuffle_dataset"]


def test_trl_follows_the_groupwise_config_when_it_changes():
    extra = ["optimizer.lr=3e-6", "optimizer.weight_decay=0.01", "run.seed=7", "generation.max_new_tokens=20",
             "optimizer.max_grad_norm=0.5", "generation.temperature=0.7"]  # fmt: skip
    cfg, trl = job_for(extra, warmup=0, steps=2)
    assert (trl["learning_rate"], trl["weight_decay"], trl["seed"]) == (3e-6, 0.01, 7)
    assert (trl["max_completion_length"], trl["max_grad_norm"], trl["temperature"]) == (20, 0.5, 0.7)
    assert cfg.run.max_steps == trl["max_steps"] == 2


@pytest.mark.parametrize(
    "overrides, key",
    [(["loss.type=grpo"], "loss.type"), (["model.reference=initial", "loss.kl_coef=0.01"], "loss.kl_coef"),
     (["grpo.dynamic_sampling.enabled=true"], "grpo.dynamic_sampling.enabled"),
     (["optimizer.warmup_steps=5"], "optimizer.warmup_steps")],
)  # fmt: skip
def test_a_setting_trl_cannot_match_is_refused_by_name(overrides, key):
    assert matched.unmatched(load_config(CONFIG, matched.groupwise_overrides(2, 8, 4, []))) == []
    problems = matched.unmatched(load_config(CONFIG, matched.groupwise_overrides(2, 8, 4, overrides)))
    assert len(problems) == 1 and problems[0].startswith(f"{key}=")


def test_trl_reads_every_steps_prompts_in_groupwise_order():
    cfg = load_config(CONFIG, matched.groupwise_overrides(2, 8, 3, []))
    plan = matched.plan_prompts(cfg, 3)
    job = matched.trl_job(cfg, plan, 1, 2, Path("/model"), REPO / "src")
    rows = runner.dataset_rows(job)
    assert [row["uid"] for row in rows] == [p.uid for step in plan for p in step]
    assert json.loads(rows[3]["metadata"]) == plan[1][1].metadata and rows[3]["answer"] == plan[1][1].answer
    assert rows[3]["prompt"] == [dict(m) for m in plan[1][1].messages]
    assert len({row["uid"] for row in rows}) == 6  # the loader's epoch order: no prompt twice in these steps


class CharTokenizer:
    """Token id i is the i-th character of ``chars``; id 0 is the EOS token ``<e>``."""

    chars = "E0123456789+-*/() "

    def decode(self, ids, skip_special_tokens):
        assert skip_special_tokens is False  # groupwise keeps special tokens in the text
        return "".join("<e>" if i == 0 else self.chars[i] for i in ids)

    def encode(self, text):
        return [self.chars.index(c) for c in text]


def test_trl_scores_with_groupwise_countdown_on_the_completion_groupwise_would_build():
    tokenizer = CharTokenizer()
    reward = runner.groupwise_reward(
        {"src": str(REPO / "src"), "reward": "countdown", "task_reward": "countdown",
         "reward_kwargs": {"format_reward": 0.1}}, tokenizer, {0}
    )  # fmt: skip
    messages = [{"role": "user", "content": "reach 8"}]
    prompt = Prompt(uid="u", answer="8", messages=tuple(messages), metadata={"numbers": [3, 5, 9]})
    cases = [("3+5", True), ("9-3", True), ("3*5", False), ("3+5", False)]  # ended on EOS, or cut at the limit
    ids = [tokenizer.encode(text) + ([0] if stopped else []) for text, stopped in cases]
    got = reward(prompts=[messages] * 4, completions=None, completion_ids=ids, uid=["u"] * 4, answer=["8"] * 4,
                 metadata=['{"numbers": [3, 5, 9]}'] * 4, trainer_state=None)  # fmt: skip
    expected = [
        countdown(prompt, Completion(tuple(i), (0.0,) * len(i), text, "stop" if stopped else "length", 0),
                  format_reward=0.1)
        for i, (text, stopped) in zip(ids, cases, strict=True)
    ]  # fmt: skip
    assert got == expected == [1.0, 0.1, 0.0, 0.0]


def test_the_tiny_job_is_the_default_example_made_matchable_and_scored_with_its_tasks_reward():
    tiny = matched.JOBS["tiny"]
    overrides = matched.groupwise_overrides(
        tiny.prompts, tiny.generations, 3, list(tiny.overrides), tiny.max_new_tokens
    )
    cfg = load_config(REPO / tiny.config, overrides)
    assert matched.unmatched(cfg) == []
    assert (cfg.grpo.num_prompts_per_step, cfg.grpo.num_generations_per_prompt) == (16, 8)
    assert cfg.generation.max_new_tokens == 6 and cfg.loss.entropy_coef == 0.0
    assert load_config(REPO / tiny.config).loss.entropy_coef == 0.01  # what the override turns off
    assert matched.model_directory(cfg) == (REPO / "models" / "addition-tiny").resolve()
    plan = matched.plan_prompts(cfg, 3)
    job = matched.trl_job(cfg, plan, 1, 2, Path("/model"), REPO / "src")
    assert (job["reward"], job["task_reward"]) == ("auto", "exact_numeric")
    rows = runner.dataset_rows(job)
    assert [row["prompt"] for row in rows] == [p.text for step in plan for p in step]
    tokenizer = CharTokenizer()
    reward = runner.groupwise_reward(job, tokenizer, {0})
    first = plan[0][0]
    cases = [(first.answer, True), (first.answer + "1", True), (first.answer, False)]
    ids = [tokenizer.encode(text) + ([0] if stopped else []) for text, stopped in cases]
    got = reward(prompts=[first.text] * 3, completion_ids=ids, uid=[first.uid] * 3, answer=[first.answer] * 3,
                 metadata=[rows[0]["metadata"]] * 3)  # fmt: skip
    expected = [
        exact_numeric(first, Completion(tuple(i), (0.0,) * len(i), text, "stop" if stopped else "length", 0))
        for i, (text, stopped) in zip(ids, cases, strict=True)
    ]
    assert got == expected == [1.0, 0.0, 0.0]


def test_the_runs_are_checked_for_the_same_prompts():
    a = Prompt(uid="a", answer="1", messages=({"role": "user", "content": "a"},))
    b = Prompt(uid="b", answer="2", messages=({"role": "user", "content": "b"},))
    plan, encode = [[a, b]], lambda p: (7, ord(p.uid))
    matched.check_same_prompts(plan, [[[7, 97], [7, 98]]], [["b", "a"]], encode)  # a step is a set on groupwise's side
    with pytest.raises(matched.BenchError, match="TRL's prompt token ids"):
        matched.check_same_prompts(plan, [[[7, 98], [7, 97]]], [["a", "b"]], encode)
    with pytest.raises(matched.BenchError, match="groupwise trained other prompts"):
        matched.check_same_prompts(plan, [[[7, 97], [7, 98]]], [["a", "c"]], encode)


def records(values: list[tuple[int, int, float]], load: float = 1.0) -> list[dict]:
    """(round, step, seconds) → records whose gen and learner columns are fixed fractions of the step."""
    return [
        {"round": r, "step": s, "step_s": x, "gen_s": x / 4, "learner_s": 3 * x / 4, "completion_tokens": 100 + s,
         "load": load + r}
        for r, s, x in values
    ]  # fmt: skip


def test_medians_leave_out_the_warm_up_and_pool_the_rounds_and_the_ratio_is_groupwise_over_trl():
    trl = records([(0, 0, 900.0), (0, 1, 40.0), (0, 2, 44.0), (1, 0, 800.0), (1, 1, 48.0), (1, 2, 60.0)])
    ours = records([(0, 0, 500.0), (0, 1, 20.0), (0, 2, 22.0), (1, 0, 400.0), (1, 1, 26.0), (1, 2, 30.0)])
    summary = matched.summarize({"TRL": trl, "groupwise": ours}, warmup=1)
    assert summary["TRL"]["step_s"] == 46.0 and summary["groupwise"]["step_s"] == 24.0  # medians of 4 values
    assert summary["TRL"]["gen_s"] == 11.5 and summary["groupwise"]["learner_s"] == 18.0
    assert summary["groupwise / TRL"]["step_s"] == pytest.approx(24.0 / 46.0)
    assert summary["groupwise / TRL"]["completion_tokens"] == 1.0
    table = matched.format_table(summary).splitlines()
    assert table[2] == "| TRL | 46.00 | 11.50 | 34.50 | 102 |"
    assert table[4] == "| groupwise / TRL | 0.52× | 0.52× | 0.52× | 1.00× |"


def test_each_round_gets_its_own_medians_and_ratio():
    trl = records([(0, 0, 900.0), (0, 1, 40.0), (0, 2, 44.0), (1, 0, 800.0), (1, 1, 48.0), (1, 2, 60.0)], load=2.0)
    ours = records([(0, 0, 500.0), (0, 1, 20.0), (0, 2, 22.0), (1, 0, 400.0), (1, 1, 26.0), (1, 2, 30.0)])
    rows = matched.format_rounds({"TRL": trl, "groupwise": ours}, warmup=1).splitlines()
    assert rows[2:] == ["| 1 | 42.00 | 2.00 | 21.00 | 1.00 | 0.50× |", "| 2 | 54.00 | 3.00 | 28.00 | 2.00 | 0.52× |"]


def test_a_side_with_only_warm_up_steps_is_an_error_not_a_number():
    with pytest.raises(matched.BenchError, match="TRL has no step after the 2 warm-up steps"):
        matched.summarize({"TRL": records([(0, 0, 1.0), (0, 1, 1.0)]), "groupwise": records([(0, 2, 1.0)])}, 2)


def test_without_trls_environment_the_driver_says_how_to_build_it(tmp_path):
    missing = tmp_path / "no-venv-trl"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "trl_matched.py"), "--trl-venv", str(missing)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.startswith(f"trl_matched: TRL's environment {missing} does not exist")
    assert "make bench-trl" in done.stderr
