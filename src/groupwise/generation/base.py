"""What the loops, the runtimes and evaluation need from a generation backend: the ``Generator`` interface, and the
request stream a backend that can do continuous batching opens.

A backend is one module with a generator class; :mod:`groupwise.generation.factory` builds it from the config
(``generation.backend``). Every generator implements :class:`Generator`. One that can run a stream — requests that
join a running decode loop, weights loaded at a token boundary mid-generation — also implements
:class:`StreamingGenerator`, and says per model whether it can (:meth:`StreamingGenerator.stream_support`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from groupwise.types import Completion, GenerationRequest, RowPrefix, SamplingParams

StreamDone = Callable[[list[Completion] | BaseException], None]
"""Called once, from the serving thread, with a request's completions or with the exception that failed it."""

StreamDropped = Callable[[int, float], None]
"""Called once with a cancelled request's cost: the tokens its rows hold and the seconds charged to it."""


@runtime_checkable
class Generator(Protocol):
    """Samples completions with the logprobs recorded at sampling time, under versioned weights.

    - ``generate`` returns one list per request, in request order, each holding exactly
      ``request.num_samples`` completions in sample-index order. Sampling depends only on
      (request seed, sample index, position) and the weights, not on batch composition.
    - Every completion is stamped with ``version``, the weight version that produced it (and, per token, with
      the version of the step that drew it: ``Completion.token_versions``).
    - ``load_weights`` replaces the weights (a full state dict of the policy) and sets ``version``.
    """

    @property
    def version(self) -> int: ...

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]: ...

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None: ...


@dataclass(frozen=True)
class VersionedWeights:
    """What a weight sync hands a generator: the weights (names as the policy's, adapters merged) and the
    version they are."""

    state: Mapping[str, Tensor]
    version: int

    def checked(self, version: int) -> VersionedWeights:
        """These weights, when they are the ``version`` a sync asked for; a mismatch is a bug, said at once (a
        generator that silently held other weights than its version says would corrupt every staleness count)."""
        if self.version != version:
            raise RuntimeError(
                f"a weight sync asked for version {version}, but the learner's weights are version {self.version}"
            )
        return self


@dataclass(frozen=True)
class StreamSupport:
    """Whether a generator can run a request stream for its model (continuous batching, partial rollouts, resumed
    attempts), and why not when it cannot."""

    available: bool
    reason: str = ""


class RequestStream(Protocol):
    """A running decode loop that requests join and leave while it runs (continuous batching), fed from any thread.

    ``submit`` queues a request and returns its handle; ``on_done`` gets its completions as soon as its own rows are
    done. ``cancel`` drops a request at the next token boundary and tells ``on_dropped(tokens, seconds)`` what it had
    cost — exactly once, whether the request was still running, already answered or finishing at that boundary.
    ``post_weights`` runs ``load`` on the serving thread at a token boundary (rows in flight continue under the new
    weights with partial rollouts, or drain first) and then calls ``done``. ``progress`` is what every request not
    yet forgotten generated so far, at a token boundary. ``paused`` parks the loop; ``generator_for_evaluation`` is
    what evaluation samples with meanwhile. ``steps``, ``weight_loads`` and ``busy_seconds`` are progress and time
    counters.
    """

    @property
    def steps(self) -> int: ...

    @property
    def weight_loads(self) -> int: ...

    @property
    def busy_seconds(self) -> float: ...

    def submit(self, request: GenerationRequest, on_done: StreamDone) -> int: ...

    def cancel(self, handle: int, on_dropped: StreamDropped | None = None) -> None: ...

    def cost(self, handle: int) -> tuple[int, float]: ...

    def forget(self, handle: int) -> None: ...

    def progress(self) -> dict[int, tuple[RowPrefix | None, ...]]: ...

    def post_weights(self, load: Callable[[], None], done: Callable[[BaseException | None], None]) -> None: ...

    def paused(self) -> AbstractContextManager[None]: ...

    def start(self, name: str) -> None: ...

    def close(self, timeout_s: float) -> bool: ...

    def idle(self) -> bool:
        """Whether the stream has nothing to do: no request queued, running or waiting for a slot, no weight load
        pending (an answer still awaited from an idle stream will never come: a liveness watch stops the run)."""
        ...

    def generator_for_evaluation(self) -> Generator:
        """The generator evaluation uses while this stream runs: it samples under the stream's weights and leaves
        the stream's rows as they are (the built-in engine parks the stream around each call)."""
        ...


@runtime_checkable
class OwnsEngine(Protocol):
    """A generator that runs an engine outside this process's Python objects (engine processes, a device's KV
    cache, process groups): ``shutdown`` stops it, and the generator is unusable afterwards. The session that built
    it calls it once, when the run ends (:func:`groupwise.generation.factory.shutdown_generator`)."""

    def shutdown(self) -> None: ...


@runtime_checkable
class StreamingGenerator(Generator, Protocol):
    """A generator that can open a :class:`RequestStream` over its own weights (for the models it supports)."""

    def stream_support(self) -> StreamSupport:
        """Whether this generator can stream its model (it may run the model once to find out)."""
        ...

    def open_stream(
        self, sampling: SamplingParams, *, max_rows: int | None = None, partial: str = "off", kv: str = "recompute",
        reuse_prefixes: bool = True,
    ) -> RequestStream:  # fmt: skip
        """A stream for a runtime to feed while it runs; ``partial``/``kv`` say what a weight load mid-stream does
        (``off``: drain first; ``continue``: rows go on, their KV cache ``recompute``-d or ``keep``-t);
        ``reuse_prefixes``: keep finished rows' keys and values for later requests that extend them (an episode's
        next turn), where the backend can."""
        ...
