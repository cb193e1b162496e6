"""Multi-turn episodes: the tokens that train are the tokens that were sampled, and every limit ends an episode.

Invariants pinned:
- token faithfulness: an episode's trainable tokens are exactly the ids the generator returned, turn by turn,
  never decoded and encoded again (a turn whose text re-encodes to other ids keeps its sampled ids); each turn
  is asked to continue exactly the prompt plus every token before it; the environment tokens between turns are
  the chat template's rendering of the conversation (prompt + completion equals the template's own tokens);
- a template that rewrites earlier turns is refused (by the probe, and at run start naming
  ``episode.chat_template``), never trained on silently; the probe appends ``episode.max_turns`` (at least four)
  assistant turns — numeric, prose, tool-call — so a sliding window or a template that hides earlier tool calls is
  found too, naming the first turn that broke the prefix;
- limits: ``max_turns`` ends an episode after that many model turns; the token budget and the model's positions
  are never exceeded (a turn samples at most what is left); an observation past ``max_observation_tokens`` is cut
  to fit and counted; an answer thousands of times the cap is cut before it is tokenized, on the step's thread,
  and keeps its first tokens up to the cap; an answer that ends the episode is stored under the same cap;
- failures: an environment that raises, answers with something that is not a StepResult, a non-finite reward or
  messages without content, or runs past ``step_timeout_s`` fails only its own group, with an error naming the
  environment, the prompt and the sample, and the tokens its episodes had sampled charged to it; a reward may be
  any finite real number (``numpy.float32``, ``numpy.int64``), kept as a float;
- an environment constructor runs under the step deadline: a hung one fails its group at ``step_timeout_s``;
  replaying a row into an environment that raises or hangs (constructor, ``reset``, ``step``) is a mismatch naming
  the row, the prompt and the call;
- an episode samples the same tokens whether its group runs alone or with others (seeds per sample and turn);
- a group whose episodes open differently keeps the shared part as its prompt and the rest as environment tokens;
- an episode group (trainable flags, episode records) comes back from its checkpoint form unchanged;
- weights loaded between turns: each sampled token keeps the version it was sampled under, and each environment
  token the version of the turn before it;
- the shipped guess-the-number game answers "Higher."/"Lower." with the guesses left, pays 1 + bonus × guesses left
  for the secret and nothing when the guesses run out; with ``remind`` each answer ends with the opening question.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from groupwise.config import ConfigError
from groupwise.data.loader import LoadedPrompt
from groupwise.environments.guess_number import GuessNumberEnvironment
from groupwise.episodes.environment import StepResult
from groupwise.episodes.episode import MAX_CHARS_PER_TOKEN, TRUNCATION_MARK, EpisodeLimits
from groupwise.episodes.group import EpisodeError, EpisodeSettings
from groupwise.episodes.lockstep import run_episode_groups
from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer, append_only_problem
from groupwise.generation import Engine
from groupwise.model import load_policy
from groupwise.model.tokenizer import build_char_tokenizer
from groupwise.types import Completion, GenerationRequest, Prompt, SamplingParams, cost_of

TOKENIZER = build_char_tokenizer("full")
EOS = TOKENIZER.eos_token_id
RENDERER = ChatRenderer(TOKENIZER, (), PLAIN_CHAT_TEMPLATE)
SAMPLING = SamplingParams(max_new_tokens=8, temperature=1.0)
# A template that drops the reasoning of earlier assistant turns (as some reasoning models' templates do).
DROPS_EARLIER_REASONING = (
    "{%- for m in messages -%}{{ m['role'] }}: "
    "{%- if m['role'] == 'assistant' and not loop.last -%}{{ m['content'].split('</think>')[-1] }}"
    "{%- else -%}{{ m['content'] }}{%- endif -%}"
    "{%- if m['role'] == 'assistant' -%}{{ eos_token }}{%- endif -%}{{ '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}assistant: {% endif -%}"
)


def chars(text: str) -> list[int]:
    """One id per character (the char tokenizer's vocabulary), whatever the text would re-encode to."""
    return [int(i) for i in TOKENIZER.convert_tokens_to_ids(list(text))]


class ScriptedGenerator:
    """A fake generator (test only): each request's reply is ``reply(context, seed)``, cut at the turn cap; every
    request is recorded with the cap it was given."""

    def __init__(self, reply: Callable[[tuple[int, ...], int], list[int]], new_weights_each_call: bool = False) -> None:
        self.reply = reply
        self.requests: list[tuple[GenerationRequest, int]] = []
        self.new_weights_each_call = new_weights_each_call
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        out = []
        for request in requests:
            self.requests.append((request, sampling.max_new_tokens))
            ids = self.reply(request.prompt_token_ids, request.seed)[: sampling.max_new_tokens]
            logprobs = tuple(-1.0 - 0.01 * i for i in range(len(ids)))
            finish = "stop" if ids and ids[-1] == EOS else "length"
            text = TOKENIZER.decode(ids, skip_special_tokens=True)
            out.append([Completion(tuple(ids), logprobs, text, finish, self._version)])
        self._version += int(self.new_weights_each_call)  # weights loaded between two turns (async training)
        return out


def settings(factory=GuessNumberEnvironment, timeout_s: float = 5.0, **limits) -> EpisodeSettings:
    values = {"max_turns": 4, "max_tokens": 400, "max_observation_tokens": 64, "max_turn_tokens": 8, **limits}
    return EpisodeSettings("test-env", factory, RENDERER, EpisodeLimits(**values), timeout_s)


def game(uid: str, secret: int) -> Prompt:
    return Prompt(uid=uid, answer=str(secret), messages=({"role": "user", "content": "Guess 1 to 20."},))


def run(generator, episode_settings, prompts, group_size=2, seeds=None):
    seeds = seeds or [100 + i for i in range(len(prompts))]
    return run_episode_groups(generator, SAMPLING, episode_settings, prompts, seeds, group_size)


def test_sampled_ids_are_kept_even_when_their_text_would_re_encode_otherwise():
    # The characters "<eos>" decode to a text that encodes back to the single EOS id: re-tokenizing would train
    # on ids the model never sampled (the BPE-merge hazard, in miniature).
    turn = chars("<eos>7") + [EOS]
    assert TOKENIZER(TOKENIZER.decode(turn), add_special_tokens=False)["input_ids"] != turn
    generator = ScriptedGenerator(lambda context, seed: list(turn))
    [episodes] = run(generator, settings(max_turns=3), [game("p", 12)])
    for episode in episodes:
        completion = episode.completion("")
        sampled = [t for t, keep in zip(completion.token_ids, completion.trainable, strict=True) if keep]
        assert sampled == turn * episode.turns
        assert episode.turns == 3 and episode.end == "max_turns"
    # Each turn continued exactly the prompt and every token before it.
    for request, _ in generator.requests:
        assert any(e.context()[: len(request.prompt_token_ids)] == request.prompt_token_ids for e in episodes)
    contexts = sorted(len(r.prompt_token_ids) for r, _ in generator.requests)
    assert len(contexts) == 6 and len(set(contexts)) == 3  # two episodes, three turns each


def test_environment_tokens_are_the_templates_rendering_of_the_conversation():
    generator = ScriptedGenerator(lambda context, seed: chars(str(seed % 9 + 1)) + [EOS])
    [episodes] = run(generator, settings(max_turns=3), [game("p", 15)])
    for episode in episodes:
        assert episode.end == "max_turns"
        last_turn = len(chars(episode.assistant[-1])) + 1
        conversation = episode.history  # the opening, each reply and each answer, up to the last turn
        rendered = RENDERER.ids(RENDERER.text(conversation, generation_prompt=True))
        assert list(episode.context())[:-last_turn] == rendered
        flags = episode.completion("").trainable
        assert sum(flags) == sum(len(chars(text)) + 1 for text in episode.assistant)


def test_a_template_that_rewrites_earlier_turns_is_refused():
    assert append_only_problem(RENDERER) is None
    problem = append_only_problem(ChatRenderer(TOKENIZER, (), DROPS_EARLIER_REASONING))
    assert problem is not None and "not append-only" in problem


# A template that renders only the last four messages (a sliding window), and one that writes earlier tool-call
# turns as "[called]": both append-only on a three-message conversation.
LAST_FOUR_MESSAGES = PLAIN_CHAT_TEMPLATE.replace("for m in messages", "for m in messages[-4:]")
HIDES_EARLIER_CALLS = PLAIN_CHAT_TEMPLATE.replace(
    "{{ m['content'] }}",
    "{% if '<tool_call>' in m['content'] and not loop.last %}[called]{% else %}{{ m['content'] }}{% endif %}",
)


@pytest.mark.parametrize("template, says", [
    (LAST_FOUR_MESSAGES, "at assistant turn 2 (a prose turn) of a 4-turn probe conversation: the chat template is "
                         "not append-only: adding the environment's answer changes the earlier text at character 0"),
    (HIDES_EARLIER_CALLS, "at assistant turn 3 (a tool-call turn) of a 4-turn probe conversation: the chat template "
                          "is not append-only: adding the environment's answer changes the earlier text"),
])  # fmt: skip
def test_a_template_that_drops_earlier_turns_only_in_longer_conversations_is_refused_naming_the_turn(template, says):
    problem = append_only_problem(ChatRenderer(TOKENIZER, (), template))
    assert problem is not None and problem.startswith(says), problem
    assert problem.endswith("(episode.chat_template)") and "model.chat_template" not in problem
    assert append_only_problem(ChatRenderer(TOKENIZER, (), template), turns=1) is not None  # at least four turns
    assert append_only_problem(RENDERER, turns=12) is None


def test_run_start_refuses_a_template_that_is_not_append_only(tmp_path):
    from test_episode_runs import episode_config

    from groupwise.trainer.builder import build_components

    cfg = episode_config(tmp_path, episode={"chat_template": DROPS_EARLIER_REASONING})
    with pytest.raises(ConfigError) as caught:
        build_components(cfg)
    [issue] = caught.value.errors
    assert issue.path == "episode.chat_template" and "not append-only" in issue.rule


def test_max_turns_ends_every_episode_after_that_many_turns():
    generator = ScriptedGenerator(lambda context, seed: chars("0") + [EOS])  # never the secret
    [episodes] = run(generator, settings(factory=lambda: GuessNumberEnvironment(max_guesses=10), max_turns=2),
                     [game("p", 5)], group_size=3)  # fmt: skip
    assert [(e.turns, e.end, len(e.step_rewards)) for e in episodes] == [(2, "max_turns", 2)] * 3
    assert all(e.record(sum(e.step_rewards)).reward == 0.0 for e in episodes)


@pytest.mark.parametrize("max_tokens, max_context", [(30, None), (400, 60)])
def test_the_token_budget_and_the_positions_are_never_exceeded(max_tokens, max_context):
    generator = ScriptedGenerator(lambda context, seed: chars("12345678"))  # always cut at the turn cap
    limits = {"max_turns": 10, "max_tokens": max_tokens, "max_turn_tokens": 8, "max_context": max_context}
    [episodes] = run(generator, settings(factory=lambda: GuessNumberEnvironment(max_guesses=50), **limits),
                     [game("p", 5)])  # fmt: skip
    for episode in episodes:
        assert episode.end == "token_budget"
        assert len(episode.token_ids) <= max_tokens
        if max_context is not None:
            assert len(episode.context()) <= max_context
    for request, cap in generator.requests:
        assert cap >= 1
        if max_context is not None:
            assert len(request.prompt_token_ids) + cap <= max_context


class Verbose:
    """An environment (test only) answering every turn with ``size`` characters."""

    def __init__(self, size: int = 500) -> None:
        self.size = size

    def reset(self, prompt: Prompt, sample_index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "Talk."}]

    def step(self, assistant_message: dict[str, str]) -> StepResult:
        return StepResult(messages=[{"role": "user", "content": "x" * self.size}], reward=0.5)


