"""A KV cache that writes into preallocated buffers instead of concatenating every step.

transformers' ``DynamicLayer`` grows with ``torch.cat``: each decode step copies the whole cache
of every layer, which on CPU costs more than the attention itself once rows × length is large.
Here each layer allocates ``[rows, heads, capacity, head_dim]`` once and writes new positions in
place; the model sees ``keys``/``values`` as views of the filled prefix.

It plugs into the public ``Cache(layer_class_to_replicate=...)`` hook (transformers ≥ 4.57, all
of 5.x). If that hook is missing, :func:`new_kv_cache` falls back to a plain ``DynamicCache``:
results are identical, only slower.
"""

from __future__ import annotations

from functools import partial
from typing import Any, cast

from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose storage is allocated once for ``capacity`` positions."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._buffers: tuple[Tensor, Tensor] | None = None  # keys, values: [rows, heads, capacity, head_dim]

    # Any: DynamicLayer.update's own extra arguments (unused here), kept so the override matches it.
    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Write the new positions after the filled prefix and return views of everything filled so far."""
        if self._buffers is None:
            rows, heads, _, head_dim = key_states.shape
            self._buffers = (
                key_states.new_empty((rows, heads, self.capacity, head_dim)),
                value_states.new_empty((rows, heads, self.capacity, value_states.shape[-1])),
            )
            self.device, self.dtype = key_states.device, key_states.dtype
            self.is_initialized = True
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(
                f"KV cache capacity {self.capacity} exceeded (needs {end}); size it for prompt + new tokens"
            )
        key_buffer, value_buffer = self._buffers
        key_buffer[:, :, self.length : end] = key_states
        value_buffer[:, :, self.length : end] = value_states
        self.length = end
        return self._refresh_views()

    def preload(self, keys: Tensor, values: Tensor) -> None:
        """Start filled: ``keys``/``values [rows, heads, P, head_dim]`` are columns ``[0, P)`` (a reused prefix)."""
        self._buffers = (
            keys.new_zeros((*keys.shape[:2], self.capacity, keys.shape[-1])),
            values.new_zeros((*values.shape[:2], self.capacity, values.shape[-1])),
        )
        self._buffers[0][:, :, : keys.shape[2]] = keys
        self._buffers[1][:, :, : values.shape[2]] = values
        self.device, self.dtype, self.is_initialized = keys.device, keys.dtype, True
        self.length = keys.shape[2]
        self._refresh_views()

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep (or repeat) rows ``indices``; only the filled prefix is copied, into fresh full-capacity buffers."""
        if self._buffers is None:
            return
        key_buffer, value_buffer = self._buffers
        self._buffers = (
            _select_prefix(key_buffer, indices, self.length),
            _select_prefix(value_buffer, indices, self.length),
        )
        self._refresh_views()

    def _refresh_views(self) -> tuple[Tensor, Tensor]:
        assert self._buffers is not None
        key_buffer, value_buffer = self._buffers
        self.keys = key_buffer[:, :, : self.length]
        self.values = value_buffer[:, :, : self.length]
        return self.keys, self.values


def _select_prefix(buffer: Tensor, indices: Tensor, length: int) -> Tensor:
    selected = buffer.new_empty((indices.numel(), *buffer.shape[1:]))
    selected[:, :, :length] = buffer[indices, :, :length]
    return selected


def new_kv_cache(capacity: int) -> Cache:
    """An empty cache whose layers hold up to ``capacity`` positions (prompt width + new tokens)."""
    # The hook calls what it is given with no arguments: a factory of layers works, though it is typed as a class.
    layer_factory = cast("type[DynamicLayer]", partial(PreallocatedLayer, capacity))
    try:
        return Cache(layer_class_to_replicate=layer_factory)
    except TypeError:  # pragma: no cover - transformers without the layer hook
        return DynamicCache()


def kv_cache_after(prefix: Tensor, capacity: int) -> Cache:
    """A cache of ``capacity`` columns whose first ``P`` are filled from ``prefix [layers, 2, rows, heads, P, dim]``
    (keys, values); a forward on it appends after them."""
    cache = new_kv_cache(capacity)
    if prefix.shape[-2] == 0:
        return cache  # nothing to preload: the layers are made at the first update, as for a fresh cache
    for keys, values in prefix:
        layer = PreallocatedLayer(capacity)
        layer.preload(keys, values)
        cache.layers.append(layer)
    return cache


def select_cache_rows(cache: Cache, indices: Tensor) -> None:
    """Keep (or repeat) cache rows ``indices`` in every layer."""
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer):
            raise TypeError(f"cannot select rows of a {type(layer).__name__} cache layer")
        layer.batch_select_indices(indices)

