"""``reward.timeout_s``: a reward call that runs too long fails, naming the prompt, instead of stalling the run.

Pinned:
- a call past its deadline raises ``RewardTimeout`` after about ``timeout_s`` (not after the call returns); the
  next call runs on a fresh helper thread at once, while the abandoned one finishes on its own and its thread
  ends; results and exceptions of calls within the deadline come back unchanged; ``null`` calls inline;
- ``RewardTimeout`` is not a ``TimeoutError``: through ``score_completions`` it becomes a ``RewardError`` naming the
  function, the prompt, the completion and ``reward.timeout_s``, which the async controller classifies as a data
  failure (an infrastructure error would be retried with backoff instead);
- async run (embedded, tiny model): prompts whose verifier hangs fail as data failures and are skipped, every
  other prompt trains, the run finishes; sync run: the first timeout stops the run with that RewardError;
- the built-in math_verify reward scores on the helper thread (its signal-based timeouts are off there).
"""

from __future__ import annotations

import threading
import time

import pytest
from test_sync_trainer import tiny_config

from groupwise.config import ConfigError, config_from_dict
from groupwise.controller.failures import classify_failure
from groupwise.data.reward_timeout import RewardTimeout, TimedReward, with_timeout
from groupwise.data.scoring import RewardError, score_completions
from groupwise.run.fates_file import read_fates
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session
from groupwise.types import Completion, Prompt


def test_a_late_call_is_abandoned_and_the_next_one_runs_on_a_fresh_thread():
    release = threading.Event()
    started = []

    def verifier(prompt, completion, *, block=False):
        started.append(threading.current_thread())
        if block:
            release.wait(10.0)
            return 0.5
        if completion == "boom":
            raise KeyError("bad completion")
        return 1.0

    timed = TimedReward(verifier, timeout_s=0.05)
    begin = time.perf_counter()
    with pytest.raises(RewardTimeout, match=r"longer than reward.timeout_s=0.05 s"):
        timed("p", "c", block=True)
    assert time.perf_counter() - begin < 5.0 and timed.abandoned == 1
    assert timed("p", "c") == 1.0  # served at once by a new helper while the first call is still stuck
    with pytest.raises(KeyError, match="bad completion"):
        timed("p", "boom")
    stuck, fresh = started[0], started[1]
    assert stuck is not fresh and stuck.is_alive() and stuck.daemon
    release.set()
    stuck.join(5.0)
    assert not stuck.is_alive()  # the abandoned call returned; its result was dropped and its thread ended
    assert with_timeout(verifier, None) is verifier
    with pytest.raises(ValueError, match="must be > 0"):
        TimedReward(verifier, 0.0)


def test_a_timeout_is_a_reward_error_naming_the_prompt_and_a_data_failure():
    def slow(prompt, completion):
        time.sleep(1.0 if completion.text == "slow" else 0.0)
        return 1.0

    prompt = Prompt(uid="addition/train/3+4", answer="7", text="3+4=")
    completions = [Completion((), (), text, "stop", 0) for text in ("fast", "slow")]
    expected = (r"reward function 'slow' raised RewardTimeout: the call took longer than reward.timeout_s=0.1 s.*"
                r"prompt 'addition/train/3\+4', completion 1")
    with pytest.raises(RewardError, match=expected) as info:
        score_completions(TimedReward(slow, 0.1), prompt, completions)
    assert not isinstance(info.value.__cause__, TimeoutError)
    assert classify_failure(info.value) == "data"
    with pytest.raises(ConfigError, match="reward.timeout_s"):
        config_from_dict({"reward": {"timeout_s": 0}})


def config(tmp_path, mode, digits):
    cfg = tiny_config(tmp_path, run={"name": mode, "max_steps": 2}, eval={"at_start": False, "at_end": False})
    data = cfg.model_dump(by_alias=True)
    data["mode"] = mode
    data["reward"] = {"function": "scripted_rewards:hangs_on_answers_ending_in", "kwargs": {"digits": digits},
                      "timeout_s": 0.2}
    data["grpo"]["dynamic_sampling"] = {"enabled": False}
    if mode == "async":
        data["async"] = {
            "sampler": {"name": "ready_first", "max_staleness_versions": 1},
            "max_buffered_rollouts": 8, "max_inflight_prompts": 8,
            "rollout_failure": {"max_skipped_prompts": 1000, "min_step_batch_fraction": 0.25,
                                "max_data_attempts_per_prompt": 1, "replacement_reserve_prompts": 4},
        }  # fmt: skip
    return config_from_dict(data)


def test_async_skips_the_prompts_whose_verifier_hangs_and_trains_the_rest(tmp_path):
    session = build_session(config(tmp_path, "async", "37"))
    run_async(session)
    lines = read_fates(session.run_dir.fates_path)
    answers = {p.uid: p.answer for p in session.task.train_prompts()}
    failed = [line for line in lines if line["fate"] == "failed"]
    assert failed and all(answers[line["prompt_uid"]][-1] in "37" for line in failed)
    assert all("RewardTimeout" in line["detail"] and line["resolution"] != "fatal" for line in failed)
    trained = [line for line in lines if line["fate"] == "trained"]
    assert len(trained) == 2 * session.cfg.grpo.num_prompts_per_step
    assert not any(answers[line["prompt_uid"]][-1] in "37" for line in trained)


def test_sync_stops_at_the_first_timeout_naming_it(tmp_path):
    session = build_session(config(tmp_path, "sync", "0123456789"))  # every call hangs
    with pytest.raises(RewardError, match=r"RewardTimeout: the call took longer than reward.timeout_s=0.2 s"):
        run_sync(session)


def test_math_verify_works_on_the_helper_thread():
    pytest.importorskip("math_verify")
    from groupwise.data.rewards import math_verify

    prompt = Prompt(uid="math/1", answer="42", text="?")
    right, wrong = (Completion((), (), f"The answer is ${x}$", "stop", 0) for x in ("42", "41"))
    timed = TimedReward(math_verify, timeout_s=30.0)  # its own signal.alarm timeouts only work on the main thread
    assert (timed(prompt, right), timed(prompt, wrong)) == (1.0, 0.0)
