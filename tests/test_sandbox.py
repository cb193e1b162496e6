"""The Python sandbox: model-written programs run in a separate process, within limits, and every attack is contained.

Invariants pinned:
- the ``python`` tool answers with the program's stdout (then its stderr), ``(no output)`` when it printed nothing;
  a program that raised, exited non-zero or was killed at a limit is an error the model reads (``error: the program
  raised ZeroDivisionError: …`` with its traceback), counted in ``tool_errors``; an answer is cut to
  ``max_answer_chars``, saying how many bytes there were;
- each attack is contained within its limit and leaves no process behind, and the next program runs as usual: an
  infinite loop (killed at its CPU time), a sleep (killed at its wall time, the whole process group), a memory bomb
  (``MemoryError`` at the address-space limit), a fork bomb (forks refused past ``max_processes``), 100 MB of output
  (stopped at ``max_output_bytes``: ``File too large``);
- with namespaces (``isolation: required``, where Linux lets an unprivileged process have them): no network (a
  connection to a port the parent listens on is refused), writes land only in the sandbox's own tmpfs (nothing
  appears outside; the system directories are read-only), the run's files and the parent's working directory are
  not there to read; without them (``isolation: off``) the program reaches the loopback and the files its user may
  read, as docs/environments.md says;
- the program sees no variable of the run's environment (a secret set in the parent is not there), starts in an
  empty folder, keeps nothing between calls, and its temporary folder is removed;
- the sandbox's own failure (an interpreter that cannot start) is a :class:`SandboxUnavailable` (an infrastructure
  error): never an answer the model reads, it fails the episode, classified ``infra``;
- ``python_sandbox`` is a built-in environment: its episodes call the tool, count the attacks as tool errors, go
  on, and score the final reply.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from test_episodes import TOKENIZER, game, settings

from groupwise.config.episode_schema import BUILTIN_ENVIRONMENTS
from groupwise.controller.failures import classify_failure
from groupwise.environments.python_sandbox import PythonSandboxEnvironment, python, python_tool
from groupwise.episodes.group import EpisodeError
from groupwise.episodes.lockstep import run_episode_groups
from groupwise.episodes.tools import ToolError, tool_problem
from groupwise.sandbox.process import MB, Sandbox, SandboxLimits, SandboxUnavailable
from groupwise.types import Completion, Prompt, SamplingParams

# A wall time far past the CPU time, so that the limit a test is about comes first on a loaded machine too
LIMITS = SandboxLimits(wall_s=30.0, cpu_s=1, memory_bytes=128 * MB, max_processes=4, max_output_bytes=1 * MB)
SHORT = dataclasses.replace(LIMITS, wall_s=4.0, cpu_s=10)  # for the wall time itself
SAMPLING = SamplingParams(max_new_tokens=400, temperature=1.0)
RUNNER_MARK = b'linecache.cache["<main.py>"]'  # in the command line of every program the sandbox runs


class TextTurns:
    """A generator (test only) whose turns write the given texts (the char tokenizer has no braces, so the text is
    set, and the tokens are "x<eos>")."""

    version = 0

    def __init__(self, *texts: str) -> None:
        self.texts = iter(texts)

    def generate(self, requests, sampling):
        ids = (*TOKENIZER.convert_tokens_to_ids(["x"]), TOKENIZER.eos_token_id)
        return [[Completion(ids, (-1.0, -1.0), next(self.texts), "stop", 0)] for _ in requests]


def call(code: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


def namespaces_here() -> bool:
    try:
        Sandbox(LIMITS, "required")
    except SandboxUnavailable:
        return False
    return True


needs_namespaces = pytest.mark.skipif(not namespaces_here(), reason="this OS refuses unprivileged namespaces")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS, "preferred")


def answer(sandbox: Sandbox, code: str, max_chars: int = 2000) -> str:
    """The tool's answer to ``code``; a failure's answer is its ToolError text, ``error: `` first."""
    try:
        return python_tool(sandbox, max_chars)(code)
    except ToolError as exc:
        return f"error: {exc}"


def sandbox_processes() -> list[int]:
    """Programs the sandbox started that are still alive (not zombies)."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if RUNNER_MARK in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive.append(int(pid))
        except OSError:
            continue
    return alive


def assert_nothing_left() -> None:
    deadline = time.monotonic() + 2.0
    while sandbox_processes() and time.monotonic() < deadline:  # killed processes are reaped by their init
        time.sleep(0.05)
    assert sandbox_processes() == []


