"""The sandbox's first process: it confines itself, then starts the model's program and reports how it ended.

groupwise runs this file as a script with the sandbox's interpreter (``python -I -B boot.py CONFIG``), in a session
of its own, with the program's streams (stdin: the code; stdout and stderr: files the parent reads back). It imports
only the standard library: the interpreter may not be the run's. In order:

1. **Drop root.** As uid 0 it becomes ``nobody`` (65534): model code never runs as root, and Linux does not count
   root's processes against ``RLIMIT_NPROC``.
2. **Take what an unprivileged process may take** (``unshare``): a user namespace with a network namespace (one
   loopback interface, down: no network), a PID namespace (the program is its init: when the program ends, or this
   process dies, the kernel kills every process in it), an IPC namespace, and a mount namespace whose root is a
   fresh tmpfs of ``disk_bytes`` holding read-only binds of the system's program directories and the interpreter's
   prefix, ``/dev/{null,zero,random,urandom}``, ``/work`` (the working directory) and ``/tmp``. The run's files,
   the parent's working directory and the home directories are not in it. Process counts are per user namespace, so
   ``RLIMIT_NPROC`` bounds this sandbox alone. Where ``unshare`` is refused (a container's seccomp profile, a
   sysctl) and the isolation is ``preferred``, it goes on without: the program runs in ``work`` with the limits.
3. **Set the limits**: ``RLIMIT_AS``, ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, no
   core files, and ``no_new_privs`` (no set-user-ID program can raise its privileges).
4. **Report and run**: one JSON line on the status descriptor (``{"ready": {...}}``, or ``{"error": ...}`` and exit
   125), then the program (``python -I -B -u -c RUNNER``, forked with a parent-death signal), its exit status and
   CPU seconds as a second line (``{"exit": code, "cpu_s": seconds}``, a negative code for a signal).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
NOBODY = 65534
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")
DEVICES = ("null", "zero", "random", "urandom")
# statvfs flags a read-only remount must keep (a user namespace may not clear them) and their mount flags
KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)

# The program: its source from stdin, run as __main__; an exception's one-line summary goes to descriptor 3 (the
# program's, not a forked child's) and its traceback to stderr (source lines included), even when stderr is full.
RUNNER = r"""
import linecache, os, sys, traceback
code, program = sys.stdin.read(), os.getpid()
sys.stdin = open(os.devnull)
linecache.cache["<main.py>"] = (len(code), None, code.splitlines(True), "<main.py>")
try:
    exec(compile(code, "<main.py>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as exc:
    if os.getpid() == program:  # not a process the program forked
        try:
            message = str(exc)
        except BaseException:
            message = ""
        summary = type(exc).__name__ + (": " + message if message else "")
        os.write(3, summary.encode("utf-8", "replace")[:2000])
    try:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    finally:
        os._exit(1)
"""

_libc = ctypes.CDLL(None, use_errno=True)


def _checked(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: text.encode() if text is not None else None  # noqa: E731
    _checked(_libc.mount(encode(source), encode(target), encode(kind), flags, encode(data)), f"mount {target}")


def drop_root() -> None:
    """As uid 0, become ``nobody`` with no supplementary groups (and dumpable again, so that its own
    ``/proc/self`` files, the namespace maps, stay writable)."""
    if os.geteuid() != 0:
        return
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    _checked(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def enter_namespaces() -> str | None:
    """Enter new user, PID, network, IPC and mount namespaces, keeping the uid and gid; why not, or None."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS
    try:
        _checked(_libc.unshare(flags), "unshare")
    except (OSError, AttributeError) as exc:  # refused here (seccomp, a sysctl), or not Linux
        return str(exc)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)
    return None


def build_root(root: str, disk_bytes: int) -> None:
    """Make ``root`` (a folder in the working directory: no path above it is looked up again, so it needs no
    permission there) a tmpfs of ``disk_bytes`` with the interpreter's files bound read-only, chroot into it and go to
    ``/work``."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},nr_inodes=4096,mode=755")
    os.chdir(root)
    bound: list[str] = []
    for path in (*SYSTEM_PATHS, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        if os.path.islink(path) and os.path.dirname(path) == "/":  # a merged /usr: /lib -> usr/lib
            os.symlink(os.readlink(path), "." + path)
            continue
        real = os.path.realpath(path)
        if os.path.exists(real) and not any(real == b or real.startswith(b + "/") for b in bound):
            _bind_read_only(real, "." + real)
            bound.append(real)
    os.makedirs("dev")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            _bind_read_only("/dev/" + name, "dev/" + name, read_only=False)
    for name in ("work", "tmp"):
        os.mkdir(name, 0o700)
    os.chroot(".")
    os.chdir("/work")


def _bind_read_only(source: str, target: str, read_only: bool = True) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        kept = os.statvfs(target).f_flag
        flags = sum(mount_flag for stat_flag, mount_flag in KEPT_FLAGS if kept & stat_flag)
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def set_limits(limits: dict[str, int], isolated: bool) -> None:
    """The resource limits of this process and everything it starts (hard limits: they cannot be raised again).
    Isolated, process counts are this user namespace's; otherwise they are the user's, so the limit adds the
    tasks the user runs now."""
    processes = limits["max_processes"] + 1  # this process too
    if not isolated:
        processes += _tasks_of(os.getuid())
    for name, value in (
        ("RLIMIT_CORE", 0),
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["max_output_bytes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_NPROC", processes),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))  # SIGXCPU, then SIGKILL
    _checked(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def _tasks_of(uid: int) -> int:
    """The tasks (threads included: what RLIMIT_NPROC counts) of ``uid`` now."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as file:
                fields = dict(line.split(":", 1) for line in file if ":" in line)
        except OSError:  # it ended meanwhile
            continue
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


def run_program(env: dict[str, str], status: int, exception: int) -> tuple[int, float]:
    """Fork the program (its parent-death signal SIGKILL; ``exception`` its descriptor 3; unbuffered output, so that
    what it printed before a kill is kept) and wait for it: its exit status (negative: a signal) and the CPU seconds
    it used."""
    python = os.path.realpath(sys.executable)
    pid = os.fork()
    if pid == 0:
        try:
            _checked(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
            os.dup2(exception, 3)
            os.execve(python, [python, "-I", "-B", "-u", "-c", RUNNER], env)
        except BaseException as exc:  # noqa: BLE001 — reported to the parent, never raised in a fork
            os.write(status, (json.dumps({"error": f"could not start {python}: {exc}"}) + "\n").encode())
            os._exit(127)
    _, wait_status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(wait_status), usage.ru_utime + usage.ru_stime


def _moved(fd: int) -> int:
    """``fd`` moved to a number of 10 or more, closed on exec: descriptor 3 is the program's."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def main() -> None:
    config = json.loads(sys.argv[1])
    status, exception = _moved(config["status_fd"]), _moved(config["exception_fd"])
    try:
        drop_root()
        why = enter_namespaces() if config["isolation"] != "off" else "isolation: off"
        if why is not None and config["isolation"] == "required":
            raise OSError(f"the sandbox cannot isolate its program here ({why}); see docs/environments.md")
        if why is None:
            build_root(config["root"], config["limits"]["disk_bytes"])
            config["env"].update(HOME="/work", TMPDIR="/tmp")
        else:
            os.chdir(config["work"])
        set_limits(config["limits"], isolated=why is None)
    except Exception as exc:  # noqa: BLE001 — the sandbox's own failure: reported, never the program's
        os.write(status, (json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
        os._exit(125)
    ready = {"isolated": why is None, "why_not": why, "uid": os.getuid()}
    os.write(status, (json.dumps({"ready": ready}) + "\n").encode())
    code, cpu_s = run_program(config["env"], status, exception)
    os.write(status, (json.dumps({"exit": code, "cpu_s": cpu_s}) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