def test_an_observation_past_its_cap_is_cut_to_fit_and_counted():
    generator = ScriptedGenerator(lambda context, seed: chars("ok") + [EOS])
    [episodes] = run(generator, settings(factory=Verbose, max_turns=3, max_observation_tokens=40), [game("p", 1)])
    for episode in episodes:
        assert episode.truncated_observations == 3  # turns 1 and 2 shown cut; turn 3's ends the episode, kept cut
        assert all(len(obs[0]["content"]) < 500 for obs in episode.observations)
        assert all(obs[0]["content"].endswith(TRUNCATION_MARK) for obs in episode.observations)
        flags = episode.completion("").trainable
        runs, current = [], 0
        for flag in flags:
            if not flag:
                current += 1
            elif current:
                runs.append(current)
                current = 0
        closing = 1  # the plain template's newline after the end of an assistant turn
        assert runs and all(run - closing <= 40 for run in runs)
        assert math.isclose(sum(episode.step_rewards), 1.5)


class Flooding:
    """An environment (test only) answering turn 1 with 200,000 digits and ending at turn 2 with as many."""

    ANSWER = "0123456789" * 20_000

    def reset(self, prompt: Prompt, sample_index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "Talk."}]

    def step(self, assistant_message: dict[str, str]) -> StepResult:
        done = assistant_message["content"] != "first"
        return StepResult(messages=[{"role": "user", "content": self.ANSWER}], done=done)


