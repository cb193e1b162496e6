"""The run directory ``<output_dir>/<name>/`` and the path of every artifact a run writes.

One place names every file so the trainer, the checkpointer, the report and the tests agree::

    config.yaml              resolved config (rewritten on resume; a changed one is kept beside it)
    metrics.jsonl            one JSON object per optimizer step        (groupwise.run.metrics)
    events.log               timestamped human-readable events         (groupwise.run.metrics)
    train_data/step_<N>.jsonl  one line per trained row of step N
    fates.jsonl              the fate of every dispatched prompt attempt
    checkpoints/step_<N>/    atomic checkpoints                        (groupwise.run.checkpoint)
    tensorboard/             TensorBoard event files
    final/                   the trained policy in Hugging Face format
    report.md, plots/        written by ``groupwise report`` / ``groupwise compare``
    sim/summary.json         written by ``groupwise simulate``

Nothing inside a run directory may be a symbolic link (:func:`linked_entries`; a start on a directory holding one
is refused, and every run file is opened without following one): a run writes only inside its directory. The run
directory itself, and the directories above it, may be links; they are followed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from groupwise.config.issues import ConfigIssue
from groupwise.config.sections import run_name_problem
from groupwise.run.journal import write_run_file

CONFIG_FILE = "config.yaml"
_TRAIN_DATA_FILE = re.compile(r"^step_(\d+)\.jsonl$")


class RunDirError(ValueError):
    """The run directory cannot be started: its name, an existing non-empty directory, an unwritable parent."""


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory. Constructing it touches nothing; use :meth:`create` to start a run."""

    root: Path
    resumed: bool = False

    @classmethod
    def create(cls, output_dir: str | Path, name: str | None, config_yaml: str, resume: bool) -> RunDir:
        """Make ``<output_dir>/<name>/`` (``name`` None → ``YYYYmmdd-HHMMSS``) and write ``config.yaml``.

        An existing non-empty run directory is refused unless ``resume`` is set, so a second run with
        the same name never mixes its metrics or checkpoints into the first one. With ``resume`` on a
        missing or empty directory the run simply starts fresh (``resumed`` is False), which lets a
        preemptible job always pass ``--resume``. When a resumed run's config differs from the stored
        one, the old file is kept as ``config.<timestamp>.yaml`` so the change stays auditable.
        Every refusal is checked by :func:`start_problems` first, so nothing is created when one applies.
        """
        problems = start_problems(output_dir, name, resume)
        if problems:
            raise RunDirError("; ".join(f"{issue.rule}: {issue.fix}" for issue in problems))
        root = Path(output_dir) / name if name is not None else _fresh_timestamp_dir(Path(output_dir))
        has_content = root.is_dir() and any(root.iterdir())
        root.mkdir(parents=True, exist_ok=True)
        run_dir = cls(root=root, resumed=has_content)
        run_dir._write_config(config_yaml)
        return run_dir

    def discard_if_new(self) -> None:
        """Delete the directory when this start made it (``resumed`` False): a start that failed after
        :meth:`create` must not leave a directory that looks like a run to ``--resume``."""
        if not self.resumed:
            shutil.rmtree(self.root, ignore_errors=True)

    def _write_config(self, config_yaml: str) -> None:
        path = self.config_path
        if path.exists() and path.read_text(encoding="utf-8") != config_yaml:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path.rename(self.root / f"config.{stamp}.yaml")
        write_text_atomic(path, config_yaml)

    @classmethod
    def of(cls, run_dir: RunDir | str | Path) -> RunDir:
        """``run_dir`` itself, or a RunDir over an existing directory path."""
        return run_dir if isinstance(run_dir, RunDir) else cls(root=Path(run_dir))

    # --- paths -------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The run directory itself (same as ``root``)."""
        return self.root

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def events_path(self) -> Path:
        return self.root / "events.log"

    @property
    def train_data_dir(self) -> Path:
        return self.root / "train_data"

    def train_data_path(self, step: int) -> Path:
        return self.train_data_dir / f"step_{_check_step(step)}.jsonl"

    def train_data_files(self) -> list[tuple[int, Path]]:
        """Every ``train_data/step_<N>.jsonl`` as ``(N, path)``, ascending by N (other names are ignored)."""
        if not self.train_data_dir.is_dir():
            return []
        found = [(int(m.group(1)), path) for path in self.train_data_dir.iterdir()
                 if (m := _TRAIN_DATA_FILE.match(path.name))]  # fmt: skip
        return sorted(found)

    @property
    def fates_path(self) -> Path:
        return self.root / "fates.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{_check_step(step)}"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def final_dir(self) -> Path:
        return self.root / "final"

    @property
    def report_path(self) -> Path:
        return self.root / "report.md"

    @property
    def plots_dir(self) -> Path:
        return self.root / "plots"

    @property
    def sim_summary_path(self) -> Path:
        return self.root / "sim" / "summary.json"

    @property
    def is_simulation(self) -> bool:
        """Written by ``groupwise simulate`` (it creates ``sim/`` first): its prompts are the simulator's."""
        return self.sim_summary_path.parent.is_dir()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, then ``os.replace`` it: readers see the old or new file, never half.
    Neither step follows a symbolic link (a link at ``path`` is replaced, not written through)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_run_file(tmp, text.encode("utf-8"))
    os.replace(tmp, path)


