"""Policies: tokenizers, the tiny model factory, loading/saving, prompt encoding, per-token logprobs.

The names below are imported on first use (PEP 562), so importing a torch-free submodule such as
:mod:`groupwise.model.gguf_files` (what ``groupwise config check`` needs) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from groupwise.model.encode import encode_prompt
    from groupwise.model.gguf_files import smollm2_gguf_path
    from groupwise.model.loading import Policy, eos_token_ids, load_policy, resolve_device, resolve_dtype
    from groupwise.model.logprobs import completion_logprobs, position_ids_from_mask, token_logprobs
    from groupwise.model.tiny import build_tiny_model
    from groupwise.model.tokenizer import build_char_tokenizer, char_vocabulary

_HOMES = {
    "encode_prompt": "encode",
    "smollm2_gguf_path": "gguf_files",
    "Policy": "loading",
    "eos_token_ids": "loading",
    "load_policy": "loading",
    "resolve_device": "loading",
    "resolve_dtype": "loading",
    "completion_logprobs": "logprobs",
    "position_ids_from_mask": "logprobs",
    "token_logprobs": "logprobs",
    "build_tiny_model": "tiny",
    "build_char_tokenizer": "tokenizer",
    "char_vocabulary": "tokenizer",
}

__all__ = [
    "Policy",
    "build_char_tokenizer",
    "build_tiny_model",
    "char_vocabulary",
    "completion_logprobs",
    "encode_prompt",
    "eos_token_ids",
    "load_policy",
    "position_ids_from_mask",
    "resolve_device",
    "resolve_dtype",
    "smollm2_gguf_path",
    "token_logprobs",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'groupwise.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"groupwise.model.{home}"), name)
