"""A ready base for environments where the model calls tools until it answers.

Each model turn either calls tools (in :attr:`ToolEnvironment.tool_format`'s syntax, by default
``<tool_call>{...}</tool_call>``; :mod:`groupwise.episodes.tool_formats`): they run and their answers come back as
``tool`` messages, in the order the calls were written; or it does not: the episode ends and :meth:`score` rates
the final reply. A turn's calls run at the same time (as parallel tool calls do), each with its own
``tool_timeout_s``, so a turn lasts about one timeout however many of its calls hang, and config check keeps
``tool_timeout_s`` below ``episode.step_timeout_s``: a tool never fails its group. A malformed call, an unknown
tool, arguments that do not fit the tool's type hints, a tool that raises, hangs past ``tool_timeout_s``, answers
megabytes or a value that cannot be written as text, a call past ``max_calls_per_turn``: each is an error message
the model reads, counted in ``episode/tool_errors``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from groupwise.episodes.deadline import PendingCall, StepTimeout
from groupwise.episodes.environment import Message, StepResult
from groupwise.episodes.tool_formats import TOOL_FORMATS, ToolCall
from groupwise.episodes.tools import ToolAnswer, run_tool_call
from groupwise.types import Prompt


class ToolEnvironment(ABC):
    """Subclass it: set :attr:`tools` (plain functions) and :attr:`system_prompt`, write :meth:`score` (a subclass
    without one cannot be made). :attr:`tool_format` names the call syntax the model writes (a key of
    :data:`~groupwise.episodes.tool_formats.TOOL_FORMATS`; ``hermes`` is what a template without tools support is
    taught)."""

    system_prompt: str = ""
    tool_format: str = "hermes"
    tool_timeout_s: float = 10.0
    max_answer_chars: int = 2000
    max_calls_per_turn: int = 16

    def __init__(self) -> None:
        self.prompt: Prompt | None = None

    @property
    def tools(self) -> Sequence[Callable[..., Any]]:
        return ()

    def reset(self, prompt: Prompt, sample_index: int) -> list[Message]:
        self.prompt = prompt
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if prompt.messages is not None:
            return opening + [dict(m) for m in prompt.messages]
        return [*opening, {"role": "user", "content": prompt.text or ""}]

    def step(self, assistant_message: Message) -> StepResult:
        calls = TOOL_FORMATS[self.tool_format].parse(assistant_message["content"]).calls
        if not calls:
            assert self.prompt is not None, "reset() before step()"
            return StepResult(reward=self.score(self.prompt, assistant_message["content"]), done=True)
        answers = self._answers(calls)
        messages = [{"role": "tool", "content": answer.text} for answer in answers]
        errors = sum(answer.is_error for answer in answers)
        return StepResult(messages=messages, info={"tool_calls": len(calls), "tool_errors": errors})

    @abstractmethod
    def score(self, prompt: Prompt, final_reply: str) -> float:
        """The reward of the final reply (the turn without a tool call)."""

    def _answers(self, calls: Sequence[ToolCall]) -> list[ToolAnswer]:
        """Every call's answer, in the order written. The first :attr:`max_calls_per_turn` run at once, each on its
        own thread with its own :attr:`tool_timeout_s`, so a turn takes about one timeout however many calls
        hang; the rest are answered with an error without running."""
        by_name = {tool.__name__: tool for tool in self.tools}
        running = [
            PendingCall(_runner(call, by_name, self.max_answer_chars), f"groupwise-tool-{call.name}")
            for call in calls[: self.max_calls_per_turn]
        ]
        answers = [self._waited(call, pending) for call, pending in zip(calls, running, strict=False)]
        over = f"error: not run: a turn may call at most {self.max_calls_per_turn} tools"
        return answers + [ToolAnswer(over, True) for _ in calls[self.max_calls_per_turn :]]

    def _waited(self, call: ToolCall, pending: PendingCall[ToolAnswer]) -> ToolAnswer:
        try:
            return pending.result(self.tool_timeout_s)
        except StepTimeout:
            return ToolAnswer(f"error: {call.name} took longer than {self.tool_timeout_s:g} s and was stopped", True)


def _runner(call: ToolCall, tools: Mapping[str, Callable[..., Any]], max_chars: int) -> Callable[[], ToolAnswer]:
    return lambda: run_tool_call(call, tools, max_chars)
