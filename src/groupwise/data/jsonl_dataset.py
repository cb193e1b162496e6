"""Prompts from JSON Lines files, and the ``jsonl`` task built on them.

One JSON object per line (blank lines are skipped)::

    {"prompt": "2+3=", "answer": "5"}
    {"messages": [{"role": "user", "content": "What is 2+3?"}], "answer": 5, "id": "q-17", "level": 1}

- exactly one of ``prompt`` (a string) or ``messages`` (a non-empty list of ``{"role", "content"}``
  string pairs);
- ``answer``: a string or a number (stored as its string form);
- ``id`` (optional, string or integer): the prompt uid, verbatim; it must be unique in the file.
  Without it the uid is ``"{file stem}/{split}/{line number}"`` (1-based physical line);
- any other field goes to ``Prompt.metadata`` (e.g. ``numbers`` for the countdown reward).

Every bad line is reported at once (up to 20) in one :class:`DatasetError` naming the file and line. Hostile lines
are bad lines too, never a crash later: nesting deeper than :data:`MAX_NESTING` levels (a line nested 100,000 deep
exhausts the parser's recursion; a deep ``metadata`` would be copied into every checkpoint), a lone surrogate
escape such as ``"\\ud800"`` anywhere in the line (valid JSON, but not a character: no tokenizer can encode it and no
file can hold it as UTF-8), and an integer of more digits than Python converts (4,300).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from groupwise.types import Prompt

MAX_REPORTED_ERRORS = 20
MAX_NESTING = 64  # objects and arrays inside each other, the line's own object included


class DatasetError(ValueError):
    """A dataset file is missing, empty or has malformed lines; ``path`` is the file (None: no file given)."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


def answer_text(value: object) -> str | None:
    """The answer as a string, or None when it is not a string or a finite number."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


def _messages(value: object) -> tuple[dict[str, str], ...] | str:
    """The chat turns, or a description of what is wrong with them."""
    if not isinstance(value, list) or not value:
        return "'messages' must be a non-empty list of {\"role\": ..., \"content\": ...} objects"
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict) or set(turn) != {"role", "content"}:
            return f"messages[{i}] must be an object with exactly the keys 'role' and 'content', got {turn!r:.80}"
        if not isinstance(turn["role"], str) or not isinstance(turn["content"], str):
            return f"messages[{i}]: 'role' and 'content' must be strings"
        turns.append({"role": turn["role"], "content": turn["content"]})
    return tuple(turns)


def _structure_problem(record: dict[str, Any]) -> str | None:
    """Why a parsed line cannot be used as it is (too deep, or a lone surrogate in some string), or None.

    Walks the record with an explicit stack (a recursive walk is what a deep line would break)."""
    stack: list[tuple[Any, int, str]] = [(value, 2, str(key)) for key, value in record.items()]
    stack.extend((key, 1, "(a key)") for key in record)
    while stack:
        value, depth, field = stack.pop()
        if isinstance(value, str):
            bad = lone_surrogate(value)
            if bad is not None:
                return (f"a lone surrogate escape ({bad}) in field {field!r}: half of a UTF-16 pair, not a character, "
                        "so no tokenizer can encode it; write the character itself, or a complete pair")
        elif isinstance(value, (dict, list)):
            if depth > MAX_NESTING:
                return f"nested deeper than {MAX_NESTING} levels (arrays and objects inside each other)"
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((item, depth + 1, field) for item in items)
    return None


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of ``text`` as its JSON escape (``\\ud800``), or None when it is valid text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"\\u{ord(text[exc.start]):04x}"
    return None


def _parse_line(line: str, uid_fallback: str, seen_ids: dict[str, int], lineno: int) -> Prompt | str:
    """One prompt, or a description of what is wrong with the line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"invalid JSON ({exc.msg} at column {exc.colno})"
    except RecursionError:
        return f"nested deeper than {MAX_NESTING} levels (arrays and objects inside each other)"
    except ValueError as exc:  # an integer beyond Python's conversion limit
        return f"invalid JSON ({str(exc).split('; use sys.')[0]}; write such a number as a string)"
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    problem = _structure_problem(record)
    if problem is not None:
        return problem
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt == has_messages:
        return "needs exactly one of 'prompt' (a string) or 'messages' (chat turns); " + (
            "both are present" if has_prompt else "neither is present"
        )
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    if has_prompt:
        text = record.pop("prompt")
        if not isinstance(text, str):
            return f"'prompt' must be a string, got {type(text).__name__}"
        if not text.strip():
            return "'prompt' is empty: the model would generate from nothing but BOS"
    else:
        turns = _messages(record.pop("messages"))
        if isinstance(turns, str):
            return turns
        messages = turns
        if not any(turn["content"].strip() for turn in messages):
            return "every turn of 'messages' has empty content: the model would be asked nothing"
    if "answer" not in record:
        return "missing 'answer' (a string or number)"
    answer = answer_text(record.pop("answer"))
    if answer is None:
        return "'answer' must be a string or a finite number"
    uid = uid_fallback
    if "id" in record:
        raw_id = record.pop("id")
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
            return f"'id' must be a non-empty string or an integer, got {raw_id!r:.40}"
        uid = str(raw_id)
    if uid in seen_ids:
        return f"duplicate id {uid!r} (first used on line {seen_ids[uid]})"
    seen_ids[uid] = lineno
    return Prompt(uid=uid, answer=answer, text=text, messages=messages, metadata=record)