class WatchedRenderer(ChatRenderer):
    """The plain renderer (test only), recording the longest text it tokenized and the threads it rendered
    answers on."""

    def __init__(self) -> None:
        super().__init__(TOKENIZER, (), PLAIN_CHAT_TEMPLATE)
        self.longest, self.threads = 0, set()

    def ids(self, text: str) -> list[int]:
        self.longest = max(self.longest, len(text))
        return super().ids(text)

    def after_turn(self, history, reply, sampled, observations):
        self.threads.add(threading.current_thread().name.rstrip("0123456789"))
        return super().after_turn(history, reply, sampled, observations)


def test_a_huge_answer_is_cut_before_it_is_tokenized_off_the_callers_thread_keeping_its_first_tokens():
    renderer = WatchedRenderer()
    generator = ScriptedGenerator(lambda context, seed: chars("first" if len(context) < 30 else "again") + [EOS])
    limits = EpisodeLimits(max_turns=4, max_tokens=400, max_observation_tokens=40, max_turn_tokens=8)
    [episodes] = run(generator, EpisodeSettings("flood", Flooding, renderer, limits, 5.0), [game("p", 1)])
    assert renderer.longest <= 40 * MAX_CHARS_PER_TOKEN + 200  # never the 200,000 characters
    assert renderer.threads == {"groupwise-env-step-"}  # not the caller's (the controller's, the stream's loop)
    for episode in episodes:
        shown, last = (obs[0]["content"] for obs in episode.observations)
        assert episode.end == "done" and episode.truncated_observations == 2
        # shown: its first tokens, filling the cap (framing "user: …\nassistant: " included), not only the mark
        assert shown == Flooding.ANSWER[: len(shown) - len(TRUNCATION_MARK)] + TRUNCATION_MARK
        answer_tokens = len(episode.token_ids) - 2 * len("first") - 2 - 1  # two turns, their EOS, one closing
        assert answer_tokens == 40
        # the last answer (done): never shown, stored under the same cap
        assert last == Flooding.ANSWER[: 40 - len(TRUNCATION_MARK)] + TRUNCATION_MARK


