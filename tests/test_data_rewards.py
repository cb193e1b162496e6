"""Reward functions, the safe expression parser, and reward selection.

Invariants pinned:
- exact_numeric gives 1 only to a stopped completion whose stripped text is a number equal to the
  answer; "length" completions, <pad>/junk inside the text and non-numbers give 0; partial credit is
  p × (matching characters / answer length) and only for same-length numeric text.
- final_number gives 1 only to a stopped completion whose last number equals the answer (exactly, signs
  only where no digit or letter precedes them); a cut-off reply, a reply without a number or with another
  last number gives 0; a non-numeric answer is an error naming the prompt.
- numbers are read as written: only ASCII digits are digits (Arabic-Indic "٥٦" and full-width "５６" are no
  number, for final_number, exact_numeric and parse_number alike); a thousands-grouped integer part ("2,056",
  "1,000,000": groups of exactly 3 digits after each comma) is one number, any other comma separates numbers.
- the expression parser evaluates exactly with operator precedence and parentheses, and rejects
  everything outside its grammar.
- countdown gives 1 iff value == target and numbers ⊆ the given multiset; format_reward for a
  parseable wrong answer; 0 (never an exception) for hostile input: code, exponents, huge or deeply
  nested input, division by zero — and it answers quickly.
- load_reward_fn resolves auto / built-ins / module:function and names the spec in every error;
  math_verify without the package names the install command; with it, the \boxed{}/LaTeX answers of the
  project's math file (tests/data/math_questions.jsonl) score 1 when right, 0 when wrong or cut off.
- check_reward_kwargs rejects kwargs that do not fit the function, naming each unknown key and the closest one.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groupwise.data.expression import MAX_PAREN_DEPTH, ExpressionError, parse_expression
from groupwise.data.jsonl_dataset import JsonlTask
from groupwise.data.rewards import (
    RewardSpecError,
    check_reward_kwargs,
    countdown,
    exact_numeric,
    final_number,
    load_reward_fn,
    math_verify,
    parse_number,
)
from groupwise.types import Completion, Prompt

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None


def completion(text: str, finish_reason: str = "stop") -> Completion:
    return Completion(token_ids=(), logprobs=(), text=text, finish_reason=finish_reason, weight_version=0)


ADD = Prompt(uid="addition/train/7+5", answer="12", text="7+5=")
GAME = Prompt(
    uid="countdown/train/3,5,7->22",
    answer="22",
    messages=({"role": "user", "content": "..."},),
    metadata={"numbers": [3, 5, 7], "target": 22},
)


# ---------------------------------------------------------------- final_number

TIMES = Prompt(uid="times/7x8", answer="56", messages=({"role": "user", "content": "What is 7 * 8?"},))
MINUS = Prompt(uid="minus/2-5", answer="-3", text="2-5=")


@pytest.mark.parametrize("text", ["56", "7 * 8 = 56", "The answer is 56.", "7*8=56\n", "8 * 7 = 50 + 6 = 56",
                                  "56.0", "= +56 !"])
def test_final_number_accepts_a_reply_that_ends_on_the_answer(text):
    assert final_number(TIMES, completion(text)) == 1.0


@pytest.mark.parametrize("text", ["", "fifty-six", "56 is 7 * 8", "7 * 8 = 54", "56 or 57", "5 6", "7 * 8 = 560",
                                  "7 * 8 = 56.5"])
def test_final_number_rejects_replies_whose_last_number_is_not_the_answer(text):
    assert final_number(TIMES, completion(text)) == 0.0


def test_final_number_requires_a_finished_completion():
    assert final_number(TIMES, completion("7 * 8 = 56", finish_reason="length")) == 0.0


def test_final_number_reads_a_sign_only_where_it_starts_a_number():
    assert final_number(MINUS, completion("2 - 5 = -3")) == 1.0
    assert final_number(MINUS, completion("2-5=-3")) == 1.0
    assert final_number(Prompt(uid="p", answer="3", text="8-5="), completion("8-5=3")) == 1.0
    assert final_number(MINUS, completion("x-3")) == 0.0  # "x-3" names x minus 3, not the number -3


def test_final_number_needs_a_numeric_answer():
    with pytest.raises(ValueError, match=r"times/x.*not a plain number"):
        final_number(Prompt(uid="times/x", answer="many", text="?"), completion("56"))


# ---------------------------------------------------------------- exact_numeric


@pytest.mark.parametrize("text", ["12", " 12", "12\n", "12.0", "+12", "012"])
def test_exact_numeric_accepts_the_number_in_any_plain_spelling(text):
    assert exact_numeric(ADD, completion(text)) == 1.0


@pytest.mark.parametrize(
    "text",
    ["13", "1", "", "12<pad>", "1<pad>2", "<pad>12", "1 2", "12 apples", "twelve", "12=12", "1e1", "nan", "12<eos>"],
)
def test_exact_numeric_rejects_wrong_and_junk(text):
    assert exact_numeric(ADD, completion(text)) == 0.0


def test_exact_numeric_requires_a_finished_completion():
    assert exact_numeric(ADD, completion("12", finish_reason="length")) == 0.0


OTHER_SCRIPT_DIGITS = ["٥٦", "۵۶", "５６", "5٦", "7 * 8 = ٥٦"]  # Arabic-Indic, Persian, full-width, mixed


@pytest.mark.parametrize("text", OTHER_SCRIPT_DIGITS)
def test_digits_of_other_scripts_are_not_numbers(text):
    assert final_number(TIMES, completion(text)) == 0.0
    assert exact_numeric(Prompt(uid="x", answer="56", text="7*8="), completion(text)) == 0.0
    assert parse_number(text.split()[-1]) is None
    with pytest.raises(ValueError, match="not a plain number"):
        final_number(Prompt(uid="x", answer="٥٦", text="7*8="), completion("56"))


@pytest.mark.parametrize(
    "text, last",
    [("the total is 2,056", "2056"), ("1,000", "1000"), ("a million is 1,000,000.", "1000000"),
     ("-1,234.5 in all", "-1234.5"), ("pick 3,4,56", "56"), ("12345,056", "56"), ("1,0560", "560"),
     ("1,05", "5")],
)
def test_a_thousands_grouped_number_is_one_number(text, last):
    for answer in {last, "56", "0", "1"}:
        expected = 1.0 if answer == last else 0.0
        assert final_number(Prompt(uid="x", answer=answer, text="?"), completion(text)) == expected, answer


def test_parse_number_and_exact_numeric_read_thousands_groups():
    assert parse_number("1,056") == 1056 and parse_number("-2,056.25") == Fraction(-8225, 4)
    assert parse_number("1,000,000") == 10**6
    for not_grouped in ["1,05", "1,0000", "12,34", ",123", "1,", "1,,000", "1,000,", "1234,567"]:
        assert parse_number(not_grouped) is None, not_grouped
    thousand = Prompt(uid="x", answer="1000", text="?")
    assert exact_numeric(thousand, completion("1,000")) == 1.0
    assert exact_numeric(Prompt(uid="x", answer="1,000", text="?"), completion("1000")) == 1.0
    assert exact_numeric(Prompt(uid="x", answer="0", text="?"), completion("1,000")) == 0.0


def test_exact_numeric_compares_non_integral_answers_exactly():
    half = Prompt(uid="x", answer="0.5", text="1/2=")
    assert exact_numeric(half, completion("0.50")) == 1.0
    assert exact_numeric(half, completion("0.5000001")) == 0.0


def test_exact_numeric_partial_credit_counts_matching_positions():
    prompt = Prompt(uid="addition/train/50+73", answer="123", text="50+73=")
    assert exact_numeric(prompt, completion("124"), partial_credit=0.6) == pytest.approx(0.6 * 2 / 3)
    assert exact_numeric(prompt, completion("923"), partial_credit=0.6) == pytest.approx(0.6 * 2 / 3)
    assert exact_numeric(prompt, completion("999"), partial_credit=0.6) == 0.0
    assert exact_numeric(prompt, completion("123"), partial_credit=0.6) == 1.0
    # other length, junk, unfinished: no partial credit
    assert exact_numeric(prompt, completion("12"), partial_credit=0.6) == 0.0
    assert exact_numeric(prompt, completion("12x"), partial_credit=0.6) == 0.0
    assert exact_numeric(prompt, completion("124", "length"), partial_credit=0.6) == 0.0
    # default: no partial credit
    assert exact_numeric(prompt, completion("124")) == 0.0


def test_exact_numeric_rejects_bad_settings_and_non_numeric_answers():
    with pytest.raises(ValueError, match="partial_credit=1.5"):
        exact_numeric(ADD, completion("12"), partial_credit=1.5)
    with pytest.raises(ValueError, match="'Paris'.*not a plain number"):
        exact_numeric(Prompt(uid="q", answer="Paris", text="capital?"), completion("Paris"))


# ---------------------------------------------------------------- expression parser


@pytest.mark.parametrize(
    ("text", "value", "literals"),
    [
        ("3*5+7", Fraction(22), (3, 5, 7)),
        ("3+5*7", Fraction(38), (3, 5, 7)),
        ("(3+5)*7", Fraction(56), (3, 5, 7)),
        ("7-5-3", Fraction(-1), (7, 5, 3)),
        ("7/(5-3)", Fraction(7, 2), (7, 5, 3)),
        ("8/4/2", Fraction(1), (8, 4, 2)),
        (" ( ( 4 ) ) ", Fraction(4), (4,)),
        ("6×7÷2−1", Fraction(20), (6, 7, 2, 1)),
    ],
)
def test_parser_evaluates_exactly_with_precedence(text, value, literals):
    parsed = parse_expression(text)
    assert parsed.value == value
    assert parsed.literals == literals


@pytest.mark.parametrize(
    "text", ["", "3+", "(3+5", "3+5)", "-3+5", "3**2", "3 5", "2^3", "3.5+1", "abs(3)", "x+1", "()", "3//2", "5/0"]
)
def test_parser_rejects_text_outside_the_grammar(text):
    with pytest.raises(ExpressionError):
        parse_expression(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=6), st.lists(st.sampled_from("+-*"), min_size=5, max_size=5))
def test_parser_agrees_with_python_on_integer_expressions(operands, operators):
    # Python's integer arithmetic is the oracle for + - * with the usual precedence.
    text = str(operands[0])
    for op, n in zip(operators, operands[1:], strict=False):
        text += f"{op}{n}"
    assert parse_expression(text).value == Fraction(eval(text))  # noqa: S307 - trusted, generated test input


# ---------------------------------------------------------------- countdown


@pytest.mark.parametrize("text", ["3*5+7", "7+3*5", "5*3+7", " 3 * 5 + 7 ", "(3*5)+7", "7+(5*3)", "3×5+7"])
def test_countdown_accepts_correct_expressions(text):
    assert countdown(GAME, completion(text)) == 1.0


def test_countdown_multiset_rule():
    assert countdown(GAME, completion("7*3+1")) == 0.0  # 1 is not given (value 22 though)
    assert countdown(GAME, completion("5+5+5+7")) == 0.0  # 5 used three times (value 22)
    assert countdown(GAME, completion("22")) == 0.0  # not a given number
    twice = Prompt(uid="c", answer="10", metadata={"numbers": [5, 5, 2]})
    assert countdown(twice, completion("5+5")) == 1.0  # a repeated number may be used as often as given
    assert countdown(twice, completion("5+5+5-5")) == 0.0


def test_countdown_requires_the_target_and_a_finished_completion():
    assert countdown(GAME, completion("3+5+7")) == 0.0
    assert countdown(GAME, completion("3*5+7", finish_reason="length")) == 0.0


def test_countdown_format_reward_for_parseable_wrong_answers_only():
    assert countdown(GAME, completion("3+5+7"), format_reward=0.1) == 0.1
    assert countdown(GAME, completion("3*5+7"), format_reward=0.1) == 1.0
    assert countdown(GAME, completion("the answer is 22"), format_reward=0.1) == 0.0
    assert countdown(GAME, completion("7/(5-5)"), format_reward=0.1) == 0.0  # division by zero


HOSTILE = [
    "__import__('os').system('echo hi')",
    "9**9**9",
    "9^9^9",
    "lambda: 0",
    "3*5+7; import os",
    "(" * 10_000 + "3" + ")" * 10_000,
    "(" * (MAX_PAREN_DEPTH + 1) + "3*5+7" + ")" * (MAX_PAREN_DEPTH + 1),
    "1+" * 100_000 + "1",
    "9" * 1_000_000,
    "99999999999*99999999999*99999999999",
    "3*5+7\x00",
    "<pad>3*5+7",
    "",
    "   ",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_countdown_hostile_input_scores_zero_quickly(text):
    start = time.perf_counter()
    assert countdown(GAME, completion(text)) == 0.0
    assert countdown(GAME, completion(text), format_reward=0.1) in (0.0, 0.1)
    assert time.perf_counter() - start < 0.5


def test_countdown_moderately_nested_parentheses_are_fine():
    nested = "(" * MAX_PAREN_DEPTH + "3*5+7" + ")" * MAX_PAREN_DEPTH
    assert countdown(GAME, completion(nested)) == 1.0


def test_countdown_needs_numbers_in_metadata():
    with pytest.raises(ValueError, match="metadata\\['numbers'\\]"):
        countdown(Prompt(uid="c", answer="3"), completion("1+2"))


# ---------------------------------------------------------------- selection


def test_load_reward_fn_resolves_auto_builtin_and_import():
    assert load_reward_fn("auto", "exact_numeric") is exact_numeric
    assert load_reward_fn("auto", "countdown") is countdown
    assert load_reward_fn("countdown", "exact_numeric") is countdown
    assert load_reward_fn("final_number", "exact_numeric") is final_number
    imported = load_reward_fn("groupwise.data.rewards:exact_numeric", "countdown")
    assert imported is exact_numeric


def test_load_reward_fn_errors_name_the_spec(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("NOT_CALLABLE = 3\n\ndef score(prompt, completion):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward_fn("my_rewards:score", "exact_numeric")(ADD, completion("x")) == 1.0
    with pytest.raises(RewardSpecError, match="'no_such_module_xyz:f'.*cannot import"):
        load_reward_fn("no_such_module_xyz:f", "exact_numeric")
    with pytest.raises(RewardSpecError, match="'my_rewards:missing'.*no attribute"):
        load_reward_fn("my_rewards:missing", "exact_numeric")
    with pytest.raises(RewardSpecError, match="'my_rewards:NOT_CALLABLE'.*not callable"):
        load_reward_fn("my_rewards:NOT_CALLABLE", "exact_numeric")
    with pytest.raises(RewardSpecError, match="'exact'.*built-in"):
        load_reward_fn("exact", "exact_numeric")


@pytest.mark.skipif(HAS_MATH_VERIFY, reason="math-verify is installed; the missing-package path cannot run")
def test_math_verify_without_package_names_the_install_command():
    with pytest.raises(RewardSpecError, match="pip install math-verify"):
        load_reward_fn("math_verify", "exact_numeric")
    with pytest.raises(RewardSpecError, match="pip install math-verify"):
        math_verify(ADD, completion("12"))


def test_math_verify_missing_package_error_when_import_is_blocked(monkeypatch):
    # Simulates an environment without the package even where it is installed.
    monkeypatch.setitem(sys.modules, "math_verify", None)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real_find_spec(name, *a)
    )
    with pytest.raises(RewardSpecError, match="pip install math-verify"):
        load_reward_fn("auto", "math_verify")
    with pytest.raises(RewardSpecError, match="pip install math-verify"):
        math_verify(ADD, completion("12"))


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="needs math-verify (pip install math-verify)")
def test_math_verify_accepts_equivalent_answers():
    prompt = Prompt(uid="m", answer="\\frac{1}{2}", text="half?")
    assert load_reward_fn("math_verify", "exact_numeric")(prompt, completion("The answer is $0.5$")) == 1.0
    assert math_verify(prompt, completion("The answer is $3$")) == 0.0


def test_check_reward_kwargs_rejects_unknown_keys():
    check_reward_kwargs(exact_numeric, {"partial_credit": 0.5})
    check_reward_kwargs(countdown, {})
    with pytest.raises(RewardSpecError, match=r"'countdown' takes no key 'partial_credit'.*\['format_reward'\]"):
        check_reward_kwargs(countdown, {"partial_credit": 0.5})
    with pytest.raises(RewardSpecError, match=r"'partial_credt' \(did you mean 'partial_credit'\?\)"):
        check_reward_kwargs(exact_numeric, {"partial_credt": 0.5})


MATH_FILE = Path(__file__).parent / "data" / "math_questions.jsonl"


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="needs math-verify (in the dev extras)")
def test_math_verify_scores_boxed_latex_answers_of_the_math_file():
    """Each question of the project's math file has a right and a wrong \\boxed{} completion: 1 and 0, and 0 for
    the right one cut off by the length limit. The answers include a surd and an interval, which plain parsing
    of the answer would have read as the number 2."""
    task = JsonlTask(MATH_FILE, default_reward="math_verify")
    reward = load_reward_fn("auto", task.default_reward)
    prompts = task.train_prompts()
    assert {p.uid for p in prompts} >= {"surd", "interval", "expand", "frac-sum"}
    for prompt in prompts:
        right, wrong = prompt.metadata["correct"], prompt.metadata["wrong"]
        assert reward(prompt, completion(right)) == 1.0, prompt.uid
        assert reward(prompt, completion(wrong)) == 0.0, prompt.uid
        assert reward(prompt, completion(right, finish_reason="length")) == 0.0, prompt.uid
