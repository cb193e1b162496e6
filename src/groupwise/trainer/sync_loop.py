"""The sync GRPO/DAPO loop, readable top to bottom, generic over its rollout and trainer clients.

Each step: rounds of ``round_size`` = ``ceil(P × batch_multiplier)`` prompts (:mod:`groupwise.algo.step_size`) →
G completions each, scored by the rollout client (raw, scaled, shaped rewards) → per-group zero-variance filter
(dynamic sampling) → accumulate kept groups until P → the trainer client computes advantages on the trained
groups and takes one optimizer step → the new weights go to the generator → the caller's step hook (metrics,
train data, evaluation, checkpoint). With dynamic sampling off it is plain GRPO.

The loop talks to the two seams the async controller talks to (``groupwise.controller.interfaces``): a
``RolloutClient`` (``rollout`` one prompt group, ``sync_weights``) and a ``TrainerClient`` (``train_chunk``,
``finish_step``; here one chunk per step). A round's rollouts are requested together and awaited together, so
generation and training strictly alternate. The trainer (:mod:`groupwise.runtime.sync_run`) plugs in the engine
and the learner, in-process or on Ray; the simulator (:mod:`groupwise.sim.simulation`) plugs in the simulated
generator and learner and runs this same loop in virtual time.

Pre-filter data (every generated row's reward) lives in the step tally, never in the training rows, so the
unfiltered metric cannot be misaligned with what was trained. Every generated group gets a line in fates.jsonl
(trained, filtered, discarded or carried; pending when its step is never trained), written before the step hook
runs (and so before the step's checkpoint), so a resume rolls the file back to exactly the checkpointed steps. A
round whose generation call raises ends the run, and its prompts get lines too: the one whose reward function or
environment failed ``failed``/``fatal``, the others ``pending``.

With a prompt source that skips prompts predicted to carry no signal (``SkipsNoSignal``: ``data.skip_no_signal``),
a round still holds ``round_size`` prompts: the source drew more in their place. Each skipped draw gets its
``skipped_no_signal`` line right after the take, and every generated group's outcome goes back to the source
when its round returns (before the filter, so filtered groups count too).

Generation cost (:mod:`groupwise.algo.waste`): a round is one generator call, so each group of a round is
attributed the round's seconds pro rata by completion tokens (they add up to ``perf/gen_seconds``), unless the
rollout client attributes them itself (a ``SelfTimedRollouts``: the simulator, whose engine has no calls).
Every group counts as generated when its round returns and as settled when its fate line is written (trained,
filtered, discarded; pending when the run stops; a carried group settles in the step that takes it). The step's
``waste/*`` metrics come from :attr:`TrainerState.generation`, which a checkpoint keeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.algo.accumulator import DynamicSamplingAccumulator, DynamicSamplingExhausted, StepSelection
from groupwise.algo.step_size import round_size
from groupwise.algo.tally import StepTally
from groupwise.algo.waste import SYNC_WASTE_FATES, GenerationAccount, split_call_seconds
from groupwise.chunks import TrainChunk, step_chunk
from groupwise.controller.interfaces import SelfTimedRollouts, SkipsNoSignal  # shared protocols, not the controller
from groupwise.data.scoring import RewardError
from groupwise.run.fates_file import write_sync_step_fates, write_untrained_step_fates
from groupwise.types import Group, cost_of, group_from_dict, group_to_dict

if TYPE_CHECKING:
    from groupwise.config import GrpoSection
    from groupwise.controller.interfaces import LoaderItem, PromptSource, RolloutClient, TrainerClient
    from groupwise.data.signal_history import SkippedDraw
    from groupwise.run.fates_file import FatesWriter

DATA_RAN_OUT = "the data ran out (max_epochs) before the step filled"
DS_GAVE_UP = "dynamic sampling exhausted its rounds; the run failed"
DS_STOPPED = "dynamic sampling exhausted its rounds; the run stopped there (stop_when_exhausted)"


@dataclass
class TrainerState:
    """Counters a checkpoint must restore for resume to equal continuing."""

    step: int = 0
    next_group_id: int = 0
    carried: list[Group] = field(default_factory=list)
    generation: GenerationAccount = field(default_factory=GenerationAccount)

    def next_group_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_group_id, self.next_group_id + n))
        self.next_group_id += n
        return ids

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "next_group_id": self.next_group_id,
            "carried": [group_to_dict(g) for g in self.carried],
            "generation": self.generation.state_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        state = cls(
            step=int(data["step"]),
            next_group_id=int(data["next_group_id"]),
            carried=[group_from_dict(g) for g in data.get("carried", [])],
        )
        if "generation" in data:  # absent in checkpoints written before costs were counted: they start at 0
            state.generation.load_state_dict(data["generation"])
        return state


@dataclass
class SyncStep:
    """One trained step, as the step hook sees it (``state.step`` already counts it)."""

    step: int
    metrics: dict[str, float]  # the trainer's step metrics and the step tally's
    chunk: TrainChunk  # the trained groups (carried-in ones first) and their advantages: the step's one chunk
    tally: StepTally
    started: float  # the loop clock when the step began
    gen_seconds: float  # loop-clock seconds spent in the step's generation rounds
    gen_tokens: int

    @property
    def trained(self) -> list[Group]:
        return list(self.chunk.groups)


SyncStepHook = Callable[[SyncStep], "Awaitable[None] | None"]


@dataclass
class _Collected:
    selection: StepSelection
    generated: list[Group]  # every group generated for the step (all rounds), for fates
    gen_seconds: float
    gen_tokens: int


class SyncLoop:
    """The sync loop over ``rollouts`` and ``trainer`` (see the module docstring); ``state`` is updated in place.

    ``fates`` (optional) receives the step's ``fates.jsonl`` lines; ``on_step_end`` runs after each trained step,
    once the new weights are with the generator.
    """

    def __init__(
        self,
        grpo: GrpoSection,
        loader: PromptSource,
        rollouts: RolloutClient,
        trainer: TrainerClient,
        state: TrainerState,
        *,
        on_step_end: SyncStepHook | None = None,
        fates: FatesWriter | None = None,
    ) -> None:
        self.grpo = grpo
        self.loader = loader
        self.rollouts = rollouts
        self.trainer = trainer
        self.state = state
        self.on_step_end = on_step_end
        self.fates = fates
        self._lines = SettlingFates(fates, state)
        self._skipping = loader if isinstance(loader, SkipsNoSignal) else None
        ds = grpo.dynamic_sampling
        self.round_size = round_size(grpo.num_prompts_per_step, ds.batch_multiplier, ds.enabled)
        self.no_signal: str | None = None  # why dynamic sampling could not fill the step that stopped the run

    async def run(self, max_steps: int) -> str:
        """Train from ``state.step`` to ``max_steps``: ``"max_steps"``, ``"exhausted"`` when the data ran out first,
        or ``"no_signal"`` when a step could not be filled and ``stop_when_exhausted`` is on (:attr:`no_signal` says
        why). Otherwise :class:`DynamicSamplingExhausted` propagates, after the step's fates."""
        await self.rollouts.sync_weights(self.state.step)  # the generator holds the weights it generates for
        while self.state.step < max_steps:
            if not await self.train_step():
                return "exhausted" if self.no_signal is None else "no_signal"
        return "max_steps"

    async def train_step(self) -> bool:
        """One RL step = one optimizer step. Returns False when the step could not fill and the run stops: the
        data ran out, or dynamic sampling did and ``stop_when_exhausted`` is on."""
        clock = asyncio.get_running_loop().time
        step, started = self.state.step, clock()
        collected = await self._collect(step)
        if collected is None:
            return False
        selection = collected.selection
        chunk = step_chunk(selection.trained, self.grpo)  # advantages of exactly the trained groups
        try:
            await self.trainer.train_chunk(step, chunk, True)
            metrics = await self.trainer.finish_step(step)
        except Exception as err:  # the step's optimizer step never ran: its groups are pending, saying why
            groups, reason = [*self.state.carried, *collected.generated], _failed("its optimizer step", err)
            write_untrained_step_fates(self._lines, step, groups, selection.filtered, reason)
            raise
        write_sync_step_fates(
            self._lines, step, collected.generated, selection.trained, selection.surplus, selection.surplus_carried,
            selection.filtered,
        )  # fmt: skip
        await self.rollouts.sync_weights(step + 1)
        self.state.carried = selection.carry_over
        self.state.step = step + 1
        metrics.update(selection.tally.metrics())
        metrics.update(self.state.generation.step_metrics(SYNC_WASTE_FATES))
        if self.on_step_end is not None:
            done = SyncStep(
                step, metrics, chunk, selection.tally, started, collected.gen_seconds, collected.gen_tokens
            )
            outcome = self.on_step_end(done)
            if outcome is not None:
                await outcome
        return True

    async def _collect(self, step: int) -> _Collected | None:
        """Generate rounds until P groups with signal are kept (or the round budget or the data runs out)."""
        clock = asyncio.get_running_loop().time
        accumulator = self._accumulator()
        generated: list[Group] = []
        gen_seconds, gen_tokens = 0.0, 0
        # Not `while True`: groups carried in from the previous step may already fill this one (no round needed).
        while accumulator.can_generate_more:
            items = self.loader.take(self.round_size)
            if self._skipping is not None:
                self._lines.write_skipped(self._skipping.drain_skipped())
            if not items:
                # Carried groups get their pending line from record_carried_at_end, after the last checkpoint.
                write_untrained_step_fates(self._lines, step, generated, accumulator.filtered, DATA_RAN_OUT)
                return None
            started, ids = clock(), self.state.next_group_ids(len(items))
            try:
                groups = await self._generate_round(step, items, ids)
            except Exception as err:  # the earlier rounds' groups will never train: pending, saying why
                reason = _failed("a generation round", err)
                write_untrained_step_fates(self._lines, step, generated, accumulator.filtered, reason)
                self._lines.write_failed_round(step, items, ids, err, f"step {step} was not trained: {reason}")
                raise
            round_seconds = clock() - started
            if self._skipping is not None:
                for group in groups:
                    self._skipping.observe(group)
            gen_seconds += round_seconds
            self._count_generated(groups, round_seconds)
            gen_tokens += sum(g.num_completion_tokens for g in groups)
            generated += groups
            accumulator.add_round(groups)
        try:
            selection = accumulator.finish()
        except DynamicSamplingExhausted as err:
            if not self.grpo.dynamic_sampling.stop_when_exhausted:
                groups = [*self.state.carried, *generated]
                write_untrained_step_fates(self._lines, step, groups, accumulator.filtered, DS_GAVE_UP)
                raise
            # The run ends as finished: carried groups stay carried (record_carried_at_end writes their line after
            # the last checkpoint, and a resume trains them), as when the data runs out.
            write_untrained_step_fates(self._lines, step, generated, accumulator.filtered, DS_STOPPED)
            self.no_signal = str(err)
            return None
        return _Collected(selection, generated, gen_seconds, gen_tokens)

    async def _generate_round(self, step: int, items: Sequence[LoaderItem], ids: Sequence[int]) -> list[Group]:
        """Every prompt of the round requested at once (attempt 0, under the step's weights), in order."""
        calls = [self.rollouts.rollout(item, gid, 0, step) for item, gid in zip(items, ids, strict=True)]
        return list(await asyncio.gather(*calls))

    def _count_generated(self, groups: list[Group], round_seconds: float) -> None:
        """Attribute the round's seconds to its groups pro rata by tokens (unless the client did); count them as
        generated."""
        if not isinstance(self.rollouts, SelfTimedRollouts):
            shares = split_call_seconds(round_seconds, [g.num_completion_tokens for g in groups])
            for group, seconds in zip(groups, shares, strict=True):
                group.gen_seconds = seconds
        for group in groups:
            self.state.generation.generated(group.num_completion_tokens, group.gen_seconds)

    def _accumulator(self) -> DynamicSamplingAccumulator:
        ds = self.grpo.dynamic_sampling
        return DynamicSamplingAccumulator(
            num_prompts_per_step=self.grpo.num_prompts_per_step,
            group_filter=self.grpo.group_filter(),
            max_gen_rounds=ds.max_gen_rounds if ds.enabled else 1,
            on_exhausted=ds.on_exhausted,
            min_step_batch_fraction=ds.min_step_batch_fraction,
            surplus=ds.surplus,
            carried_in=self.state.carried,
        )


