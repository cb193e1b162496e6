"""A tiny randomly initialised Llama, for from-scratch demos and fast tests.

The default shape is the "1M" configuration (h128, L4, H4, ffn512: about 1M
parameters with a char vocabulary), which runs a GRPO step in about 0.1 s on two CPU cores.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM


def build_tiny_model(
    num_layers: int = 4,
    hidden_size: int = 128,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_position_embeddings: int = 256,
    vocab_size: int = 91,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` with tied embeddings and sdpa attention, initialised from ``seed``.

    The same arguments always give bit-identical weights; the global torch RNG is left untouched
    (initialisation runs inside a forked RNG), so building a model does not shift other randomness.
    """
    _check_shape(num_layers, hidden_size, num_heads, intermediate_size, max_position_embeddings, vocab_size)
    for name, token_id in (("pad", pad_token_id), ("bos", bos_token_id), ("eos", eos_token_id)):
        if not 0 <= token_id < vocab_size:
            raise ValueError(f"{name}_token_id={token_id} is outside the vocabulary [0, {vocab_size}); "
                             "pass the ids of the tokenizer the model is built for")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    config._attn_implementation = "sdpa"
    # Initialisation runs on the CPU, so only the CPU generator needs forking.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id
    )
    return model.eval()


def _check_shape(
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    vocab_size: int,
) -> None:
    sizes = {
        "num_layers": num_layers,
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": vocab_size,
    }
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"tiny model {name}={value!r} must be a positive integer")
    head_dim, remainder = divmod(hidden_size, num_heads)
    if remainder or head_dim % 2:
        raise ValueError(
            f"tiny model hidden_size={hidden_size} with num_heads={num_heads} gives a head size of "
            f"{hidden_size / num_heads:g}; rotary embeddings need hidden_size divisible by num_heads into an even size "
            "(e.g. hidden_size=128, num_heads=4)"
        )
