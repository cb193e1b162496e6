"""The stream-interleaving tier: every callback of a generation stream fires exactly once, whatever the order.

A deterministic scheduler drives a real :class:`~groupwise.generation.stream.GenerationStream` (tiny model, CPU)
tick by tick in the test's thread and injects the calls other threads make — ``cancel`` (with a cost callback),
``post_weights`` (a load that works, or one that raises), ``submit`` of a new request, ``forget``, ``close`` — at
every interleaving point of the first token boundaries: before a boundary, inside its decode step (after the
boundary read its mailbox, before the drawn tokens are appended) and after the tokens are appended but before any
request is answered. The request under test finishes at the second boundary (``max_new_tokens`` 3, no stop
token), so these points include a cancel racing the request's last token (the lost-callback hang). Every
assignment of the events to the points runs, in every order where two share a point.

Pinned for every schedule:
- each ``cancel``'s ``on_dropped`` fires exactly once, with a cost within what the request could hold;
- each weight post's ``done`` fires exactly once (``None`` for a load that worked, its error for one that raised);
- a request's ``on_done`` fires at most once, and exactly once unless it was cancelled or the stream was closed;
- afterwards (unless closed) the stream is idle, every slot is free and it holds no request and no callback;
- a closed stream answers a later ``cancel`` at once.

The default tier runs every pair of events with ``cancel`` in both partial modes (1,081 schedules, seconds); the
``slow`` tier every such set of three (27,720) and two sets of four (23,760).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import pytest
from fakes.decoder_models import char_tokenizer, peaked_model

from groupwise.generation import Engine
from groupwise.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.numerics

MAX_NEW = 3  # token 0 from the prefill of boundary 0, token 1 its decode step, token 2 (the last) boundary 1's
SAMPLES = 2
SAMPLING = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0)
TICKS = 3
POINTS = [(tick, point) for tick in range(TICKS) for point in ("before", "decode", "finish")]
EVENTS = ("cancel", "cancel_again", "load", "failing_load", "submit", "forget", "close")


@pytest.fixture(scope="module")
def engine():
    tokenizer = char_tokenizer()
    model = peaked_model(len(tokenizer), seed=0, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    return Engine(model, tokenizer, (len(tokenizer) + 7,), cuda_graphs="off")  # a stop id never drawn


class Schedule:
    """One run: the stream, the injected events by point, and every callback's calls."""

    def __init__(self, engine, partial: str, placed: dict[tuple[int, str], list[str]]) -> None:
        self.engine, self.placed = engine, placed
        self.stream = engine.open_stream(SAMPLING, max_rows=8, partial=partial)
        self.calls: Counter[str] = Counter()
        self.costs: list[tuple[int, float]] = []
        self.loads: list[BaseException | None] = []
        self.tick = 0
        self.closed = False
        self.cancelled: set[str] = set()
        prompt = tuple(engine.tokenizer("1+2=")["input_ids"])
        self.handles = {"r0": self.stream.submit(GenerationRequest(prompt, SAMPLES, seed=1), self._done("r0"))}
        self._next = GenerationRequest(prompt, SAMPLES, seed=2)
        self._hook_points()

    def _done(self, name: str) -> Callable[[object], None]:
        return lambda outcome: self.calls.update([f"done:{name}"])

    def _dropped(self, name: str) -> Callable[[int, float], None]:
        def on_dropped(tokens: int, seconds: float) -> None:
            self.calls.update([name])
            self.costs.append((tokens, seconds))

        return on_dropped

    def _hook_points(self) -> None:
        slots, stream = self.stream._rows.slots, self.stream
        step, finish = slots.step, stream._finish

        def decoding():
            self._inject("decode")
            return step()

        def finishing(finished):
            self._inject("finish")
            return finish(finished)

        slots.step, stream._finish = decoding, finishing

    def _inject(self, point: str) -> None:
        for event in self.placed.pop((self.tick, point), []):
            self._apply(event)

    def _apply(self, event: str) -> None:
        stream = self.stream
        if event in ("cancel", "cancel_again"):
            self.cancelled.add("r0")
            stream.cancel(self.handles["r0"], self._dropped(event))
        elif event == "load":
            state = self.engine.model.state_dict()
            stream.post_weights(lambda: self.engine.load_weights(state, self.engine.version + 1), self.loads.append)
        elif event == "failing_load":
            stream.post_weights(_raise_disk_on_fire, self.loads.append)
        elif event == "submit":
            self.handles["r1"] = stream.submit(self._next, self._done("r1"))
        elif event == "forget":
            stream.forget(self.handles["r0"])
        elif event == "close":
            self.closed = True
            assert stream.close(1.0)

    def run(self) -> None:
        while self.tick < TICKS and not self.closed:
            self._inject("before")
            if not self.closed:
                self.stream.run_until_idle(max_ticks=1)
                self.tick += 1
        for event in [event for events in self.placed.values() for event in events]:  # points never reached
            self._apply(event)  # (after a close too: the other threads still make their calls)
        if not self.closed:
            assert not self.stream.run_until_idle(max_ticks=50), "the stream still has work after 50 boundaries"

    def check(self, events: list[str]) -> None:
        for event in ("cancel", "cancel_again"):
            assert self.calls[event] == events.count(event), (event, self.calls)
        assert all(0 <= tokens <= SAMPLES * MAX_NEW and seconds >= 0.0 for tokens, seconds in self.costs)
        posts = events.count("load") + events.count("failing_load")
        assert len(self.loads) == posts, self.loads
        if "load" in events and not self.closed:
            assert self.loads == [None]
        if "failing_load" in events:
            assert all(isinstance(error, RuntimeError) for error in self.loads)
        for name in self.handles:
            answered = self.calls[f"done:{name}"]
            assert answered <= 1, (name, self.calls)
            if name not in self.cancelled and not self.closed:
                assert answered == 1, (name, self.calls)
        if not self.closed:
            assert self.stream.idle() and self.stream._rows.slots.live == 0
            table = self.stream._table
            assert not table.running and not table.take_cancellers(), "no request and no canceller is left held"
        else:  # a closed stream answers a cancel at once
            late = Counter()
            self.stream.cancel(self.handles["r0"], lambda tokens, seconds: late.update(["late"]))
            assert late["late"] == 1


