"""Pauses of a serving vLLM engine: evaluation's, and the weight loads made inside one.

The vLLM stream (:mod:`groupwise.generation.vllm.stream`) shares one ``AsyncLLM`` between rollouts, weight loads and
evaluation. Whoever needs the engine still holds a pause: vLLM's ``keep`` mode freezes the running requests in the
engine with their KV cache, ``wait`` lets them finish first. The first holder pauses the engine, the last one out
resumes it, and the busy clock (:class:`~groupwise.generation.vllm.stream_rows.BusyClock`) stops meanwhile.

* **A weight load** pauses (``keep``), pushes the state dict (CUDA IPC, or on CPU a folder the workers reload from:
  :mod:`groupwise.generation.vllm.weights`) and sets the version vLLM stamps on every token sampled after it.
* **A weight post** (a runtime's load at a token boundary) pauses ``keep`` with partial rollouts — the rows go on
  under the new weights with the KV cache of the old — or drains (``wait``) without, so no row spans versions; it
  runs the poster's load on a worker thread and answers the poster exactly once (its end and a close may both try).

The coroutines run on the stream's loop thread; the engine is passed to each (the stream drops it at shutdown).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from groupwise.generation.vllm.stream_rows import BusyClock
from groupwise.generation.vllm.weights import DiskReload, IpcTransfer

PostDone = Callable[[BaseException | None], None]


class EnginePauses:
    """The pause holders of one engine, its weight version and its weight loads (see the module docstring).

    ``lock`` is the stream's: the pending post's callback is read and taken under it."""

    def __init__(
        self, lock: threading.Lock, clock: BusyClock, version: int, weights_dir: str | None, ipc: IpcTransfer | None
    ) -> None:
        self.version = version
        self.weight_loads = 0
        self._lock, self._clock, self._ipc = lock, clock, ipc
        self._holders = 0  # touched on the loop thread only
        self._unpaused = asyncio.Event()  # (used on the loop only)
        self._unpaused.set()
        self.post_done: PostDone | None = None  # the pending weight post's callback
        folder = weights_dir or tempfile.mkdtemp(prefix="groupwise-vllm-weights-")
        self._own_dir = None if weights_dir else folder  # removed at close
        self._disk = DiskReload(folder)

    async def pause(self, engine: Any, mode: str) -> None:  # Any: a vLLM AsyncLLM (vllm: optional, lazy)
        self._holders += 1
        self._unpaused.clear()
        if self._holders == 1:
            await engine.pause_generation(mode=mode, clear_cache=False)
            for _ in range(4):  # let the rows take in what the engine sent before it paused (progress, stamps)
                await asyncio.sleep(0)
            self._clock.tick()
            self._clock.paused = True

    async def resume(self, engine: Any) -> None:
        self._holders -= 1
        if self._holders == 0:
            self._clock.tick()
            self._clock.paused = False
            await engine.resume_generation()
            self._unpaused.set()

    async def load(self, engine: Any, state: Mapping[str, Tensor], version: int) -> None:
        """Push ``state`` into the paused engine and set the version it stamps."""
        await self.pause(engine, "keep")
        try:
            if self._ipc is not None:
                await asyncio.to_thread(self._ipc.push_blocking, state)
            else:
                await self._disk.push(engine, state)
            await engine.update_weight_version(str(version))
            self.version = version
        finally:
            await self.resume(engine)

    def take_post(self, done: PostDone) -> None:
        """(Any thread.) Hold ``done`` as the pending post's callback; one post at a time."""
        with self._lock:
            if self.post_done is not None:
                raise RuntimeError("a weight load is already pending; wait for its done callback before the next")
            self.post_done = done

    async def post(self, engine: Any, load: Callable[[], None], partial: str) -> None:
        """Run a posted ``load`` inside a pause (``keep`` with ``partial="continue"``, a drain with ``"off"``)."""
        error: BaseException | None = None
        if partial == "off":  # a drain needs generation running: wait out a pause someone else holds
            await self._unpaused.wait()
        await self.pause(engine, "keep" if partial == "continue" else "wait")
        try:
            await asyncio.to_thread(load)
            self.weight_loads += 1
        except BaseException as failure:  # noqa: BLE001 — the poster gets the error
            error = failure
        finally:
            await self.resume(engine)
        self.answer_post(error)

    def answer_post(self, error: BaseException | None) -> None:
        """Answer the pending weight post once (its end and a close may both try)."""
        with self._lock:
            done, self.post_done = self.post_done, None
        if done is not None:
            done(error)

    def remove_folder(self) -> None:
        """Remove the reload folder this made itself (one passed in stays)."""
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
