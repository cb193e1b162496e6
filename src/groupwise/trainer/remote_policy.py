"""The policy when its trained weights live in other processes (the Ray learner actor, data-parallel ranks)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from groupwise.model.loading import Policy
from groupwise.model.lora import ADAPTER_DIR, write_adapter
from groupwise.model.weights import ModelWeights

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedTokenizerBase


@dataclass
class RemotePolicy:
    """The tokenizer here, the trained weights elsewhere: ``model`` reads and writes them there (a checkpoint's
    model state), ``generator_state`` fetches the generator's weights (adapters merged)."""

    model: ModelWeights
    tokenizer: PreTrainedTokenizerBase
    local: Policy  # a plain copy in this process, refreshed from the learner only to save
    generator_state: Callable[[], Mapping[str, torch.Tensor]]
    lora: LoraConfig | None = None  # the peft LoraConfig when the learner trains adapters

    def save(self, directory: str | Path) -> Path:
        """``final/``: the merged weights in the local plain copy, plus the adapter in ``adapter/`` with LoRA."""
        with torch.no_grad():
            self.local.model.load_state_dict(dict(self.generator_state()))
        saved = self.local.save(directory)
        if self.lora is not None:
            write_adapter(saved / ADAPTER_DIR, self.model.state_dict(), self.lora)
        return saved
