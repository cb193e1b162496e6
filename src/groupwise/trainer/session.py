"""Everything one training run holds, built from a config: policy, engine, learner, data, run directory.

The sync loop and the async runtime both drive a :class:`Session`; it owns the edges (metrics, train data,
evaluation, checkpoints, the final model) so the loops stay short.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groupwise.algo.accumulator import StepSelection
from groupwise.batch import RowBatch
from groupwise.cli.progress import RunProgress
from groupwise.model.lora import generator_state_dict, load_trained_state_dict, trained_state_dict
from groupwise.run.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from groupwise.run.fates_file import FatesWriter
from groupwise.run.jsonl import write_rows_jsonl
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir
from groupwise.trainer.evaluation import evaluate_policy
from groupwise.types import group_from_dict, group_to_dict

TRAIN_DATA_COLUMNS = (
    "prompt_uid",
    "group_id",
    "completion_index",
    "completion_text",
    "completion_ids",
    "finish_reason",
    "reward_raw",
    "reward",
    "advantage",
    "generation_logprobs",
    "start_version",
)


@dataclass
class TrainerState:
    """Counters a checkpoint must restore for resume to equal continuing."""

    step: int = 0
    next_group_id: int = 0
    carried: list = field(default_factory=list)

    def next_group_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_group_id, self.next_group_id + n))
        self.next_group_id += n
        return ids

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "next_group_id": self.next_group_id,
            "carried": [group_to_dict(g) for g in self.carried],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        return cls(
            step=int(data["step"]),
            next_group_id=int(data["next_group_id"]),
            carried=[group_from_dict(g) for g in data.get("carried", [])],
        )


@dataclass
class StepOutcome:
    """What one step's generation produced, before training."""

    selection: StepSelection
    gen_seconds: float
    gen_tokens: int
    generated: list = field(default_factory=list)  # every group generated for the step (all rounds), for fates

    def perf_metrics(self, step_seconds: float) -> dict[str, float]:
        return {
            "perf/step_seconds": step_seconds,
            "perf/gen_seconds": self.gen_seconds,
            "perf/gen_tokens_per_s": self.gen_tokens / self.gen_seconds if self.gen_seconds > 0 else 0.0,
        }


