"""A request's messages as the chat template renders them, with the run's tool-call format.

Every rendering of one session goes through here, so the same message is always rendered the same way: a served
reply as the raw text the model sampled (its tool-call markup included), an assistant message the endpoint did not
serve as its content followed by its calls written in the model family's syntax, a ``tool`` message as its
content (and name). The request's ``tools`` reach the template's ``tools`` argument when the template renders it,
else a system-prompt paragraph (:func:`~groupwise.episodes.tools.tool_instructions`), exactly as an environment's
tools do.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from groupwise.episodes.environment import Message
from groupwise.episodes.template import ChatRenderer, template_takes_tools
from groupwise.episodes.tool_formats import ToolFormat
from groupwise.harness.wire import ChatMessage, canonical_arguments

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MessageKey = Hashable
"""What two messages are compared by: role, content (stripped, for an assistant) and canonical tool calls."""


def message_key(message: ChatMessage) -> MessageKey:
    """How a request's message is recognised: an assistant's by its stripped content and canonical calls (an
    agent framework may drop whitespace or send ``content: null`` beside its calls), any other by all it says."""
    if message.role == "assistant":
        return ("assistant", message.content.strip(), message.tool_calls)
    return (message.role, message.content, message.name)


def served_key(text: str, calls: Sequence[tuple[str, str]]) -> MessageKey:
    """The key of a served reply, as its echo in a later request will have it."""
    return ("assistant", text.strip(), tuple((name, canonical_arguments(arguments)) for name, arguments in calls))


def tools_key(tools: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(list(tools), sort_keys=True)


class RequestRenderer:
    """Renders requests' messages with one chat template and tool format (one :class:`ChatRenderer` per distinct
    tool list, made on first use)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, template: str | None, tool_format: ToolFormat) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.format = tool_format
        self._takes_tools: bool | None = None
        self._renderers: dict[str, ChatRenderer] = {}

    def renderer(self, tools: Sequence[Mapping[str, Any]]) -> ChatRenderer:
        key = tools_key(tools)
        made = self._renderers.get(key)
        if made is None:
            if tools and self._takes_tools is None:
                self._takes_tools = template_takes_tools(self.tokenizer, self.template)
            made = ChatRenderer(self.tokenizer, tools, self.template, takes_tools=bool(self._takes_tools))
            self._renderers[key] = made
        return made

    def as_template_message(self, message: ChatMessage) -> Message:
        """A message the endpoint did not serve, as the template gets it (calls in the model family's syntax)."""
        if message.role == "assistant" and message.tool_calls:
            calls = [
                (name, json.loads(arguments) if _is_json_object(arguments) else {})
                for name, arguments in message.tool_calls
            ]
            written = self.format.write(calls)
            return {"role": "assistant", "content": f"{message.content}\n{written}" if message.content else written}
        out = {"role": message.role, "content": message.content}
        if message.role == "tool" and message.name:
            out["name"] = message.name
        return out

    def opening(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]) -> list[int]:
        """The tokens of ``messages`` with the generation prompt: a context rendered whole."""
        renderer = self.renderer(tools)
        return renderer.opening(renderer.offer_tools(messages))

    def after_reply(
        self,
        history: Sequence[Message],
        reply: Message,
        sampled: Sequence[int],
        new: Sequence[Message],
        tools: Sequence[Mapping[str, Any]],
    ) -> list[int]:
        """The tokens after a served reply's sampled ids when ``new`` messages follow it (the template's closing of
        the reply, the new messages, the generation prompt); raises
        :class:`~groupwise.episodes.template.TemplateNotAppendOnly` when the template rewrites earlier text."""
        renderer = self.renderer(tools)
        return renderer.after_turn(renderer.offer_tools(history), reply, sampled, new)

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False