def load_jsonl_prompts(path: str | Path, split: str) -> list[Prompt]:
    """All prompts of a JSONL file; raises :class:`DatasetError` listing every bad line (up to 20)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise DatasetError(
            f"{path}: no such file (relative paths are resolved against the working directory, here "
            f"{Path.cwd()}, giving {path.absolute()})", path,
        ) from exc
    except IsADirectoryError as exc:
        raise DatasetError(f"{path}: is a directory, not a JSON-lines file", path) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read as UTF-8 text: {exc}", path) from exc
    prompts: list[Prompt] = []
    errors: list[str] = []
    seen_ids: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parsed = _parse_line(line, f"{path.stem}/{split}/{lineno}", seen_ids, lineno)
        if isinstance(parsed, str):
            errors.append(f"  line {lineno}: {parsed}")
        else:
            prompts.append(parsed)
    if errors:
        shown = errors[:MAX_REPORTED_ERRORS]
        more = len(errors) - len(shown)
        tail = f"\n  ... and {more} more bad lines" if more else ""
        raise DatasetError(f"{path}: {len(errors)} bad line(s):\n" + "\n".join(shown) + tail, path)
    if not prompts:
        raise DatasetError(f"{path}: no prompts (the file is empty); add one JSON object per line", path)
    return prompts


class JsonlTask:
    """Prompts from a train file and an optional held-out file. Splits are whatever the files hold."""

    name = "jsonl"

    def __init__(self, train_path: str | Path | None, eval_path: str | Path | None = None,
                 default_reward: str = "exact_numeric") -> None:
        if train_path is None:
            raise DatasetError("the jsonl task needs a training file: set data.jsonl.train_path")
        self.train_path = Path(train_path)
        self.eval_path = None if eval_path is None else Path(eval_path)
        self.default_reward = default_reward
        self._train = load_jsonl_prompts(self.train_path, "train")
        self._eval = [] if self.eval_path is None else load_jsonl_prompts(self.eval_path, "eval")

    def train_prompts(self) -> list[Prompt]:
        return list(self._train)

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def demonstration(self, prompt: Prompt) -> str:
        """The completion an SFT recipe trains on: the item's ``demonstration`` field when it has one (a string),
        else its answer."""
        demonstration = prompt.metadata.get("demonstration")
        return demonstration if isinstance(demonstration, str) else prompt.answer
