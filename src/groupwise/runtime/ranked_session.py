"""A training session whose learner is ``learner.num_ranks`` data-parallel processes (groupwise.runtime.
learner_ranks): the same :class:`~groupwise.trainer.session.Session`, with the learner and the policy's trained
weights in the ranks and the engine, data and run directory here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from groupwise.data.skipping_loader import build_training_loader
from groupwise.model.lora import lora_config
from groupwise.run.checkpoint import latest_checkpoint
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir
from groupwise.run.trackers import config_trackers
from groupwise.runtime.learner_ranks import LearnerRanks, RankedLearner, RankedModel
from groupwise.trainer.builder import build_components, generator_needs_own_model
from groupwise.trainer.preflight import Inputs, check_train_start
from groupwise.trainer.remote_policy import RemotePolicy
from groupwise.trainer.session import Session

if TYPE_CHECKING:
    from groupwise.config import RunConfig


@dataclass
class RankedSession(Session):
    """A :class:`Session` with its learner in rank processes; :meth:`close` stops them."""

    ranks: LearnerRanks | None = field(default=None, repr=False)

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()
        super().close()


def build_ranked_session(
    cfg: RunConfig, *, resume: bool = False, resume_from: Path | None = None, inputs: Inputs | None = None
) -> RankedSession:
    """Start the ranks (they load the model while this process loads its own copy for the engine), wire the
    session, restore a checkpoint when resuming. Every check that can refuse the run runs first."""
    inputs = inputs or check_train_start(cfg, resume=resume, resume_from=resume_from)
    kept: list[RunDir] = []  # the run directory, once made: the ranks' errors name its newest checkpoint
    ranks = LearnerRanks(cfg, kept=lambda: _kept(kept))
    try:
        torch.manual_seed(cfg.run.seed)
        parts = build_components(cfg, separate_engine_model=generator_needs_own_model(cfg), inputs=inputs)
        ranks.wait_started()
        learner = RankedLearner(ranks)
        lora = cfg.model.lora
        policy = RemotePolicy(
            RankedModel(ranks), parts.policy.tokenizer, parts.policy, learner.generator_state,
            lora_config(lora.rank, lora.alpha, lora.dropout, lora.target_modules) if lora.enabled else None,
        )
        run_dir = RunDir.create(cfg.run.output_dir, cfg.run.name, cfg.to_yaml(),
                                resume=resume or resume_from is not None)
        kept.append(run_dir)
    except BaseException:
        ranks.close()
        raise
    writer = MetricsWriter(run_dir, trackers=config_trackers(cfg, run_dir.root))
    loader = build_training_loader(cfg, parts.task.train_prompts())
    session = RankedSession(
        cfg=cfg, run_dir=run_dir, policy=policy, engine=parts.engine, streaming=parts.streaming, learner=learner,
        rollouts=parts.rollouts, loader=loader, task=parts.task, reward_fn=parts.reward_fn, events=writer, ranks=ranks,
    )  # fmt: skip
    try:
        if not session.begin(resume_from, notes=parts.notes):
            session.publish_weights()  # the ranks built the same weights from the same seed; this makes it certain
    except BaseException:
        ranks.close()
        run_dir.discard_if_new()
        raise
    writer.event(f"learner: {cfg.learner.num_ranks} ranks ({cfg.learner.sharding}), processes "
                 f"{', '.join(str(p.pid) for p in ranks.processes)}")
    writer.event(f"learner logprobs: {learner.logprob_path}")
    return session


def _kept(run_dirs: list[RunDir]) -> str:
    if not run_dirs:
        return "nothing (the run directory was not made yet)"
    latest = latest_checkpoint(run_dirs[0].path)
    return f"the checkpoint {latest}" if latest is not None else f"no complete checkpoint under {run_dirs[0].path}"