def _raise_disk_on_fire() -> None:
    raise RuntimeError("disk on fire")


def placements(events: tuple[str, ...]):
    """Every assignment of ``events`` to interleaving points, in every order where several share one."""
    for points in itertools.product(POINTS, repeat=len(events)):
        groups: dict[tuple[int, str], list[str]] = {}
        for event, point in zip(events, points, strict=True):
            groups.setdefault(point, []).append(event)
        for orders in itertools.product(*(itertools.permutations(group) for group in groups.values())):
            yield {point: list(order) for point, order in zip(groups, orders, strict=True)}


def sweep(engine, partial: str, events: tuple[str, ...]) -> int:
    runs = 0
    for placed in placements(events):
        shown = {point: list(order) for point, order in placed.items()}
        schedule = Schedule(engine, partial, placed)
        try:
            schedule.run()
            schedule.check(list(events))
        except AssertionError as error:
            raise AssertionError(f"partial={partial}, schedule {shown}: {error}") from error
        runs += 1
    return runs


def _compatible(events: tuple[str, ...]) -> bool:
    """One weight post at a time (a second one while the first is pending is refused by design)."""
    return events.count("load") + events.count("failing_load") <= 1


PAIRS = [pair for pair in itertools.combinations(EVENTS, 2) if "cancel" in pair and _compatible(pair)]


@pytest.mark.parametrize("partial", ["continue", "off"])
@pytest.mark.parametrize("events", PAIRS, ids="+".join)
def test_every_callback_fires_once_for_every_pair_of_events(engine, partial, events):
    assert sweep(engine, partial, events) >= len(POINTS) ** 2


def test_a_cancel_racing_the_last_token_still_gets_its_cost(engine):
    """The hang of issue 23: the cancel lands after boundary 1 read its mailbox, and r0 finishes at boundary 1."""
    schedule = Schedule(engine, "continue", {(1, "decode"): ["cancel"]})
    schedule.run()
    assert schedule.calls["cancel"] == 1 and schedule.calls["done:r0"] == 1
    assert schedule.costs[0][0] == SAMPLES * MAX_NEW  # it ran to its end: every token it drew
    assert not schedule.stream._table.answered  # its requester is gone: nobody forgets it, so it is not kept


TRIPLES = [triple for triple in itertools.combinations(EVENTS, 3) if "cancel" in triple and _compatible(triple)]


@pytest.mark.slow
@pytest.mark.parametrize("partial", ["continue", "off"])
@pytest.mark.parametrize("events", TRIPLES, ids="+".join)
def test_every_callback_fires_once_for_every_set_of_three_events(engine, partial, events):
    assert sweep(engine, partial, events) >= len(POINTS) ** 3


@pytest.mark.slow
@pytest.mark.parametrize("events", [("cancel", "load", "submit", "forget"), ("cancel", "cancel_again", "failing_load",
                                                                             "close")], ids="+".join)  # fmt: skip
def test_every_callback_fires_once_for_four_events(engine, events):
    assert sweep(engine, "continue", events) >= len(POINTS) ** 4