def test_the_answer_is_what_the_program_printed_and_a_failure_is_an_error_with_its_traceback(sandbox):
    assert answer(sandbox, "print(17 * 23)") == "391\n"
    assert answer(sandbox, "x = 1") == "(no output)"
    assert answer(sandbox, "import sys\nprint('out')\nprint('warn', file=sys.stderr)") == "out\nstderr:\nwarn\n"
    failed = answer(sandbox, "print('before')\n1 / 0")
    assert failed.startswith("error: the program raised ZeroDivisionError: division by zero\nbefore\nstderr:\n")
    assert 'File "<main.py>", line 2, in <module>\n    1 / 0\n' in failed  # the source line, for the model to read
    assert failed.endswith("ZeroDivisionError: division by zero\n")
    assert answer(sandbox, "raise SystemExit(3)") == "error: the program exited with status 3"
    assert answer(sandbox, "def f(:\n    pass").startswith("error: the program raised SyntaxError: invalid syntax")
    long = answer(sandbox, "print('a' * 5000)", max_chars=300)
    assert len(long) == 300 and long.endswith("…[5001 bytes in all]") and long.startswith("a" * 250)


def test_an_infinite_loop_is_killed_at_its_cpu_time_and_the_next_program_runs(sandbox):
    started = time.monotonic()
    assert answer(sandbox, "while True:\n    pass") == "error: the program used its 1 s of CPU time and was killed"
    assert time.monotonic() - started < LIMITS.wall_s
    assert_nothing_left()
    assert answer(sandbox, "print('still here')") == "still here\n"


def test_a_program_past_its_wall_time_is_killed_with_its_whole_process_group():
    short = Sandbox(SHORT, "preferred")
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(8)\nprint('waiting')\ntime.sleep(60)"
    started = time.monotonic()
    assert answer(short, code) == "error: the program ran past its time limit of 4 s and was killed\nwaiting\n"
    assert time.monotonic() - started < SHORT.wall_s + 2.0
    if short.run("pass").isolated:  # a child that left the process group dies with the PID namespace
        assert_nothing_left()


def test_a_memory_bomb_ends_in_a_memory_error_at_the_address_space_limit(sandbox):
    bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"
    assert answer(sandbox, bomb).startswith("error: the program raised MemoryError\nstderr:\nTraceback")
    assert answer(sandbox, "x = bytearray(10**10)").startswith("error: the program raised MemoryError")
    assert_nothing_left()


def test_a_fork_bomb_gets_no_more_than_max_processes(sandbox):
    counted = "import os, time\nmade = 0\nfor _ in range(20):\n    try:\n        pid = os.fork()\n"
    counted += "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(2)\n        os._exit(0)\n"
    counted += "    made += 1\nprint(made)"
    made = int(answer(sandbox, counted))
    assert 1 <= made <= LIMITS.max_processes - 1  # the program itself is one of them
    started = time.monotonic()
    bomb = answer(
        Sandbox(SHORT, "preferred"),
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    )
    assert bomb.startswith("error: the program") and time.monotonic() - started < SHORT.wall_s + 2.0
    assert_nothing_left()
    assert answer(sandbox, "print(6 * 7)") == "42\n"


def test_100_mb_of_output_stops_at_the_output_limit_and_the_answer_is_cut(sandbox):
    started = time.monotonic()
    flood = answer(sandbox, "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)")
    assert flood.startswith("error: the program raised OSError: [Errno 27] File too large\nxxx")
    assert f"…[{LIMITS.max_output_bytes} bytes in all]" in flood and len(flood) <= 2000
    assert time.monotonic() - started < 10.0  # the output limit stopped it, not the wall time
    printed = answer(sandbox, "while True:\n    print('y' * 1000)")
    assert printed.startswith("error: the program raised OSError: [Errno 27] File too large\nyyy")
    assert_nothing_left()


