"""The deterministic, checkpointable prompt loader.

Invariants pinned:
- same (prompts, seed) → same stream; another seed → another order; shuffle off → dataset order.
- each epoch is a permutation of all prompts, and epoch e's order depends only on (seed, e), not on
  the chunk sizes used to take() (hypothesis).
- items carry their epoch and index_in_epoch; take() crosses epoch boundaries.
- max_epochs: exactly max_epochs × N prompts, then take() returns fewer / nothing and exhausted is set.
- state_dict → JSON → load_state_dict at random points (with pushed-back items) continues exactly
  like the uninterrupted loader (hypothesis).
- push_front items come out first in the given order, keep their epoch, survive a checkpoint, and
  are served even after the stream is exhausted; foreign items and mismatched checkpoints are refused.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groupwise.data.loader import LoadedPrompt, PromptLoader
from groupwise.types import Prompt

PROMPTS = [Prompt(uid=f"t/train/{i}", answer=str(i), text=f"q{i}") for i in range(7)]


def uids(items: list[LoadedPrompt]) -> list[str]:
    return [item.prompt.uid for item in items]


def stream(loader: PromptLoader, chunks: list[int]) -> list[LoadedPrompt]:
    out: list[LoadedPrompt] = []
    for n in chunks:
        out.extend(loader.take(n))
    return out


def test_same_seed_same_stream_other_seed_other_order():
    a = PromptLoader(PROMPTS, seed=1).take(21)
    b = PromptLoader(PROMPTS, seed=1).take(21)
    c = PromptLoader(PROMPTS, seed=2).take(21)
    assert a == b
    assert uids(a) != uids(c)


def test_shuffle_off_gives_dataset_order_every_epoch():
    items = PromptLoader(PROMPTS, seed=5, shuffle=False).take(14)
    assert uids(items) == [p.uid for p in PROMPTS] * 2
    assert [i.epoch for i in items] == [0] * 7 + [1] * 7


def test_epochs_are_permutations_with_positions():
    items = PromptLoader(PROMPTS, seed=3).take(7 * 4)
    for epoch in range(4):
        chunk = items[7 * epoch : 7 * (epoch + 1)]
        assert sorted(uids(chunk)) == sorted(p.uid for p in PROMPTS)
        assert [i.epoch for i in chunk] == [epoch] * 7
        assert [i.index_in_epoch for i in chunk] == list(range(7))
    assert len({tuple(uids(items[7 * e : 7 * (e + 1)])) for e in range(4)}) > 1  # orders differ across epochs


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_order_does_not_depend_on_chunking(seed, chunks):
    chunked = stream(PromptLoader(PROMPTS, seed=seed), chunks)
    whole = PromptLoader(PROMPTS, seed=seed).take(len(chunked))
    assert chunked == whole


def test_cursor_properties_follow_the_stream():
    loader = PromptLoader(PROMPTS, seed=0)
    assert (loader.epoch, loader.position) == (0, 0)
    loader.take(5)
    assert (loader.epoch, loader.position) == (0, 5)
    loader.take(2)
    assert (loader.epoch, loader.position) == (1, 0)
    loader.take(10)
    assert (loader.epoch, loader.position) == (2, 3)


def test_max_epochs_exhausts_after_exactly_that_many_prompts():
    loader = PromptLoader(PROMPTS, seed=0, max_epochs=2)
    first = loader.take(10)
    assert len(first) == 10 and not loader.exhausted
    rest = loader.take(10)
    assert len(rest) == 4
    assert loader.exhausted
    assert loader.take(3) == []
    assert [i.epoch for i in first + rest] == [0] * 7 + [1] * 7


def test_push_front_order_epoch_and_service_after_exhaustion():
    loader = PromptLoader(PROMPTS, seed=9, max_epochs=1)
    items = loader.take(7)
    assert loader.exhausted
    loader.push_front(items[2:4])
    loader.push_front([items[6]])
    assert not loader.exhausted
    again = loader.take(5)
    assert again == [items[6], items[2], items[3]]
    assert all(item.epoch == 0 for item in again)
    assert loader.exhausted


def test_push_front_is_served_before_the_stream():
    loader = PromptLoader(PROMPTS, seed=4)
    first = loader.take(3)
    reference = PromptLoader(PROMPTS, seed=4)
    reference.take(3)
    loader.push_front(first[:2])
    assert loader.take(5) == first[:2] + reference.take(3)


def test_push_front_refuses_items_of_another_loader():
    mine = PromptLoader(PROMPTS, seed=1)
    theirs = PromptLoader(PROMPTS, seed=2).take(7)
    mine_order = mine.take(7)
    foreign = next(t for t, m in zip(theirs, mine_order, strict=True) if t.prompt.uid != m.prompt.uid)
    with pytest.raises(ValueError, match="was not yielded by this loader"):
        mine.push_front([foreign])
    with pytest.raises(ValueError, match="was not yielded by this loader"):
        mine.push_front([LoadedPrompt(PROMPTS[0], epoch=0, index_in_epoch=99)])


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 1000),
    max_epochs=st.one_of(st.none(), st.integers(1, 3)),
    before=st.lists(st.integers(0, 8), max_size=6),
    pushed=st.integers(0, 5),
    after=st.lists(st.integers(0, 8), min_size=1, max_size=6),
)
def test_state_dict_round_trip_continues_the_uninterrupted_stream(seed, max_epochs, before, pushed, after):
    def run_until_checkpoint() -> PromptLoader:
        loader = PromptLoader(PROMPTS, seed=seed, max_epochs=max_epochs)
        taken = stream(loader, before)
        loader.push_front(taken[len(taken) - min(pushed, len(taken)) :])  # "in flight" at checkpoint
        return loader

    uninterrupted = run_until_checkpoint()
    checkpointed = run_until_checkpoint()
    saved = json.loads(json.dumps(checkpointed.state_dict()))
    restored = PromptLoader(PROMPTS, seed=seed, max_epochs=max_epochs)
    restored.load_state_dict(saved)
    assert (restored.epoch, restored.position, restored.exhausted) == (
        uninterrupted.epoch,
        uninterrupted.position,
        uninterrupted.exhausted,
    )
    assert stream(restored, after) == stream(uninterrupted, after)


def test_load_state_dict_refuses_other_data_or_seed():
    state = PromptLoader(PROMPTS, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed: checkpoint 1 vs now 2"):
        PromptLoader(PROMPTS, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="num_prompts: checkpoint 7 vs now 6"):
        PromptLoader(PROMPTS[:6], seed=1).load_state_dict(state)
    renamed = [Prompt(uid=p.uid + "x", answer=p.answer, text=p.text) for p in PROMPTS]
    with pytest.raises(ValueError, match="prompts_fingerprint"):
        PromptLoader(renamed, seed=1).load_state_dict(state)


def test_constructor_rejects_empty_data_and_bad_max_epochs():
    with pytest.raises(ValueError, match="at least one prompt"):
        PromptLoader([], seed=0)
    with pytest.raises(ValueError, match="max_epochs=0"):
        PromptLoader(PROMPTS, seed=0, max_epochs=0)
    with pytest.raises(ValueError, match="n=-1"):
        PromptLoader(PROMPTS, seed=0).take(-1)
