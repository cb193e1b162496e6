"""Running a Python program in a separate, limited process: the parent's side of the sandbox.

:meth:`Sandbox.run` writes the code to a fresh temporary folder, starts :mod:`groupwise.sandbox.boot` in a session
of its own with a scrubbed environment (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``: no variable of the run, no key),
waits at most ``wall_s``, kills the whole process group (at the deadline, and after the program ended: whatever it
left running), reads back the head of its stdout, the tail of its stderr and its exception, and removes the folder.
What the child confines and limits is in :mod:`groupwise.sandbox.boot`; docs/environments.md says what is and is
not isolated.

The sandbox's own failures (its interpreter cannot start, ``unshare`` is refused while isolation is required, a
process cannot be forked) raise :class:`SandboxUnavailable`, an infrastructure error: never an answer to the model,
whose program's own failures (an exception, a limit) are reported in the :class:`SandboxRun`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from groupwise.episodes.tools import ToolInfrastructureError
from groupwise.sandbox import boot

Isolation = Literal["required", "preferred", "off"]
"""``required``: namespaces or no run (:class:`SandboxUnavailable`); ``preferred``: namespaces where the OS allows
them, else limits only; ``off``: limits only."""
MB = 1 << 20
#: Interpreters tried, after the run's own, when groupwise runs as root: the sandbox drops to ``nobody``, who may not
#: be able to run an interpreter installed under root's home (pyenv's, say).
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


class SandboxUnavailable(ToolInfrastructureError):
    """The sandbox itself failed (not the program in it): the episode fails, and is retried with a fresh
    environment under ``episode.retry_failed_episodes``."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. Memory, CPU and file size are per process; ``max_processes`` bounds how many."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 * MB
    max_processes: int = 8
    max_output_bytes: int = 1 * MB
    disk_bytes: int = 32 * MB
    max_open_files: int = 256

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_bytes", "max_processes", "max_output_bytes", "disk_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")
        if self.memory_bytes < 64 * MB:
            raise ValueError(
                f"sandbox limit memory_bytes must be ≥ 64 MB (an interpreter starts in about 30), got "
                f"{self.memory_bytes}"
            )


@dataclass(frozen=True)
class SandboxRun:
    """How one program ended: the head of its stdout, the tail of its stderr (each with its full size in bytes; at most
    ``read_bytes`` of each were read), its
    exception (``Type: message``), its exit status (negative: the signal that killed it; None: killed at the wall
    deadline), the CPU seconds it used (None at the deadline) and whether the sandbox isolated it."""

    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    read_bytes: int
    exception: str | None
    exit_code: int | None
    cpu_s: float | None
    timed_out: bool
    isolated: bool


@dataclass(frozen=True)
class _Files:
    """The parent's descriptors of one run's files (read back through them, never by path)."""

    code: int
    stdout: int
    stderr: int
    status: int
    exception: int

    def close(self) -> None:
        for fd in (self.code, self.stdout, self.stderr, self.status, self.exception):
            os.close(fd)


class Sandbox:
    """Runs programs with ``python`` (None: the run's interpreter, see :func:`sandbox_python`) under ``limits``."""

    def __init__(self, limits: SandboxLimits, isolation: Isolation = "required", python: str | None = None) -> None:
        self.limits, self.isolation = limits, isolation
        self.python = sandbox_python(python, isolation)

    def run(self, code: str, read_chars: int = 4000) -> SandboxRun:
        """Run ``code``; ``read_chars`` bytes of its stdout (the first) and stderr (the last) are read back."""
        return run_code(code, self.limits, self.python, self.isolation, read_chars)


