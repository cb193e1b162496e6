"""`SimulatedRollouts`: a ``RolloutClient`` that generates nothing and takes virtual time as a real engine would.

One attempt at a prompt (see :mod:`groupwise.sim.workload` for the model):

1. draw G completion lengths (log-normal), G uniforms for correctness, and four for the attempt's fate
   (infra failure, the point where it fails, data failure, straggler);
2. book the G completions on the engine's slots (:class:`~groupwise.sim.slots.EngineSlots`) and sleep
   until the last one ends — a straggler's completions run ``straggler_factor`` times slower, an infra
   failure stops every completion at the same uniformly drawn fraction of its work;
3. raise :class:`SimulatedInfraFailure` (an ``InfraError``: retried with backoff) or, when scored,
   :class:`SimulatedDataFailure` (a data error), or return a :class:`SimulatedGroup` whose raw rewards are
   1 for a correct completion and 0 otherwise, correct with probability ``p(prompt, start_version)``.

Simulated completions carry no tokens (there is no model); their total length is
``SimulatedGroup.completion_tokens``, which ``num_completion_tokens`` reports, so the simulated learner
and the throughput metrics see the simulated lengths. Weight syncs take ``weight_sync_s``; completions in
flight keep running meanwhile (the ``RolloutClient`` contract allows it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from groupwise.controller.failures import InfraError
from groupwise.controller.interfaces import LoaderItem
from groupwise.sim.slots import EngineSlots
from groupwise.sim.variates import VariateStream
from groupwise.sim.workload import LearningCurve, SimWorkload, sigmoid
from groupwise.types import Completion, Group

FATE_DRAWS = 4  # infra failure?, where it fails, data failure?, straggler?


class SimulatedInfraFailure(InfraError):
    """An injected infrastructure failure of one simulated rollout attempt (``sim.infra_failure_rate``)."""


class SimulatedDataFailure(ValueError):
    """An injected data failure of one simulated rollout attempt (``sim.data_failure_rate``)."""


@dataclass
class SimulatedGroup(Group):
    """A :class:`Group` of simulated completions: no tokens, only their total simulated length."""

    completion_tokens: int = 0

    @property
    def num_completion_tokens(self) -> int:  # type: ignore[override]
        return self.completion_tokens


@dataclass
class GeneratorCounters:
    """What the simulated engine did, for the run summary."""

    attempts: int = 0
    returned_groups: int = 0
    infra_failures: int = 0
    data_failures: int = 0
    cancelled: int = 0
    stragglers: int = 0
    returned_tokens: int = 0
    zero_variance_groups: int = 0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SimulatedRollouts:
    """The simulated generator (see the module docstring). ``difficulty`` maps prompt uid → hidden difficulty."""

    def __init__(
        self,
        workload: SimWorkload,
        curve: LearningCurve,
        difficulty: Mapping[str, float],
        variates: VariateStream | None = None,
    ) -> None:
        self.workload = workload
        self.curve = curve
        self.difficulty = difficulty
        self.variates = variates or VariateStream(workload.seed, workload.length_median_tokens, workload.length_sigma)
        self.slots = EngineSlots(workload.rollout_slots)
        self.counters = GeneratorCounters()
        self.weight_version = 0
        self.sync_seconds = 0.0
        self._blank: dict[int, Completion] = {}
        self._logits: dict[int, float] = {}  # weight version → success logit (before difficulty)

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        w, counters = self.workload, self.counters
        G = w.group_size
        counters.attempts += 1
        lengths = self.variates.lengths(G)
        draws = self.variates.uniforms(G + FATE_DRAWS)
        infra, fail_at, data, straggler = draws[G:]
        scale = w.straggler_factor if straggler < w.straggler_rate else 1.0
        counters.stragglers += scale != 1.0
        failing = infra < w.infra_failure_rate
        if failing:
            scale *= fail_at
        loop = asyncio.get_running_loop()
        prefill, per_token = w.prefill_s * scale, w.per_token_s * scale
        end = self.slots.book(loop.time(), [prefill + length * per_token for length in lengths])
        # asyncio.sleep without its extra coroutine frame: one timer, one future (cheaper per simulated group).
        done = loop.create_future()
        timer = loop.call_at(end, _resolve, done)
        try:
            await done
        except asyncio.CancelledError:
            timer.cancel()
            counters.cancelled += 1
            raise
        uid = prompt.prompt.uid
        if failing:
            counters.infra_failures += 1
            raise SimulatedInfraFailure(f"simulated infrastructure failure of {uid!r} attempt {attempt}")
        if data < w.data_failure_rate:
            counters.data_failures += 1
            raise SimulatedDataFailure(f"simulated data failure of {uid!r} attempt {attempt} (scoring raised)")
        logit = self._logits.get(start_version)
        if logit is None:  # one learning-curve lookup per weight version, not per attempt
            logit = self._logits[start_version] = self.curve.success_logit(start_version)
        p = sigmoid(logit - self.difficulty[uid])
        rewards = [1.0 if u < p else 0.0 for u in draws[:G]]
        tokens = sum(lengths)
        correct = sum(rewards)
        counters.zero_variance_groups += correct == 0 or correct == G
        counters.returned_groups += 1
        counters.returned_tokens += tokens
        blank = self._blank.get(start_version) or self._blank_completion(start_version)
        return SimulatedGroup(
            group_id=group_id,
            prompt=prompt.prompt,
            prompt_token_ids=(),
            completions=[blank] * G,
            raw_rewards=rewards,
            rewards=list(rewards),
            start_version=start_version,
            end_version=self.weight_version,
            epoch=prompt.epoch,
            attempt=attempt,
            completion_tokens=tokens,
        )

    async def sync_weights(self, version: int) -> None:
        """Load the weights of ``version`` (its learning-curve point must exist): ``weight_sync_s`` seconds."""
        self.curve.signal_groups(version)  # raises for a version the learner has not produced
        if self.workload.weight_sync_s > 0:
            await asyncio.sleep(self.workload.weight_sync_s)
            self.sync_seconds += self.workload.weight_sync_s
        self.weight_version = version

    def _blank_completion(self, version: int) -> Completion:
        blank = self._blank.get(version)
        if blank is None:
            blank = self._blank[version] = Completion((), (), "", "stop", version)
        return blank
