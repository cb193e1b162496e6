"""A task's two prompt splits checked as data, before any model loads: what a plug-in task (``data.task:
package.module:Class``) returns is the user's code, so every way it can be wrong is named here, not met later as a
traceback.

- **Refused**: ``train_prompts()`` or ``eval_prompts()`` raising; returning anything but a list (a generator is
  spent after one pass, and the trainer reads the splits many times); items that are not
  :class:`~groupwise.types.Prompt`; fields of the wrong type (``uid`` a non-empty string, ``answer`` a string,
  exactly one of ``text`` (a string) and ``messages`` (a sequence of ``{"role", "content"}`` string mappings),
  ``metadata`` a dict); the same uid twice in one split (the uid is what the fates, ``train_data`` and
  ``groupwise audit`` count training by: a duplicate would hide a prompt trained twice).
- **Warned**: eval prompts that are also training prompts (the same text or messages): the held-out accuracy would
  then measure what training saw.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from groupwise.types import Prompt

MAX_LISTED = 5
"""How many offending prompts a message lists."""


@dataclass
class SplitReport:
    """What :func:`check_splits` found: ``problems`` refuse the task, ``overlap`` is worth a warning."""

    problems: list[str] = field(default_factory=list)
    overlap: str | None = None


def check_splits(train_prompts: Callable[[], object], eval_prompts: Callable[[], object]) -> SplitReport:
    """Call both split methods once and check what they return (the module docstring lists the rules)."""
    report = SplitReport()
    splits: dict[str, list[Prompt]] = {}
    for split, method in (("train", train_prompts), ("eval", eval_prompts)):
        prompts, problem = _called(split, method)
        if problem is not None:
            report.problems.append(problem)
        elif prompts is not None:
            splits[split] = prompts
    if report.problems:
        return report
    report.problems.extend(duplicate_uid_problems(splits))
    report.overlap = overlap_note(splits["train"], splits["eval"])
    return report


def _called(split: str, method: Callable[[], object]) -> tuple[list[Prompt] | None, str | None]:
    """The split's prompts, or why they cannot be used."""
    name = f"{split}_prompts()"
    try:
        returned = method()
    except Exception as exc:  # the user's code: its failure is reported, not raised
        return None, f"{name} raised {type(exc).__name__}: {exc}"
    if not isinstance(returned, list):
        return None, (f"{name} returned a {type(returned).__name__}; it must return a list of "
                      "groupwise.types.Prompt (the splits are read more than once)")
    bad = [f"item {i}: {why}" for i, item in enumerate(returned) if (why := prompt_problem(item)) is not None]
    if bad:
        return None, f"{name} returned {len(bad)} unusable item(s) of {len(returned)}: " + "; ".join(_few(bad))
    return returned, None


def prompt_problem(item: object) -> str | None:
    """Why ``item`` is not a usable :class:`Prompt`, or None."""
    if not isinstance(item, Prompt):
        return f"a {type(item).__name__}, not a groupwise.types.Prompt"
    if not isinstance(item.uid, str) or not item.uid:
        return f"uid {item.uid!r} is not a non-empty string"
    where = f"prompt {item.uid!r}"
    if not isinstance(item.answer, str):
        return f"{where}: answer is {type(item.answer).__name__}, not str"
    if (item.text is None) == (item.messages is None):
        return f"{where}: exactly one of text and messages must be set"
    if item.text is not None and not isinstance(item.text, str):
        return f"{where}: text is {type(item.text).__name__}, not str"
    if item.messages is not None and not _is_chat(item.messages):
        return f"{where}: messages must be a sequence of {{'role': str, 'content': str}} mappings"
    if not isinstance(item.metadata, dict):
        return f"{where}: metadata is a {type(item.metadata).__name__}, not a dict"
    return None


def _is_chat(messages: object) -> bool:
    return (isinstance(messages, Sequence) and not isinstance(messages, str) and len(messages) > 0
            and all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in messages))  # fmt: skip


def duplicate_uid_problems(splits: Mapping[str, Sequence[Prompt]]) -> list[str]:
    """Uids used twice within a split (the same uid in both splits is allowed: evaluation is not training, and a
    file of eval items may number them as the train file does)."""
    problems = []
    for split, prompts in splits.items():
        repeated = [uid for uid, count in Counter(p.uid for p in prompts).items() if count > 1]
        if repeated:
            problems.append(f"{len(repeated)} uid(s) appear more than once in the {split} split: "
                            + ", ".join(_few([repr(uid) for uid in repeated])))  # fmt: skip
    return problems


def overlap_note(train: Sequence[Prompt], eval_: Sequence[Prompt]) -> str | None:
    """A note when eval prompts ask what a training prompt asks (the same text, or the same messages)."""
    seen = {_question(p) for p in train}
    shared = [p.uid for p in eval_ if _question(p) in seen]
    if not shared:
        return None
    return (f"{len(shared)} of {len(eval_)} eval prompts ask what a training prompt asks (e.g. "
            f"{', '.join(_few([repr(uid) for uid in shared]))}): held-out accuracy would measure what training saw")


def _question(prompt: Prompt) -> object:
    if prompt.text is not None:
        return prompt.text
    return tuple((m["role"], m["content"]) for m in prompt.messages or ())


def _few(items: Sequence[str]) -> list[str]:
    shown = list(items[:MAX_LISTED])
    if len(items) > MAX_LISTED:
        shown.append(f"... and {len(items) - MAX_LISTED} more")
    return shown
