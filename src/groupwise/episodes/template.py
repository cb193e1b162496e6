"""Observation tokens from the chat template, appended to what the model sampled, never re-tokenized.

After a model turn the episode's tokens are: the context so far, the tokens the model sampled (kept as sampled),
then environment tokens — the template's closing of the assistant turn the model did not write itself (the
newline after an end-of-turn token, or the end-of-turn token of a turn cut at its length), and the template's
rendering of the new messages with the next generation prompt. Those come from rendering the conversation as
text twice, with and without the new messages, and taking the difference; :class:`TemplateNotAppendOnly` is
raised when the longer rendering does not start with the shorter one (a template that rewrites earlier turns,
e.g. dropping earlier reasoning): training on a sequence the model never saw is refused, not done silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from groupwise.episodes.environment import Message
from groupwise.episodes.tools import tool_instructions
from groupwise.types import Prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


PLAIN_CHAT_TEMPLATE = (
    "{%- for m in messages -%}{{ m['role'] }}: {{ m['content'] }}"
    "{%- if m['role'] == 'assistant' -%}{{ eos_token }}{%- endif -%}{{ '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}assistant: {% endif -%}"
)
"""``episode.chat_template: plain``: ``role: content`` lines, an assistant turn ending with the EOS token. For a
model without a chat template of its own (a base model, the tiny from-scratch policy); append-only by construction."""


class TemplateNotAppendOnly(ValueError):
    """The chat template renders a longer conversation as something that does not extend the shorter one."""


_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "groupwise_probe_tool", "description": "A probe.", "parameters": {"type": "object",
                                                                                          "properties": {}}},
}  # fmt: skip


def template_takes_tools(tokenizer: PreTrainedTokenizerBase, template: str | None) -> bool:
    """Whether the chat template renders a ``tools`` argument: a probe tool's name appears in a rendering given it
    (a template that only mentions the word "tools" in a comment does not take them)."""
    probe = [{"role": "user", "content": "Hello."}]
    try:
        rendered = tokenizer.apply_chat_template(
            probe, tools=[_PROBE_TOOL], chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that fails when given tools does not take them
        return False
    return isinstance(rendered, str) and "groupwise_probe_tool" in rendered


class ChatRenderer:
    """Renders conversations with the tokenizer's chat template.

    Tools (JSON schemas, :func:`~groupwise.episodes.tools.tool_schema`'s or a request's OpenAI ``tools``) reach the
    model through the template's ``tools`` argument when the template renders it (:func:`template_takes_tools`);
    otherwise :meth:`offer_tools` writes :func:`~groupwise.episodes.tools.tool_instructions` into the system
    message (a documented text format, the same call syntax)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, tools: Sequence[Mapping[str, Any]] = (), template: str | None = None,
        takes_tools: bool | None = None,
    ) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.template = template  # None: the tokenizer's own
        if tools and takes_tools is None:
            takes_tools = template_takes_tools(tokenizer, template)
        self.tools: list[dict[Any, Any] | Callable[..., Any]] | None = (
            [dict(t) for t in tools] if tools and takes_tools else None
        )
        self.tool_text = tool_instructions(tools) if tools and not takes_tools else None
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no EOS token to end an assistant turn with")
        self.end_of_turn = int(eos)

    def text(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        rendered = self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, chat_template=self.template, tokenize=False,
            add_generation_prompt=generation_prompt,
        )  # fmt: skip
        if not isinstance(rendered, str):
            raise TypeError(f"the chat template rendered a {type(rendered).__name__}, not a string")
        return rendered

    def ids(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def offer_tools(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` with the tool instructions in the system message when the template cannot take tools."""
        out = [dict(m) for m in messages]
        if self.tool_text is None:
            return out
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{self.tool_text}".strip()
            return out
        return [{"role": "system", "content": self.tool_text}, *out]

    def opening(self, messages: Sequence[Message]) -> list[int]:
        """The tokens of an episode's opening messages with the generation prompt."""
        return self.ids(self.text(messages, generation_prompt=True))

    def prompt_opening(self, prompt: Prompt) -> list[int]:
        """The opening tokens of a prompt as its own conversation (its messages, or its text as the user turn)."""
        messages: list[Message] = (
            [dict(m) for m in prompt.messages] if prompt.messages is not None
            else [{"role": "user", "content": prompt.text or ""}]
        )  # fmt: skip
        return self.opening(self.offer_tools(messages))

    def after_turn(
        self, history: Sequence[Message], reply: Message, sampled: Sequence[int], observations: Sequence[Message]
    ) -> list[int]:
        """The environment tokens that follow a turn's ``sampled`` tokens: the template's closing of ``reply``
        (see the module docstring), then ``observations`` with the next generation prompt (none when empty).

        ``history`` is the conversation before the turn (ending in the generation prompt's turn)."""
        before = self.text(history, generation_prompt=True)
        with_reply = self.text([*history, reply], generation_prompt=False)
        _check_extends(before, with_reply, "adding the assistant's reply")
        closing = self._closing(self.ids(with_reply[len(before):]), ended=bool(sampled) and sampled[-1] ==
                                self.end_of_turn)  # fmt: skip
        if not observations:
            return closing
        with_answer = self.text([*history, reply, *observations], generation_prompt=True)
        _check_extends(with_reply, with_answer, "adding the environment's answer")
        return closing + self.ids(with_answer[len(with_reply):])

    def _closing(self, reply_ids: list[int], ended: bool) -> list[int]:
        """What the template writes after the reply's end-of-turn token (with that token first when the model's
        turn did not end with it)."""
        if self.end_of_turn not in reply_ids:
            raise TemplateNotAppendOnly(
                "the chat template does not end an assistant turn with the EOS token, so the sampled end of a turn "
                "cannot be matched to it"
            )
        last = len(reply_ids) - 1 - reply_ids[::-1].index(self.end_of_turn)
        tail = reply_ids[last + 1:]
        return tail if ended else [self.end_of_turn, *tail]


def _check_extends(shorter: str, longer: str, what: str) -> None:
    if not longer.startswith(shorter):
        at = next((i for i, (a, b) in enumerate(zip(shorter, longer, strict=False)) if a != b), len(longer))
        raise TemplateNotAppendOnly(
            f"the chat template is not append-only: {what} changes the earlier text at character {at} "
            f"({shorter[at:at + 40]!r} became {longer[at:at + 40]!r}); training on it would train on a sequence "
            "the model never saw. Use a template that renders earlier turns unchanged (episode.chat_template)"
        )


def append_only_problem(renderer: ChatRenderer, turns: int = 4) -> str | None:
    """Why the renderer's template cannot run episodes, or None.

    Probed on a conversation of ``turns`` assistant turns (at least four, so that each kind — numeric with
    reasoning, prose, a tool call — is answered), each appended as an episode appends it: a template that drops or
    rewrites earlier turns only in a longer conversation (a sliding window, earlier reasoning or tool calls
    stripped) is found, naming the first turn whose rendering broke the prefix. With tools offered, the answers
    to tool calls are ``tool`` messages."""
    kinds = (  # (what kind, the reply, the answer to it)
        ("a numeric turn", "<think>2 + 2 = 4</think> 4", "Now say it in words."),
        ("a prose turn", "Two and two make four: two things beside two things are four things.", "Multiply 17 by 23."),
        ("a tool-call turn", '<tool_call>\n{"name": "multiply", "arguments": {"a": 17, "b": 23}}\n</tool_call>', "391"),
    )
    answer_role = "tool" if renderer.tools is not None or renderer.tool_text is not None else "user"
    history: list[Message] = renderer.offer_tools([{"role": "user", "content": "What is 2 + 2?"}])
    count = max(turns, len(kinds) + 1)  # every kind of turn followed by an answer
    for turn in range(1, count + 1):
        kind, content, answer = kinds[(turn - 1) % len(kinds)]
        reply = {"role": "assistant", "content": content}
        role = answer_role if kind == "a tool-call turn" else "user"
        observations = [{"role": role, "content": answer}] if turn < count else []
        where = f"at assistant turn {turn} ({kind}) of a {count}-turn probe conversation"
        try:
            sampled = renderer.ids(content) + [renderer.end_of_turn]
            renderer.after_turn(history, reply, sampled, observations)
        except (TemplateNotAppendOnly, TypeError, ValueError) as exc:
            return f"{where}: {exc}"
        except Exception as exc:  # a template that raises on these messages (jinja's own errors) cannot run episodes
            return f"the chat template failed {where}: {type(exc).__name__}: {exc}"
        history += [reply, *observations]
    return None
