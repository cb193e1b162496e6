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
and the throughput metrics see the simulated lengths.

Weight syncs take ``weight_sync_s``. What happens to the completions in flight meanwhile:

* partial rollouts off (the default): they keep running under the version they started with, all their tokens
  of ``start_version`` (the ``RolloutClient`` contract allows it). With ``sim.weight_sync_drains`` the sync first
  waits until every booked completion has ended (an engine with one copy of the weights finishes what it
  accepted before it loads the next), so the long tail of the lengths stalls the trainer at every sync;
* partial rollouts on (``async.partial_rollouts: continue``): the sync does not wait, and when it ends the
  completions in flight go on under the new version: a completion's tokens are split by version
  (:mod:`groupwise.sim.token_timing`; ``SimulatedGroup.version_tokens``), and its chance of being correct uses the
  token-weighted mean of the versions' success logits. Rebuilding the rows' KV cache under the new weights is
  not charged (one prefill of prompt + tokens so far per live row in a real engine).

Costs (:mod:`groupwise.algo.waste`): an attempt's tokens are those its completions produced (an infrastructure
failure stops part-way) and its seconds the slot-seconds they occupied ÷ ``rollout_slots``, its share of the
engine's capacity. A cancelled attempt costs its whole booking (the engine finishes and discards it), reported
through :meth:`SimulatedRollouts.spent` when the controller asks (it does for aborts, not at shutdown).
``counters.generated_tokens`` counts what the engine handed back (returned, failed, or spent after an abort).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from groupwise.controller.failures import InfraError
from groupwise.controller.interfaces import LoaderItem
from groupwise.sim.slots import EngineSlots
from groupwise.sim.token_timing import tokens_by, version_counts
from groupwise.sim.variates import VariateStream
from groupwise.sim.workload import LearningCurve, SimWorkload, sigmoid
from groupwise.types import NO_COST, Completion, GenerationCost, Group, attach_cost

FATE_DRAWS = 4  # infra failure?, where it fails, data failure?, straggler?


class SimulatedInfraFailure(InfraError):
    """An injected infrastructure failure of one simulated rollout attempt (``sim.infra_failure_rate``)."""


class SimulatedDataFailure(ValueError):
    """An injected data failure of one simulated rollout attempt (``sim.data_failure_rate``)."""


@dataclass
class SimulatedGroup(Group):
    """A :class:`Group` of simulated completions: no tokens, only their total simulated length.

    ``version_tokens``: ``((version, tokens), ...)`` over its completions when a weight update reached them in
    flight (partial rollouts); empty when every token is of ``start_version``."""

    completion_tokens: int = 0
    version_tokens: tuple[tuple[int, int], ...] = ()

    @property
    def num_completion_tokens(self) -> int:
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
    generated_tokens: int = 0
    zero_variance_groups: int = 0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _merged(mixes: list[list[tuple[int, int]]]) -> tuple[tuple[int, int], ...]:
    """Tokens per version summed over a group's completions, oldest version first."""
    totals: dict[int, int] = {}
    for mix in mixes:
        for version, tokens in mix:
            totals[version] = totals.get(version, 0) + tokens
    return tuple(sorted(totals.items()))