def _failed(what: str, error: BaseException) -> str:
    return f"{what} failed ({type(error).__name__}); the run stopped"


class SettlingFates:
    """The sync loop's fate lines: settled in ``state.generation`` and written to ``fates`` when the run keeps a
    fates file (the writer functions of :mod:`groupwise.run.fates_file` call :meth:`write_groups`)."""

    def __init__(self, fates: FatesWriter | None, state: TrainerState) -> None:
        self.fates = fates
        self.state = state

    def write_groups(self, groups: Iterable[Group], fate: str, step: int | None, detail: str = "") -> None:
        groups = list(groups)
        for group in groups:
            self.state.generation.settled(fate, group.num_completion_tokens, group.gen_seconds)
        if self.fates is not None:
            self.fates.write_groups(groups, fate, step, detail)

    def write_failed_round(
        self, step: int, items: Sequence[LoaderItem], group_ids: Sequence[int], error: BaseException, pending: str
    ) -> None:
        """The lines of a round whose generation call raised, which ends a sync run: the prompt the error names
        (its reward function or environment failed) is ``failed``/``fatal`` with the error, charged what its
        attempt sampled; every other prompt of the round is ``pending`` (``pending``: why), its group lost with
        the call."""
        culprit = error.prompt_uid if isinstance(error, RewardError) else None
        for item, group_id in zip(items, group_ids, strict=True):
            failed = item.prompt.uid == culprit
            culprit = None if failed else culprit  # one attempt failed, even if its prompt is drawn twice
            tokens = cost_of(error).tokens if failed else 0
            fate = "failed" if failed else "pending"
            self.state.generation.generated(tokens, 0.0)
            self.state.generation.settled(fate, tokens, 0.0)
            if self.fates is not None:
                self.fates.write({
                    "group_id": group_id, "prompt_uid": item.prompt.uid, "epoch": item.epoch, "attempt": 0,
                    "start_version": step, "fate": fate, "step": step, "resolution": "fatal" if failed else None,
                    "detail": f"{type(error).__name__}: {error}" if failed else pending, "mode": "sync",
                    "tokens": tokens,
                })  # fmt: skip

    def write_skipped(self, draws: Sequence[SkippedDraw]) -> None:
        """``skipped_no_signal`` lines for draws skipped before dispatch (nothing generated, nothing to settle)."""
        if self.fates is not None and draws:
            self.fates.write_skipped(draws)


def record_carried_at_end(fates: FatesWriter | None, state: TrainerState) -> None:
    """``pending`` lines for the groups still carried when the run stops. A trainer writes them after its last
    checkpoint: a resume from it rolls them back and trains the carried groups after all."""
    SettlingFates(fates, state).write_groups(state.carried, "pending", state.step, detail="carried at the end")
