"""Turning a :class:`~groupwise.types.Prompt` into the token ids a generator is asked to continue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from groupwise.types import Prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, system_prompt: str | None = None
) -> tuple[int, ...]:
    """The prompt's token ids.

    - ``prompt.text`` is tokenized as is, with the tokenizer's own BOS handling; a ``system_prompt``
      is put in front of it, followed by a newline.
    - ``prompt.messages`` (chat turns) are rendered with the tokenizer's chat template and
      ``add_generation_prompt=True``, a ``system_prompt`` becoming a leading system turn; the rendered
      text already holds any BOS the template wants, so no special tokens are added again. A tokenizer
      without a chat template raises :class:`ChatTemplateMissing`: joining turns some other way would
      train on a format the model was never tuned for.
    """
    if (prompt.text is None) == (prompt.messages is None):
        raise ValueError(
            f"prompt {prompt.uid!r} must set exactly one of text or messages "
            f"(text set: {prompt.text is not None}, messages set: {prompt.messages is not None})"
        )
    if prompt.text is not None:
        text = prompt.text if system_prompt is None else f"{system_prompt}\n{prompt.text}"
        return _tokenize(tokenizer, text, add_special_tokens=True, uid=prompt.uid)
    messages = [dict(message) for message in prompt.messages or ()]
    for index, message in enumerate(messages):
        if "content" not in message or "role" not in message:
            raise ValueError(f"prompt {prompt.uid!r} message {index} is {message!r}; each needs 'role' and 'content'")
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    if not has_chat_template(tokenizer):
        raise ChatTemplateMissing(
            f"prompt {prompt.uid!r} is a chat (messages) but the tokenizer has no chat template to render it; use "
            "an instruct model whose tokenizer ships one, or give the data as plain 'prompt' strings"
        )
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(rendered, str):  # transformers' return type covers every mode; tokenize=False gives the text
        raise TypeError(f"the tokenizer's chat template rendered a {type(rendered).__name__}, not a string")
    return _tokenize(tokenizer, rendered, add_special_tokens=False, uid=prompt.uid)


class ChatTemplateMissing(ValueError):
    """Chat-format prompts (``messages``) with a tokenizer that has no chat template."""


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _tokenize(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool, uid: str) -> tuple[int, ...]:
    ids = tuple(int(token_id) for token_id in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
    if not ids:
        raise ValueError(
            f"prompt {uid!r} encodes to no tokens (text {text!r}); a generator needs at least one prompt token "
            "to condition on — give the prompt some text or use a tokenizer that adds BOS"
        )
    return ids