class SimulatedRollouts:
    """The simulated generator (see the module docstring). ``difficulty`` maps prompt uid → hidden difficulty."""

    #: Each group's ``gen_seconds`` is set here (its share of the engine's capacity), in sync mode as in async.
    attributes_gen_seconds = True

    def __init__(
        self,
        workload: SimWorkload,
        curve: LearningCurve,
        difficulty: Mapping[str, float],
        variates: VariateStream | None = None,
        *,
        partial_rollouts: bool = False,
    ) -> None:
        if partial_rollouts and workload.weight_sync_drains:
            raise ValueError("with partial rollouts no weight sync drains the engine; weight_sync_drains must be off")
        self.workload = workload
        self.partial_rollouts = partial_rollouts
        self.curve = curve
        self.difficulty = difficulty
        self.variates = variates or VariateStream(workload.seed, workload.length_median_tokens, workload.length_sigma)
        self.slots = EngineSlots(workload.rollout_slots)
        self.counters = GeneratorCounters()
        self.weight_version = 0
        self.sync_seconds = 0.0
        self.drain_seconds = 0.0
        self._switches: list[tuple[float, int]] = []  # partial rollouts: (time, version) a sync reached the engine
        self._cancelled: dict[int, GenerationCost] = {}  # cancelled attempts' costs, until spent() reports them
        self._blank: dict[int, Completion] = {}
        self._logits: dict[int, float] = {}  # weight version → success logit (before difficulty)

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        w, counters = self.workload, self.counters
        G = w.group_size
        counters.attempts += 1
        lengths = self.variates.lengths(G)
        draws = self.variates.uniforms(G + FATE_DRAWS)
        infra, fail_at, data, straggler = draws[G:]
        straggling = straggler < w.straggler_rate
        scale = w.straggler_factor if straggling else 1.0
        counters.stragglers += scale != 1.0
        failing = infra < w.infra_failure_rate
        if failing:
            scale *= fail_at
        loop = asyncio.get_running_loop()
        prefill, per_token = w.prefill_s * scale, w.per_token_s * scale
        durations = [prefill + length * per_token for length in lengths]
        starts: list[float] | None = [] if failing or self.partial_rollouts else None
        end = self.slots.book(loop.time(), durations, starts)
        switched = len(self._switches)
        tokens = self._tokens_before_failure(starts, durations, lengths, straggling) if failing else sum(lengths)
        cost = GenerationCost(tokens, sum(durations) / self.slots.num_slots)
        # asyncio.sleep without its extra coroutine frame: one timer, one future (cheaper per simulated group).
        done = loop.create_future()
        timer = loop.call_at(end, _resolve, done)
        try:
            await done
        except asyncio.CancelledError:
            timer.cancel()
            counters.cancelled += 1
            self._cancelled[group_id] = cost
            raise
        counters.generated_tokens += cost.tokens
        uid = prompt.prompt.uid
        self._raise_drawn_failure(uid, attempt, cost, failing, data < w.data_failure_rate)
        rewards, version_tokens = self._draw_rewards(uid, draws[:G], start_version, starts, lengths, prefill,
                                                     per_token, switched)  # fmt: skip
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
            gen_seconds=cost.seconds,
            version_tokens=version_tokens,
        )

    def _raise_drawn_failure(
        self, uid: str, attempt: int, cost: GenerationCost, infra_failed: bool, data_failed: bool
    ) -> None:
        """Raise the failure the attempt drew (infrastructure first: it ends generation before scoring), carrying
        the tokens it spent; return when it drew none."""
        if infra_failed:
            self.counters.infra_failures += 1
            raise attach_cost(SimulatedInfraFailure(f"simulated infrastructure failure of {uid!r} attempt {attempt}"),
                              cost)  # fmt: skip
        if data_failed:
            self.counters.data_failures += 1
            raise attach_cost(SimulatedDataFailure(
                f"simulated data failure of {uid!r} attempt {attempt} (scoring raised)"), cost)  # fmt: skip

    def _tokens_before_failure(
        self, starts: list[float] | None, durations: Sequence[float], lengths: Sequence[int], straggling: bool
    ) -> int:
        """The tokens a failed attempt made: the failure stopped every completion part-way (its booking shortened by
        the failure's fraction), and each had made what its own pace allows by then."""
        assert starts is not None
        w = self.workload
        pace = w.straggler_factor if straggling else 1.0
        prefill, per_token = w.prefill_s * pace, w.per_token_s * pace
        spans = zip(starts, durations, lengths, strict=True)
        return sum(tokens_by(t + d, t, prefill, per_token, n) for t, d, n in spans)

    def _draw_rewards(
        self,
        uid: str,
        uniforms: Sequence[float],
        start_version: int,
        starts: list[float] | None,
        lengths: Sequence[int],
        prefill: float,
        per_token: float,
        switched: int,
    ) -> tuple[list[float], tuple[tuple[int, int], ...]]:
        """Each completion's 0/1 reward, 1 when its uniform draw is below ``sigmoid(logit − difficulty)``, and the
        tokens per weight version. Without a weight load during the attempt the logit is the start version's; with
        partial rollouts and loads (the switches recorded after the first ``switched``) it is the token-weighted
        mean of the versions that made it."""
        difficulty = self.difficulty[uid]
        if self.partial_rollouts and len(self._switches) > switched:
            switches = self._switches[switched:]
            assert starts is not None
            mixes = [version_counts(t, prefill, per_token, n, start_version, switches)
                     for t, n in zip(starts, lengths, strict=True)]  # fmt: skip
            logits = [sum(n * self._logit(v) for v, n in mix) / max(1, sum(n for _, n in mix)) for mix in mixes]
            rewards = [1.0 if u < sigmoid(x - difficulty) else 0.0 for u, x in zip(uniforms, logits, strict=True)]
            return rewards, _merged(mixes)
        p = sigmoid(self._logit(start_version) - difficulty)
        return [1.0 if u < p else 0.0 for u in uniforms], ()

    async def spent(self, group_id: int) -> GenerationCost:
        """What the engine spent on a cancelled attempt (its whole booking; nothing if it never was booked)."""
        cost = self._cancelled.pop(group_id, NO_COST)
        self.counters.generated_tokens += cost.tokens
        return cost

    def _logit(self, version: int) -> float:
        logit = self._logits.get(version)
        if logit is None:  # one learning-curve lookup per weight version, not per attempt
            logit = self._logits[version] = self.curve.success_logit(version)
        return logit

    async def sync_weights(self, version: int) -> None:
        """Load the weights of ``version`` (its learning-curve point must exist): ``weight_sync_s`` seconds, after
        the engine drained when ``weight_sync_drains`` (see the module docstring)."""
        self.curve.signal_groups(version)  # raises for a version the learner has not produced
        loop = asyncio.get_running_loop()
        if self.workload.weight_sync_drains:
            while (wait := self.slots.all_done_at - loop.time()) > 0:
                await asyncio.sleep(wait)
                self.drain_seconds += wait
        if self.workload.weight_sync_s > 0:
            await asyncio.sleep(self.workload.weight_sync_s)
            self.sync_seconds += self.workload.weight_sync_s
        self.weight_version = version
        if self.partial_rollouts:
            self._switches.append((loop.time(), version))

    def _blank_completion(self, version: int) -> Completion:
        blank = self._blank.get(version)
        if blank is None:
            blank = self._blank[version] = Completion((), (), "", "stop", version)
        return blank
