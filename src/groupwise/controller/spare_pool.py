"""`SparePool`: prompts held back to replace groups that are filtered or lost.

The rollout pump is the only dataloader consumer; when the pool is below its low-water mark
(``replacement_reserve_prompts``) it diverts a WHOLE loader batch here instead of admitting it, so no
target step is burned. Dispatch slots take spares FIFO. At the end of data the pool is drained in whole
steps; a leftover partial step is not trained, only counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")


class SparePool(Generic[Item]):
    """A FIFO of spare prompts with a low-water mark."""

    def __init__(self, low_water_mark: int) -> None:
        if low_water_mark < 0:
            raise ValueError(f"replacement_reserve_prompts must be >= 0, got {low_water_mark}")
        self.low_water_mark = low_water_mark
        self._items: deque[Item] = deque()
        self.taken = 0

    def __len__(self) -> int:
        return len(self._items)

    def needs_refill(self) -> bool:
        """True while the pool holds fewer spares than the low-water mark."""
        return len(self._items) < self.low_water_mark

    def add_batch(self, items: Iterable[Item]) -> None:
        self._items.extend(items)

    def take(self) -> Item | None:
        """The oldest spare, or None when the pool is empty (never waits for a refill)."""
        if not self._items:
            return None
        self.taken += 1
        return self._items.popleft()

    def take_many(self, count: int) -> list[Item]:
        """The ``count`` oldest spares; the pool must hold that many (check ``len`` first)."""
        if count > len(self._items):
            raise ValueError(f"take_many({count}) from a spare pool of {len(self._items)}")
        self.taken += count
        return [self._items.popleft() for _ in range(count)]

    def discard_leftover(self) -> list[Item]:
        """Empty the pool (a partial step at the end of data is not trained) and return what was left."""
        leftover = list(self._items)
        self._items.clear()
        return leftover

    # Any: an item as JSON-like checkpoint data, both ways.
    def state_dict(self, encode: Callable[[Item], Any] = lambda item: item) -> dict[str, Any]:
        return {"items": [encode(item) for item in self._items]}

    def load_state_dict(self, state: dict[str, Any], decode: Callable[[Any], Item] = lambda data: data) -> None:
        if set(state) != {"items"}:
            raise ValueError(f"spare pool state must have exactly the key 'items', got {sorted(state)}")
        self._items = deque(decode(data) for data in state["items"])
