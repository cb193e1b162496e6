"""Continuous batching and partial rollouts on vLLM: a stream over ``AsyncLLM``, with the built-in stream's methods.

:class:`VllmStream` is a :class:`~groupwise.generation.base.StreamingGenerator` whose stream is itself: a
:class:`~groupwise.generation.base.Generator` (``version`` / ``generate`` / ``load_weights``), and, once
:meth:`~VllmStream.open_stream` set the run's sampling and partial-rollout mode, the
:class:`~groupwise.generation.base.RequestStream` the runtimes feed (``submit`` / ``cancel`` / ``cost`` / ``forget``
/ ``progress`` / ``post_weights`` / ``paused`` / ``start`` / ``close``; ``steps``, ``weight_loads``,
``busy_seconds``), so rollouts, weight loads and evaluation share one engine. Closing the stream ends its requests
and leaves the engine serving ``generate`` (the run's last evaluation); :meth:`~VllmStream.shutdown` stops the
engine (the session does, when the run ends; also at interpreter exit).

``AsyncLLM`` runs its engine core in a child process (a script that builds one needs an ``if __name__ ==
"__main__":`` guard); its asyncio loop runs on a daemon thread of this stream, and every callback (``on_done``,
``on_dropped``, ``done``) is called from that thread.

* **Continuous batching** is vLLM's own: a submitted request's samples (one vLLM request each,
  :mod:`groupwise.generation.vllm.rows`) join the running batch at once.
* **Weights mid-stream** (:meth:`VllmStream.post_weights`, :mod:`groupwise.generation.vllm.pauses`): with
  ``partial="continue"`` the rows go on under the new weights with the KV cache computed under the old ones (the
  built-in stream's ``kv="keep"``; vLLM does not recompute it); with ``partial="off"`` no row spans versions.
* **Per-token versions**: vLLM labels every output token with the weight version set when it was sampled
  (``CompletionOutput.weight_versions``); those spans are what a finished row records. Until a row finishes,
  :meth:`progress` reports the version stamped as each token arrived (outputs produced before a pause are delivered
  before the pause returns, so the stamps agree with vLLM's labels).
* **Cancellation** aborts the request's vLLM requests; ``on_dropped(tokens, seconds)`` gets what it cost, the
  tokens generated so far included. A resumed attempt (``GenerationRequest.prefixes``) resubmits prompt + tokens so
  far (the draws then differ from an uninterrupted row's, unlike the built-in engine).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from torch import Tensor

from groupwise.generation.base import RequestStream, StreamDone, StreamDropped, StreamSupport
from groupwise.generation.request_limits import request_limit
from groupwise.generation.sampling import check_sampling_params
from groupwise.generation.vllm.pauses import EnginePauses
from groupwise.generation.vllm.rows import (
    assemble,
    check_source,
    expand_rows,
    package,
    package_finished,
    recorded_logprobs,
    sampling_params_for,
    versions_from_spans,
)  # fmt: skip
from groupwise.generation.vllm.setup import VllmSettings, build_async_llm, import_vllm
from groupwise.generation.vllm.stream_rows import BusyClock, RowState, StreamEntry
from groupwise.generation.vllm.weights import IpcTransfer, check_names
from groupwise.types import Completion, GenerationRequest, RowPrefix, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PARTIAL_MODES = ("off", "continue")
_T = TypeVar("_T")


class VllmStream:
    """A generation stream over ``AsyncLLM`` (see the module docstring); building it starts the engine."""

    def __init__(
        self, settings: VllmSettings, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Sequence[int],
        weight_names: Sequence[str], sampling: SamplingParams, *, version: int = 0, partial: str = "off",
        weights_dir: str | None = None,
    ) -> None:  # fmt: skip
        check_sampling_params(sampling)
        check_source(settings.logprobs, sampling)
        if partial not in PARTIAL_MODES:
            raise ValueError(f"partial={partial!r} must be one of {PARTIAL_MODES}")
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty; pass groupwise.model.eos_token_ids(tokenizer, model)")
        self.settings, self.tokenizer, self.sampling, self.partial = settings, tokenizer, sampling, partial
        self.eos_token_ids = tuple(int(token) for token in eos_token_ids)
        self._weight_names = set(weight_names)
        self._vllm = import_vllm(settings)
        self._lock = threading.Lock()  # entries and their rows: read by any thread, written on the loop thread
        self._entries: dict[int, StreamEntry] = {}
        self._answered: dict[int, StreamEntry] = {}
        self._next_handle = 0
        self._clock = BusyClock()
        self._closed = False  # the engine was shut down
        self.steps = self.generated_tokens = self.joins = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="groupwise-vllm", daemon=True)
        self._thread.start()
        try:
            self.engine: Any = self._run(build_async_llm(settings))  # Any: a vLLM AsyncLLM (vllm: optional, lazy)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)  # no thread is left behind by a failed start
            self._thread.join(10.0)
            raise
        ipc = IpcTransfer(self.engine, self._run) if settings.device == "cuda" else None
        self._pauses = EnginePauses(self._lock, self._clock, int(version), weights_dir, ipc)
        self._run(self.engine.update_weight_version(str(self.version)))
        atexit.register(_shutdown_at_exit, weakref.ref(self))  # AsyncLLM's own finaliser fails at interpreter exit

    # -- Generator ----------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._pauses.version

    @property
    def weight_loads(self) -> int:
        return self._pauses.weight_loads

    @property
    def busy_seconds(self) -> float:
        return self._clock.busy_seconds

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """Every request through the stream (joining whatever runs), in request order; blocks until all are done.
        Not from the stream's own thread, and not inside :meth:`paused`."""
        done = threading.Event()
        results: dict[int, Any] = {}  # completions, or the error raised below

        def answer(index: int, outcome: list[Completion] | BaseException) -> None:
            results[index] = outcome
            if len(results) == len(requests):
                done.set()

        for index, request in enumerate(requests):
            self.submit(request, functools.partial(answer, index), sampling=sampling)
        while requests and not done.wait(1.0):
            if self._closed:
                raise RuntimeError("the vLLM stream was closed before these requests were answered")
        for outcome in results.values():
            if isinstance(outcome, BaseException):
                raise outcome
        return [results[index] for index in range(len(requests))]

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None:
        """Load a full state dict (LoRA merged) into the engine and set the version; generation is paused (``keep``)
        meanwhile. From any thread but the stream's own."""
        if version < self.version:
            raise ValueError(
                f"load_weights(version={version}) would move the engine back from version {self.version}; "
                "weight versions only increase — pass the learner's current version"
            )
        check_names(state, self._weight_names)
        self._run(self._pauses.load(self.engine, state, int(version)))

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop the engine (its processes, KV cache and loop thread); requests still held get no answer. The stream
        and the generator are unusable afterwards."""
        if self._closed:
            return
        self._closed = True
        self._pauses.answer_post(RuntimeError("the vLLM engine was shut down before the weights were loaded"))
        with contextlib.suppress(Exception):  # the engine may already be dead: shutting down must still end the thread
            self._run(self._shutdown(), timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        self._pauses.remove_folder()

    # -- StreamingGenerator -------------------------------------------------------------------------------------
    def stream_support(self) -> StreamSupport:
        """vLLM streams every model it serves (its scheduler batches continuously)."""
        return StreamSupport(True)

    def open_stream(
        self, sampling: SamplingParams, *, max_rows: int | None = None, partial: str = "off", kv: str = "recompute",
        reuse_prefixes: bool = True,
    ) -> RequestStream:  # fmt: skip
        """This engine as the run's stream, sampling with ``sampling`` unless a request says otherwise. ``partial``:
        ``off`` drains the running rows before a weight load, ``continue`` loads at once and the rows go on with
        their KV cache (vLLM's ``keep`` pause: ``kv`` must be ``keep``). ``max_rows`` is not used: vLLM's
        scheduler bounds the rows it decodes at once (``generation.vllm.max_num_seqs``) and queues the rest;
        ``reuse_prefixes`` is vLLM's own business (its prefix cache)."""
        if partial not in PARTIAL_MODES:
            raise ValueError(f"partial={partial!r} must be one of {PARTIAL_MODES}")
        if partial == "continue" and kv != "keep":
            raise ValueError(
                f"kv={kv!r}: vLLM keeps the running rows' KV cache across a weight load (its 'keep' pause) and "
                "cannot recompute it; open the stream with kv='keep' (async.partial_rollout_kv: keep)"
            )
        check_sampling_params(sampling)
        check_source(self.settings.logprobs, sampling)
        self.sampling, self.partial = sampling, partial
        return self

    def idle(self) -> bool:
        """Nothing to do: no request held unanswered and no weight load pending (what the liveness watch asks:
        an answer awaited from an idle stream will never come)."""
        with self._lock:
            return not self._entries and self._pauses.post_done is None

    def generator_for_evaluation(self) -> VllmStream:
        """Evaluation's requests join the running batch (vLLM needs no pause for them): the stream itself."""
        return self

    # -- the stream (any thread) --------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, on_done: StreamDone, sampling: SamplingParams | None = None) -> int:
        """Queue ``request`` (sampled with the stream's settings unless ``sampling`` is given); ``on_done`` gets its
        completions or the error that failed it. Returns the handle for :meth:`cancel` and :meth:`progress`."""
        sampling = sampling or self.sampling
        if request.max_new_tokens is not None:  # an episode turn: its own, lower limit
            sampling = replace(sampling, max_new_tokens=request_limit(request, sampling.max_new_tokens))
            request = replace(request, max_new_tokens=None)
        if sampling is not self.sampling:
            check_sampling_params(sampling)
            check_source(self.settings.logprobs, sampling)
        rows, finished = expand_rows([request], sampling.max_new_tokens)
        with self._lock:
            handle, self._next_handle = self._next_handle, self._next_handle + 1
            entry = StreamEntry(handle, request, sampling, on_done, [RowState(row) for row in rows], finished)
            self._entries[handle] = entry
        self._loop.call_soon_threadsafe(self._start, entry)
        return handle

    def cancel(self, handle: int, on_dropped: StreamDropped | None = None) -> None:
        """Abort a request; ``on_dropped(tokens, seconds)`` gets its cost once its rows stopped (at once for one
        already answered; never when the stream closes first)."""
        with self._lock:
            answered = self._answered.pop(handle, None)
            entry = self._entries.get(handle)
            if entry is not None:
                entry.cancelled, entry.on_dropped = True, on_dropped
        if entry is not None:
            self._loop.call_soon_threadsafe(_cancel_tasks, entry)
        elif on_dropped is not None:
            on_dropped(*((answered.tokens, answered.seconds) if answered is not None else (0, 0.0)))

    def cost(self, handle: int) -> tuple[int, float]:
        """Tokens a request not yet forgotten holds, and the busy seconds charged to it."""
        with self._lock:
            entry = self._entries.get(handle) or self._answered.get(handle)
            return (entry.tokens, entry.seconds) if entry is not None else (0, 0.0)

    def forget(self, handle: int) -> None:
        with self._lock:
            self._answered.pop(handle, None)

    def progress(self) -> dict[int, tuple[RowPrefix | None, ...]]:
        """Per request not yet forgotten: what each sample generated so far (None: nothing yet)."""
        with self._lock:
            return {handle: entry.progress() for handle, entry in [*self._entries.items(), *self._answered.items()]}

    def post_weights(self, load: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        """Pause generation (``keep`` with ``partial="continue"``, ``wait`` with ``"off"``), run ``load`` (on a
        worker thread: it may call :meth:`load_weights`), resume, then call ``done`` with None or the error."""
        self._pauses.take_post(done)
        asyncio.run_coroutine_threadsafe(self._pauses.post(self.engine, load, self.partial), self._loop)

    def pause(self) -> None:
        """Freeze generation (vLLM's ``keep``) until :meth:`resume`; running requests keep their place."""
        self._run(self._pauses.pause(self.engine, "keep"))

    def resume(self) -> None:
        self._run(self._pauses.resume(self.engine))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def start(self, name: str) -> None:
        """The engine serves from construction on; this names its thread (the built-in stream's interface)."""
        self._thread.name = name

    def close(self, timeout_s: float) -> bool:
        """End the stream: the requests still held are aborted (each answered with an error), a pending weight post
        gets an error. The engine keeps serving :meth:`generate` (:meth:`shutdown` stops it). True when every aborted
        request had stopped within ``timeout_s``."""
        if self._closed:
            return True
        self._pauses.answer_post(RuntimeError("the vLLM stream was closed before the weights were loaded"))
        try:
            self._run(self._abort_all(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- the loop thread ----------------------------------------------------------------------------------------
    def _run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a blocking VllmStream call from the stream's own thread would deadlock it")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def _start(self, entry: StreamEntry) -> None:
        if self._closed:
            return
        self._clock.tick()
        if self._clock.live:
            self.joins += 1
        for state in entry.rows:
            self._clock.live[state] = entry
        entry.tasks = [self._loop.create_task(self._generate_row(entry, state)) for state in entry.rows]
        self._loop.create_task(self._settle(entry))

    async def _generate_row(self, entry: StreamEntry, state: RowState) -> None:
        from vllm.sampling_params import RequestOutputKind

        sampling = entry.sampling
        params = sampling_params_for(
            self._vllm, state.row, sampling, self.eos_token_ids, self.settings.logprobs, RequestOutputKind.DELTA
        )
        request_id = f"{entry.handle}-{state.row.sample}"
        try:
            async for output in self.engine.generate({"prompt_token_ids": list(state.row.prompt)}, params, request_id):
                completion = output.outputs[0]
                tokens = [int(token) for token in completion.token_ids]
                logprobs = recorded_logprobs(tokens, completion.logprobs if tokens else [], self.settings.logprobs,
                                             sampling.temperature)  # fmt: skip
                self._clock.tick()
                with self._lock:
                    state.token_ids += tokens
                    state.logprobs += logprobs
                    state.versions += [self.version] * len(tokens)
                    if output.finished:
                        state.versions = versions_from_spans(
                            completion.weight_versions, len(state.token_ids), state.versions
                        )
                        state.finish_reason = str(completion.finish_reason)
                self.steps += 1
                self.generated_tokens += len(tokens)
        finally:
            self._clock.tick()
            self._clock.live.pop(state, None)

    async def _settle(self, entry: StreamEntry) -> None:
        """Wait for the entry's rows; answer it (or, cancelled, report its cost)."""
        outcomes = await asyncio.gather(*entry.tasks, return_exceptions=True)
        with self._lock:
            self._entries.pop(entry.handle, None)
            if not entry.cancelled:
                self._answered[entry.handle] = entry
        if entry.cancelled:
            if entry.on_dropped is not None:
                entry.on_dropped(entry.tokens, entry.seconds)
            return
        errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        result: list[Completion] | BaseException | None = errors[0] if errors else None
        if result is None:
            try:
                rows = [state.row for state in entry.rows]
                completions = package(rows, [state.output() for state in entry.rows], self.eos_token_ids,
                                      self.tokenizer)  # fmt: skip
                completions += package_finished(entry.finished, self.eos_token_ids, self.tokenizer)
                result = assemble([entry.request], [*rows, *entry.finished], completions)[0]
            except Exception as error:  # noqa: BLE001 — packaging failed (the tokenizer): that request gets it
                result = error
        entry.on_done(result)

    async def _abort_all(self) -> None:
        """Abort every request held; each gets an error as its answer (nobody waits for one forever)."""
        with self._lock:
            entries = list(self._entries.values())
            for entry in entries:
                entry.cancelled, entry.on_dropped = True, None  # (its settling then answers nothing itself)
        tasks = [task for entry in entries for task in entry.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for entry in entries:
            entry.on_done(RuntimeError("the vLLM stream was closed before this request was answered"))

    async def _shutdown(self) -> None:
        await self._abort_all()
        engine, self.engine = self.engine, None
        engine.shutdown()
        del engine  # (collected now: AsyncLLM's __del__ shuts down again, which fails at interpreter exit)


def _cancel_tasks(entry: StreamEntry) -> None:
    """(On the loop thread.) Cancel the entry's row tasks: vLLM aborts their requests."""
    for task in entry.tasks:
        task.cancel()


def _shutdown_at_exit(stream: weakref.ref[VllmStream]) -> None:
    alive = stream()
    if alive is not None:
        alive.shutdown(10.0)
