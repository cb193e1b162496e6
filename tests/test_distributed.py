"""Data-parallel learner ranks (``learner.num_ranks``): same update as one rank, resume, a rank that dies.

Invariants pinned:
- the split of a step across ranks: every row on exactly one rank, whole groups, the greedy token balance
  (the largest group first, to the least loaded rank), deterministic;
- config: learner keys with one rank are errors naming each key;
- (slow) 2 ranks, DDP and FSDP, take the update one rank takes on the same rows: every parameter tensor
  within 1e-5 relative (‖Δ‖ / ‖θ‖) after 3 steps, a step at once (sync) and streamed in chunks (async), with
  micro-batches; the weight version is exact and the optimizer state has one rank's layout;
- (slow) an async in_order run on 2 FSDP ranks samples, trains and records the groups of a one-rank run
  (fates.jsonl equal) and ends within 1e-5 of its parameters; LoRA on 2 FSDP ranks trains the one-rank adapter
  and merges the same generator weights (1e-5);
- (slow) a 2-rank sync run (DDP and FSDP) resumed from its checkpoint ends with the parameters of the
  uninterrupted run, bit for bit; a one-rank run resumes the 2-rank checkpoint;
- (slow) killing one rank ends the run within 60 s with LearnerRankDied naming the rank and the checkpoint kept.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from groupwise.config import ConfigError, config_from_dict
from groupwise.trainer.micro_batches import rank_rows

sys.path.insert(0, str(Path(__file__).parent))


def test_rank_split_keeps_groups_whole_and_balances_tokens():
    groups = [0, 0, 1, 1, 1, 2, 3, 3]
    lengths = [5, 5, 1, 1, 1, 20, 4, 4]  # group totals: 10, 3, 20, 8
    shares = rank_rows(groups, lengths, 2)
    assert sorted(r for share in shares for r in share) == list(range(8))
    assert shares == [[5], [0, 1, 2, 3, 4, 6, 7]]  # 20 | 10 + 8 + 3 = 21: largest first, least loaded rank
    assert rank_rows(groups, lengths, 2) == shares
    assert rank_rows([7, 7], [3, 3], 3) == [[0, 1], [], []]  # fewer groups than ranks: some ranks get none


def test_learner_keys_need_several_ranks():
    base = {"model": {"source": "tiny"}}
    with pytest.raises(ConfigError) as err:
        config_from_dict({**base, "learner": {"sharding": "fsdp", "collective_timeout_s": 30}})
    assert len(err.value.errors) == 2 and "learner.collective_timeout_s" in str(err.value)
    assert "learner.sharding" in str(err.value) and "num_ranks" in str(err.value)
    assert config_from_dict({**base, "learner": {"num_ranks": 2, "sharding": "fsdp"}}).learner.sharding == "fsdp"


# --- processes (slow: each start spawns two ranks that import torch and load the model) -------------------------
TINY = {"vocab": "full", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


def learner_config(ranks: int, sharding: str = "ddp"):
    data = {
        "model": {"source": "tiny", "device": "cpu", "tiny": TINY},
        "optimizer": {"lr": 1e-3, "logprob_chunk_tokens": 16, "micro_batch_rows": 4},
        "loss": {"entropy_coef": 0.01},
        "grpo": {"num_prompts_per_step": 5},
    }
    if ranks > 1:
        data["learner"] = {"num_ranks": ranks, "sharding": sharding}
    return config_from_dict(data)


def train(learner, steps, streamed: bool) -> list[dict]:
    metrics = []
    for rows in steps:
        if streamed:  # the async controller's way: chunks of whole groups, then the step closes
            learner.train_chunk(rows.select_groups([0, 1]))
            learner.train_chunk(rows.select_groups([2, 3, 4]))
            metrics.append(learner.finish_step())
        else:
            metrics.append(learner.train_step(rows))
    return metrics


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_take_the_one_rank_update(sharding):
    from test_learner import make_rows

    from groupwise.runtime.learner_ranks import LearnerRanks, RankedLearner, RankedModel
    from groupwise.trainer.builder import build_learner, load_policy_from_config

    steps = [make_rows(seed, groups=5) for seed in range(3)]
    one_cfg = learner_config(1)
    results = {}
    for streamed in (False, True):
        torch.manual_seed(one_cfg.run.seed)
        one = build_learner(one_cfg, load_policy_from_config(one_cfg).model)
        results[streamed] = (train(one, steps, streamed), one)
    ranks = LearnerRanks(learner_config(2, sharding))
    try:
        ranks.wait_started()
        learner, model = RankedLearner(ranks), RankedModel(ranks)
        initial, fresh_optimizer = model.state_dict(), learner.state_dict()
        for streamed in (False, True):
            if streamed:  # start the ranks again from the initial weights and a fresh optimizer
                model.load_state_dict(initial)
                learner.load_state_dict(fresh_optimizer)
            want_metrics, one = results[streamed]
            got_metrics = train(learner, steps, streamed)
            got = model.state_dict()
            for name, want in one.model.state_dict().items():  # relative: ‖got − want‖ / ‖want‖ per tensor
                assert float((got[name] - want).norm() / want.norm()) <= 1e-5, (streamed, name)
            for g, w in zip(got_metrics, want_metrics, strict=True):
                assert g["loss/total"] == pytest.approx(w["loss/total"], rel=1e-5, abs=1e-7)
                assert g["perf/train_tokens"] == w["perf/train_tokens"]
            assert learner.version == one.version == 3  # the streamed run restarted from the saved version 0
            optimizer = learner.state_dict()["optimizer"]
            assert sorted(optimizer["state"]) == sorted(one.state_dict()["optimizer"]["state"])
    finally:
        ranks.close()


def session_config(tmp_path: Path, name: str, max_steps: int, ranks: int = 2, sharding: str = "ddp", **sections):
    from test_sync_trainer import tiny_config

    extra = {"learner": {"num_ranks": ranks, "sharding": sharding}} if ranks > 1 else {}
    extra.update(sections)
    return tiny_config(
        tmp_path, run={"name": name, "max_steps": max_steps}, eval={"at_start": False, "at_end": False},
        checkpoint={"every": 1, "keep_last": 5, "save_final": False}, **extra,
    )  # fmt: skip


def run_session(cfg, steps: int | None = None, **kwargs):
    from groupwise.runtime.sessions import build_run_session
    from groupwise.runtime.sync_run import train_steps

    session = build_run_session(cfg, **kwargs)
    try:
        train_steps(session, steps or cfg.run.max_steps)
        params = session.policy.model.state_dict()
    finally:
        session.close()
    return session, params


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_rank_resume_equals_continuing_and_one_rank_resumes_it(tmp_path, sharding):
    _, straight = run_session(session_config(tmp_path, "straight", 3, sharding=sharding))
    run_session(session_config(tmp_path, "resumed", 1, sharding=sharding))
    resumed_session, resumed = run_session(session_config(tmp_path, "resumed", 3, sharding=sharding), resume=True)
    assert resumed_session.state.step == 3 and resumed_session.learner.version == 3
    for name, tensor in straight.items():
        assert torch.equal(resumed[name], tensor), name
    one_session, _ = run_session(session_config(tmp_path, "resumed", 4, ranks=1), resume=True)
    assert one_session.state.step == 4 and one_session.learner.version == 4


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_with_its_name_and_what_was_kept(tmp_path):
    from groupwise.runtime.learner_ranks import LearnerRankDied
    from groupwise.runtime.sessions import build_run_session
    from groupwise.runtime.sync_run import train_steps

    session = build_run_session(session_config(tmp_path, "killed", 3))
    try:
        train_steps(session, 1)
        os.kill(session.ranks.processes[1].pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(LearnerRankDied) as err:
            train_steps(session, 3)
        assert time.monotonic() - started < 60
    finally:
        session.close()
    message = str(err.value)
    assert "learner rank 1 of 2" in message and "signal 9" in message and "step_1" in message
    assert not any(p.is_alive() for p in session.ranks.processes)


@pytest.mark.slow
def test_async_in_order_run_on_two_fsdp_ranks_trains_as_one_rank(tmp_path):
    from test_async_resume import async_config

    from groupwise.runtime.async_run import run_async
    from groupwise.runtime.sessions import build_run_session

    def run(name: str, ranks: int):
        data = async_config(tmp_path, name, 3)
        if ranks > 1:
            data["learner"] = {"num_ranks": ranks, "sharding": "fsdp"}
        session = build_run_session(config_from_dict(data))
        try:
            run_async(session)
            return session.policy.model.state_dict(), (session.run_dir.path / "fates.jsonl").read_text()
        finally:
            session.close()

    (one, one_fates), (two, two_fates) = run("one", 1), run("two", 2)
    assert two_fates == one_fates  # the same groups sampled, trained and filtered, at the same versions
    for name, want in one.items():
        assert float((two[name] - want).norm() / want.norm()) <= 1e-5, name


@pytest.mark.slow
def test_lora_on_two_fsdp_ranks_trains_the_one_rank_adapter():
    from test_learner import make_rows

    from groupwise.model.lora import generator_state_dict, trained_state_dict
    from groupwise.runtime.learner_ranks import LearnerRanks, RankedLearner, RankedModel
    from groupwise.trainer.builder import build_learner, load_policy_from_config

    def config(ranks: int):
        data = learner_config(ranks, "fsdp").model_dump(by_alias=True)
        data["model"]["lora"] = {"enabled": True, "rank": 4, "target_modules": ["q_proj", "v_proj"]}
        return config_from_dict(data)

    steps = [make_rows(seed, groups=5) for seed in range(3)]
    torch.manual_seed(config(1).run.seed)
    one = build_learner(config(1), load_policy_from_config(config(1)).model)
    train(one, steps, streamed=False)
    ranks = LearnerRanks(config(2))
    try:
        ranks.wait_started()
        learner, model = RankedLearner(ranks), RankedModel(ranks)
        train(learner, steps, streamed=False)
        for got, want in ((model.state_dict(), trained_state_dict(one.model)),
                          (learner.generator_state(), generator_state_dict(one.model))):
            assert sorted(got) == sorted(want)
            for name, tensor in want.items():
                assert float((got[name] - tensor).norm() / tensor.norm()) <= 1e-5, name
    finally:
        ranks.close()
