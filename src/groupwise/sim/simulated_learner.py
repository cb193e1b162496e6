"""`SimulatedTrainer`: a ``TrainerClient`` whose chunks take virtual time proportional to their tokens.

``train_chunk`` sleeps ``completion tokens × train_s_per_token``; ``finish_step`` (the optimizer step)
advances the :class:`~groupwise.sim.workload.LearningCurve` by the step's groups with reward variance, so
the next weight version generates more correct completions. It checks the call protocol the controller
promises (first chunk flagged, no chunk after its step finished, one ``finish_step`` per step) so a
simulated run also exercises that contract.
"""

from __future__ import annotations

import asyncio

from groupwise.chunks import TrainChunk
from groupwise.sim.workload import LearningCurve, SimWorkload


class TrainerProtocolError(AssertionError):
    """The controller called the trainer out of order (a bug in the controller)."""


class SimulatedTrainer:
    """The simulated learner (see the module docstring). ``busy_seconds`` is the total training time."""

    def __init__(self, workload: SimWorkload, curve: LearningCurve) -> None:
        self.workload = workload
        self.curve = curve
        self.busy_seconds = 0.0
        self.trained_groups = 0
        self.trained_tokens = 0
        self._open_step: int | None = None
        self._step_tokens = 0
        self._step_signal = 0
        self._step_seconds = 0.0

    async def train_chunk(self, step: int, chunk: TrainChunk, first_chunk: bool) -> None:
        groups = chunk.groups
        if first_chunk != (self._open_step is None) or (self._open_step not in (None, step)):
            raise TrainerProtocolError(
                f"train_chunk(step={step}, first_chunk={first_chunk}) while step {self._open_step} is open"
            )
        if step != self.curve.latest_version:
            raise TrainerProtocolError(
                f"train_chunk for step {step} but the learner is at version {self.curve.latest_version}"
            )
        if first_chunk:
            self._open_step, self._step_tokens, self._step_signal, self._step_seconds = step, 0, 0, 0.0
        tokens = sum(g.num_completion_tokens for g in groups)
        seconds = tokens * self.workload.train_s_per_token
        self._step_tokens += tokens
        self._step_signal += sum(1 for g in groups if max(g.raw_rewards) != min(g.raw_rewards))
        self._step_seconds += seconds
        self.trained_groups += len(groups)
        self.trained_tokens += tokens
        self.busy_seconds += seconds
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def finish_step(self, step: int) -> dict[str, float]:
        """The optimizer step: the learning curve gains this step's groups with variance."""
        if self._open_step != step:
            raise TrainerProtocolError(f"finish_step({step}) but the open step is {self._open_step}")
        self._open_step = None
        self.curve.record_step(self._step_signal)
        seconds, tokens = self._step_seconds, self._step_tokens
        return {
            "perf/train_seconds": seconds,
            "perf/train_tokens": float(tokens),
            "perf/train_tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        }
