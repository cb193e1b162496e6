"""Every prompt checked against the loaded tokenizer and model, before the run directory exists.

- **No content** (refused): a prompt whose tokens are all special tokens (an empty text becomes BOS alone), so the
  model would generate from nothing. JSONL files refuse empty prompts at parse time already; this catches the rest.
- **Too long** (refused): prompt tokens + ``generation.max_new_tokens`` beyond the model's positions
  (``max_position_embeddings``). Refused rather than truncated: a cut prompt asks another question than the one the
  reward checks, and positions past the trained range give a model's output no meaning.
- **A chat without a template** (refused): a ``messages`` prompt when the tokenizer has no chat template to render
  it (a base model, the built-in character tokenizer); joining turns some other way would train on a format the
  model was never tuned for.
- **Unknown characters** (counted and reported, not refused): characters the tokenizer maps to its unknown token.
  The run still asks a well-defined question (the model sees ``<unk>`` there) and real datasets hold the odd symbol
  a vocabulary lacks; refusing would leave no way to train on them. The note names how many prompts are affected,
  examples and the characters, in ``events.log`` and on stderr.

Each refusal lists up to :data:`MAX_LISTED` prompts with their uid and token count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from groupwise.config import ConfigIssue
from groupwise.model.encode import has_chat_template
from groupwise.types import Prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_LISTED = 10


@dataclass
class PromptReport:
    """What :func:`check_prompts` found: ``issues`` refuse the run, ``notes`` are reported and the run goes on."""

    issues: list[ConfigIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_prompts(
    encode: Callable[[Prompt], Sequence[int]],
    tokenizer: PreTrainedTokenizerBase,
    positions: int | None,
    max_new_tokens: int,
    splits: Mapping[str, tuple[str, Sequence[Prompt]]],
    renders_chats: bool | None = None,
    budget_key: str = "generation.max_new_tokens",
) -> PromptReport:
    """Check every prompt of ``splits`` (``{split: (config key of its source, prompts)}``).

    ``encode`` is what generation uses (system prompt and chat template included); ``positions`` is the model's
    longest sequence (``None``: unknown, not checked); ``renders_chats`` whether chat prompts can be rendered
    (``None``: whether the tokenizer has a chat template); ``budget_key`` names what ``max_new_tokens`` is.
    """
    report = PromptReport()
    unk = getattr(tokenizer, "unk_token_id", None)
    special = set(getattr(tokenizer, "all_special_ids", ()) or ()) - {unk}  # an unknown character is content
    renders_chats = has_chat_template(tokenizer) if renders_chats is None else renders_chats
    for split, (key, prompts) in splits.items():
        chats = [prompt.uid for prompt in prompts if prompt.messages is not None and not renders_chats]
        if chats:
            report.issues.append(ConfigIssue(
                key, f"{len(chats)} {split} prompt(s)", "these prompts are chats ('messages') but the tokenizer has "
                "no chat template to render them:\n" + _listed(chats),
                "use an instruct model whose tokenizer ships a chat template, or give the data as plain 'prompt' "
                "strings",
            ))
            continue
        empty: list[str] = []
        too_long: list[str] = []
        with_unknown: list[Prompt] = []
        for prompt in prompts:
            try:
                ids = encode(prompt)
            except ValueError as exc:  # encode_prompt refuses a prompt with no tokens at all
                empty.append(f"{prompt.uid} ({exc})")
                continue
            if all(token in special for token in ids):
                empty.append(f"{prompt.uid} (only special tokens: {len(ids)})")
            if positions is not None and len(ids) + max_new_tokens > positions:
                too_long.append(f"{prompt.uid} ({len(ids)} tokens)")
            if unk is not None and unk in ids:
                with_unknown.append(prompt)
        if empty:
            report.issues.append(ConfigIssue(
                key, f"{len(empty)} {split} prompt(s)", "these prompts have no content: the model would generate "
                "from BOS alone:\n" + _listed(empty), "give every prompt some text (or drop those items)",
            ))
        if too_long:
            report.issues.append(ConfigIssue(
                key, f"{len(too_long)} {split} prompt(s)",
                f"prompt tokens + {budget_key} ({max_new_tokens}) exceed the model's {positions} "
                "positions for:\n" + _listed(too_long),
                f"shorten or drop these prompts, lower {budget_key}, or use a model with more positions",
            ))
        if with_unknown and unk is not None:
            report.notes.append(_unknown_note(tokenizer, unk, split, len(prompts), with_unknown))
    return report


def _listed(entries: list[str]) -> str:
    shown = [f"  {entry}" for entry in entries[:MAX_LISTED]]
    if len(entries) > MAX_LISTED:
        shown.append(f"  ... and {len(entries) - MAX_LISTED} more")
    return "\n".join(shown)


def _unknown_note(tokenizer: PreTrainedTokenizerBase, unk: int, split: str, total: int, prompts: list[Prompt]) -> str:
    examples = prompts[:3]
    chars: dict[str, None] = {}
    for prompt in examples:
        text = prompt.text if prompt.text is not None else "".join(m["content"] for m in prompt.messages or ())
        for char in dict.fromkeys(text):
            if unk in tokenizer(char, add_special_tokens=False)["input_ids"]:
                chars[char] = None
    shown = ", ".join(repr(c) for c in list(chars)[:10]) or "(not found character by character)"
    return (f"{len(prompts)} of {total} {split} prompts hold characters the tokenizer maps to its unknown token "
            f"(e.g. {', '.join(p.uid for p in examples)}; characters {shown}); the model sees the unknown token there")