@pytest.fixture
def listener():
    """A port the test listens on, and the connections it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test, nothing having connected
            accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


CONNECT = (
    "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
)
CONNECT += "except OSError as exc:\n    print('refused:', exc)"


@needs_namespaces
def test_with_namespaces_a_program_has_no_network(listener):
    port, accepted = listener
    isolated = Sandbox(LIMITS, "required")
    assert answer(isolated, CONNECT.format(port=port)) == "refused: [Errno 101] Network is unreachable\n"
    time.sleep(0.2)
    assert accepted == []


@needs_namespaces
def test_with_namespaces_writes_stay_in_the_sandbox_and_the_runs_files_are_not_there(tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("secret: 1\n")
    monkeypatch.chdir(run_dir)
    probe = tmp_path / "escaped"
    outside = f"/tmp/groupwise-sandbox-escape-{os.getpid()}"
    code = "import os\n"
    for path in (probe, outside, "/usr/escaped", "../escaped", "/work/kept"):
        code += f"try:\n    open({str(path)!r}, 'w').write('x')\n    print('wrote', {str(path)!r})\n"
        code += f"except OSError as exc:\n    print('no', {str(path)!r}, exc.strerror)\n"
    for path in (run_dir / "config.yaml", Path.cwd() / "config.yaml", Path(__file__)):
        code += f"print('read' if os.path.exists({str(path)!r}) else 'absent', {path.name!r})\n"
    isolated = Sandbox(LIMITS, "required")
    assert answer(isolated, code).splitlines() == [
        f"no {probe} No such file or directory",
        f"wrote {outside}",  # the sandbox's own /tmp
        "no /usr/escaped Read-only file system",
        "wrote ../escaped",  # the sandbox's own root
        "wrote /work/kept",
        "absent config.yaml",
        "absent config.yaml",
        "absent test_sandbox.py",
    ]
    assert not probe.exists() and not Path(outside).exists() and not Path("/usr/escaped").exists()
    assert answer(isolated, "import os\nprint(os.listdir('.'))") == "[]\n"  # nothing kept from the last program


def test_without_namespaces_the_program_reaches_the_loopback_and_readable_files(listener):
    port, accepted = listener
    limited = Sandbox(LIMITS, "off")
    assert answer(limited, CONNECT.format(port=port)) == "connected\n"
    first_line = Path(__file__).read_text().splitlines()[0]
    assert answer(limited, f"print(open({__file__!r}).readline(), end='')") == first_line + "\n"
    assert answer(limited, "import os\nprint(os.getcwd().endswith('/work'), os.listdir('.'))") == "True []\n"


def test_the_program_sees_no_variable_of_the_run_and_its_folder_is_removed(sandbox, monkeypatch, tmp_path):
    monkeypatch.setenv("GROUPWISE_TEST_SECRET", "s3cret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    shown = answer(sandbox, "import os\nprint(sorted(os.environ))\nopen('left', 'w').write('x')")
    assert shown == "['HOME', 'LANG', 'PATH', 'TMPDIR']\n"
    assert list(tmp_path.iterdir()) == []


def test_a_sandbox_that_cannot_start_fails_the_episode_as_an_infrastructure_error(tmp_path):
    with pytest.raises(SandboxUnavailable, match="no interpreter can run the sandbox's programs: /nonexistent/python"):
        Sandbox(LIMITS, "preferred", python="/nonexistent/python")

    class Broken(PythonSandboxEnvironment):
        """The sandbox environment whose interpreter disappears after it was made (test only)."""

        def __init__(self) -> None:
            super().__init__(wall_s=30, cpu_s=1, isolation="preferred")
            self.sandbox.python = str(tmp_path / "gone")

    generator = TextTurns(call("print(1)"))
    [outcome] = run_episode_groups(
        generator,
        SAMPLING,
        settings(factory=Broken, timeout_s=60.0, max_turn_tokens=80, max_tokens=400),
        [game("p", 1)],
        [1],
        1,
    )
    assert isinstance(outcome, EpisodeError) and classify_failure(outcome) == "infra"
    assert "failed in step() (prompt 'p', sample 0): SandboxUnavailable: the sandbox could not start" in str(outcome)


def test_the_built_in_environment_runs_the_tool_counts_attacks_as_tool_errors_and_goes_on():
    assert BUILTIN_ENVIRONMENTS["python_sandbox"].endswith(":PythonSandboxEnvironment")
    assert tool_problem(python) is None
    generator = TextTurns(
        call("print(17 * 23)") + call("while True:\n    pass") + call("x = bytearray(10**10)"), "It is 391."
    )
    env_settings = settings(
        factory=lambda: PythonSandboxEnvironment(wall_s=30, cpu_s=1, memory_mb=128, isolation="preferred"),
        timeout_s=60.0,
        max_turn_tokens=400,
        max_tokens=2000,
        max_observation_tokens=1500,
    )
    [episodes] = run_episode_groups(generator, SAMPLING, env_settings, [Prompt("p", "391", "What is 17 * 23?")], [1], 1)
    assert not isinstance(episodes, Exception), episodes
    [episode] = episodes
    answers = [m["content"] for m in episode.observations[0]]
    assert answers[0] == "391\n"
    assert answers[1] == "error: the program used its 1 s of CPU time and was killed"
    assert answers[2].startswith("error: the program raised MemoryError")
    assert (episode.tool_calls, episode.tool_errors, episode.step_rewards) == (3, 2, [0.0, 1.0])
