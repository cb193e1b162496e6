"""A line when a slow phase of a command starts and one when it ends, so that minutes of loading or evaluating
never look like a hang, with or without a terminal.

Phases are what takes long outside the optimizer steps: loading the model (dequantising a GGUF file the first
time) and each held-out evaluation. The lines go to stderr, flushed at once (stdout keeps what a command
produces: progress lines, summaries, tables and ``--json`` output), and, when an events writer is given, to the
run's ``events.log`` too::

    loading the model (gguf smollm2) ...
      dequantising SmolLM2-135M-Instruct.Q4_1.gguf once; the float copy is cached in ~/.cache/groupwise/gguf/...
    loading the model: done in 41.2 s
    evaluating 100 held-out prompts at step 0 ...
    evaluating 100 held-out prompts at step 0: done in 2:31 (eval/accuracy=0.0300)

A phase that raises prints ``<phase>: failed after <time>`` and lets the error go on.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Echo = Callable[[str], None]


def print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def format_duration(seconds: float) -> str:
    """``12.3 s`` under a minute, else ``M:SS`` (``H:MM:SS`` from an hour on)."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    total = int(round(seconds))
    hours, minutes, secs = total // 3600, total % 3600 // 60, total % 60
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class Phase:
    """A phase in progress; set ``outcome`` to say what it found (shown on its end line)."""

    what: str
    outcome: str = ""


class PhaseLog:
    """Prints (``echo``, stderr by default) and records (``events``, e.g. ``MetricsWriter.event``) phase lines."""

    def __init__(self, echo: Echo = print_to_stderr, events: Echo | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.echo = echo
        self.events = events
        self.clock = clock

    def line(self, text: str) -> None:
        self.echo(text)
        if self.events is not None:
            self.events(text.strip())

    def note(self, text: str) -> None:
        """A line inside the current phase (indented)."""
        self.line(f"  {text}")

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[Phase]:
        started = self.clock()
        current = Phase(what)
        self.line(f"{what} ...")
        try:
            yield current
        except BaseException:
            self.line(f"{what}: failed after {format_duration(self.clock() - started)}")
            raise
        outcome = f" ({current.outcome})" if current.outcome else ""
        self.line(f"{what}: done in {format_duration(self.clock() - started)}{outcome}")
