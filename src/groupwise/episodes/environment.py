"""The environment protocol: messages in, messages out. An environment never sees a token.

``reset(prompt, sample_index)`` gives the opening messages of one episode (the system and user turns the model
answers first); ``step(assistant_message)`` answers one model turn with a :class:`StepResult`. One environment
object runs one episode; ``episode.environment`` names a factory that makes one per episode (a class, or any
callable taking the ``episode.kwargs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from groupwise.plugins import PluginImportError, import_plugin
from groupwise.types import Prompt

Message = dict[str, str]


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to one model turn.

    ``messages``: what the model reads next (each with ``role`` and ``content``; none when ``done``); ``reward``:
    this turn's contribution (the episode's reward is the sum); ``done``: the episode is over; ``info``: counts
    the environment reports (``tool_calls`` and ``tool_errors`` are summed into ``episode/*`` metrics).
    """

    messages: Sequence[Message] = ()
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode's counterpart. Methods may be slow (a tool call): they run off the generation thread."""

    def reset(self, prompt: Prompt, sample_index: int) -> Sequence[Message]: ...

    def step(self, assistant_message: Message) -> StepResult: ...


@runtime_checkable
class OffersTools(Protocol):
    """An environment whose model may call tools: ``tools`` are plain Python functions with typed parameters
    and a docstring, offered through the chat template's ``tools`` argument when it has one."""

    @property
    def tools(self) -> Sequence[Callable[..., Any]]: ...


EnvironmentFactory = Callable[[], Environment]


class EnvironmentSpecError(ValueError):
    """``episode.environment`` cannot be turned into a factory (the message says why)."""


def environment_factory(spec: str, kwargs: Mapping[str, Any], builtins: Mapping[str, str]) -> EnvironmentFactory:
    """A factory making one environment per episode from ``spec`` (a built-in name or ``module:attribute``),
    called with ``kwargs``. Raises :class:`EnvironmentSpecError` when it cannot be imported or is not callable."""
    try:
        made = import_plugin(builtins.get(spec, spec), "episode.environment")
    except PluginImportError as exc:
        raise EnvironmentSpecError(f"{exc} (the built-in environments are {', '.join(builtins)})") from exc
    if not callable(made):
        raise EnvironmentSpecError(f"{spec!r} names a {type(made).__name__}, not a class or function")
    options = dict(kwargs)
    return lambda: made(**options)


def checked_messages(messages: Any, where: str) -> tuple[Message, ...]:
    """``messages`` as a tuple of ``{'role': str, 'content': str}``, or ValueError naming ``where`` and the fault."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"{where} returned {type(messages).__name__}, not a list of messages")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) or not isinstance(
            message.get("content"), str
        ):
            raise ValueError(f"{where} message {index} is {message!r:.120}; each needs a str 'role' and 'content'")
        out.append({"role": message["role"], "content": message["content"]})
    return tuple(out)
