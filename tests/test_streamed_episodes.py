"""Episodes on a generation stream: each turn is a request of its own, and a slow environment holds up nobody else.

Invariants pinned:
- a slow environment step delays only its own episode: while one episode's step sleeps, the other episodes of
  its group take every turn they have (the lockstep driver, by contrast, makes them wait for it);
- on the built-in engine's stream an episode samples exactly the tokens it samples on the lockstep driver (the
  same seed per sample and turn), so either driver trains the same episodes;
- a hung environment constructor fails its group at the step deadline and leaves only daemon threads behind
  (``asyncio.run`` and the interpreter's exit wait for none);
- a turn takes at most what its episode has room for: the stream ends a row at its request's own
  ``max_new_tokens``, the batch engine splits a call by limit and answers in request order, and a limit of 0 or
  above the sampling's is refused;
- a group cancelled while a turn is on the stream cancels that turn there, and its cost counts the tokens of
  its finished turns and of the cancelled one;
- a checkpointed episode group is taken back at its turns (the saved tokens of a turn on the stream continue it)
  when fresh environments given the saved turns answer as before, and each episode starts over when they do not;
  saved with another seed, the whole group starts over, saying why;
- an async run with partial rollouts killed in the middle of a checkpoint resumes with the episodes that were in
  flight continued at their turns (``resume: continued``, ``rollout/resumed_tokens``), every prompt accounted for
  once and every trained row replaying to its reward;
- an async run with continuous batching trains episodes with the windowed sampler (dynamic sampling on) and
  with weight_fifo: every step balances, every trained row replays to its reward, and the audit finds every
  prompt accounted for once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest
from test_episode_runs import check_rows, episode_config, killed_in_a_checkpoint_then_resumed
from test_episodes import EOS, RENDERER, TOKENIZER, chars, game, settings

from groupwise.cli.run_prompts import training_uids
from groupwise.environments.guess_number import GuessNumberEnvironment
from groupwise.episodes.group import finish_step, open_group, start_step
from groupwise.episodes.lockstep import run_episode_groups
from groupwise.episodes.progress import encode_group, take_back
from groupwise.generation import Engine
from groupwise.generation.request_limits import generate_by_limit
from groupwise.model import load_policy
from groupwise.run.audit import audit_run
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.inflight import kept_tokens
from groupwise.runtime.streamed_episodes import GroupTurns, run_streamed_group
from groupwise.trainer.builder import build_session
from groupwise.types import Completion, GenerationRequest, RowPrefix, SamplingParams

SAMPLING = SamplingParams(max_new_tokens=8, temperature=1.0)


class InstantStream:
    """A fake request stream (test only): each request is answered on a thread of its own after ``delay_s`` with
    ``reply`` cut to the request's limit; ``hold`` keeps requests unanswered (a turn still decoding)."""

    def __init__(self, reply: list[int], delay_s: float = 0.005, hold: bool = False) -> None:
        self.reply, self.delay_s, self.hold = reply, delay_s, hold
        self.submitted: list[GenerationRequest] = []
        self.cancelled: list[int] = []

    def submit(self, request: GenerationRequest, on_done) -> int:
        self.submitted.append(request)
        handle = len(self.submitted) - 1
        if not self.hold:
            ids = tuple(self.reply[: request.max_new_tokens])
            completion = Completion(ids, (-1.0,) * len(ids), TOKENIZER.decode(ids, skip_special_tokens=True), "stop", 0)
            threading.Timer(self.delay_s, on_done, args=([completion],)).start()
        return handle

    def cancel(self, handle: int, on_dropped=None) -> None:
        self.cancelled.append(handle)
        if on_dropped is not None:
            on_dropped(5, 0.25)  # five tokens of the unfinished turn, a quarter second of the stream

    def cost(self, handle: int) -> tuple[int, float]:
        return len(self.reply), 0.01

    def forget(self, handle: int) -> None:
        pass


