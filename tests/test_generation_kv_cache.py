"""The preallocated KV cache behaves exactly like transformers' concatenating ``DynamicLayer``:
same keys/values after several updates, after row selection (drop and repeat), and the same
sequence length; it is the cache the engine actually gets (no silent fallback); overflowing its
capacity is an error, never a silent reallocation."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from groupwise.generation.kv_cache import PreallocatedLayer, new_kv_cache, select_cache_rows


def _states(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, length, 4, generator=generator), torch.randn(rows, 2, length, 4, generator=generator)


def test_matches_dynamic_layer_through_updates_and_row_selection() -> None:
    ours, reference = PreallocatedLayer(capacity=8), DynamicLayer()
    for step, length in enumerate((3, 1, 1)):
        keys, values = _states(4, length, seed=step)
        got = ours.update(keys, values)
        expected = reference.update(keys, values)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    for indices in (torch.tensor([0, 2, 3]), torch.tensor([1, 1, 0])):
        ours.batch_select_indices(indices)
        reference.batch_select_indices(indices)
        keys, values = _states(3, 1, seed=9)
        assert torch.equal(ours.update(keys, values)[0], reference.update(keys, values)[0])
        assert torch.equal(ours.values, reference.values)
    assert ours.get_seq_length() == reference.get_seq_length() == 7


def test_engine_cache_uses_preallocated_layers_and_refuses_overflow() -> None:
    cache = new_kv_cache(capacity=4)
    keys, values = _states(2, 3, seed=0)
    cache.update(keys, values, 0)
    assert isinstance(cache.layers[0], PreallocatedLayer)
    select_cache_rows(cache, torch.tensor([1]))
    assert torch.equal(cache.layers[0].keys, keys[1:])
    with pytest.raises(RuntimeError, match="capacity 4 exceeded"):
        cache.update(*_states(1, 2, seed=1), 0)
