"""What reading and loading a model's weights needs: a ``torch.nn.Module``, or a stand-in for a model whose weights
live in another process (the Ray learner actor, data-parallel ranks). Imports no torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class ModelWeights(Protocol):
    """A model's weights as a state dict (a ``torch.nn.Module``; on Ray, the learner actor's model)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> object: ...
