"""A child process that ends with its parent: the learner ranks must not outlive a driver that was killed.

A rank (:mod:`groupwise.runtime.learner_ranks`) notices a driver that exited only when it next reads its pipe;
one in the middle of a command — a long step, or a collective whose peer never got the command because the driver
died between its two sends — goes on for as long as that takes (up to ``learner.collective_timeout_s``), as an
orphan holding memory, cores and a GPU. :func:`exit_with_parent` starts a daemon thread that waits on the parent's
sentinel (the pipe ``multiprocessing`` keeps open in the parent; the kernel closes it when the parent dies, however
it dies) and ends the process with ``os._exit`` at once.

Why not ``prctl(PR_SET_PDEATHSIG)``: Linux sends that signal when the *thread* that started the child exits, not
the process, so a driver that built its ranks on a worker thread would lose them when that thread ended; and it
is Linux-only. The sentinel is the process's own lifetime, on every platform ``multiprocessing`` supports.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading

PARENT_GONE_EXIT_CODE = 1


def exit_with_parent() -> bool:
    """In a process ``multiprocessing`` started: end it within moments of its parent's death. False when this
    process has no ``multiprocessing`` parent (nothing to watch)."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return False
    watch = threading.Thread(target=_exit_when_ready, args=(parent.sentinel,), name="groupwise-parent-watch",
                             daemon=True)  # fmt: skip
    watch.start()
    return True


def _exit_when_ready(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])  # ready (EOF) once the parent is gone
    os._exit(PARENT_GONE_EXIT_CODE)
