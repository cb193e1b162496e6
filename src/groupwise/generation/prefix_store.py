"""Keys/values of sequences a generation stream computed recently, so a request that extends one prefills less.

Why: a multi-turn episode sends each turn as a new request whose prompt is the previous turn's prompt, that turn's
sampled tokens and the environment's answer. Prefilling that ever-growing prompt from scratch every turn is most
of an episode's compute; the stream already computed the keys/values of all of it but the answer.

What is kept: when a stream's row finishes, the keys/values of its sequence — the prompt and every sampled token
but the last (which was drawn, never fed) — gathered from its slot, keyed by those tokens. A key/value at
position i depends only on tokens ``0..i`` and the weights, so any common prefix of a stored sequence and a new
one can be reused: :meth:`PrefixStore.longest` finds the longest.

Under which weights: every entry belongs to one weights stamp (the engine's version and the model's parameters'
storages and in-place version counters). :meth:`PrefixStore.match_weights` empties the store when the stamp
changed (a weight load, an optimizer step on a shared model), so keys/values from older weights are never reused.

Bounded: at most ``max_tokens`` token positions are held (each costs ``layers · 2 · KV heads · head dim`` values);
the least recently used entries go first. An entry a request reused whole goes before them (that request's row
stores a longer one when it finishes), and an entry whose tokens start a newer one is dropped when that one is
stored (the newer covers it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from torch import Tensor


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (a binary search over slice comparisons, so
    the per-token work runs in C)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # invariant: a[:low] == b[:low] and a[:high + 1] != b[:high + 1]
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class PrefixStore:
    """An LRU store of ``tokens → keys/values [layers, 2, KV, len(tokens), D]`` (see the module docstring)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], Tensor] = OrderedDict()
        self._stamp: Hashable | None = None
        self.tokens = 0  # token positions held

    def __len__(self) -> int:
        return len(self._entries)

    def match_weights(self, stamp: Hashable | None) -> None:
        """Empty the store unless its entries were computed under weights ``stamp`` (None: weights whose changes
        cannot be seen, so nothing is kept)."""
        if stamp != self._stamp or stamp is None:
            self.clear()
        self._stamp = stamp

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def longest(self, sequence: tuple[int, ...], limit: int) -> Tensor | None:
        """The stored keys/values of the longest prefix (at most ``limit`` tokens) of ``sequence`` (None: none).
        The entry it came from becomes the most recently used, unless all of it was taken: then it becomes the
        first to go (the row that took it stores a longer one when it finishes)."""
        best_key, best = None, 0
        for key in self._entries:
            if key[0] == sequence[0]:
                length = min(common_prefix(key, sequence), limit)
                if length > best:
                    best_key, best = key, length
        if best_key is None:
            return None
        self._entries.move_to_end(best_key, last=best < len(best_key))
        return self._entries[best_key][..., :best, :]

    def put(self, tokens: tuple[int, ...], kv: Tensor) -> None:
        """Keep ``kv`` (``[layers, 2, KV, len(tokens), D]``) for ``tokens``; entries it covers go, then the least
        recently used ones while more than ``max_tokens`` positions are held."""
        if not tokens or len(tokens) > self.max_tokens:
            return
        for key in [key for key in self._entries if key == tokens[: len(key)]]:
            self._drop(key)
        self._entries[tokens] = kv
        self.tokens += len(tokens)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self.tokens -= len(key)
