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
from typing import Any

from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose storage is allocated once for ``capacity`` positions."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._key_buffer: Tensor | None = None
        self._value_buffer: Tensor | None = None

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Write the new positions after the filled prefix and return views of everything filled so far."""
        if self._key_buffer is None:
            rows, heads, _, head_dim = key_states.shape
            shape = (rows, heads, self.capacity, head_dim)
            self._key_buffer = key_states.new_empty(shape)
            self._value_buffer = value_states.new_empty((rows, heads, self.capacity, value_states.shape[-1]))
            self.device, self.dtype = key_states.device, key_states.dtype
            self.is_initialized = True
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(
                f"KV cache capacity {self.capacity} exceeded (needs {end}); size it for prompt + new tokens"
            )
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._refresh_views()
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep (or repeat) rows ``indices``; only the filled prefix is copied, into fresh full-capacity buffers."""
        if self._key_buffer is None:
            return
        self._key_buffer = _select_prefix(self._key_buffer, indices, self.length)
        self._value_buffer = _select_prefix(self._value_buffer, indices, self.length)
        self._refresh_views()

    def _refresh_views(self) -> None:
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]


def _select_prefix(buffer: Tensor, indices: Tensor, length: int) -> Tensor:
    selected = buffer.new_empty((indices.numel(), *buffer.shape[1:]))
    selected[:, :, :length] = buffer[indices, :, :length]
    return selected


def new_kv_cache(capacity: int) -> Cache:
    """An empty cache whose layers hold up to ``capacity`` positions (prompt width + new tokens)."""
    try:
        return Cache(layer_class_to_replicate=partial(PreallocatedLayer, capacity))
    except TypeError:  # pragma: no cover - transformers without the layer hook
        return DynamicCache()


def select_cache_rows(cache: Cache, indices: Tensor) -> None:
    """Keep (or repeat) cache rows ``indices`` in every layer."""
    for layer in cache.layers:
        layer.batch_select_indices(indices)