class SlowFirstPlayer(GuessNumberEnvironment):
    """Sample 0's every step sleeps (test only); each step's end time is recorded per sample."""

    finished: dict[int, list[float]] = {}

    def reset(self, prompt, sample_index):
        self.sample = sample_index
        SlowFirstPlayer.finished[sample_index] = []
        return super().reset(prompt, sample_index)

    def step(self, message):
        if self.sample == 0:
            time.sleep(0.6)
        result = super().step(message)
        SlowFirstPlayer.finished[self.sample].append(time.perf_counter())
        return result


def test_a_slow_environment_delays_only_its_own_episode():
    stream = InstantStream(chars("1") + [EOS])  # always guesses 1: the secret is 20, so no episode ends early
    group_settings = settings(factory=SlowFirstPlayer, max_turns=3)
    outcome = asyncio.run(run_streamed_group(stream, group_settings, game("p", 20), 5, 4, GroupTurns()))
    assert not isinstance(outcome, Exception)
    assert [e.turns for e in outcome] == [3, 3, 3, 3]
    first_slow_step = SlowFirstPlayer.finished[0][0]
    for sample in (1, 2, 3):  # every turn of the fast episodes ended before the slow one's first step did
        assert len(SlowFirstPlayer.finished[sample]) == 3
        assert SlowFirstPlayer.finished[sample][-1] < first_slow_step
    # The lockstep driver, for contrast: a round waits for its slowest step.
    lockstep = run_episode_groups(LockstepStream(stream), SAMPLING, group_settings, [game("p", 20)], [5], 4)
    assert not isinstance(lockstep[0], Exception)
    assert SlowFirstPlayer.finished[1][-1] > SlowFirstPlayer.finished[0][0]


def test_a_hung_constructor_fails_its_group_and_keeps_no_thread_the_exit_would_wait_for():
    from test_episodes import SlowToMake

    stream = InstantStream(chars("1") + [EOS])
    started = time.perf_counter()
    outcome = asyncio.run(run_streamed_group(stream, settings(factory=SlowToMake, timeout_s=0.3), game("p", 20), 5,
                                             2, GroupTurns()))  # fmt: skip
    assert time.perf_counter() - started < 1.5  # asyncio.run returned without joining the stuck constructors
    assert str(outcome) == ("environment 'test-env' could not be created (prompt 'p', sample 0): StepTimeout: it "
                            "took longer than episode.step_timeout_s=0.3 s and was abandoned")
    stuck = [t for t in threading.enumerate() if t.name.startswith("groupwise-env-make")]
    assert stuck and all(t.daemon for t in stuck)  # the interpreter's exit joins none of them


class LockstepStream:
    """The fake stream's replies as a batch generator (test only)."""

    version = 0

    def __init__(self, stream: InstantStream) -> None:
        self.stream = stream

    def generate(self, requests, sampling):
        ids = tuple(self.stream.reply[: sampling.max_new_tokens])
        text = TOKENIZER.decode(ids, skip_special_tokens=True)
        return [[Completion(ids, (-1.0,) * len(ids), text, "stop", 0)] for _ in requests]


