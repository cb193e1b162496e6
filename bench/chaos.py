"""Kill-and-resume chaos test: SIGKILL ``groupwise train`` at random moments, resume until done, then audit.

    .venv/bin/python bench/chaos.py                                  # 20 async + 10 sync trials, 3 kills each
    .venv/bin/python bench/chaos.py --trials 1 --modes async --kills 2   # the CI tier (tests/test_chaos.py)
    .venv/bin/python bench/chaos.py --record bench/RESULTS.md        # also append a "Chaos" section there

Each trial trains a small job on the warm-start model ``models/addition-tiny`` (P=4, G=4, dynamic sampling on,
a checkpoint every step) as a subprocess. Async trials rotate over the ``in_order``, ``ready_first`` and
``windowed`` samplers; sync trials carry surplus groups. Every life of the process is SIGKILLed once it has written
its first complete checkpoint: half of the kills land at a random moment of training, half while a checkpoint is
being written (the child slows each checkpoint file write by ``--write-delay`` seconds so that window is wide,
and the parent kills as soon as a ``.tmp-step_*`` directory appears). With ``--first-write`` (the default) the first
life of every trial is also killed inside its *first* checkpoint write, before any checkpoint is complete: the
directory then holds only ``.tmp-step_1-*``, and ``--resume`` must start it again from step 0. The next life runs
``--resume``. After the kills a last life runs to the end. Then the trial checks:

* every complete-looking checkpoint (``COMPLETE`` manifest) verifies and loads — checked after every kill;
* ``groupwise audit RUN_DIR`` exits 0: no prompt trained twice in an epoch, none dispatched without a fate;
* ``metrics.jsonl`` has exactly one line per step 1..max_steps (no gap, no duplicate).

Internal: ``bench/chaos.py --child ARGS`` runs ``groupwise ARGS`` with the slowed checkpoint writes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WRITE_DELAY_ENV = "GROUPWISE_CHAOS_WRITE_DELAY_S"
ASYNC_SAMPLERS = ("in_order", "ready_first", "windowed")
POLL_S = 0.005


def child_main(argv: list[str]) -> int:
    """Run the groupwise CLI with every checkpoint file write slowed down (a wide window to kill inside)."""
    import groupwise.run.checkpoint as checkpoint
    from groupwise.cli.main import main

    delay = float(os.environ.get(WRITE_DELAY_ENV, "0"))
    real_write, real_fsync = checkpoint._write_file_synced, checkpoint._fsync_file

    def slow_write(path: Path, data: bytes) -> None:
        time.sleep(delay)
        real_write(path, data)

    def slow_fsync(path: Path) -> None:
        time.sleep(delay)
        real_fsync(path)

    checkpoint._write_file_synced, checkpoint._fsync_file = slow_write, slow_fsync
    return main(argv)


def trial_config(mode: str, sampler: str, name: str, output_dir: Path, max_steps: int, seed: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "mode": mode,
        "run": {"name": name, "output_dir": str(output_dir), "seed": seed, "max_steps": max_steps},
        "model": {"source": "hf", "path": str(REPO / "models" / "addition-tiny"), "device": "cpu"},
        "data": {"task": "addition", "addition": {"min_digits": 1, "max_digits": 2, "num_eval": 8}},
        "generation": {"max_new_tokens": 5},
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4, "dynamic_sampling": {"enabled": True}},
        "loss": {"importance_sampling": True},
        "logging": {"progress": False, "tensorboard": False},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 1, "keep_last": 2, "save_final": False},
    }
    if mode == "sync":
        config["grpo"]["dynamic_sampling"].update(
            batch_multiplier=1.5, max_gen_rounds=8, surplus="carry", on_exhausted="train_short",
            min_step_batch_fraction=0.25,
        )  # fmt: skip
        return config
    knobs = {"in_order": {"max_lookahead_versions": 1}, "windowed": {"max_staleness_versions": 2}}
    failure: dict[str, Any] = {"min_step_batch_fraction": 0.25}
    if sampler != "windowed":  # windowed keeps no spare pool: a lost group is made up by later ones
        # About half the groups of this job are zero-variance: a deep pool keeps a step from losing all of its slots.
        failure.update(on_dropped_prompt="replace", replacement_reserve_prompts=32, max_replacement_attempts=16)
    config["async"] = {
        "sampler": {"name": sampler, **knobs.get(sampler, {"max_staleness_versions": 1})},
        "max_buffered_rollouts": 16,
        "max_inflight_prompts": 8,
        "rollout_failure": failure,
    }
    return config


@dataclass
class TrialResult:
    trial: int
    mode: str
    sampler: str
    kills_random: int = 0
    kills_in_write: int = 0
    kills_first_write: int = 0
    finished_before_kill: int = 0
    lives: int = 0
    steps: int = 0
    trained_twice: int = -1
    without_fate: int = -1
    bad_checkpoints: int = 0
    metrics_ok: bool = False
    audit_exit: int = -1
    final_exit: int = -1
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.final_exit == 0 and self.audit_exit == 0 and self.trained_twice == 0 and self.without_fate == 0
            and self.bad_checkpoints == 0 and self.metrics_ok
        )  # fmt: skip


class Trial:
    """One chaos trial: a run directory, its config, and the lives of its training process."""

    def __init__(self, index: int, mode: str, sampler: str, workdir: Path, max_steps: int, write_delay: float):
        self.result = TrialResult(index, mode, sampler)
        self.name = f"trial{index:02d}-{mode}-{sampler}"
        self.run_dir = workdir / "runs" / self.name
        self.logs = workdir / "logs"
        self.config_path = workdir / f"{self.name}.yaml"
        self.max_steps = max_steps
        self.write_delay = write_delay
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        import yaml

        config = trial_config(mode, sampler, self.name, workdir / "runs", max_steps, seed=index)
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")

    def start(self) -> subprocess.Popen:
        args = [sys.executable, str(Path(__file__).resolve()), "--child", "train", str(self.config_path)]
        if self.result.lives:
            args.append("--resume")
        self.result.lives += 1
        log = (self.logs / f"{self.name}-life{self.result.lives}.log").open("w")
        env = {**os.environ, WRITE_DELAY_ENV: str(self.write_delay), "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def complete_checkpoints(self) -> list[Path]:
        directory = self.run_dir / "checkpoints"
        return sorted(p for p in directory.glob("step_*") if (p / "COMPLETE").is_file()) if directory.is_dir() else []

    def writing_checkpoint(self) -> bool:
        directory = self.run_dir / "checkpoints"
        return directory.is_dir() and any(p.name.startswith(".tmp-step_") for p in directory.iterdir())

    def live_and_kill(self, kind: str, rng: random.Random, timeout_s: float) -> None:
        """One life that is SIGKILLed (``kind``: ``random`` or ``in_write``) once it wrote a complete checkpoint, or
        (``first_write``) while it writes its first one."""
        before = {p.name for p in self.complete_checkpoints()}
        process = self.start()
        deadline = time.monotonic() + timeout_s
        armed = kind == "first_write"
        kill_at = None
        while process.poll() is None and time.monotonic() < deadline:
            if not armed:
                armed = bool({p.name for p in self.complete_checkpoints()} - before)
                if armed and kind == "random":
                    kill_at = time.monotonic() + rng.uniform(0.0, 2.0)
            elif self._due(kind, kill_at):
                process.send_signal(signal.SIGKILL)
                process.wait()
                self.result.kills_random += kind == "random"
                self.result.kills_in_write += kind == "in_write"
                self.result.kills_first_write += kind == "first_write"
                return
            time.sleep(POLL_S)
        if process.poll() is None:
            process.kill()
            process.wait()
            self.result.notes.append(f"life {self.result.lives} timed out before its kill")
        else:
            self.result.finished_before_kill += 1

    def _due(self, kind: str, kill_at: float | None) -> bool:
        if kind == "random":
            return kill_at is not None and time.monotonic() >= kill_at
        if kind == "first_write":
            return self.writing_checkpoint() and not self.complete_checkpoints()
        return self.writing_checkpoint()

    def check_checkpoints(self) -> None:
        from groupwise.run.checkpoint import CheckpointError, load_checkpoint

        for path in self.complete_checkpoints():
            try:
                load_checkpoint(path)
            except (CheckpointError, OSError, ValueError, RuntimeError) as err:
                self.result.bad_checkpoints += 1
                self.result.notes.append(f"{path.name} looks complete but does not load: {err}")

    def finish(self, timeout_s: float) -> None:
        process = self.start()
        try:
            self.result.final_exit = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            self.result.notes.append("the last life timed out")

    def audit(self) -> None:
        from groupwise.cli.run_prompts import training_uids
        from groupwise.run.audit import audit_run
        from groupwise.run.metrics import read_metrics

        command = [sys.executable, "-m", "groupwise.cli", "audit", str(self.run_dir)]
        audited = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        self.result.audit_exit = audited.returncode
        (self.logs / f"{self.name}-audit.txt").write_text(audited.stdout + audited.stderr, encoding="utf-8")
        if (self.run_dir / "fates.jsonl").is_file():
            report = audit_run(self.run_dir, training_uids)
            self.result.trained_twice, self.result.without_fate = report.trained_twice, report.without_fate
        metrics_path = self.run_dir / "metrics.jsonl"
        steps = [r["step"] for r in read_metrics(metrics_path)] if metrics_path.is_file() else []
        self.result.steps = max(steps, default=0)
        self.result.metrics_ok = steps == list(range(1, self.max_steps + 1))


def run_trial(
    index: int, mode: str, sampler: str, kills: int, workdir: Path, max_steps: int = 12, write_delay: float = 0.05,
    seed: int = 0, timeout_s: float = 300.0, first_write: bool = False,
) -> TrialResult:  # fmt: skip
    """Run one trial (see the module docstring) and return what it found; ``first_write`` adds a first life killed
    inside its first checkpoint write."""
    rng = random.Random(f"chaos|{seed}|{index}")
    start = time.monotonic()
    trial = Trial(index, mode, sampler, workdir, max_steps, write_delay)
    if first_write:
        trial.live_and_kill("first_write", rng, timeout_s)
        trial.check_checkpoints()
    for k in range(kills):
        kind = "in_write" if (k + index) % 2 else "random"
        trial.live_and_kill(kind, rng, timeout_s)
        trial.check_checkpoints()
    trial.finish(timeout_s)
    trial.check_checkpoints()
    trial.audit()
    trial.result.seconds = round(time.monotonic() - start, 1)
    return trial.result


def plan(trials: int, modes: list[str], sync_trials: int) -> list[tuple[str, str]]:
    """``trials`` async trials rotating over the samplers, then ``sync_trials`` sync ones (per ``modes``)."""
    out: list[tuple[str, str]] = []
    if "async" in modes:
        out += [("async", ASYNC_SAMPLERS[i % len(ASYNC_SAMPLERS)]) for i in range(trials)]
    if "sync" in modes:
        out += [("sync", "-")] * sync_trials
    return out


def results_table(results: list[TrialResult]) -> str:
    header = (
        "| trial | mode | sampler | kills (random / in checkpoint write / in the first one) | lives | steps | "
        "trained twice | "
        "dispatched without fate | complete checkpoints failing to load | metrics 1..N | audit exit | s |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in results:
        lines.append(
            f"| {r.trial} | {r.mode} | {r.sampler} | {r.kills_random} / {r.kills_in_write} / {r.kills_first_write} | "
            f"{r.lives} | {r.steps} | "
            f"{r.trained_twice} | {r.without_fate} | {r.bad_checkpoints} | {'ok' if r.metrics_ok else 'GAP'} | "
            f"{r.audit_exit} | {r.seconds} |"
        )
    return "\n".join(lines)


def summary_line(results: list[TrialResult]) -> str:
    kills = sum(r.kills_random + r.kills_in_write + r.kills_first_write for r in results)
    in_write = sum(r.kills_in_write for r in results)
    first = sum(r.kills_first_write for r in results)
    return (
        f"{sum(r.passed for r in results)}/{len(results)} trials passed; {kills} SIGKILLs ({in_write} during a "
        f"checkpoint write, {first} during the first one); prompts trained twice: "
        f"{sum(max(r.trained_twice, 0) for r in results)}; dispatched "
        f"without fate: {sum(max(r.without_fate, 0) for r in results)}; complete-looking checkpoints that failed to "
        f"load: {sum(r.bad_checkpoints for r in results)}"
    )


def record(path: Path, command: str, results: list[TrialResult]) -> None:
    """Append a "Chaos" section (command, machine, date, table) to ``path``."""
    section = (
        f"\n## Chaos: kill-and-resume ({date.today().isoformat()})\n\n"
        f"Command: `{command}`  \nMachine: 2-core CPU, no GPU (shared with other jobs).  \n"
        f"Job: models/addition-tiny, addition, P=4, G=4, dynamic sampling on, checkpoint every step, "
        f"{results[0].steps if results else 0} steps per run.\n\n"
        f"{summary_line(results)}\n\n{results_table(results)}\n"
    )
    with path.open("a", encoding="utf-8") as handle:
        if path.stat().st_size == 0:
            handle.write("# Benchmarks\n")
        handle.write(section)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="async trials (samplers rotate)")
    parser.add_argument("--sync-trials", type=int, default=10)
    parser.add_argument("--modes", default="async,sync")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs per trial")
    parser.add_argument("--steps", type=int, default=12, help="run.max_steps of each trial")
    parser.add_argument("--write-delay", type=float, default=0.05, help="seconds added to each checkpoint file write")
    parser.add_argument("--first-write", action=argparse.BooleanOptionalAction, default=True,
                        help="also kill each trial's first life inside its first checkpoint write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "chaos")
    parser.add_argument("--record", type=Path, default=None, help="append a Chaos section to this markdown file")
    args = parser.parse_args(argv)
    results = []
    for index, (mode, sampler) in enumerate(plan(args.trials, args.modes.split(","), args.sync_trials)):
        result = run_trial(index, mode, sampler, args.kills, args.workdir, args.steps, args.write_delay, args.seed,
                           first_write=args.first_write)
        results.append(result)
        status = "ok" if result.passed else "FAILED"
        print(f"trial {index} {mode}/{sampler}: {status} {json.dumps(asdict(result))}", flush=True)
    print(summary_line(results))
    print(results_table(results))
    if args.record is not None:
        args.record.touch()
        record(args.record, "python bench/chaos.py " + " ".join(argv), results)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
