"""Policies: tokenizers, the tiny model factory, loading/saving, prompt encoding, per-token logprobs."""

from groupwise.model.encode import encode_prompt
from groupwise.model.loading import (
    Policy,
    eos_token_ids,
    load_policy,
    resolve_device,
    resolve_dtype,
    smollm2_gguf_path,
)
from groupwise.model.logprobs import completion_logprobs, position_ids_from_mask, token_logprobs
from groupwise.model.tiny import build_tiny_model
from groupwise.model.tokenizer import build_char_tokenizer, char_vocabulary

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
