"""Engine batching never mixes outcomes: a randomised search over batch sizes, arrivals and failing verifiers.

The embedded runtime batches whatever rollout requests are waiting into one engine call (the Ray runtime does the
same per worker call), and ``RolloutWorker.generate_group_outcomes`` scores each group on its own. Hypothesis draws
how many prompts arrive, in how many waves, the engine call size, and which prompts' verifiers raise; pinned:
- every request gets exactly its own outcome: a group of its own prompt and group id, or a ``RewardError`` naming
  its own prompt and no other;
- a failing verifier never fails another prompt, whatever batch the two share;
- an engine call that raises fails every request of that call (and only those), with the engine's error.
"""

from __future__ import annotations

import asyncio
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groupwise.data.loader import LoadedPrompt
from groupwise.data.scoring import RewardError
from groupwise.runtime.embedded import EmbeddedRollouts
from groupwise.trainer.rollout import RolloutWorker
from groupwise.types import Completion, Prompt, SamplingParams

G = 2


class ListGenerator:
    """Returns G fixed completions per request; raises for calls that include a request flagged ``boom``."""

    version = 0

    def __init__(self, boom: set[tuple[int, ...]]) -> None:
        self.boom = boom
        self.calls: list[list[tuple[int, ...]]] = []

    def generate(self, requests, sampling):
        self.calls.append([request.prompt_token_ids for request in requests])
        if any(request.prompt_token_ids in self.boom for request in requests):
            raise RuntimeError("engine fault")
        return [[Completion((1,), (-0.1,), f"c{i}", "stop", 0) for i in range(G)] for _ in requests]


def worker_for(uids: list[str], failing: set[str], boom: set[str]) -> RolloutWorker:
    ids = {uid: (index,) for index, uid in enumerate(uids)}

    def verifier(prompt, completion):
        if prompt.uid in failing:
            raise ValueError(f"cannot verify {prompt.uid}")
        return float(completion.text == "c0")

    worker = RolloutWorker(ListGenerator({ids[uid] for uid in boom}), None, verifier, SamplingParams(), G, run_seed=0)
    worker._encoded.update(ids)  # no tokenizer needed
    return worker


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 24))
    uids = [f"q/{i}" for i in range(n)]
    failing = set(draw(st.lists(st.sampled_from(uids), max_size=n)))
    boom = set(draw(st.lists(st.sampled_from(uids), max_size=2))) if draw(st.booleans()) else set()
    waves = draw(st.lists(st.integers(1, n), min_size=1, max_size=4))
    return uids, failing, boom, waves, draw(st.integers(1, 8))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_each_request_gets_its_own_outcome(schedule):
    uids, failing, boom, waves, batch = schedule
    worker = worker_for(uids, failing, boom)
    rollouts = EmbeddedRollouts(worker, weights=None, max_batch_groups=batch)

    async def main():
        pending, start = [], 0
        for size in waves:  # requests arrive in waves, so engine calls mix prompts of different waves
            for uid in uids[start : start + size]:
                item = LoadedPrompt(Prompt(uid=uid, answer="", text=uid), epoch=0, index_in_epoch=0)
                pending.append(asyncio.ensure_future(rollouts.rollout(item, len(pending), 0, 0)))
            start += size
            await asyncio.sleep(0)
        for uid in uids[start:]:
            item = LoadedPrompt(Prompt(uid=uid, answer="", text=uid), epoch=0, index_in_epoch=0)
            pending.append(asyncio.ensure_future(rollouts.rollout(item, len(pending), 0, 0)))
        try:
            return await asyncio.gather(*pending, return_exceptions=True)
        finally:
            await rollouts.close()

    outcomes = asyncio.run(main())
    engine_failed = {uid for uid, out in zip(uids, outcomes, strict=True) if str(out) == "engine fault"}
    faulting_calls = [call for call in worker.generator.calls if any(ids in worker.generator.boom for ids in call)]
    assert engine_failed == {uids[ids[0]] for call in faulting_calls for ids in call}  # exactly those calls' requests
    for group_id, (uid, outcome) in enumerate(zip(uids, outcomes, strict=True)):
        if uid in engine_failed:
            continue
        if uid in failing:  # a verifier failure fails only its own prompt, naming it alone
            assert isinstance(outcome, RewardError) and outcome.prompt_uid == uid
            assert set(re.findall(r"q/\d+", str(outcome))) == {uid}
        else:
            assert outcome.prompt.uid == uid and outcome.group_id == group_id and len(outcome.completions) == G
