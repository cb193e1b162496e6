"""Failures are fates, never zeros: failed episodes and sessions retried with a fresh environment, and a run that
stops after too many failures in a row.

Invariants pinned:
- with ``episode.retry_failed_episodes`` N, an episode whose environment fails (in ``reset`` or ``step``) starts
  over from its opening with a fresh environment, on the same seeds (the retry sends the environment the same
  turn), and its group trains; its record counts the retry and the tokens the failed attempt sampled;
- an episode that fails N + 1 times fails its group with the last error, naming the environment, the prompt, the
  sample and the retries, charged with every attempt's tokens; a ``ConnectionError`` underneath classifies the failure
  ``infra``;
- the same for harness sessions: a failed session starts again with a fresh session (a new key), its result
  counting the retry and the tokens its failed session was served; past the retries the group fails, charged with
  every session's tokens;
- ``FailureStreak``: failures in a row count, a finished episode ends the streak, the ``limit``-th in a row raises
  ``ConsecutiveEpisodeFailures`` naming what failed and the last three errors; the async failure budgets re-raise
  it (also as the cause of a group's failure) however many prompts they may still skip;
- a run whose environment fails episode after episode stops with that error (sync and async), keeping its
  checkpoint and a fate for every dispatched prompt (``audit`` passes); whole sync and async (on the stream) runs
  with a flaky environment, and an async run with a flaky harness, retry and train on, logging ``episode/retries``
  and ``episode/retried_tokens`` as their rows' records say;
- ``episode.retry_failed_episodes`` and ``episode.max_consecutive_failures`` outside their bounds are refused,
  naming the key.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict

import pytest
from test_episode_runs import episode_config
from test_episodes import EOS, RENDERER, ScriptedGenerator, chars, game
from test_harness_runs import ask, harness_config, run_group

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.controller.failures import FailureBudgets, PromptAttempts, classify_failure
from groupwise.environments.guess_number import GuessNumberEnvironment
from groupwise.episodes.episode import EpisodeLimits
from groupwise.episodes.failure_streak import ConsecutiveEpisodeFailures, FailureStreak
from groupwise.episodes.group import EpisodeError, EpisodeSettings
from groupwise.episodes.lockstep import run_episode_groups
from groupwise.harness.launch import HarnessSpec
from groupwise.harness.runner import HarnessError
from groupwise.harness.session import HarnessSession
from groupwise.run.fates_file import read_fates
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session
from groupwise.types import SamplingParams, cost_of

SAMPLING = SamplingParams(max_new_tokens=8, temperature=1.0)


class Flaky(GuessNumberEnvironment):
    """Guess-the-number whose environments fail (test only): the first ``step_failures[sample]`` attempts at a
    sample fail in ``step`` and the first ``reset_failures[sample]`` in ``reset``, for every prompt; from the
    ``down_from``-th prompt seen on, every step fails (an outage). ``seen`` records each attempt's first turn."""

    attempts: dict[tuple[str, int], int] = defaultdict(int)
    seen: dict[tuple[str, int], list[str]] = defaultdict(list)
    prompts: list[str] = []
    lock = threading.Lock()

    def __init__(self, step_failures=None, reset_failures=None, down_from: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step_failures = {int(k): v for k, v in (step_failures or {}).items()}
        self.reset_failures = {int(k): v for k, v in (reset_failures or {}).items()}
        self.down_from = down_from
        self.key: tuple[str, int] = ("", 0)
        self.attempt = 0

    @classmethod
    def forget(cls) -> None:
        cls.attempts.clear()
        cls.seen.clear()
        cls.prompts.clear()

    def reset(self, prompt, sample_index):
        with Flaky.lock:
            self.key = (prompt.uid, sample_index)
            Flaky.attempts[self.key] += 1
            self.attempt = Flaky.attempts[self.key]
            if prompt.uid not in Flaky.prompts:
                Flaky.prompts.append(prompt.uid)
        if self.attempt <= self.reset_failures.get(sample_index, 0):
            raise ConnectionError("the sandbox went away in reset")
        return super().reset(prompt, sample_index)

    def step(self, assistant_message):
        Flaky.seen[self.key].append(assistant_message["content"])
        down = self.down_from is not None and Flaky.prompts.index(self.key[0]) >= self.down_from
        if down or self.attempt <= self.step_failures.get(self.key[1], 0):
            raise ConnectionError("the sandbox went away")
        return super().step(assistant_message)


@pytest.fixture(autouse=True)
def fresh_counts():
    Flaky.forget()
    yield
    Flaky.forget()


def settings(retries: int, limit: int = 0, **flaky) -> EpisodeSettings:
    limits = EpisodeLimits(max_turns=2, max_tokens=200, max_observation_tokens=64, max_turn_tokens=8)
    streak = FailureStreak(limit, "environment 'test-env'")
    return EpisodeSettings("test-env", lambda: Flaky(**flaky), RENDERER, limits, 5.0, retries=retries, streak=streak)


def by_seed(context, seed):
    """A reply that depends on the turn's seed only: a retry on the same seed says the same."""
    return chars(str(seed % 10)) + [EOS]


def test_a_failed_episode_starts_over_with_a_fresh_environment_on_the_same_seeds():
    [episodes] = run_episode_groups(
        ScriptedGenerator(by_seed),
        SAMPLING,
        settings(1, step_failures={0: 1}, reset_failures={1: 1}),
        [game("p", 20)],
        [7],
        2,
    )
    assert not isinstance(episodes, Exception), episodes
    first, second = episodes
    assert Flaky.attempts == {("p", 0): 2, ("p", 1): 2}
    assert Flaky.seen[("p", 0)][0] == Flaky.seen[("p", 0)][1]  # the failed attempt's turn, sampled again
    assert (first.retries, first.retried_tokens) == (1, 2)  # its failed attempt sampled "<digit><eos>"
    assert (second.retries, second.retried_tokens) == (1, 0)  # its reset failed: nothing sampled
    record = first.record(sum(first.step_rewards))
    assert (record.retries, record.retried_tokens) == (1, 2)


def test_an_episode_failing_past_its_retries_fails_its_group_charged_with_every_attempt():
    [outcome] = run_episode_groups(
        ScriptedGenerator(by_seed), SAMPLING, settings(2, step_failures={0: 99}), [game("p", 20)], [7], 2
    )
    assert isinstance(outcome, EpisodeError)
    assert str(outcome) == (
        "environment 'test-env' failed in step() (prompt 'p', sample 0): ConnectionError: the sandbox went away "
        "(after 2 retries with a fresh environment)"
    )
    assert Flaky.attempts[("p", 0)] == 3 and classify_failure(outcome) == "infra"
    assert cost_of(outcome).tokens >= 3 * 2 + 2  # three attempts at sample 0, and sample 1's turns


def test_the_streak_counts_failures_in_a_row_and_stops_at_its_limit_naming_the_last_errors():
    streak = FailureStreak(3, "environment 'python_sandbox'")
    for _ in range(2):
        streak.failed(RuntimeError("down"))
    streak.finished()  # an episode finished: the outage, if any, is over
    streak.failed(RuntimeError("one"))
    streak.failed(RuntimeError("two"))
    with pytest.raises(ConsecutiveEpisodeFailures) as stopped:
        streak.failed(ConnectionError("three"))
    assert str(stopped.value) == (
        "3 episodes in a row failed, none finishing between them (episode.max_consecutive_failures=3): the "
        "environment 'python_sandbox' looks down, so the run stops instead of failing prompt after prompt. The last "
        "errors: (1) RuntimeError: one; (2) RuntimeError: two; (3) ConnectionError: three. Fix the environment and "
        "continue with --resume, or raise episode.max_consecutive_failures (0 never stops for this)"
    )
    never = FailureStreak(0, "harness 'x'")
    for _ in range(1000):
        never.failed(RuntimeError("down"))
    from groupwise.config.async_schema import RolloutFailureSection

    budgets = FailureBudgets(RolloutFailureSection(max_skipped_prompts=1000, max_data_attempts_per_prompt=5))
    wrapped = EpisodeError("environment failed", "p", 0)
    wrapped.__cause__ = stopped.value
    for error in (stopped.value, wrapped):
        with pytest.raises(type(error)):
            budgets.on_failure(PromptAttempts(), error, "rollout of 'p'")


def test_episodes_failing_in_a_row_stop_the_episodes_with_the_streaks_error():
    with pytest.raises(ConsecutiveEpisodeFailures, match="the environment 'test-env' looks down") as stopped:
        run_episode_groups(
            ScriptedGenerator(by_seed),
            SAMPLING,
            settings(1, limit=3, step_failures={0: 99, 1: 99}),
            [game("p", 20)],
            [7],
            2,
        )
    assert "(3) EpisodeError: environment 'test-env' failed in step() (prompt 'p', sample 0)" in str(stopped.value)


def flaky_harness(session: HarnessSession) -> float:
    """Its first session of each sample asks once and crashes (test only); the next one asks and answers 1."""
    with Flaky.lock:
        Flaky.attempts[(session.prompt.uid, session.sample_index)] += 1
        attempt = Flaky.attempts[(session.prompt.uid, session.sample_index)]
    ask(session)
    if attempt == 1:
        raise RuntimeError("the agent crashed")
    return 1.0


def down_harness(session: HarnessSession) -> float:
    ask(session)
    raise ConnectionError("the model server is gone")


def run_harness_group(function, retries: int, limit: int = 0):
    streak = FailureStreak(limit, "harness 'test-harness'")
    return run_group(HarnessSpec("test-harness", function=function), retries=retries, streak=streak)


def test_a_failed_harness_session_starts_again_with_a_fresh_session():
    results = run_harness_group(flaky_harness, retries=1)
    assert not isinstance(results, HarnessError), results
    assert [(r.sample_index, r.reward, r.retries, r.retried_tokens) for r in results] == [
        (0, 1.0, 1, 3),
        (1, 1.0, 1, 3),
    ]
    assert Flaky.attempts == {("game/0", 0): 2, ("game/0", 1): 2}
    failed = run_harness_group(down_harness, retries=2)
    assert isinstance(failed, HarnessError) and str(failed) == (
        "harness 'test-harness' failed (prompt 'game/0', sample 0): it raised ConnectionError: the model server is "
        "gone (after 2 retries with a fresh session)"
    )
    assert cost_of(failed).tokens == 2 * 3 * 3  # two samples, three sessions each, 3 tokens served to each
    with pytest.raises(ConsecutiveEpisodeFailures, match="the harness 'test-harness' looks down"):
        run_harness_group(down_harness, retries=5, limit=4)


def test_the_retry_keys_are_bounded_and_named():
    for key, value in (("retry_failed_episodes", -1), ("retry_failed_episodes", 101), ("max_consecutive_failures", -1)):
        with pytest.raises(ConfigError, match=f"episode.{key}"):
            config_from_dict({"episode": {"environment": "guess_number", key: value}})


FLAKY = "test_episode_retries:Flaky"
STREAM = {"generation": {"max_new_tokens": 4, "continuous_batching": True}}
ASYNC = {
    "sampler": {"name": "ready_first", "max_staleness_versions": 1},
    "max_buffered_rollouts": 4,
    "max_inflight_prompts": 2,
}


@pytest.mark.parametrize(
    "mode, sections", [("sync", {}), ("async", {**STREAM, "async": ASYNC})], ids=["sync", "async-stream"]
)
def test_runs_with_a_flaky_environment_retry_and_train_counting_the_retries(tmp_path, capsys, mode, sections):
    episode = {
        "environment": FLAKY,
        "kwargs": {"max_guesses": 3, "step_failures": {"0": 1}},
        "retry_failed_episodes": 1,
    }
    session = build_session(episode_config(tmp_path, mode, episode=episode, eval={"at_start": False}, **sections))
    (run_sync if mode == "sync" else run_async)(session)
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        rows = [json.loads(x) for x in session.run_dir.train_data_path(record["step"]).read_text().splitlines()]
        assert record["episode/retries"] == sum(r["episode"]["retries"] for r in rows) == 2  # sample 0 of each group
        assert record["episode/retried_tokens"] == sum(r["episode"]["retried_tokens"] for r in rows) > 0
    assert main(["audit", str(session.run_dir.path)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    "mode, sections",
    [
        ("sync", {}),
        ("async", {"async": {**ASYNC, "rollout_failure": {"max_skipped_prompts": 100, "backoff_base_s": 0.0}}}),
    ],
    ids=["sync", "async"],
)
def test_a_run_whose_environment_is_down_stops_naming_it_and_keeps_what_it_had(tmp_path, capsys, mode, sections):
    episode = {
        "environment": FLAKY,
        "kwargs": {"max_guesses": 3, "down_from": 8},
        "retry_failed_episodes": 1,
        "max_consecutive_failures": 6,
    }
    cfg = episode_config(
        tmp_path,
        mode,
        episode=episode,
        eval={"at_start": False},
        checkpoint={"every": 1, "keep_last": 10},
        run={"max_steps": 8},
        **sections,
    )
    session = build_session(cfg)
    with pytest.raises(ConsecutiveEpisodeFailures, match="environment 'test_episode_retries:Flaky' looks down"):
        (run_sync if mode == "sync" else run_async)(session)
    lines = read_fates(session.run_dir.fates_path)
    trained_steps = sorted({line["step"] for line in lines if line["fate"] == "trained"})
    assert trained_steps[:2] == [0, 1]  # the steps before the outage trained (4 prompts before the 9th)...
    saved = [int(p.name.removeprefix("step_")) for p in (session.run_dir.path / "checkpoints").glob("step_*")]
    assert saved and max(saved) <= len(trained_steps)  # ...and their checkpoints are kept
    stopped = [line for line in lines if "ConsecutiveEpisodeFailures" in line["detail"]]
    assert stopped and all(line["fate"] in ("failed", "pending") for line in stopped)
    assert main(["audit", str(session.run_dir.path)]) == 0, capsys.readouterr().out


def test_an_async_run_with_a_flaky_harness_retries_its_sessions_on_the_stream(tmp_path, capsys):
    cfg = harness_config(
        tmp_path,
        "async",
        "test_episode_retries:flaky_harness",
        eval={"at_start": False, "at_end": False},
        episode={"retry_failed_episodes": 1},
        **STREAM,
        **{"async": ASYNC},
    )
    session = build_session(cfg)
    try:
        run_async(session)
    finally:
        session.close()
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["episode/retries"] for r in records] == [8.0, 8.0]  # every session's first attempt crashed
    assert all(r["episode/retried_tokens"] > 0 for r in records)
    assert main(["audit", str(session.run_dir.path)]) == 0, capsys.readouterr().out
