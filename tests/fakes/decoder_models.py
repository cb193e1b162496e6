"""Small random Llama / Qwen2 models with peaked next-token distributions, for the decode-path equivalence tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

_FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def peaked_model(vocab_size: int, seed: int, family: str = "llama", **overrides):
    """A 2-layer model (hidden 48, 6 heads / 2 KV heads unless overridden), tied embeddings, in eval mode.

    The final norm is scaled up so distributions are peaked (ties and near-flat draws are rare), and any
    biases are drawn from N(0, 0.5²) instead of zeros, so a path that ignores them would show.
    """
    settings = dict(
        vocab_size=vocab_size, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    config_class, model_class = _FAMILIES[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**settings, **overrides})).eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(8.0)
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.5)
    return model


def char_tokenizer():
    """The built-in character tokenizer (full vocabulary) of the tiny models."""
    from groupwise.model import load_policy

    return load_policy("tiny", tiny={"vocab": "full", "num_layers": 1, "hidden_size": 16, "num_heads": 2}).tokenizer


def text_requests(tokenizer, texts, samples: int):
    """One request per text (ragged prompts), ``samples`` completions each, seeded by position."""
    from groupwise.types import GenerationRequest

    return [GenerationRequest(tuple(tokenizer(t)["input_ids"]), samples, seed=i) for i, t in enumerate(texts)]


def assert_same_completions(got, expected, tolerance: float = 1e-5) -> None:
    """Same tokens, finish reasons and text per completion; logprobs within ``tolerance``."""
    assert [[c.token_ids for c in per] for per in got] == [[c.token_ids for c in per] for per in expected]
    for per_got, per_expected in zip(got, expected, strict=True):
        for a, b in zip(per_got, per_expected, strict=True):
            assert (a.finish_reason, a.text) == (b.finish_reason, b.text)
            assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) <= tolerance
