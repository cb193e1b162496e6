"""Threads left running a call that never returned, and the process exit that does not wait for them.

A run that stops on a stall (``runtime.stall_timeout_s``), and a reward call past ``reward.timeout_s``, leave the
stuck call on its daemon thread: Python cannot stop a thread. At interpreter teardown such a thread, still in
native code (a torch kernel, say), is torn down by ``pthread_exit``, whose forced unwinding through C++ code ends
the process in ``std::terminate`` (SIGABRT, exit 134: "terminate called without an active exception") after the
run had already reported its error. So whoever leaves a thread behind names it here (:func:`leave_running`), and
the ``groupwise`` process ends with :func:`exit_process`: when such a thread is still alive it flushes the output
and leaves with ``os._exit`` (no teardown to crash in), else with ``sys.exit``. Only the console script calls
it; an in-process :func:`groupwise.cli.main.main` (the tests) just returns its exit code.

The teardown itself is bounded too: joining the threads a library left behind and its exit handlers (an inference
engine's shutdown, a compile worker pool) took minutes on a machine whose every process got a few percent of a
core. A daemon watchdog ends the process with the same code ``GROUPWISE_EXIT_GRACE_S`` seconds (default 10) after
the command's last line, whatever the teardown is still doing; the command's own work (checkpoints, metrics, the
engines' shutdown) is done by then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import NoReturn

_left_running: list[threading.Thread] = []
_lock = threading.Lock()


def leave_running(thread: threading.Thread) -> None:
    """``thread`` keeps running a call nobody waits for any more; the process must not wait for it at exit."""
    with _lock:
        _left_running.append(thread)


def still_running() -> list[threading.Thread]:
    """The threads left running that have not ended yet."""
    with _lock:
        _left_running[:] = [thread for thread in _left_running if thread.is_alive()]
        return list(_left_running)


EXIT_GRACE_ENV = "GROUPWISE_EXIT_GRACE_S"
DEFAULT_EXIT_GRACE_S = 10.0


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``: without interpreter teardown while a thread left running is still alive,
    and within the exit grace whatever the teardown does."""
    if still_running():
        _hard_exit(code)
    try:
        grace = float(os.environ.get(EXIT_GRACE_ENV, DEFAULT_EXIT_GRACE_S))
    except ValueError:  # a malformed setting must not turn a finished command into a traceback
        grace = DEFAULT_EXIT_GRACE_S
    threading.Thread(target=_exit_after, args=(grace, code), name="groupwise-exit-watchdog", daemon=True).start()
    sys.exit(code)


def _exit_after(grace_s: float, code: int) -> None:
    time.sleep(grace_s)
    _hard_exit(code)


def _hard_exit(code: int) -> NoReturn:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more to say on it
            stream.flush()
    os._exit(code)