def run_code(code: str, limits: SandboxLimits, python: str, isolation: Isolation, read_chars: int = 4000) -> SandboxRun:
    """``code`` run once in a fresh temporary folder, removed afterwards (see the module docstring)."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="groupwise-sandbox-"))
    except OSError as exc:  # a full or unwritable temporary directory: the sandbox's, not the program's
        raise SandboxUnavailable(f"the sandbox could not make its folder: {exc}") from exc
    try:
        return _run_in(folder, code, limits, python, isolation, read_chars)
    except OSError as exc:
        raise SandboxUnavailable(f"the sandbox failed: {exc}") from exc
    finally:
        shutil.rmtree(folder, onerror=_writable_then_again)


def _run_in(
    folder: Path, code: str, limits: SandboxLimits, python: str, isolation: Isolation, read_chars: int
) -> SandboxRun:
    work, root = folder / "work", folder / "root"
    for place in (work, root):
        place.mkdir(mode=0o700)
        if os.geteuid() == 0:  # the program runs as nobody: its folders are nobody's, the rest stays root's
            os.chown(place, boot.NOBODY, boot.NOBODY)
    folder.chmod(0o711)
    (folder / "code.py").write_text(code, encoding="utf-8", errors="replace")
    files = _Files(
        *(
            os.open(folder / name, os.O_RDONLY if name == "code.py" else os.O_RDWR | os.O_CREAT, 0o600)
            for name in ("code.py", "stdout", "stderr", "status", "exception")
        )
    )
    try:
        config = _boot_config(files, limits, isolation, work, root)
        timed_out = _started_and_ended(python, folder, files, config, limits.wall_s)
        return _outcome(files, timed_out, read_chars)
    finally:
        files.close()


def _boot_config(files: _Files, limits: SandboxLimits, isolation: Isolation, work: Path, root: Path) -> dict[str, Any]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"}
    numbers = {
        name: int(getattr(limits, name))
        for name in ("cpu_s", "memory_bytes", "max_processes", "max_output_bytes", "disk_bytes", "max_open_files")
    }
    return {
        "status_fd": files.status,
        "exception_fd": files.exception,
        "isolation": isolation,
        "work": work.name,  # relative to the boot's working directory, the run's folder
        "root": root.name,
        "limits": numbers,
        "env": env,
    }


def _started_and_ended(python: str, folder: Path, files: _Files, config: dict[str, Any], wall_s: float) -> bool:
    """Start the boot process in ``folder`` and wait for it at most ``wall_s``; its process group is killed either
    way, before it is reaped (so the group's id cannot have been reused). Whether the deadline passed."""
    try:
        process = subprocess.Popen(
            [python, "-I", "-B", boot.__file__, json.dumps(config)],
            stdin=files.code,
            stdout=files.stdout,
            stderr=files.stderr,
            pass_fds=(files.status, files.exception),
            env={"PATH": "/usr/bin:/bin"},
            cwd=folder,
            start_new_session=True,
        )
    except OSError as exc:  # no process could be made (EAGAIN, ENOMEM), or no such interpreter
        raise SandboxUnavailable(f"the sandbox could not start {python}: {exc}") from exc
    try:
        timed_out = not _exited(process.pid, wall_s)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # nothing left in the group
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return timed_out


def _exited(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` exited within ``timeout_s``, leaving it unreaped (a pidfd becomes readable when it exits;
    before Linux 5.3, polled)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        deadline = time.monotonic() + timeout_s
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True
    try:
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    finally:
        os.close(pidfd)


def _outcome(files: _Files, timed_out: bool, read_chars: int) -> SandboxRun:
    lines = [json.loads(line) for line in _read(files.status, 0, 1 << 16).splitlines() if line.strip()]
    errors = [line["error"] for line in lines if "error" in line]
    ready = next((line["ready"] for line in lines if "ready" in line), None)
    if errors or ready is None:
        why = errors[0] if errors else f"it did not start (stderr: {_tail(files.stderr, 500)!r})"
        raise SandboxUnavailable(f"the sandbox failed: {why}")
    ended: dict[str, Any] = next((line for line in lines if "exit" in line), {})
    exception = _read(files.exception, 0, 2000).strip() or None
    return SandboxRun(
        stdout=_read(files.stdout, 0, read_chars),
        stderr=_tail(files.stderr, read_chars),
        stdout_bytes=os.fstat(files.stdout).st_size,
        stderr_bytes=os.fstat(files.stderr).st_size,
        read_bytes=read_chars,
        exception=exception,
        exit_code=None if timed_out else ended.get("exit"),
        cpu_s=None if timed_out else ended.get("cpu_s"),
        timed_out=timed_out,
        isolated=bool(ready["isolated"]),
    )


def _read(fd: int, offset: int, size: int) -> str:
    return os.pread(fd, size, offset).decode("utf-8", errors="replace")


def _tail(fd: int, size: int) -> str:
    return _read(fd, max(0, os.fstat(fd).st_size - size), size)


def _writable_then_again(function: Any, path: str, _: Any) -> None:
    """rmtree's retry for what the program made unremovable (a folder it took its own permissions from)."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        function(path)


@functools.cache
def sandbox_python(python: str | None, isolation: Isolation) -> str:
    """The interpreter the sandbox runs: ``python``, or the run's own; as root, the first of the run's own and
    :data:`SYSTEM_PYTHONS` that ``nobody`` can run. Each is tried with a program that does nothing; none works:
    :class:`SandboxUnavailable` saying why each failed."""
    candidates = [python] if python is not None else [sys.executable]
    if python is None and os.geteuid() == 0:
        candidates += [p for p in SYSTEM_PYTHONS if os.path.exists(p)]
    failures = []
    for candidate in candidates:
        try:
            run = run_code("pass", SandboxLimits(wall_s=30.0), candidate, isolation)
        except SandboxUnavailable as exc:
            failures.append(f"{candidate}: {exc}")
            continue
        if run.exit_code == 0:
            return candidate
        failures.append(f"{candidate}: a program that does nothing ended with {run.exit_code}: {run.stderr[-300:]!r}")
    raise SandboxUnavailable("no interpreter can run the sandbox's programs: " + "; ".join(failures))