@pytest.fixture(scope="module")
def engine():
    policy = load_policy("tiny", tiny={"vocab": "full", "num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                       "intermediate_size": 64, "max_position_embeddings": 256}, seed=1, device="cpu")
    return Engine(policy.model, policy.tokenizer, eos_token_ids=(EOS,))  # fmt: skip


@pytest.mark.numerics  # tokens compared exactly across batch shapes (the stream's slots vs the batch engine)
def test_an_episode_samples_the_same_tokens_on_the_stream_as_in_lockstep(engine):
    group_settings = settings(max_turns=3)
    prompts, seeds = [game("a", 3), game("b", 17)], [7, 8]
    lockstep = run_episode_groups(engine, SAMPLING, group_settings, prompts, seeds, 3)
    stream = engine.open_stream(SAMPLING, max_rows=16)
    stream.start("test-stream")

    async def both_groups():
        return await asyncio.gather(*(
            run_streamed_group(stream, group_settings, prompt, seed, 3, GroupTurns())
            for prompt, seed in zip(prompts, seeds, strict=True)
        ))  # fmt: skip

    try:
        streamed = asyncio.run(both_groups())
    finally:
        stream.close(10.0)
    for on_stream, in_rounds in zip(streamed, lockstep, strict=True):
        assert [e.token_ids for e in on_stream] == [e.token_ids for e in in_rounds]
        assert [e.trainable for e in on_stream] == [e.trainable for e in in_rounds]
        assert [e.end for e in on_stream] == [e.end for e in in_rounds]
    assert sum(e.turns for group in streamed for e in group) > 6  # some episodes took more than one turn


def test_a_turn_takes_at_most_its_own_limit(engine):
    prompt = tuple(RENDERER.opening([{"role": "user", "content": "Say something long."}]))
    requests = [GenerationRequest(prompt, 2, 11, max_new_tokens=limit) for limit in (1, 3, None)]
    never_stops = SamplingParams(max_new_tokens=6, temperature=1.0)
    stream = engine.open_stream(never_stops, max_rows=8)
    answers: dict[int, object] = {}
    for index, request in enumerate(requests):
        stream.submit(request, lambda outcome, i=index: answers.__setitem__(i, outcome))
    stream.run_until_idle()
    split = generate_by_limit(requests, never_stops, engine.generate)  # the batch engine: one call per limit
    for index, limit in enumerate((1, 3, 6)):
        on_stream = answers[index]
        assert all(len(c.token_ids) <= limit for c in on_stream)
        assert all(c.finish_reason == "length" for c in on_stream if len(c.token_ids) == limit)
        assert [c.token_ids for c in split[index]] == [c.token_ids for c in on_stream]
    for bad in (0, 7):
        with pytest.raises(ValueError, match=f"max_new_tokens={bad}; it must be 1 to the sampling's 6"):
            stream.submit(GenerationRequest(prompt, 1, 0, max_new_tokens=bad), lambda outcome: None)
    stream.close(5.0)


def test_a_cancelled_group_cancels_its_turn_on_the_stream_and_counts_what_it_spent():
    stream = InstantStream(chars("1") + [EOS], hold=True)
    turns = GroupTurns()

    async def cancel_while_decoding():
        task = asyncio.create_task(run_streamed_group(stream, settings(), game("p", 20), 5, 2, turns))
        while len(stream.submitted) < 2:  # both episodes' first turns are on the stream
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await turns.cost()

    tokens, seconds = asyncio.run(cancel_while_decoding())
    assert sorted(stream.cancelled) == [0, 1]
    assert (tokens, seconds) == (2 * 5, 2 * 0.25)


@pytest.mark.parametrize("sampler, dynamic", [
    ({"name": "windowed", "max_staleness_versions": 1}, True),
    ({"name": "weight_fifo", "max_staleness_versions": 1}, False),
])  # fmt: skip
def test_an_async_run_streams_episodes_with_every_kind_of_sampler(tmp_path, sampler, dynamic):
    cfg = episode_config(
        tmp_path, "async", grpo={"dynamic_sampling": {"enabled": dynamic}}, eval={"at_start": False, "at_end": False},
        generation={"continuous_batching": True},
        **{"async": {"sampler": sampler, "max_buffered_rollouts": 4, "max_inflight_prompts": 4,
                     "partial_rollouts": "off",
                     "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 16}}},
    )  # fmt: skip
    session = build_session(cfg)
    assert session.streaming.available, session.streaming.reason
    run_async(session)
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["ds/groups_trained"] + record["accounting/dropped_groups"] == 2
        check_rows(session, record["step"])
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()


def test_partial_rollouts_with_episodes_are_refused_where_turns_go_in_rounds():
    from groupwise.config import ConfigError, config_from_dict

    data = {
        "mode": "async", "model": {"source": "tiny"}, "episode": {"environment": "guess_number"},
        "generation": {"continuous_batching": True, "backend": "vllm"}, "async": {"partial_rollouts": "continue"},
    }  # fmt: skip
    with pytest.raises(ConfigError, match="continue mid-turn only on the built-in engine's generation stream"):
        config_from_dict(data)
    config_from_dict({**data, "generation": {"continuous_batching": True}})  # the built-in engine's stream: fine


class SlowGuessNumber(GuessNumberEnvironment):
    """guess_number whose steps take 50 ms (test only): episodes are mid-way when a step's checkpoint is taken."""

    def step(self, message):
        time.sleep(0.05)
        return super().step(message)


def test_an_async_episode_run_with_partial_rollouts_killed_mid_checkpoint_continues_episodes_at_their_turn(
    tmp_path, monkeypatch, capsys
):
    from groupwise.cli.main import main
    from groupwise.episodes.record import EpisodeRecord

    def config(max_steps: int):
        return episode_config(
            tmp_path, "async", run={"name": "resume", "max_steps": max_steps},
            eval={"at_start": False, "at_end": False}, checkpoint={"every": 1, "keep_last": 3, "save_final": False},
            loss={"importance_sampling": True}, generation={"continuous_batching": True},
            episode={"environment": "test_streamed_episodes:SlowGuessNumber"},
            **{"async": {"sampler": {"name": "in_order", "max_lookahead_versions": 1}, "max_buffered_rollouts": 8,
                         "max_inflight_prompts": 8, "partial_rollouts": "continue",
                         "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 16}}},
        )  # fmt: skip

    resumed = killed_in_a_checkpoint_then_resumed(config, monkeypatch)
    run_dir = resumed.run_dir.path
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in metrics if "loss/total" in r] == [1, 2, 3, 4]
    report = audit_run(run_dir, training_uids)
    assert report.ok, report.format()
    resumes = []
    for step in (1, 2, 3, 4):
        rows = check_rows(resumed, step)
        resumes += [EpisodeRecord.from_dict(r["episode"]).resume for r in rows]
    assert main(["audit", "--replay-episodes", str(run_dir)]) == 0, capsys.readouterr().out
    assert "continued" in resumes  # episodes the checkpoint held in flight went on at their turn
    assert sum(r.get("rollout/resumed_tokens", 0) for r in metrics) > 0
    assert sum(r.get("episode/resumed_continued", 0) for r in metrics) == resumes.count("continued")


class Moody(GuessNumberEnvironment):
    """Answers each guess with a count of the environments made so far (test only): not deterministic."""

    made = 0

    def reset(self, prompt, sample_index):
        Moody.made += 1
        self.mood = Moody.made
        return super().reset(prompt, sample_index)

    def step(self, message):
        result = super().step(message)
        return replace(result, messages=[{"role": "user", "content": f"mood {self.mood}"}])


@pytest.mark.parametrize("factory, expected", [(GuessNumberEnvironment, "continued"), (Moody, "restarted")])
def test_a_saved_group_continues_where_its_environment_answers_as_before(factory, expected):
    group_settings = settings(factory=factory, max_turns=3)
    group = open_group(group_settings, game("p", 20), 3, 2)
    for episode in group.episodes:  # one turn each, then a checkpoint with sample 1's second turn on the stream
        finish_step(group_settings, start_step(group_settings, group, episode, scripted_turn("4")))
    on_stream = RowPrefix(tuple(chars("1")), (-0.5,), (0,), None)
    data = encode_group(group, SAMPLING, {1: on_stream})
    assert data is not None and kept_tokens(data) == 2 * 2 + 1
    fresh = open_group(group_settings, game("p", 20), 3, 2)
    turns, why = take_back(group_settings, fresh, data, SAMPLING)
    assert why is None
    assert [e.resume for e in fresh.episodes] == [expected, expected]
    if expected == "continued":
        assert turns == {1: on_stream}
        for before, after in zip(group.episodes, fresh.episodes, strict=True):
            assert (after.token_ids, after.trainable, after.turns) == (before.token_ids, before.trainable, 1)
    else:  # the rebuilt environment answered otherwise: each episode starts over from its opening
        assert turns == {} and all(e.token_ids == [] and e.turns == 0 for e in fresh.episodes)
    other_seed = open_group(group_settings, game("p", 20), 4, 2)
    assert take_back(group_settings, other_seed, data, SAMPLING) == ({}, "its seed differs (another run.seed, "
                                                                         "prompt or attempt numbering)")


def scripted_turn(text: str) -> Completion:
    ids = (*chars(text), EOS)
    return Completion(ids, (-1.0,) * len(ids), text, "stop", 0)