def linked_entries(root: Path) -> list[Path]:
    """Every symbolic link inside ``root`` (files and directories, at any depth; links are not descended into).
    ``root`` itself may be a link: it is the run directory's location, followed on purpose."""
    found: list[Path] = []
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        found.extend(Path(directory) / name for name in (*dirnames, *filenames)
                     if os.path.islink(os.path.join(directory, name)))  # fmt: skip
    return sorted(found)


def _fresh_timestamp_dir(output_dir: Path) -> Path:
    # Two runs started in the same second would otherwise collide; a suffix keeps both.
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = output_dir / stamp
    suffix = 1
    while root.exists() and (not root.is_dir() or any(root.iterdir())):
        suffix += 1
        root = output_dir / f"{stamp}-{suffix}"
    return root


def start_problems(output_dir: str | Path, name: str | None, resume: bool) -> list[ConfigIssue]:
    """Why :meth:`RunDir.create` would refuse to start this run (empty when it would not). Touches nothing, so
    ``groupwise train`` asks before it loads any model."""
    if name is None and resume:
        return [ConfigIssue(
            "run.name", None, "--resume needs the name of the run to continue, but run.name is null",
            f"set run.name to the directory name under {str(output_dir)!r} (for example run.name=20260101-120000)",
        )]
    if name is not None:
        problem = run_name_problem(name)
        if problem is not None:
            return [ConfigIssue("run.name", name, problem, "use a plain name such as 'addition-ds'")]
        root = Path(output_dir) / name
        if root.is_dir() and any(root.iterdir()) and not resume:
            return [ConfigIssue(
                "run.name", name, f"the run directory {str(root)!r} already exists and is not empty",
                "pass --resume to continue that run (from its newest complete checkpoint, or from step 0 when it has "
                "none), choose another run.name, or delete the directory",
            )]
        links = linked_entries(root) if root.is_dir() else []
        if links:
            shown = ", ".join(f"{link} -> {os.readlink(link)}" for link in links[:5])
            more = f" (and {len(links) - 5} more)" if len(links) > 5 else ""
            return [ConfigIssue(
                "run.name", name, f"the run directory {str(root)!r} holds symbolic links ({shown}{more}); a run "
                "writes, truncates and rewrites files only inside its own directory, never through a link",
                "replace each link by the file or directory itself (cp -a --remove-destination), or remove it",
            )]
    return location_problems(output_dir, name)


def location_problems(output_dir: str | Path, name: str | None) -> list[ConfigIssue]:
    """Whether the run directory (``output_dir/name``, made with its parents when missing) can be written there."""
    root = Path(output_dir) if name is None else Path(output_dir) / name
    if root.exists() and not root.is_dir():
        key, value = ("run.name", name) if name is not None else ("run.output_dir", str(output_dir))
        return [ConfigIssue(key, value, f"{str(root)!r} exists and is a file, not a directory",
                            f"choose another {key}, or move the file")]
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [ConfigIssue("run.output_dir", str(output_dir), f"{str(existing)!r} is a file, so the run directory "
                            f"{str(root)!r} cannot be created under it", "set run.output_dir to a directory")]
    problem = _cannot_create_in(existing)
    if problem is not None:
        return [ConfigIssue("run.output_dir", str(output_dir), f"{str(existing)!r} is not writable ({problem}), so "
                            f"the run directory {str(root)!r} cannot be written", "set run.output_dir to a writable "
                            "directory (or fix its permissions)")]
    return []


def _cannot_create_in(directory: Path) -> str | None:
    """Why no directory can be made in ``directory``, or None. Permission bits are not enough (root passes
    ``os.access`` on a read-only mount, and /proc or /sys take no new directories), so a directory is made there and
    removed at once: nothing is left behind."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        probe = tempfile.mkdtemp(prefix=".groupwise-probe-", dir=directory)
    except OSError as err:
        return err.strerror or type(err).__name__
    os.rmdir(probe)
    return None


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return step
