"""`ScriptedRollouts`: a RolloutClient whose latency, rewards and failures are scripted per (prompt, attempt)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from groupwise.controller.failures import InfraError
from groupwise.types import Completion, Group


class ScriptedDataError(ValueError):
    """A data failure raised on purpose by the fake."""


class ScriptedInfraError(InfraError):
    """An infrastructure failure raised on purpose by the fake."""


@dataclass(frozen=True)
class Outcome:
    """One scripted attempt: wait ``latency`` virtual seconds, then fail or return a group.

    ``rewards`` None gives alternating 0/1 rewards (non-zero variance); a constant tuple is zero-variance.
    """

    latency: float = 1.0
    rewards: tuple[float, ...] | None = None
    fail: Literal["data", "infra"] | None = None


@dataclass
class RolloutCall:
    uid: str
    group_id: int
    attempt: int
    start_version: int
    started_at: float


@dataclass
class ScriptedRollouts:
    """``script[uid]`` lists outcomes per attempt (the last repeats); ``default`` covers unscripted prompts."""

    group_size: int
    script: dict[str, list[Outcome]] = field(default_factory=dict)
    default: Outcome = field(default_factory=Outcome)
    outcome_fn: Callable[[str, int], Outcome] | None = None
    sync_latency: float = 0.0
    calls: list[RolloutCall] = field(default_factory=list)
    syncs: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)

    def outcome(self, uid: str, attempt: int) -> Outcome:
        if self.outcome_fn is not None:
            return self.outcome_fn(uid, attempt)
        outcomes = self.script.get(uid)
        if not outcomes:
            return self.default
        return outcomes[min(attempt, len(outcomes) - 1)]

    async def rollout(self, prompt: Any, group_id: int, attempt: int, start_version: int) -> Group:
        uid = prompt.prompt.uid
        loop = asyncio.get_running_loop()
        self.calls.append(RolloutCall(uid, group_id, attempt, start_version, loop.time()))
        outcome = self.outcome(uid, attempt)
        await asyncio.sleep(outcome.latency)
        if outcome.fail == "data":
            raise ScriptedDataError(f"scripted data failure of {uid} attempt {attempt}")
        if outcome.fail == "infra":
            raise ScriptedInfraError(f"scripted infra failure of {uid} attempt {attempt}")
        rewards = (
            list(outcome.rewards) if outcome.rewards is not None else [float(i % 2) for i in range(self.group_size)]
        )
        if len(rewards) != self.group_size:
            rewards = (rewards * self.group_size)[: self.group_size]
        completions = [
            Completion(
                token_ids=(1, 2),
                logprobs=(-0.5, -0.7),
                text=f"{uid}#{i}",
                finish_reason="stop",
                weight_version=start_version,
            )
            for i in range(self.group_size)
        ]
        self.finished.append(group_id)
        return Group(
            group_id=group_id,
            prompt=prompt.prompt,
            prompt_token_ids=(7,),
            completions=completions,
            raw_rewards=rewards,
            rewards=list(rewards),
            start_version=start_version,
            end_version=start_version,
            epoch=prompt.epoch,
            attempt=attempt,
        )

    async def sync_weights(self, version: int) -> None:
        self.syncs.append(version)
        if self.sync_latency:
            await asyncio.sleep(self.sync_latency)
