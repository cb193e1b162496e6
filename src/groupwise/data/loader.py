"""A deterministic, checkpointable stream of prompts over epochs.

Epoch ``e`` visits every prompt once, in the order of a permutation seeded by
``derive_seed("prompt_loader", seed, e)`` (identity when ``shuffle`` is off). The order of an epoch
therefore depends only on (seed, e), never on how many prompts were taken before or in what chunks.

The loader's whole state is the stream cursor (epoch, position) plus a *front queue* of prompts
put back with :meth:`PromptLoader.push_front` (on resume, prompts that were in flight at the
checkpoint are put back so that they are dispatched again, keeping their epoch). Queued items are
saved as (epoch, index_in_epoch) because the prompt is recomputable from the epoch permutation.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from groupwise.seeding import derive_seed
from groupwise.types import LoaderItem, Prompt


@dataclass(frozen=True)
class LoadedPrompt:
    """A prompt as the loader yielded it: in epoch ``epoch`` at position ``index_in_epoch``."""

    prompt: Prompt
    epoch: int
    index_in_epoch: int


def epoch_order(num_prompts: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The prompt indices of epoch ``epoch``: a permutation of ``range(num_prompts)`` seeded by (seed, epoch)."""
    order = list(range(num_prompts))
    if shuffle:
        random.Random(derive_seed("prompt_loader", seed, epoch)).shuffle(order)
    return order


def _fingerprint(prompts: Sequence[Prompt]) -> str:
    """A short hash of the prompt uids in order, to catch resuming over a different dataset."""
    return hashlib.sha256("\n".join(p.uid for p in prompts).encode()).hexdigest()[:16]


class PromptLoader:
    """Yields :class:`LoadedPrompt` forever, or for ``max_epochs`` epochs."""

    def __init__(
        self, prompts: Sequence[Prompt], seed: int, shuffle: bool = True, max_epochs: int | None = None
    ) -> None:
        if not prompts:
            raise ValueError("PromptLoader needs at least one prompt; the training split is empty")
        if max_epochs is not None and max_epochs < 1:
            raise ValueError(f"PromptLoader: max_epochs={max_epochs} must be >= 1 (or None for no limit)")
        self._prompts = tuple(prompts)
        self._seed = seed
        self._shuffle = shuffle
        self._max_epochs = max_epochs
        self._epoch = 0
        self._position = 0
        self._front: deque[LoadedPrompt] = deque()
        self._cached_order: tuple[int, list[int]] | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next prompt of the stream (not the front queue) comes from."""
        return self._epoch

    @property
    def position(self) -> int:
        """How many prompts of the current epoch the stream has yielded."""
        return self._position

    @property
    def exhausted(self) -> bool:
        """True when nothing is queued at the front and ``max_epochs`` epochs have been yielded."""
        return not self._front and self._max_epochs is not None and self._epoch >= self._max_epochs

    def _order(self, epoch: int) -> list[int]:
        if self._cached_order is None or self._cached_order[0] != epoch:
            self._cached_order = (epoch, epoch_order(len(self._prompts), self._seed, epoch, self._shuffle))
        return self._cached_order[1]

    def _item(self, epoch: int, index_in_epoch: int) -> LoadedPrompt:
        prompt = self._prompts[self._order(epoch)[index_in_epoch]]
        return LoadedPrompt(prompt=prompt, epoch=epoch, index_in_epoch=index_in_epoch)

    def take(self, n: int) -> list[LoadedPrompt]:
        """The next ``n`` prompts (front queue first); fewer only when the loader becomes exhausted."""
        if n < 0:
            raise ValueError(f"take(n={n}): n must be >= 0")
        taken: list[LoadedPrompt] = []
        while len(taken) < n and self._front:
            taken.append(self._front.popleft())
        while len(taken) < n and not self.exhausted:
            item = self._item(self._epoch, self._position)
            self._position += 1
            if self._position == len(self._prompts):
                self._epoch += 1
                self._position = 0
            if self._admits(item):
                taken.append(item)
        return taken

    def _admits(self, item: LoadedPrompt) -> bool:
        """Whether a fresh draw from the stream is yielded (always, here); a subclass may skip it before dispatch,
        and then the draw is consumed. Prompts put back with :meth:`push_front` are never asked again."""
        return True

    def push_front(self, items: Sequence[LoaderItem]) -> None:
        """Put ``items`` back so that the next take() yields them first, in the given order."""
        own = [self._own(item) for item in items]
        self._front.extendleft(reversed(own))

    def _own(self, item: LoaderItem) -> LoadedPrompt:
        """The loader's own item for ``item``, which it must have yielded (same epoch, index and prompt)."""
        in_range = item.epoch >= 0 and 0 <= item.index_in_epoch < len(self._prompts)
        own = self._item(item.epoch, item.index_in_epoch) if in_range else None
        if own is None or own.prompt.uid != item.prompt.uid:
            raise ValueError(
                f"push_front: prompt {item.prompt.uid!r} (epoch {item.epoch}, index {item.index_in_epoch}) "
                "was not yielded by this loader; only put back what take() returned"
            )
        return own

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: cursor, front queue, and what the loader was built over."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "returned": [
                {"epoch": item.epoch, "index_in_epoch": item.index_in_epoch, "uid": item.prompt.uid}
                for item in self._front
            ],
            "seed": self._seed,
            "shuffle": self._shuffle,
            "num_prompts": len(self._prompts),
            "prompts_fingerprint": _fingerprint(self._prompts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the loader must be built over the same prompts, seed and shuffle."""
        built_with = {
            "seed": self._seed,
            "shuffle": self._shuffle,
            "num_prompts": len(self._prompts),
            "prompts_fingerprint": _fingerprint(self._prompts),
        }
        mismatched = {k: (state.get(k), v) for k, v in built_with.items() if state.get(k) != v}
        if mismatched:
            details = ", ".join(f"{k}: checkpoint {saved!r} vs now {now!r}" for k, (saved, now) in mismatched.items())
            raise ValueError(
                f"PromptLoader.load_state_dict: the checkpoint was made over other data or settings ({details}); "
                "resume with the same dataset, data settings and seed"
            )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < len(self._prompts):
            raise ValueError(f"PromptLoader.load_state_dict: invalid cursor epoch={epoch}, position={position}")
        front = []
        for entry in state["returned"]:
            queued_epoch, index = int(entry["epoch"]), int(entry["index_in_epoch"])
            if queued_epoch < 0 or not 0 <= index < len(self._prompts):
                raise ValueError(f"PromptLoader.load_state_dict: queued prompt {entry!r} is out of range")
            item = self._item(queued_epoch, index)
            if item.prompt.uid != entry["uid"]:
                raise ValueError(f"PromptLoader.load_state_dict: queued prompt {entry!r} does not match the dataset")
            front.append(item)
        self._epoch, self._position = epoch, position
        self._front = deque(front)
