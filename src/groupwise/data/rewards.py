"""Reward functions (verifiers) and how a run selects one.

Every reward function has the signature::

    reward_fn(prompt: Prompt, completion: Completion, **kwargs) -> float

- ``completion.text`` is the completion decoded with special tokens *kept* (a sampled ``<pad>``
  stays visible as ``<pad>``), without the trailing EOS token.
- ``completion.finish_reason`` is ``"stop"`` (EOS or a stop string) or ``"length"`` (cut at
  ``max_new_tokens``). The built-in verifiers give 0 to a ``"length"`` completion: an answer that
  was cut off is not a finished answer.
- ``kwargs`` are ``reward.kwargs`` from the config, the same for every call of a run.
- The result must be a finite real number; anything else is a :class:`~groupwise.data.scoring.RewardError`.

Built-ins (see ``docs/rewards.md``): ``exact_numeric``, ``final_number``, ``countdown``, ``math_verify``.
:func:`load_reward_fn` maps the config's ``reward.function`` to a callable.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, cast

from groupwise.data.expression import ExpressionError, parse_expression
from groupwise.plugins import PluginImportError, import_plugin
from groupwise.types import Completion, Prompt

RewardFn = Callable[..., float]

# A plain decimal number: optional sign, ASCII digits, optional fraction. No exponent, no "_", no "nan", and no
# other script's digits ("٥٦", full-width "５６": Python's \d and int() would read them as 56). The integer part
# may be grouped in thousands: 1 to 3 digits, then groups of exactly 3 after each comma ("2,056", "1,000,000"), a
# group that no digit follows; any other comma separates numbers ("3,4,5" is three numbers).
_UNSIGNED = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"
_NUMBER = re.compile(rf"[+-]?{_UNSIGNED}")
# The same numbers found inside text; a sign counts only right before the digits and not after a digit or a
# letter ("8-2" is 8 and 2, "x-3" is 3), a decimal point only between digits ("6." at the end of a sentence is 6).
_NUMBER_IN_TEXT = re.compile(rf"(?<![\w.])[+-]?{_UNSIGNED}|(?<=[\w.]){_UNSIGNED}")
#: The longest text read as a number: Python converts at most 4,300 digits to an int (Fraction does), so a longer
#: answer would fail mid-run and a longer completion would make the verifier raise instead of scoring 0.
MAX_NUMBER_CHARS = 4000
_MATH_VERIFY_INSTALL = "pip install math-verify  (or: pip install 'groupwise[math]')"


class RewardSpecError(ValueError):
    """``reward.function`` or ``reward.kwargs`` cannot be turned into a usable reward function."""


def parse_number(text: str) -> Fraction | None:
    """The exact value of a plain decimal number (``-12``, ``3.50``, ``2,056`` = 2056) of at most
    :data:`MAX_NUMBER_CHARS` characters, written in ASCII digits, or None for anything else."""
    if len(text) > MAX_NUMBER_CHARS or _NUMBER.fullmatch(text) is None:
        return None
    return Fraction(text.replace(",", ""))


def exact_numeric(prompt: Prompt, completion: Completion, *, partial_credit: float = 0.0) -> float:
    """1.0 iff the completion stopped and ``completion.text.strip()`` is a number equal to ``prompt.answer``.

    Numbers compare exactly (``Fraction``), so ``"12"`` and ``"12.0"`` are equal, and ``"1,000"`` is 1000
    (:func:`parse_number`). Any other text (a ``<pad>``, a space inside the number, a word, digits of another
    script) scores 0.

    ``partial_credit = p`` (0 ≤ p ≤ 1, default 0) gives a wrong but well-formed answer
    ``p × (matching characters / len(answer))`` when its text has exactly the answer's length,
    comparing position by position: answer ``"42"``, text ``"47"`` → ``p × 1/2``.
    """
    if not 0.0 <= partial_credit <= 1.0:
        raise ValueError(f"exact_numeric: partial_credit={partial_credit!r} must be in [0, 1]; e.g. 0.5")
    if completion.finish_reason != "stop":
        return 0.0
    expected = parse_number(prompt.answer.strip())
    if expected is None:
        raise ValueError(
            f"exact_numeric: prompt {prompt.uid} has answer {prompt.answer[:80]!r}, which is not a plain number "
            f"(ASCII digits with an optional sign, thousands commas and decimal point, at most {MAX_NUMBER_CHARS} "
            "characters); use another reward function (e.g. math_verify or a custom 'module:function')"
        )
    text = completion.text.strip()
    got = parse_number(text)
    if got is None:
        return 0.0
    if got == expected:
        return 1.0
    answer = prompt.answer.strip()
    if partial_credit > 0.0 and len(text) == len(answer):
        matching = sum(a == b for a, b in zip(text, answer, strict=True))
        return partial_credit * matching / len(answer)
    return 0.0


def final_number(prompt: Prompt, completion: Completion) -> float:
    """1.0 iff the completion stopped and the last number in its text equals ``prompt.answer``.

    For replies that show their working before the answer ("7 * 8 = 56", "The answer is 56."): the numbers
    are the plain decimals in the text (:func:`parse_number`: ASCII digits, "2,056" one number), compared exactly;
    a sign belongs to a number only where nothing but space or punctuation precedes it ("8-2" holds 8 and 2). A
    reply without a number, one whose last number is longer than :data:`MAX_NUMBER_CHARS`, or one cut at
    ``max_new_tokens``, scores 0.
    """
    expected = parse_number(prompt.answer.strip())
    if expected is None:
        raise ValueError(
            f"final_number: prompt {prompt.uid} has answer {prompt.answer[:80]!r}, which is not a plain number "
            f"(ASCII digits with an optional sign, thousands commas and decimal point, at most {MAX_NUMBER_CHARS} "
            "characters); use another reward function (e.g. math_verify or a custom 'module:function')"
        )
    if completion.finish_reason != "stop":
        return 0.0
    numbers = _NUMBER_IN_TEXT.findall(completion.text)
    last = parse_number(numbers[-1]) if numbers else None
    return 1.0 if last is not None and last == expected else 0.0


def countdown(prompt: Prompt, completion: Completion, *, format_reward: float = 0.0) -> float:
    """1.0 iff the completion stopped and its text is an expression equal to the target that uses
    only ``prompt.metadata["numbers"]``, each at most once (multiset check).

    The target is ``prompt.answer``. Expressions follow :mod:`groupwise.data.expression` (integers,
    ``+ - * /``, parentheses; evaluated exactly). ``format_reward = f`` (0 ≤ f < 1, default 0) is
    given to a stopped completion that parses but is wrong (other value or numbers). Unparseable
    text, division by zero, over-long or over-nested input score 0 and never raise.
    """
    if not 0.0 <= format_reward < 1.0:
        raise ValueError(f"countdown: format_reward={format_reward!r} must be in [0, 1); e.g. 0.1")
    numbers = prompt.metadata.get("numbers")
    if not isinstance(numbers, (list, tuple)) or not all(isinstance(n, int) for n in numbers):
        raise ValueError(
            f"countdown: prompt {prompt.uid} needs metadata['numbers'] as a list of integers, got {numbers!r}"
        )
    target = parse_number(prompt.answer.strip())
    if target is None:
        raise ValueError(f"countdown: prompt {prompt.uid} has answer {prompt.answer[:80]!r}; the target must be a "
                         f"plain number of at most {MAX_NUMBER_CHARS} characters")
    if completion.finish_reason != "stop":
        return 0.0
    try:
        parsed = parse_expression(completion.text)
    except ExpressionError:
        return 0.0
    uses_allowed_numbers = not (Counter(parsed.literals) - Counter(numbers))
    if uses_allowed_numbers and parsed.value == target:
        return 1.0
    return format_reward


def math_verify(prompt: Prompt, completion: Completion) -> float:
    """1.0 iff the completion stopped and ``math_verify.verify(parse(answer), parse(text))`` holds.

    Needs the optional ``math-verify`` package (``pip install math-verify`` or the ``math`` extra).
    """
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise RewardSpecError(f"reward 'math_verify' needs the math-verify package: {_MATH_VERIFY_INSTALL}") from exc
    if completion.finish_reason != "stop":
        return 0.0
    # math-verify bounds its own work with signal.alarm, which works on the main thread only; elsewhere (async
    # generation, a reward.timeout_s helper thread) turn it off: reward.timeout_s bounds the call instead.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    # The answer is math: read it as LaTeX first. Plain parsing keeps only the last number it finds, so
    # "2\sqrt{2}" would become 2 and "(-2, 2)" would become 2.
    gold = parse(f"${prompt.answer}$", parsing_timeout=limit) or parse(prompt.answer, parsing_timeout=limit)
    if not gold:
        raise ValueError(f"math_verify: cannot parse the answer {prompt.answer!r} of prompt {prompt.uid}")
    predicted = parse(completion.text, parsing_timeout=limit)
    return 1.0 if predicted and verify(gold, predicted, timeout_seconds=limit) else 0.0


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "exact_numeric": exact_numeric,
    "final_number": final_number,
    "countdown": countdown,
    "math_verify": math_verify,
}


def load_reward_fn(spec: str, task_default: str) -> RewardFn:
    """The reward function named by ``spec``.

    ``"auto"`` → ``task_default``; a built-in name (:data:`BUILTIN_REWARDS`); or ``"module:function"``,
    imported. Raises :class:`RewardSpecError` naming the spec when it cannot be resolved.
    """
    name = task_default if spec == "auto" else spec
    if name == "math_verify" and importlib.util.find_spec("math_verify") is None:
        raise RewardSpecError(f"reward {spec!r} needs the math-verify package (not installed): {_MATH_VERIFY_INSTALL}")
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if ":" not in name:
        raise RewardSpecError(
            f"reward function {spec!r} is neither 'auto', a built-in ({', '.join(sorted(BUILTIN_REWARDS))}) "
            "nor 'module:function'; fix reward.function"
        )
    return _import_reward_fn(name)


def _import_reward_fn(spec: str) -> RewardFn:
    try:
        target = import_plugin(spec, "reward function")
    except PluginImportError as exc:
        raise RewardSpecError(f"{exc}; fix reward.function (e.g. 'my_rewards:score')") from exc
    if not callable(target):
        raise RewardSpecError(f"reward function {spec!r}: it is a {type(target).__name__}, not callable")
    return cast(RewardFn, target)


def check_reward_kwargs(reward_fn: RewardFn, kwargs: Mapping[str, Any]) -> None:
    """Fail at setup, not mid-run, when ``reward.kwargs`` does not fit ``reward_fn``'s signature: the error names
    each key the function does not take (with the closest one it does take) and the keys it accepts."""
    try:
        signature = inspect.signature(reward_fn)
    except (TypeError, ValueError):
        return  # builtins and C callables have no inspectable signature; scoring will report misuse
    try:
        signature.bind(None, None, **kwargs)
    except TypeError as exc:
        name = getattr(reward_fn, "__name__", repr(reward_fn))
        accepted = [p.name for p in list(signature.parameters.values())[2:]
                    if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        unknown = [key for key in kwargs if key not in accepted]
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.6)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        what = f"takes no key {', '.join(hints)}" if unknown else f"cannot be called with them ({exc})"
        raise RewardSpecError(
            f"reward function {name!r} {what}; its keyword arguments are {accepted or 'none'}"
        ) from exc