class Failing:
    """An environment (test only) that fails in one configured way on prompt ``bad``."""

    def __init__(self, how: str) -> None:
        self.how, self.uid = how, ""

    def reset(self, prompt: Prompt, sample_index: int) -> list[dict[str, str]]:
        self.uid = prompt.uid
        if self.how == "reset" and prompt.uid == "bad":
            raise RuntimeError("no such game")
        return [{"role": "user", "content": "Go."}]

    def step(self, assistant_message: dict[str, str]):
        if self.uid != "bad":
            return StepResult(reward=1.0, done=True)
        answers = {
            "raise": lambda: (_ for _ in ()).throw(RuntimeError("boom")),
            "text": lambda: "not a result",
            "nan": lambda: StepResult(reward=float("nan"), done=True),
            "messages": lambda: StepResult(messages=[{"role": "user"}]),
            "slow": lambda: time.sleep(3) or StepResult(done=True),
        }
        return answers[self.how]()


@pytest.mark.parametrize("how, says", [
    ("reset", "failed in reset() (prompt 'bad', sample 0): RuntimeError: no such game"),
    ("raise", "failed in step() (prompt 'bad', sample 0): RuntimeError: boom"),
    ("text", "not a StepResult"),
    ("nan", "must be a finite number"),
    ("messages", "each needs a str 'role' and 'content'"),
    ("slow", "episode.step_timeout_s=0.3"),
])  # fmt: skip
def test_an_environment_failure_fails_only_its_own_group(how, says):
    generator = ScriptedGenerator(lambda context, seed: chars("42") + [EOS])
    started = time.perf_counter()
    good, bad = run(generator, settings(factory=lambda: Failing(how), timeout_s=0.3), [game("good", 1), game("bad", 1)])
    assert time.perf_counter() - started < 2.5  # the slow step was abandoned at its deadline
    assert [e.record(sum(e.step_rewards)).reward for e in good] == [1.0, 1.0]
    assert isinstance(bad, EpisodeError)
    assert "environment 'test-env'" in str(bad) and "prompt 'bad'" in str(bad) and says in str(bad)
    assert cost_of(bad).tokens == (0 if how == "reset" else 2 * 3)  # both episodes' sampled "42<eos>"


