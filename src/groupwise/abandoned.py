"""Threads left running a call that never returned, and the process exit that does not wait for them.

A run that stops on a stall (``runtime.stall_timeout_s``), and a reward call past ``reward.timeout_s``, leave the
stuck call on its daemon thread: Python cannot stop a thread. At interpreter teardown such a thread, still in
native code (a torch kernel, say), is torn down by ``pthread_exit``, whose forced unwinding through C++ code ends
the process in ``std::terminate`` (SIGABRT, exit 134: "terminate called without an active exception") after the
run had already reported its error. So whoever leaves a thread behind names it here (:func:`leave_running`), and
the ``groupwise`` process ends with :func:`exit_process`: when such a thread is still alive it flushes the output
and leaves with ``os._exit`` (no teardown to crash in), else with ``sys.exit``. Only the console script calls
it; an in-process :func:`groupwise.cli.main.main` (the tests) just returns its exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
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


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``; without interpreter teardown while a thread left running is still alive."""
    if still_running():
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more to say on it
                stream.flush()
        os._exit(code)
    sys.exit(code)
