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
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from groupwise.controller.failures import InfraError
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
        self.variates = variates if variates is not None else VariateStream(workload.seed)
        self.slots = EngineSlots(workload.rollout_slots)
        self.counters = GeneratorCounters()
        self.weight_version = 0
        self.sync_seconds = 0.0
        self._blank: dict[int, Completion] = {}
        self._sigma = workload.length_sigma

    async def rollout(self, prompt: Any, group_id: int, attempt: int, start_version: int) -> Group:
        w, counters = self.workload, self.counters
        G = w.group_size
        counters.attempts += 1
        lengths = self._lengths(self.variates.normals(G))
        draws = self.variates.uniforms(G + FATE_DRAWS)
        infra, fail_at, data, straggler = draws[G:]
        scale = w.straggler_factor if straggler < w.straggler_rate else 1.0
        counters.stragglers += scale != 1.0
        failing = infra < w.infra_failure_rate
        if failing:
            scale *= fail_at
        loop = asyncio.get_running_loop()
        now = loop.time()
        end = self.slots.book(now, [(w.prefill_s + length * w.per_token_s) * scale for length in lengths])
        try:
            await asyncio.sleep(end - now)
        except asyncio.CancelledError:
            counters.cancelled += 1
            raise
        uid = prompt.prompt.uid
        if failing:
            counters.infra_failures += 1
            raise SimulatedInfraFailure(f"simulated infrastructure failure of {uid!r} attempt {attempt}")
        if data < w.data_failure_rate:
            counters.data_failures += 1
            raise SimulatedDataFailure(f"simulated data failure of {uid!r} attempt {attempt} (scoring raised)")
        p = sigmoid(self.curve.success_logit(start_version) - self.difficulty[uid])
        rewards = [1.0 if u < p else 0.0 for u in draws[:G]]
        tokens = sum(lengths)
        correct = sum(rewards)
        counters.zero_variance_groups += correct == 0 or correct == G
        counters.returned_groups += 1
        counters.returned_tokens += tokens
        return SimulatedGroup(
            group_id=group_id,
            prompt=prompt.prompt,
            prompt_token_ids=(),
            completions=[self._blank_completion(start_version)] * G,
            raw_rewards=rewards,
            rewards=list(rewards),
            start_version=start_version,
            epoch=getattr(prompt, "epoch", 0),
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

    def _lengths(self, normals: list[float]) -> list[int]:
        median, sigma, exp = self.workload.length_median_tokens, self._sigma, math.exp
        return [max(1, round(median * exp(sigma * z))) for z in normals]

    def _blank_completion(self, version: int) -> Completion:
        blank = self._blank.get(version)
        if blank is None:
            blank = self._blank[version] = Completion((), (), "", "stop", version)
        return blank
