"""Everything one training run holds, built from a config: policy, engine, learner, data, run directory.

The sync and async runtimes (``groupwise.runtime.sync_run``, ``async_run``) both drive a :class:`Session`; it owns
the edges (metrics, train data, evaluation, checkpoints, the final model) so the loops stay short.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from groupwise.chunks import TrainChunk, step_rows
from groupwise.data.loader import PromptLoader
from groupwise.data.registry import Task
from groupwise.data.rewards import RewardFn
from groupwise.data.skipping_loader import NoSignalSkippingLoader
from groupwise.episodes.metrics import episode_metrics
from groupwise.generation.base import Generator, StreamSupport, VersionedWeights
from groupwise.generation.factory import shutdown_generator
from groupwise.model.lora import generator_state_dict, load_trained_state_dict, trained_state_dict
from groupwise.run.checkpoint import (
    CheckpointError,
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    remove_partial_checkpoints,
    restore_rng_state,
    save_checkpoint,
)
from groupwise.run.disk_full import disk_full_error, is_disk_full
from groupwise.run.fates_file import FatesWriter
from groupwise.run.jsonl import write_rows_jsonl
from groupwise.run.metrics import MetricsWriter
from groupwise.run.phases import PhaseLog
from groupwise.run.progress import RunProgress
from groupwise.run.rundir import RunDir
from groupwise.trainer.evaluation import evaluate_policy, evaluated_prompts
from groupwise.trainer.finite import check_finite_weights
from groupwise.trainer.parts import GroupRollouts, StepLearner, TrainedPolicy
from groupwise.trainer.remote_policy import RemotePolicy
from groupwise.trainer.rollout import RolloutWorker
from groupwise.trainer.sync_loop import TrainerState

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from groupwise.config import RunConfig

logger = logging.getLogger(__name__)

TRAIN_DATA_COLUMNS = (
    "prompt_uid",
    "group_id",
    "completion_index",
    "sequence_index",
    "completion_text",
    "completion_ids",
    "finish_reason",
    "raw_reward",
    "reward",
    "advantage",
    "generation_logprobs",
    "start_version",
    "version_spans",
    "env_spans",
)


@dataclass
class Session:
    """A run's components. Build one with :func:`groupwise.trainer.builder.build_session`."""

    cfg: RunConfig
    run_dir: RunDir
    policy: TrainedPolicy
    engine: Generator
    streaming: StreamSupport  # whether the generator runs a request stream (asked once, by the builder)
    learner: StepLearner
    rollouts: GroupRollouts
    loader: PromptLoader
    task: Task
    reward_fn: RewardFn
    events: MetricsWriter
    state: TrainerState = field(default_factory=TrainerState)
    last_metrics: dict[str, float] = field(default_factory=dict)
    fates: FatesWriter = field(init=False)  # fates.jsonl (groupwise.run.fates_file), made from run_dir
    # Async runs: loader position, fates offset and controller state captured together at the last step boundary
    # (groupwise.run.async_checkpoint.boundary_snapshot); checkpoints of that step use it.
    boundary_snapshot: dict[str, Any] | None = None
    restored_extra: dict[str, Any] = field(default_factory=dict)  # the resumed checkpoint's extra pieces
    latest_eval: dict[str, float] = field(default_factory=dict)  # this session's latest evaluation (progress line)
    _last_eval_step: int = -1
    _last_checkpoint_step: int = -1

    phases: PhaseLog = field(init=False)  # start and end lines of evaluations, to stderr and events.log

    def __post_init__(self) -> None:
        self.fates = FatesWriter(self.run_dir.fates_path)
        self.phases = PhaseLog(events=self.events.event)

    # --- weights -------------------------------------------------------------------------------------------
    def generator_weights(self) -> VersionedWeights:
        """The weights the generator loads and their version: the policy's, adapters merged when training LoRA
        (fetched from the learner's processes when they live elsewhere), at the learner's version."""
        if isinstance(self.policy, RemotePolicy):
            return VersionedWeights(self.policy.generator_state(), self.learner.version)
        return VersionedWeights(generator_state_dict(self.policy.model), self.learner.version)

    def publish_weights(self, version: int | None = None) -> None:
        """Hand the learner's weights to the generator; ``version``: the one the caller expects them to be."""
        weights = self.generator_weights()
        weights = weights if version is None else weights.checked(version)
        self.engine.load_weights(weights.state, weights.version)

    def close(self) -> None:
        """Stop what the session started outside this process: the generator's engine when it runs one (vLLM's),
        the harness endpoint when it serves one; learner ranks and Ray actors in the sessions that have them."""
        shutdown_generator(self.engine)
        if isinstance(self.rollouts, RolloutWorker):
            self.rollouts.close()

    # --- per-step edges ------------------------------------------------------------------------------------
    def end_step(self, step: int, metrics: dict[str, float], chunks: Sequence[TrainChunk]) -> None:
        """Log metrics and train data (the rows of the step's ``chunks``) for the step that just finished; evaluate
        and checkpoint when due."""
        done = step + 1
        # Step N is the state after N optimizer steps (step 0 is the initial policy's evaluation).
        metrics = {**metrics, "step": done, "weight_version": self.learner.version}
        if isinstance(self.loader, NoSignalSkippingLoader):  # data.skip_no_signal: the skip/* metrics
            metrics.update(self.loader.step_metrics())
        metrics.update(episode_metrics([c.episode for chunk in chunks for g in chunk.groups for c in g.completions
                                        if c.episode is not None]))  # fmt: skip
        every = self.cfg.eval.every
        if every and done % every == 0 and done < self.cfg.run.max_steps:
            metrics.update(self.evaluate(done, log=False))
        if self.cfg.logging.train_data:
            rows = step_rows(chunks)
            columns = {name: rows[name] for name in TRAIN_DATA_COLUMNS}
            columns["prompt_text"] = prompt_texts(self.policy.tokenizer, rows.sequence("prompt_ids"))
            if self.cfg.episode.enabled:  # each row's episode record: turns, rewards, what the environment said
                columns["episode"] = [record.to_dict() if record else None for record in rows["episode"]]
            write_rows_jsonl(self.run_dir.train_data_path(done), columns)
        self.events.log(done, metrics)
        self.events.event(step_summary(done, metrics))
        self.last_metrics = metrics
        ckpt_every = self.cfg.checkpoint.every
        if ckpt_every and done % ckpt_every == 0:
            self.save_checkpoint()

    def evaluate(self, step: int, log: bool = True) -> dict[str, float]:
        count = len(evaluated_prompts(self.task.eval_prompts(), self.cfg))
        with self.phases.phase(f"evaluating {count} held-out prompts at step {step}") as phase:
            result = evaluate_policy(self.engine, self.rollouts, self.task.eval_prompts(), self.cfg)
            phase.outcome = ", ".join(f"{k}={v:.4f}" for k, v in result.items())
        self._last_eval_step = step
        self.latest_eval = result
        self.events.event(f"eval at step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in result.items()))
        if log:
            self.events.log(step, {"step": step, "weight_version": self.learner.version, **result})
        return result

    def finish(self) -> None:
        """End of run: final evaluation, checkpoint and the Hugging Face ``final/`` directory. The end-of-run
        checkpoint is skipped only when the config asks for nothing on disk (``checkpoint.every: 0`` and
        ``save_final: false``)."""
        step = self.state.step
        if self.cfg.eval.at_end and self._last_eval_step != step:
            self.last_metrics.update(self.evaluate(step, log=True))
        keep = self.cfg.checkpoint.every > 0 or self.cfg.checkpoint.save_final
        if keep and self._last_checkpoint_step != step:
            self.save_checkpoint()
        if self.cfg.checkpoint.save_final:
            check_finite_weights(self.policy.model.state_dict(), f"the final policy ({self.run_dir.final_dir})")
            try:
                self.policy.save(self.run_dir.final_dir)
            except Exception as err:
                if is_disk_full(err):  # a half-written final/ must not pass for the trained policy
                    shutil.rmtree(self.run_dir.final_dir, ignore_errors=True)
                    raise disk_full_error(err, f"the trained policy to {self.run_dir.final_dir}", self.run_dir) from err
                raise
            self.events.event(f"saved the trained policy to {self.run_dir.final_dir}")
        self.events.close()

    def fail(self, step: int, err: BaseException) -> None:
        self.events.event(f"step {step + 1} failed: {err}")

    @contextlib.contextmanager
    def progress(self) -> Iterator[RunProgress]:
        with RunProgress(
            total=self.cfg.run.max_steps, start=self.state.step, enabled=self.cfg.logging.progress,
            accuracy=self.latest_eval.get("eval/accuracy"),
        ) as bar:  # fmt: skip
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
        state = self.checkpoint_state()
        check_finite_weights(state["model"], f"the checkpoint of step {self.state.step}")
        try:
            path = save_checkpoint(self.run_dir.path, self.state.step, state, self.cfg.checkpoint.keep_last)
        except Exception as err:
            if is_disk_full(err):
                raise disk_full_error(err, f"checkpoint step {self.state.step}", self.run_dir) from err
            raise
        self._last_checkpoint_step = self.state.step
        self.events.event(f"checkpoint written: {path}")
        return path

    def begin(self, resume_from: Path | None = None, notes: Sequence[str] = ()) -> bool:
        """Start the run and return whether a checkpoint was restored.

        ``resume_from`` is restored when given. A run directory that already had content (``--resume``) continues
        from its newest complete checkpoint, or, when it has none (killed before or during its first save), starts
        again from step 0 (:meth:`start_over`). Otherwise the run starts fresh. ``notes`` (what the prompt checks
        counted) go to ``events.log``.
        """
        restored = False
        if resume_from is not None:
            self.restore(resume_from)
            restored = True
        elif self.run_dir.resumed:
            latest = latest_checkpoint(self.run_dir.path)
            if latest is None:
                self.start_over()
            else:
                self.restore(latest)
                restored = True
        else:
            self.events.event(f"run started: {self.run_dir.path}")
        for note in notes:
            self.events.event(f"setup: {note}")
        return restored

    def start_over(self) -> None:
        """Resume a run directory that holds no complete checkpoint from step 0: metrics, fates and train data of
        the earlier attempt describe steps this run will take again, so they are removed (``events.log`` keeps its
        history and says so), and so are partial checkpoint directories."""
        dropped = self.events.truncate_after(-1)
        fates = self.fates.rollback(0)
        removed = remove_train_data_after(self.run_dir, 0)
        partial = remove_partial_checkpoints(self.run_dir.path)
        message = (
            f"resume: {self.run_dir.path} holds no complete checkpoint, so the run starts again from step 0; removed "
            f"the earlier attempt's {dropped} metrics line(s), {fates.dropped_lines} fates line(s), {removed} "
            f"train_data file(s) and {partial} partial checkpoint(s)"
        )
        self.events.event(message)
        logger.warning(message)

    def restore(self, path: Path | None = None) -> Path:
        """Load a checkpoint (the newest complete one when ``path`` is None) into this session."""
        from groupwise.run.async_checkpoint import ResumeError, check_sync_resume

        path = path or latest_checkpoint(self.run_dir.path)
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint under {self.run_dir.path / 'checkpoints'} to resume from")
        try:
            state = load_checkpoint(path)
            if self.cfg.mode == "sync":
                check_sync_resume(state.get("extra"), path)
            load_trained_state_dict(self.policy.model, state["model"])  # every weight, or the LoRA adapter
            self.learner.load_state_dict(state["optimizer"])
            restore_rng_state(state["rng"])
            trainer = dict(state["trainer"])
            self.loader.load_state_dict(trainer.pop("loader"))
            fates_offset = trainer.pop("fates_offset", None)
            self.state = TrainerState.from_dict(trainer)
        except ResumeError:
            raise
        except (CheckpointError, KeyError, RuntimeError, TypeError, ValueError) as err:
            # another model's weights, another dataset's loader, a checkpoint that lost a piece: say which and why
            raise ResumeError(f"cannot resume from {path}: {type(err).__name__}: {err}") from err
        self.restored_extra = dict(state.get("extra") or {})
        self._last_checkpoint_step = self.state.step  # it is on disk: finish() must not overwrite it without extras
        self.publish_weights()
        self.events.truncate_after(self.state.step)
        self._rollback_fates(fates_offset)
        self._rollback_train_data(self.state.step)
        self.events.event(f"resumed from {path} at step {self.state.step}")
        return path


    def _rollback_train_data(self, step: int) -> None:
        """Remove ``train_data/step_<N>.jsonl`` for every N > ``step``: those steps are undone like their metrics
        and fates (a later attempt writes them again), and ``groupwise audit`` checks the files against the fates."""
        removed = remove_train_data_after(self.run_dir, step)
        if removed:
            self.events.event(f"resume: removed {removed} train_data file(s) of steps after {step}")

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


def remove_train_data_after(run_dir: RunDir, step: int) -> int:
    """Delete every ``train_data/step_<N>.jsonl`` with N > ``step`` (step 0: all of them); return how many."""
    removed = 0
    for number, path in run_dir.train_data_files():
        if number > step:
            path.unlink()
            removed += 1
    return removed


def prompt_texts(tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[Sequence[int]]) -> list[str]:
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
