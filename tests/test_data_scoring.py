"""Scoring completions with a reward function.

Invariants pinned:
- score_completions returns one float per completion, in completion order, passing kwargs through.
- a reward function that raises gives RewardError naming the prompt uid and the completion index,
  with the original exception chained (never a silent 0); so does one that raises SystemExit (even 0) or another
  BaseException, while a KeyboardInterrupt (the user's Ctrl-C) passes through unchanged.
- NaN, ±inf and non-numbers (None, str, a tensor-like) are RewardErrors naming the uid.
- a reward beyond ±1e30 (±1e308, an int too large for a float) is a RewardError naming the reward function, the
  prompt and the completion, before any statistic overflows; ±1e30 itself is accepted.
"""

from __future__ import annotations

import math

import pytest

from groupwise.data.rewards import exact_numeric
from groupwise.data.scoring import RewardError, score_completions
from groupwise.types import Completion, Prompt

PROMPT = Prompt(uid="addition/train/50+73", answer="123", text="50+73=")


def completion(text: str, finish_reason: str = "stop") -> Completion:
    return Completion(token_ids=(), logprobs=(), text=text, finish_reason=finish_reason, weight_version=0)


def test_scores_follow_completion_order_and_kwargs():
    completions = [completion("123"), completion("124"), completion("123", "length"), completion("1x3")]
    assert score_completions(exact_numeric, PROMPT, completions, {}) == [1.0, 0.0, 0.0, 0.0]
    partial = score_completions(exact_numeric, PROMPT, completions, {"partial_credit": 0.3})
    assert partial == pytest.approx([1.0, 0.2, 0.0, 0.0])
    assert score_completions(exact_numeric, PROMPT, [], {}) == []


def test_integer_and_bool_rewards_become_floats():
    rewards = score_completions(lambda p, c: len(c.text) > 1, PROMPT, [completion("1"), completion("12")], None)
    assert rewards == [0.0, 1.0]
    assert all(type(r) is float for r in rewards)


def test_raising_reward_is_reported_with_uid_and_cause():
    def fragile(prompt, completion):
        if completion.text == "boom":
            raise KeyError("missing field")
        return 1.0

    with pytest.raises(RewardError) as info:
        score_completions(fragile, PROMPT, [completion("ok"), completion("boom")], {})
    error = info.value
    assert error.prompt_uid == PROMPT.uid
    assert error.completion_index == 1
    assert PROMPT.uid in str(error) and "fragile" in str(error) and "KeyError" in str(error)
    assert isinstance(error.__cause__, KeyError)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None, "1.0", [1.0]])
def test_non_finite_or_non_number_reward_is_an_error(bad):
    with pytest.raises(RewardError, match="addition/train/50\\+73") as info:
        score_completions(lambda p, c: bad, PROMPT, [completion("1")], {})
    assert info.value.completion_index == 0


def test_tensor_like_reward_gets_an_item_hint():
    class Scalar:
        def item(self) -> float:
            return 1.0

    with pytest.raises(RewardError, match=r"\.item\(\)"):
        score_completions(lambda p, c: Scalar(), PROMPT, [completion("1")], {})


def test_unknown_kwarg_surfaces_as_reward_error():
    with pytest.raises(RewardError, match="partial_credt") as info:
        score_completions(exact_numeric, PROMPT, [completion("1")], {"partial_credt": 0.5})
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize("huge", [1e308, -1e308, 1e31, 10**400])
def test_a_reward_too_large_for_the_statistics_names_function_and_prompt(huge):
    def big(prompt, completion):
        return huge if completion.text == "1" else 0.0

    with pytest.raises(RewardError, match=r"reward function 'big' returned .* for prompt 'addition/train/50\+73', "
                                          r"completion 1; rewards must be finite and within ±1e\+30") as info:
        score_completions(big, PROMPT, [completion("0"), completion("1")], {})
    assert info.value.prompt_uid == PROMPT.uid and info.value.completion_index == 1
    edge = score_completions(lambda p, c: -1e30 if c.text == "0" else 1e30, PROMPT, [completion("0"), completion("1")])
    assert edge == [-1e30, 1e30]


class _Escape(BaseException):
    pass


@pytest.mark.parametrize("error", [SystemExit(0), SystemExit(3), _Escape("out")], ids=["exit0", "exit3", "custom"])
def test_a_reward_raising_a_base_exception_is_a_reward_error_naming_it(error):
    def leaves(prompt, completion):
        raise error

    with pytest.raises(RewardError) as info:
        score_completions(leaves, PROMPT, [completion("123")])
    assert "reward function 'leaves' raised " + type(error).__name__ in str(info.value)
    assert info.value.prompt_uid == PROMPT.uid and info.value.__cause__ is error


def test_a_keyboard_interrupt_in_a_reward_passes_through():
    def interrupted(prompt, completion):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score_completions(interrupted, PROMPT, [completion("123")])
