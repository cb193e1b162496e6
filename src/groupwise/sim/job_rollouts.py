"""`JobRollouts` and `JobTrainer`: the ``RolloutClient`` and ``TrainerClient`` of the job model (``sim.job``).

One attempt at a prompt: draw G completion lengths under the attempt's start version
(:mod:`groupwise.sim.job_lengths`) and G uniforms for correctness, hand the completions to the replicas
(:class:`~groupwise.sim.job_engine.JobEngine`) and wait until the last one ends; rewards are 1 for a correct
completion and 0 otherwise, with the toy model's learning curve (:mod:`groupwise.sim.workload`). No failures or
stragglers are injected (``sim.job`` refuses those keys).

Weight syncs (:func:`~groupwise.sim.job_model.weight_sync_seconds`; the trainer waits for the transfer):

* partial rollouts on: the replicas hold decoding for the sync and the completions in flight go on under the new
  version (tokens split by version from the replicas' switch points); with ``async.partial_rollout_kv:
  recompute`` (default) each replica also prefills the context of every running sequence again, its KV cache
  having been dropped, as engines that abort and resume requests across a weight update do;
* partial rollouts off, ``sim.weight_sync_drains``: the sync first waits until no completion runs or waits;
* otherwise the engine keeps decoding the completions it holds under their old weights while the sync goes on.

`JobTrainer` charges a chunk the training FLOPs of its sequences and the training layout's communication per
token (:meth:`JobCosts.chunk_train_seconds`: update passes over every prompt + completion, and the old-logprob
forward when recomputed) and a step its optimizer updates (``K × E`` × :func:`~groupwise.sim.job_model.update_seconds`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from groupwise.controller.interfaces import LoaderItem
from groupwise.sim.job_engine import JobEngine, poll_seconds
from groupwise.sim.job_lengths import JobVariates, LengthModel
from groupwise.sim.job_model import JobCosts
from groupwise.sim.simulated_learner import SimulatedTrainer
from groupwise.sim.simulated_rollouts import GeneratorCounters, SimulatedGroup
from groupwise.sim.workload import LearningCurve, SimWorkload, sigmoid
from groupwise.types import NO_COST, Completion, GenerationCost, Group


@dataclass
class JobGroup(SimulatedGroup):
    """A simulated group that also carries its training FLOPs (one forward over every prompt + completion)."""

    forward_flops: float = 0.0
    sequence_tokens: int = 0  # prompt + completion tokens of its G sequences: the training communication


class JobRollouts:
    """The job model's simulated generator (see the module docstring)."""

    attributes_gen_seconds = True

    def __init__(
        self,
        workload: SimWorkload,
        curve: LearningCurve,
        difficulty: Mapping[str, float],
        *,
        partial_rollouts: bool = False,
        recompute_kv: bool = True,
    ) -> None:
        if workload.job is None:
            raise ValueError("JobRollouts needs a workload with a job (sim.job)")
        if partial_rollouts and workload.weight_sync_drains:
            raise ValueError("with partial rollouts no weight sync drains the engine; weight_sync_drains must be off")
        self.workload = workload
        self.costs = JobCosts.from_job(workload.job)
        self.lengths = LengthModel(workload.job.lengths)
        self.partial_rollouts = partial_rollouts
        self.recompute_kv = recompute_kv
        self.curve = curve
        self.difficulty = difficulty
        self.variates = JobVariates(workload.seed)
        self.engine = JobEngine(self.costs, poll_seconds(self.costs, self.lengths.start), partial_rollouts)
        self.slots = self.engine  # the meter's and summary's engine queries
        self.counters = GeneratorCounters()
        self.weight_version = 0
        self.sync_seconds = 0.0
        self.drain_seconds = 0.0
        self._cancelled: dict[int, GenerationCost] = {}
        self._blank: dict[int, Completion] = {}
        self._logits: dict[int, float] = {}

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        G, counters = self.workload.group_size, self.counters
        counters.attempts += 1
        lengths = self.lengths.lengths(self.variates.normals(G), start_version)
        draws = self.variates.uniforms(G)
        loop = asyncio.get_running_loop()
        ticket = self.engine.submit(lengths, loop.time())
        try:
            await ticket.future
        except asyncio.CancelledError:
            made = self.engine.cancel(ticket, loop.time())
            counters.cancelled += 1
            self._cancelled[group_id] = GenerationCost(round(made), ticket.occupied / self.engine.num_slots)
            raise
        tokens = sum(lengths)
        counters.generated_tokens += tokens
        uid = prompt.prompt.uid
        difficulty = self.difficulty[uid]
        mixes = [replica.version_tokens(seq, start_version) for replica, seq in ticket.sequences] \
            if self.partial_rollouts else []  # fmt: skip
        totals: dict[int, float] = {}
        for mix in mixes:
            for version, n in mix.items():
                totals[version] = totals.get(version, 0.0) + n
        version_tokens = tuple((v, round(n)) for v, n in sorted(totals.items()) if round(n) > 0)
        if len(version_tokens) > 1:
            logits = [self._mixed_logit(mix, start_version) for mix in mixes]
            rewards = [1.0 if u < sigmoid(x - difficulty) else 0.0 for u, x in zip(draws, logits, strict=True)]
        else:
            p = sigmoid(self._logit(start_version) - difficulty)
            rewards = [1.0 if u < p else 0.0 for u in draws]
            version_tokens = ()
        correct = sum(rewards)
        counters.zero_variance_groups += correct == 0 or correct == G
        counters.returned_groups += 1
        counters.returned_tokens += tokens
        blank = self._blank.get(start_version) or self._blank_completion(start_version)
        return JobGroup(
            group_id=group_id, prompt=prompt.prompt, prompt_token_ids=(), completions=[blank] * G,
            raw_rewards=rewards, rewards=list(rewards), start_version=start_version,
            end_version=self.weight_version, epoch=prompt.epoch, attempt=attempt, completion_tokens=tokens,
            gen_seconds=ticket.occupied / self.engine.num_slots, version_tokens=version_tokens,
            forward_flops=self.costs.sequences_forward_flops(lengths),
            sequence_tokens=G * self.costs.prompt_tokens + tokens,
        )  # fmt: skip

    def _mixed_logit(self, mix: dict[int, float], start_version: int) -> float:
        """The token-weighted mean success logit of one completion's versions."""
        total = sum(mix.values())
        if total <= 0:
            return self._logit(start_version)
        return sum(n * self._logit(v) for v, n in mix.items()) / total

    async def spent(self, group_id: int) -> GenerationCost:
        """What the engine had spent on a cancelled attempt (the tokens its completions had made)."""
        cost = self._cancelled.pop(group_id, NO_COST)
        self.counters.generated_tokens += cost.tokens
        return cost

    def _logit(self, version: int) -> float:
        logit = self._logits.get(version)
        if logit is None:
            logit = self._logits[version] = self.curve.success_logit(version)
        return logit

    async def sync_weights(self, version: int) -> None:
        """Load the weights of ``version`` (see the module docstring)."""
        self.curve.signal_groups(version)  # raises for a version the learner has not produced
        loop = asyncio.get_running_loop()
        if self.workload.weight_sync_drains:
            start = loop.time()
            await self.engine.drained()
            self.drain_seconds += loop.time() - start
        seconds = self.costs.sync_s
        if self.partial_rollouts:
            self.engine.pause(loop.time(), seconds, version, reprefill=self.recompute_kv)
        if seconds > 0:
            await asyncio.sleep(seconds)
            self.sync_seconds += seconds
        self.weight_version = version

    def _blank_completion(self, version: int) -> Completion:
        blank = self._blank[version] = Completion((), (), "", "stop", version)
        return blank


class JobTrainer(SimulatedTrainer):
    """The job model's simulated learner: training FLOPs per chunk, optimizer updates per step."""

    def __init__(self, workload: SimWorkload, curve: LearningCurve) -> None:
        super().__init__(workload, curve)
        if workload.job is None:
            raise ValueError("JobTrainer needs a workload with a job (sim.job)")
        self.costs = JobCosts.from_job(workload.job)

    def chunk_seconds(self, groups: Sequence[Group], tokens: int) -> float:
        job_groups = [_job_group(g) for g in groups]
        flops = sum(g.forward_flops for g in job_groups)
        sequence_tokens = sum(g.sequence_tokens for g in job_groups)
        return self.costs.chunk_train_seconds(flops, sequence_tokens, self.workload.epochs_per_step)

    def update_seconds(self) -> float:
        return self.workload.updates_per_step * self.costs.update_s


def _job_group(group: Group) -> JobGroup:
    if not isinstance(group, JobGroup):
        raise TypeError(f"the job trainer trains the job generator's groups, got {type(group).__name__}")
    return group