@dataclass
class Session:
    """A run's components. Build one with :func:`groupwise.trainer.builder.build_session`."""

    cfg: Any
    run_dir: RunDir
    policy: Any
    engine: Any
    learner: Any
    rollouts: Any
    loader: Any
    task: Any
    reward_fn: Any
    events: MetricsWriter
    state: TrainerState = field(default_factory=TrainerState)
    last_metrics: dict[str, float] = field(default_factory=dict)
    fates: FatesWriter | None = None  # fates.jsonl (groupwise.run.fates_file); created from run_dir when not given
    # Async runs: loader position, fates offset and controller state captured together at the last step boundary
    # (groupwise.run.async_checkpoint.boundary_snapshot); checkpoints of that step use it.
    boundary_snapshot: dict[str, Any] | None = None
    restored_extra: dict[str, Any] = field(default_factory=dict)  # the resumed checkpoint's extra pieces
    _last_eval_step: int = -1
    _last_checkpoint_step: int = -1

    def __post_init__(self) -> None:
        if self.fates is None:
            self.fates = FatesWriter(self.run_dir.fates_path)

    # --- weights -------------------------------------------------------------------------------------------
    def publish_weights(self) -> None:
        """Hand the learner's new weights (version v+1) to the generator (adapters merged, when training LoRA)."""
        self.engine.load_weights(generator_state_dict(self.policy.model), self.learner.version)

    # --- per-step edges ------------------------------------------------------------------------------------
    def end_step(self, step: int, metrics: dict[str, float], rows: RowBatch) -> None:
        """Log metrics and train data for the step that just finished; evaluate and checkpoint when due."""
        done = step + 1
        # Step N is the state after N optimizer steps (step 0 is the initial policy's evaluation).
        metrics = {**metrics, "step": done, "weight_version": self.learner.version}
        every = self.cfg.eval.every
        if every and done % every == 0 and done < self.cfg.run.max_steps:
            metrics.update(self.evaluate(done, log=False))
        if self.cfg.logging.train_data:
            columns = {name: rows[name] for name in TRAIN_DATA_COLUMNS}
            columns["prompt_text"] = prompt_texts(self.policy.tokenizer, rows["prompt_ids"])
            write_rows_jsonl(self.run_dir.train_data_path(done), columns)
        self.events.log(done, metrics)
        self.events.event(step_summary(done, metrics))
        self.last_metrics = metrics
        ckpt_every = self.cfg.checkpoint.every
        if ckpt_every and done % ckpt_every == 0:
            self.save_checkpoint()

    def evaluate(self, step: int, log: bool = True) -> dict[str, float]:
        result = evaluate_policy(self.engine, self.rollouts, self.task.eval_prompts(), self.cfg)
        self._last_eval_step = step
        self.events.event(f"eval at step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in result.items()))
        if log:
            self.events.log(step, {"step": step, "weight_version": self.learner.version, **result})
        return result

    def finish(self) -> None:
        """End of run: final evaluation, checkpoint and the Hugging Face ``final/`` directory."""
        step = self.state.step
        if self.cfg.eval.at_end and self._last_eval_step != step:
            self.last_metrics.update(self.evaluate(step, log=True))
        if self._last_checkpoint_step != step:
            self.save_checkpoint()
        if self.cfg.checkpoint.save_final:
            self.policy.save(self.run_dir.final_dir)
            self.events.event(f"saved the trained policy to {self.run_dir.final_dir}")
        self.events.close()

    def fail(self, step: int, err: BaseException) -> None:
        self.events.event(f"step {step + 1} failed: {err}")

    @contextlib.contextmanager
    def progress(self) -> Iterator[RunProgress]:
        with RunProgress(total=self.cfg.run.max_steps, start=self.state.step, enabled=self.cfg.logging.progress) as bar:
            yield bar

    # --- checkpoints ---------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        trainer = {**self.state.to_dict(), "loader": self.loader.state_dict(), "fates_offset": self.fates.offset()}
        state = {
            "model": trained_state_dict(self.policy.model),  # the adapter only, when training LoRA
            "optimizer": self.learner.state_dict(),
            "rng": capture_rng_state(),
            "trainer": trainer,
        }
        snapshot = self.boundary_snapshot
        if snapshot is not None:
            if snapshot["step"] != self.state.step:
                raise AssertionError(f"async boundary snapshot of step {snapshot['step']} at step {self.state.step}")
            trainer.update(snapshot["trainer"])
            state["extra"] = snapshot["extra"]
        return state

    def save_checkpoint(self) -> Path:
        path = save_checkpoint(
            self.run_dir.path, self.state.step, self.checkpoint_state(), self.cfg.checkpoint.keep_last
        )
        self._last_checkpoint_step = self.state.step
        self.events.event(f"checkpoint written: {path}")
        return path

    def restore(self, path: Path | None = None) -> Path:
        """Load a checkpoint (the newest complete one when ``path`` is None) into this session."""
        path = path or latest_checkpoint(self.run_dir.path)
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint under {self.run_dir.path / 'checkpoints'} to resume from")
        state = load_checkpoint(path)
        if self.cfg.mode == "sync":
            from groupwise.run.async_checkpoint import check_sync_resume

            check_sync_resume(state.get("extra"), path)
        load_trained_state_dict(self.policy.model, state["model"])
        self.learner.load_state_dict(state["optimizer"])
        restore_rng_state(state["rng"])
        trainer = dict(state["trainer"])
        self.loader.load_state_dict(trainer.pop("loader"))
        fates_offset = trainer.pop("fates_offset", None)
        self.state = TrainerState.from_dict(trainer)
        self.restored_extra = dict(state.get("extra") or {})
        self._last_checkpoint_step = self.state.step  # it is on disk: finish() must not overwrite it without extras
        self.publish_weights()
        self.events.truncate_after(self.state.step)
        self._rollback_fates(fates_offset)
        self.events.event(f"resumed from {path} at step {self.state.step}")
        return path


    def _rollback_fates(self, offset: int | None) -> None:
        """Cut fates.jsonl back to the checkpoint: later lines describe a timeline the resume undid."""
        if offset is None:
            self.events.event("resume: the checkpoint records no fates.jsonl offset (older format); fates kept as is")
            return
        result = self.fates.rollback(offset)
        if result.dropped_lines or result.dropped_bytes:
            self.events.event(f"resume: dropped {result.dropped_lines} fates.jsonl line(s) from after the checkpoint")
        if result.missing_bytes:
            self.events.event(
                f"resume: fates.jsonl is {result.missing_bytes} bytes shorter than at the checkpoint (lost in a "
                "crash); `groupwise audit` will list the prompts whose fates are missing"
            )


def prompt_texts(tokenizer: Any, prompt_ids: list) -> list[str]:
    """The prompts as the model saw them: token ids decoded with special tokens kept (a chat prompt reads as its
    rendered template, generation prompt included)."""
    return tokenizer.batch_decode([list(ids) for ids in prompt_ids], skip_special_tokens=False)


def step_summary(step: int, metrics: dict[str, float]) -> str:
    """The one-line ``events.log`` summary of a step."""
    keys = (
        ("reward/unfiltered_mean", "reward_unf"),
        ("reward/trained_mean", "reward_trained"),
        ("ds/zero_variance_fraction", "zero_var"),
        ("ds/gen_rounds", "rounds"),
        ("loss/total", "loss"),
        ("perf/step_seconds", "sec"),
        ("eval/accuracy", "eval_acc"),
    )
    parts = [f"step {step}"] + [f"{short}={metrics[key]:.4g}" for key, short in keys if key in metrics]
    return " ".join(parts)