class NumpyRewards:
    """An environment (test only) paying each turn a numpy scalar: a float32 0.25, then an int64 1 (done)."""

    def __init__(self) -> None:
        self.turn = 0

    def reset(self, prompt: Prompt, sample_index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "Go."}]

    def step(self, assistant_message: dict[str, str]) -> StepResult:
        import numpy as np

        self.turn += 1
        if self.turn == 1:
            return StepResult(messages=[{"role": "user", "content": "Again."}], reward=np.float32(0.25))
        return StepResult(reward=np.int64(1), done=True)


def test_an_episode_reward_may_be_any_real_number():
    generator = ScriptedGenerator(lambda context, seed: chars("42") + [EOS])
    [episodes] = run(generator, settings(factory=NumpyRewards), [game("p", 1)])
    assert not isinstance(episodes, Exception), episodes
    for episode in episodes:
        assert episode.step_rewards == [0.25, 1.0] and all(type(r) is float for r in episode.step_rewards)
        assert episode.record(sum(episode.step_rewards)).reward == 1.25


class SlowToMake(GuessNumberEnvironment):
    """An environment (test only) whose constructor takes 3 s (a hung download, say)."""

    def __init__(self, **kwargs) -> None:
        time.sleep(3)
        super().__init__(**kwargs)


def test_a_hung_environment_constructor_fails_its_group_at_the_step_deadline():
    generator = ScriptedGenerator(lambda context, seed: chars("42") + [EOS])
    started = time.perf_counter()
    [outcome] = run(generator, settings(factory=SlowToMake, timeout_s=0.3), [game("p", 1)], group_size=3)
    assert time.perf_counter() - started < 1.5  # the three constructors ran at once and were abandoned at 0.3 s
    assert isinstance(outcome, EpisodeError) and str(outcome) == (
        "environment 'test-env' could not be created (prompt 'p', sample 0): StepTimeout: it took longer than "
        "episode.step_timeout_s=0.3 s and was abandoned"
    )


def test_replaying_an_environment_that_raises_or_hangs_names_the_row_and_the_call(tmp_path):
    from groupwise.episodes.replay import replay_train_data

    generator = ScriptedGenerator(lambda context, seed: chars("7") + [EOS])
    [episodes] = run(generator, settings(max_turns=2), [game("p", 9)], group_size=1)
    record = episodes[0].record(sum(episodes[0].step_rewards))
    row = {"prompt_uid": "p", "completion_index": 0, "raw_reward": record.reward, "episode": record.to_dict()}
    path = tmp_path / "step_1.jsonl"
    path.write_text(json.dumps(row) + "\n")

    class Broken(GuessNumberEnvironment):
        def __init__(self, how: str) -> None:
            if how == "make":
                raise OSError("no licence")
            super().__init__()
            self.how, self.steps = how, 0

        def reset(self, prompt, sample_index):
            if self.how == "reset":
                raise KeyError("p")
            return super().reset(prompt, sample_index)

        def step(self, message):
            self.steps += 1
            if self.how == "hang" and self.steps == 2:
                time.sleep(3)
            return super().step(message)

    prompts = {"p": game("p", 9)}
    where = "step_1.jsonl:1 (prompt 'p', sample 0): "
    started = time.perf_counter()
    lines = [replay_train_data([path], lambda how=how: Broken(how), prompts, 0.3).mismatches
             for how in ("make", "reset", "hang", "none")]  # fmt: skip
    assert time.perf_counter() - started < 1.5
    assert lines == [
        [where + "the environment could not be created: OSError: no licence"],
        [where + "reset() failed: KeyError: 'p'"],
        [where + "turn 2: step() failed: StepTimeout: it took longer than episode.step_timeout_s=0.3 s and was "
                 "abandoned"],
        [],
    ]


