"""The built-in engine's calls into the Hugging Face model itself: one forward, masks as its attention takes them, a
prefill.

The engine (:mod:`groupwise.generation.engine`) runs the model's own ``forward`` for every prefill, and for the
decode steps of a model the fast step cannot take. :class:`ModelForward` is how it calls it:

* **The cache** goes in under the keyword the installed transformers knows (``cache`` from 5.24, which deprecated
  ``past_key_values``; 5.17 knows only the old name). The engine owns the cache object and never reads it back from
  the output; only the last position's logits are computed.
* **Masks.** sdpa and eager attention take a prepared 4D mask as is (sdpa a boolean one, 1 byte per entry; eager a
  float mask added to the scores), so transformers' mask construction is skipped; other attention kernels
  (flash-attention) get the 2D padding mask (untested here).
* **Prefill** (:meth:`ModelForward.prefill`): each distinct prompt once, left-padded with position ids from the
  mask, into a cache of its width plus the columns decoding will write; with reused keys/values of a prompt's first
  tokens (:mod:`groupwise.generation.prefix_prefill`) only the rest runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from groupwise.generation.chunk import Prefill
from groupwise.generation.kv_cache import kv_cache_after, new_kv_cache
from groupwise.generation.masks import as_mask
from groupwise.generation.prefix_prefill import prefill_inputs
from groupwise.generation.sampling import counter_keys, seed_to_int64

# Attention implementations that take a prepared 4D mask as is (flash-attention wants 2D).
_4D_MASK_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class PromptRow:
    """One completion to sample: which request and sample it is, and its prompt."""

    request_index: int
    sample_index: int
    seed: int
    prompt: tuple[int, ...]


class ModelForward:
    """Calls into one Hugging Face causal LM (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        forward_parameters = inspect.signature(type(model).forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_parameters else "past_key_values"

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: Cache) -> Tensor:
        """Last-position logits ``[B, V]``; the cache is updated in place."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return outputs.logits[:, -1, :]

    def takes_4d_mask(self) -> bool:
        return getattr(self.model.config, "_attn_implementation", "sdpa") in _4D_MASK_ATTENTION

    def as_model_mask(self, allowed: Tensor) -> Tensor:
        """A boolean mask as the model's attention takes it (sdpa: boolean; eager: additive)."""
        attention = getattr(self.model.config, "_attn_implementation", "sdpa")
        return as_mask(allowed, torch.bool if attention == "sdpa" else next(self.model.parameters()).dtype)

    def key_mask(self, allowed: Tensor) -> Tensor:
        """A ``[B, K]`` boolean key mask as the model's decode step takes it: 4D for sdpa/eager, else 2D 0/1."""
        return self.as_model_mask(allowed)[:, None, None, :] if self.takes_4d_mask() else allowed

    def prefill(
        self, rows: Sequence[PromptRow], device: torch.device, extra_columns: int,
        reused: Mapping[int, Tensor] | None = None,
    ) -> Prefill:  # fmt: skip
        """Run each distinct prompt once (left-padded) into a cache of its width + ``extra_columns`` columns;
        ``reused`` (by prompt id): keys/values of a prompt's first tokens, so only the rest runs
        (:mod:`groupwise.generation.prefix_prefill`)."""
        unique_index: dict[int, int] = {}
        prompts: list[tuple[int, ...]] = []
        for row in rows:
            if row.request_index not in unique_index:
                unique_index[row.request_index] = len(prompts)
                prompts.append(row.prompt)
        reused = reused or {}
        inputs = prefill_inputs(prompts, [reused.get(prompt_id) for prompt_id in unique_index])
        input_ids, padding = inputs.input_ids.to(device), inputs.padding.to(device)
        if self.takes_4d_mask():
            prefill_mask = self.as_model_mask(inputs.allowed.to(device))[:, None]
        elif inputs.prefix is None:
            prefill_mask = padding.long()
        else:  # a 2D mask cannot say which reused columns a suffix sees (reuses_prefixes is False here)
            raise ValueError("reused prefixes need an attention that takes a 4D mask (sdpa or eager)")
        capacity = padding.shape[1] + extra_columns
        cache = new_kv_cache(capacity) if inputs.prefix is None else kv_cache_after(inputs.prefix, capacity)
        logits = self.forward(input_ids, prefill_mask, inputs.position_ids.to(device), cache)
        row_to_prompt = torch.tensor([unique_index[row.request_index] for row in rows], dtype=torch.long, device=device)
        return Prefill(
            logits=logits[row_to_prompt],
            cache=cache,
            row_to_prompt=row_to_prompt,
            padding=padding,
            positions=torch.tensor([len(row.prompt) for row in rows], dtype=torch.long, device=device),
            rng_keys=counter_keys(
                torch.tensor([seed_to_int64(row.seed) for row in rows], dtype=torch.long, device=device),
                torch.tensor([row.sample_index for row in rows], dtype=torch.long, device=device),
            ),
        )
