"""The simulated workload: its cost and learning model, the prompts with hidden difficulty, the learning curve.

Cost model (virtual seconds). A completion of ``L`` tokens occupies one engine slot for
``prefill_s + L × per_token_s`` (× ``straggler_factor`` when its attempt is a straggler). Lengths are
log-normal with median ``m`` and ``p99/p50 = r``::

    L = round(m · exp(σ · z)),  z ~ Normal(0, 1),  σ = ln(r) / z₀.₉₉,  z₀.₉₉ = 2.3263

Training a chunk costs ``tokens × train_s_per_token``; a weight sync costs ``weight_sync_s`` (after draining the
engine, with ``weight_sync_drains``: :mod:`groupwise.sim.simulated_rollouts`).

Learning model. Prompt ``i`` has a hidden difficulty ``dᵢ ~ Normal(0, difficulty_spread)``. A completion
generated under weight version ``v`` is correct (raw reward 1, else 0) with probability::

    p(i, v) = sigmoid(initial_success_logit + S(v) / learning_rate_groups − dᵢ)

where ``S(v)`` counts the groups *with reward variance* trained in the steps before version ``v`` (a
zero-variance group has zero advantage and teaches nothing). Early on hard prompts give all-wrong groups,
late on easy prompts give all-right groups, so the zero-variance rate moves over a run as in DAPO runs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from groupwise.config.job_schema import JobSection
from groupwise.seeding import derive_seed
from groupwise.types import Prompt

if TYPE_CHECKING:
    from groupwise.config import RunConfig

Z_99 = 2.3263478740408408  # the standard normal's 99th percentile


def lognormal_sigma(p99_over_p50: float) -> float:
    """σ of a log-normal whose 99th percentile is ``p99_over_p50`` times its median: ``ln(r) / z₀.₉₉``."""
    if not p99_over_p50 >= 1.0:
        raise ValueError(f"p99/p50 ratio must be >= 1 (1 = every completion the same length), got {p99_over_p50}")
    return math.log(p99_over_p50) / Z_99


def sigmoid(x: float) -> float:
    """``1 / (1 + e^−x)``, without overflow for large ``|x|``."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@dataclass(frozen=True)
class SimWorkload:
    """Every parameter of the simulated generator and learner (the ``sim:`` section plus G and the seed)."""

    group_size: int
    seed: int = 0
    rollout_slots: int = 64
    length_median_tokens: float = 256.0
    length_p99_over_p50: float = 8.0
    prefill_s: float = 0.05
    per_token_s: float = 0.01
    train_s_per_token: float = 0.0002
    weight_sync_s: float = 1.0
    weight_sync_drains: bool = False
    infra_failure_rate: float = 0.0
    data_failure_rate: float = 0.0
    straggler_rate: float = 0.0
    straggler_factor: float = 5.0
    difficulty_spread: float = 2.0
    learning_rate_groups: float = 2000.0
    initial_success_logit: float = -1.0
    num_prompts: int = 2000
    job: JobSection | None = None  # the job model (``sim.job``); None = the toy cost model above
    updates_per_step: int = 1  # optimizer updates per RL step (K mini-batches × E epochs; the job model)
    epochs_per_step: int = 1

    def __post_init__(self) -> None:
        problems = []
        for name in ("group_size", "rollout_slots", "num_prompts"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prefill_s", "per_token_s", "train_s_per_token", "weight_sync_s", "difficulty_spread"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("infra_failure_rate", "data_failure_rate", "straggler_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")
        for name in ("length_median_tokens", "learning_rate_groups"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("length_p99_over_p50", "straggler_factor"):
            if not getattr(self, name) >= 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if problems:
            raise ValueError("invalid simulated workload: " + "; ".join(problems) + " (see docs/configs.md, `sim`)")

    @property
    def length_sigma(self) -> float:
        return lognormal_sigma(self.length_p99_over_p50)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> SimWorkload:
        """The workload of a ``RunConfig``: its ``sim`` section, ``grpo.num_generations_per_prompt``, ``run.seed``."""
        sim = cfg.sim.model_dump()
        for key in ("max_virtual_seconds", "write_fates", "job", "plan"):  # run controls and sections, not scalars
            sim.pop(key, None)
        opt = cfg.optimizer
        return cls(
            group_size=cfg.grpo.num_generations_per_prompt, seed=cfg.run.seed, job=resolved_job(cfg),
            updates_per_step=opt.mini_batches_per_step * opt.epochs_per_step, epochs_per_step=opt.epochs_per_step,
            **sim,
        )  # fmt: skip


def make_sim_prompts(workload: SimWorkload) -> tuple[list[Prompt], dict[str, float]]:
    """``num_prompts`` prompts ``sim/<i>`` and their hidden difficulties (seeded by the run seed).

    The difficulty is kept out of the prompt so the controller never sees it; only the simulated generator
    reads the returned mapping.
    """
    rng = random.Random(derive_seed("sim-difficulty", workload.seed))
    prompts, difficulty = [], {}
    for i in range(workload.num_prompts):
        uid = f"sim/{i}"
        prompts.append(Prompt(uid=uid, answer="", text=uid))
        difficulty[uid] = rng.gauss(0.0, workload.difficulty_spread)
    return prompts, difficulty


class LearningCurve:
    """``S(v)``: groups with reward variance trained before weight version ``v`` (versions start at 0)."""

    def __init__(self, initial_success_logit: float, learning_rate_groups: float) -> None:
        self.initial_success_logit = initial_success_logit
        self.learning_rate_groups = learning_rate_groups
        self._signal_before: list[int] = [0]  # index = version

    @property
    def latest_version(self) -> int:
        return len(self._signal_before) - 1

    def record_step(self, signal_groups: int) -> int:
        """One optimizer step trained ``signal_groups`` groups with variance; return the new version."""
        if signal_groups < 0:
            raise ValueError(f"signal_groups must be >= 0, got {signal_groups}")
        self._signal_before.append(self._signal_before[-1] + signal_groups)
        return self.latest_version

    def signal_groups(self, version: int) -> int:
        """``S(version)``; a version not reached yet is an error (the generator cannot run future weights)."""
        if not 0 <= version <= self.latest_version:
            raise ValueError(f"weight version {version} does not exist yet (latest is {self.latest_version})")
        return self._signal_before[version]

    def success_logit(self, version: int) -> float:
        """``initial_success_logit + S(version) / learning_rate_groups`` (before the prompt's difficulty)."""
        return self.initial_success_logit + self.signal_groups(version) / self.learning_rate_groups


def resolved_job(cfg: RunConfig) -> JobSection | None:
    """``cfg.sim.job`` with what it leaves to the run filled in: ``training.reference_forward`` (``null``) from
    ``loss.kl_coef > 0``, and a pipelined ``train_layout.micro_batches`` (``null``) as one sequence per
    micro-batch, ``⌈P · G / (K · data_parallel)⌉``."""
    job = cfg.sim.job
    if job is None:
        return None
    if job.training.reference_forward is None:
        training = job.training.model_copy(update={"reference_forward": cfg.loss.kl_coef > 0})
        job = job.model_copy(update={"training": training})
    layout = job.train_layout
    if layout.pipeline_parallel > 1 and layout.micro_batches is None:
        model_parallel = layout.tensor_parallel * layout.pipeline_parallel
        data_parallel = layout.data_parallel or max(1, job.cluster.train_gpus // model_parallel)
        sequences = cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt
        micro_batches = math.ceil(sequences / (cfg.optimizer.mini_batches_per_step * data_parallel))
        job = job.model_copy(update={"train_layout": layout.model_copy(update={"micro_batches": micro_batches})})
    return job