@pytest.fixture(scope="module")
def engine():
    policy = load_policy("tiny", tiny={"vocab": "full", "num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                       "intermediate_size": 64, "max_position_embeddings": 256}, seed=1, device="cpu")
    return Engine(policy.model, policy.tokenizer, eos_token_ids=(EOS,))  # fmt: skip


def test_an_episode_samples_the_same_tokens_alone_or_beside_other_groups(engine):
    prompts = [game("a", 3), game("b", 17)]
    together = run(engine, settings(max_turns=3), prompts, seeds=[7, 8])
    alone = [run(engine, settings(max_turns=3), [p], seeds=[s])[0] for p, s in zip(prompts, [7, 8], strict=True)]
    for both, single in zip(together, alone, strict=True):
        assert [e.token_ids for e in both] == [e.token_ids for e in single]
        assert [e.trainable for e in both] == [e.trainable for e in single]
    assert together[0][0].token_ids != together[0][1].token_ids  # the samples of a group differ


class NumberedOpening(GuessNumberEnvironment):
    """Each sample's opening names its index (test only): the openings of a group differ after a shared part."""

    def reset(self, prompt: Prompt, sample_index: int):
        return [*super().reset(prompt, sample_index), {"role": "user", "content": f"You are player {sample_index}."}]


def test_a_group_keeps_the_shared_opening_as_its_prompt_and_the_rest_as_environment_tokens():
    from groupwise.trainer.rollout import RolloutWorker

    generator = ScriptedGenerator(lambda context, seed: chars("9") + [EOS])
    worker = RolloutWorker(generator, TOKENIZER, lambda *a: 0.0, SAMPLING, group_size=3, run_seed=0,
                           episodes=settings(factory=NumberedOpening, max_turns=2))  # fmt: skip
    [group] = worker.generate_group_outcomes([LoadedPrompt(game("p", 9), 0, 0)], [0])
    assert group.raw_rewards == [1.5, 1.5, 1.5]  # 9 on the first guess: 1 + 0.1 × 5 guesses left
    for index, completion in enumerate(group.completions):
        opening = RENDERER.opening(NumberedOpening().reset(game("p", 9), index))
        lead = len(opening) - len(group.prompt_token_ids)
        assert lead > 0 and tuple(opening) == group.prompt_token_ids + completion.token_ids[:lead]
        assert not any(completion.trainable[:lead]) and completion.trainable[lead:] == (True, True)
        assert completion.num_tokens == 2 and completion.episode is not None and completion.episode.turns == 1


def test_an_episode_group_survives_a_checkpoint_round_trip():
    from groupwise.trainer.rollout import RolloutWorker
    from groupwise.types import group_from_dict, group_to_dict

    generator = ScriptedGenerator(lambda context, seed: chars(str(seed % 7 + 1)) + [EOS])
    worker = RolloutWorker(generator, TOKENIZER, lambda *a: 0.0, SAMPLING, group_size=2, run_seed=0,
                           episodes=settings(max_turns=2))  # fmt: skip
    [group] = worker.generate_group_outcomes([LoadedPrompt(game("p", 3), 0, 0)], [5])
    restored = group_from_dict(group_to_dict(group))
    assert restored == group
    assert [c.trainable for c in restored.completions] == [c.trainable for c in group.completions]
    assert any(not flag for c in restored.completions for flag in c.trainable)


def test_weights_loaded_between_turns_keep_each_tokens_version():
    generator = ScriptedGenerator(lambda context, seed: chars("0") + [EOS], new_weights_each_call=True)
    [episodes] = run(generator, settings(max_turns=3), [game("p", 5)])
    for episode in episodes:
        completion = episode.completion("")
        turn, expected = -1, []
        for index, sampled in enumerate(completion.trainable):
            if sampled and (index == 0 or not completion.trainable[index - 1]):
                turn += 1  # a new turn: sampled by the weights of its own engine call
            expected.append(turn)
        assert list(completion.token_versions) == expected
        assert completion.weight_version == 2 and set(expected) == {0, 1, 2}


def test_guess_number_answers_each_guess_and_with_remind_repeats_the_question():
    plain, reminding = GuessNumberEnvironment(max_guesses=3), GuessNumberEnvironment(max_guesses=3, remind=True)
    for env in (plain, reminding):
        env.reset(game("p", 9), 0)
    assert plain.step({"role": "assistant", "content": "5"}).messages == [
        {"role": "user", "content": "Higher. 2 guesses left."}]  # fmt: skip
    assert reminding.step({"role": "assistant", "content": "12"}).messages == [
        {"role": "user", "content": "Lower. 2 guesses left. Guess 1 to 20."}]  # fmt: skip
    found = reminding.step({"role": "assistant", "content": "It is 9"})
    assert found.done and not found.messages and found.reward == pytest.approx(1.0 + 0.1 * 1)
    assert plain.step({"role": "assistant", "content": "no idea"}).messages[0]["content"].startswith("Please answer")
    assert plain.step({"role": "assistant", "content": "3"}) == StepResult(done=True)  # out of guesses: no reward
