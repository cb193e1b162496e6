"""Continuous batching and partial rollouts: one decode loop that requests join as rows finish.

A :class:`GenerationStream` decodes on the engine's static slots (:mod:`groupwise.generation.slots`), where every
slot has its own position, cache column and RNG counter, so rows that joined at different times share a step:

* **Requests join a running batch.** :meth:`GenerationStream.submit` (any thread) queues a request; at the next
  token boundary its rows are prefilled (one prompt forward per request) and loaded into free slots. A request is
  handed back (``on_done``) as soon as its own rows are done, not when the batch ends. Rows of a request are taken
  in together when their slots are free (or when nothing else is decoding), in arrival order.
* **Continuations.** A request may carry a :class:`~groupwise.types.RowPrefix` per sample (a resumed in-flight
  attempt): that row is prefilled with prompt + its tokens but the last, which it feeds next, and it draws token
  ``k = len(prefix)`` with the same counter-RNG draw an uninterrupted row makes there.
* **Weights mid-call** (:meth:`GenerationStream.post_weights`). With ``partial="continue"`` the new weights are
  loaded at the next token boundary and the rows still generating go on under them: with ``kv="recompute"`` their
  KV cache is rebuilt under the new weights first (a prefill of prompt + tokens so far), with ``kv="keep"`` it is
  kept as it was computed (under older versions). With ``partial="off"`` no row spans versions: the stream stops
  taking rows in, lets the live ones finish, then loads the weights (a drain, as a batch-per-call engine does).
  Every token records the version that ran the step that drew it and its sampling-time logprob.
* **Reused prefixes** (:mod:`groupwise.generation.stream_prefixes`): a bounded store (``prefix_tokens``
  positions; by default twice as many as the slots hold) of finished rows' keys/values, which a later prefill of a
  sequence that starts the same way (a multi-turn episode's next turn) skips; ``prefixes.reused_tokens`` counts it.
* **Every callback once.** ``on_done`` of a request is called at most once (never for one dropped before it
  finished); ``on_dropped`` of a :meth:`~GenerationStream.cancel` and the ``done`` of a weight post exactly once,
  whatever order cancel, finish, weight load, failure and close come in at a token boundary (whoever takes a request
  out of the stream's table takes its cancellers' callbacks in the same locked block).
* **Progress** (:meth:`GenerationStream.progress`, any thread): what every unfinished request generated so far,
  read under the lock the serving thread appends tokens under, so a checkpoint taken while the engine runs sees
  each row at a token boundary.

This module holds the requests, their callbacks, the weight posts and the serving thread; the work of a token
boundary on the rows (admission into slots, a decode step, the KV rebuild after a load) is
:class:`~groupwise.generation.stream_decode.RowDecoding`'s. The loop runs on the stream's own daemon thread
(:meth:`start`), or in the caller's thread until there is nothing left to do (:meth:`run_until_idle`, which is how
``Engine.generate`` uses it). :meth:`pause` parks the thread at a token boundary (evaluation uses the engine
meanwhile). A failure inside the loop fails every request it holds with that error and the stream goes on serving.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from groupwise.abandoned import leave_running
from groupwise.generation.base import StreamDone, StreamDropped
from groupwise.generation.pausing import PausingGenerator
from groupwise.generation.sampling import check_sampling_params
from groupwise.generation.stream_decode import RowDecoding
from groupwise.generation.stream_rows import RequestTable, StreamRequest, StreamRow, call_dropped
from groupwise.generation.stream_slots import StreamSlots
from groupwise.types import Completion, GenerationRequest, RowPrefix, SamplingParams

if TYPE_CHECKING:
    from groupwise.generation.engine import Engine
    from groupwise.generation.llama_decode import LlamaDecoder

PARTIAL_MODES = ("off", "continue")
KV_MODES = ("recompute", "keep")


@dataclass
class _WeightPost:
    load: Callable[[], None]  # copies the new weights into the engine (in place) and sets its version
    on_done: Callable[[BaseException | None], None]
    answered: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self, error: BaseException | None) -> None:
        """Answer the poster once (a close and the serving thread may both try, from two threads)."""
        with self._lock:
            first, self.answered = not self.answered, True
        if first:
            self.on_done(error)


class GenerationStream:
    """A continuous-batching decode loop over an engine (see the module docstring)."""

    def __init__(
        self, engine: Engine, decoder: LlamaDecoder | None, sampling: SamplingParams, *, max_rows: int,
        partial: str = "off", kv: str = "recompute", slots: StreamSlots, prefix_tokens: int | None = None,
    ) -> None:  # fmt: skip
        check_sampling_params(sampling)
        if partial not in PARTIAL_MODES or kv not in KV_MODES:
            raise ValueError(f"partial={partial!r} must be one of {PARTIAL_MODES} and kv={kv!r} one of {KV_MODES}")
        if decoder is None:  # Engine.stream_support says why there is no fast step
            raise ValueError("a generation stream decodes with the fast decode step, and this engine has none")
        self.engine, self.decoder, self.sampling = engine, decoder, sampling
        self.max_rows, self.partial, self.kv = max(1, max_rows), partial, kv
        self._cond = threading.Condition(threading.Lock())
        self._rows = RowDecoding(
            engine, decoder, sampling, slots, max_rows=self.max_rows, prefix_tokens=prefix_tokens, lock=self._cond
        )
        self.prefixes = self._rows.prefixes
        self._inbox: list[StreamRequest] = []
        self._cancels: set[int] = set()
        self._table = RequestTable()  # every request not yet forgotten, and the cancellers waiting for a cost
        self._post: _WeightPost | None = None
        self._pauses = 0
        self._parked = False
        self._serving = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.busy_seconds = 0.0
        self.weight_loads = 0

    @property
    def steps(self) -> int:
        """Decode steps run: progress for a stall watchdog."""
        return self._rows.steps

    @property
    def joins(self) -> int:
        """Requests taken in while other rows were decoding."""
        return self._rows.joins

    @property
    def generated_tokens(self) -> int:
        return self._rows.generated_tokens

    # -- any thread -------------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, on_done: StreamDone) -> int:
        """Queue ``request``; ``on_done`` gets its completions (or the error that failed it), from the serving
        thread. Returns the handle :meth:`cancel` and :meth:`progress` use."""
        with self._cond:
            entry = self._table.add(request, on_done, self.sampling.max_new_tokens)
            self._inbox.append(entry)
            self._cond.notify_all()
        return entry.handle

    def cancel(self, handle: int, on_dropped: StreamDropped | None = None) -> None:
        """Drop a request (its requester gave up): its rows leave their slots at the next token boundary. Then
        ``on_dropped(tokens, seconds)`` gets what it had cost (:meth:`cost`), exactly once, whatever comes first:
        its rows leaving their slots, the request finishing at that same boundary (it is answered too), a failure
        of the loop, or :meth:`close` (the cost so far); at once for a request already answered or unknown."""
        with self._cond:
            answered = self._table.answered.pop(handle, None)
            if handle in self._table.running and not self._closed:
                self._cancels.add(handle)
                self._table.wait_for_cost(handle, on_dropped)
                self._cond.notify_all()
                return
            cost = (answered.tokens, answered.seconds) if answered is not None else self._table.cost(handle)
        if on_dropped is not None:
            on_dropped(*cost)

    def cost(self, handle: int) -> tuple[int, float]:
        """What a request not yet forgotten cost so far: the tokens its rows hold and the stream's seconds
        attributed to it (every prefill, decode step and KV rebuild split evenly among the rows it ran)."""
        with self._cond:
            return self._table.cost(handle)

    def post_weights(self, load: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        """Have the serving thread run ``load`` (copy new weights into the engine) at a token boundary — at once
        with ``partial="continue"``, after the live rows finish with ``"off"`` — then call ``done``."""
        with self._cond:
            if self._post is not None:
                raise RuntimeError("a weight load is already pending; wait for its done callback before the next")
            closed = self._closed
            if not closed:
                self._post = _WeightPost(load, done)
                self._cond.notify_all()
        if closed:  # nobody will serve it
            done(RuntimeError("the generation stream was closed before the weights were loaded"))

    def forget(self, handle: int) -> None:
        """The requester has what an answered request generated: :meth:`progress` stops reporting it."""
        with self._cond:
            self._table.answered.pop(handle, None)

    def progress(self) -> dict[int, tuple[RowPrefix | None, ...]]:
        """Per request not yet forgotten (by handle): what each sample generated so far (None: nothing yet). An
        answered request stays here, every row finished, until :meth:`forget`: between the answer and its requester
        taking it in, a checkpoint still finds it."""
        with self._cond:
            return self._table.progress()

    def idle(self) -> bool:
        """Nothing to do: no request queued, waiting or decoding, no cancel or weight load pending, no token
        boundary being run (or the serving thread has died). A request still unanswered then is never answered."""
        with self._cond:
            if self._thread is not None and not self._thread.is_alive():
                return True
            return not self._serving and not self._work_locked()

    def pause(self) -> None:
        """Block until the serving thread is parked at a token boundary (or idle); it stays there until
        :meth:`resume`. Rows keep their slots."""
        with self._cond:
            self._pauses += 1
            self._cond.notify_all()
            while self._serving and not self._parked and not self._closed:
                self._cond.wait()

    def resume(self) -> None:
        with self._cond:
            self._pauses -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def generator_for_evaluation(self) -> PausingGenerator:
        """The engine, each call parking this stream first (:class:`~groupwise.generation.pausing.PausingGenerator`)."""
        return PausingGenerator(self.engine, self)

    def start(self, name: str) -> None:
        """Serve on a daemon thread of this name (never joined at exit: a stuck step cannot keep a run alive)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve_forever, name=name, daemon=True)
            self._thread.start()

    def close(self, timeout_s: float) -> bool:
        """Stop serving: requests still held get no answer (their requesters are gone); a cancelled one's
        ``on_dropped`` gets its cost so far. Waits up to ``timeout_s`` for a step in progress; True when the thread
        ended."""
        with self._cond:
            self._closed = True
            post, self._post = self._post, None
            dropped = self._table.take_cancellers()
            self._cond.notify_all()
        if post is not None:
            post.done(RuntimeError("the generation stream was closed before the weights were loaded"))
        call_dropped(dropped)
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            leave_running(thread)  # a step that does not return: the process exits without waiting for it
            return False
        return True

    # -- the serving thread -----------------------------------------------------------------------------------
    def run_until_idle(self, max_ticks: int | None = None) -> bool:
        """Run the loop in this thread (no thread of its own) until every submitted request is done, or for at most
        ``max_ticks`` token boundaries; returns whether work is left."""
        ticks = 0
        while self._has_work() and (max_ticks is None or ticks < max_ticks):
            self._guarded_tick()
            ticks += 1
        return self._has_work()

    def _serve_forever(self) -> None:
        while True:
            with self._cond:
                self._serving = False
                self._cond.notify_all()
                while not self._closed and (self._pauses or not self._work_locked()):
                    self._cond.wait()
                if self._closed:
                    self.prefixes.clear()  # here, not in close: only the serving thread touches the store
                    return
                self._serving = True
            self._park_if_paused()  # (not timed: a paused stream is not busy)
            self._guarded_tick()

    def _has_work(self) -> bool:
        with self._cond:
            return self._work_locked()

    def _work_locked(self) -> bool:
        return bool(self._inbox or self._cancels or self._post or self._rows.busy())

    def _park_if_paused(self) -> None:
        with self._cond:
            if not self._pauses:
                return
            self._parked = True
            self._cond.notify_all()
            while self._pauses and not self._closed:
                self._cond.wait()
            self._parked = False

    def _guarded_tick(self) -> None:
        start = time.perf_counter()
        try:
            self._tick()
        except BaseException as error:  # noqa: BLE001 — every request the loop holds gets the error
            self._fail_all(error)
            if not isinstance(error, Exception):
                raise
        finally:
            self.busy_seconds += time.perf_counter() - start

    def _tick(self) -> None:
        """One token boundary: mail, weights, admission, then one decode step of every live row."""
        with self._cond:
            new, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, set()
            post = self._post
        for entry in new:
            self._take_in(entry)
        for handle in cancels:
            self._drop(handle)
        if post is not None and (self.partial == "continue" or self._rows.slots.live == 0):
            self._apply_weights(post)
            post = None
        with torch.inference_mode():
            if post is None:  # a drain ("off" mode) takes nothing in until the weights are loaded
                self._finish(self._rows.admit())
            if self._rows.slots.live:
                self._finish(self._rows.step())

    def _take_in(self, entry: StreamRequest) -> None:
        if entry.unfinished == 0:
            self._resolve(entry)
            return
        self._rows.take_in(entry)

    def _drop(self, handle: int) -> None:
        with self._cond:
            dropped = self._table.take_cancellers([handle])
            entry = self._table.running.pop(handle, None)
        if entry is not None:
            self._rows.drop(entry)
        call_dropped(dropped)

    def _resolve(self, entry: StreamRequest) -> None:
        with self._cond:
            if self._table.running.get(entry.handle) is not entry:
                return  # dropped meanwhile
            dropped = self._table.take_cancellers([entry.handle])
            del self._table.running[entry.handle]
            if entry.handle not in self._cancels:  # a cancelled request's requester is gone: nobody forgets it
                self._table.answered[entry.handle] = entry
        try:
            result: list[Completion] | Exception = self._rows.rules.completions(entry)
        except Exception as error:  # noqa: BLE001 — packaging failed (the tokenizer): that request gets it
            result = error
        entry.on_done(result)
        call_dropped(dropped)  # cancelled while its last token was drawn: the canceller still gets the cost

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            dropped = self._table.take_cancellers(list(self._table.running))
            entries = list(self._table.running.values())
            self._table.running.clear()
            self._inbox, self._cancels = [], set()
            post, self._post = self._post, None
        self._rows.clear()
        if post is not None:
            post.done(error)
        call_dropped(dropped)  # cancelled before the failure: their requesters want the cost only
        for entry in entries:
            entry.on_done(error)

    # -- weights ----------------------------------------------------------------------------------------------
    def _apply_weights(self, post: _WeightPost) -> None:
        try:
            post.load()
            self.weight_loads += 1
            self._rows.weights_loaded(recompute=self.kv == "recompute")
        except BaseException as error:
            with self._cond:
                self._post = None
            post.done(error)
            raise
        with self._cond:
            self._post = None
        post.done(None)

    # -- finished rows ----------------------------------------------------------------------------------------
    def _finish(self, finished: Collection[StreamRow]) -> None:
        """Count finished rows against their requests; hand back every request whose rows are all done."""
        for row in finished:
            row.request.unfinished -= 1
        for entry in sorted({row.request for row in finished}, key=lambda e: e.handle):
            if entry.unfinished == 0:
                self._resolve(entry)
