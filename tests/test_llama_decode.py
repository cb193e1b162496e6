"""The engine's fast Llama decode step (``groupwise.generation.llama_decode``).

- equivalence: with the fast step, the engine samples the same tokens as through the model's own
  ``forward`` and records logprobs within 1e-5 or 16 float32 ulps of the largest logit, whichever is larger
  (the two paths use different matrix-product kernels; a logprob is a difference of two numbers of the
  logits' scale, so its rounding grows with that scale: ~100 after the in-place weight change below), for
  multi-head and grouped-query attention, ragged prompts, several samples per prompt, top-p, and rows
  compacted mid-loop; also for biased projections (Llama ``attention_bias``/``mlp_bias``) and Qwen2 (q/k/v
  biases);
- both projection kinds (dense, oneDNN) give this equivalence and freshness; ``auto`` takes oneDNN for float32
  on a CPU only from a hidden size of ``ONEDNN_MIN_HIDDEN``, and an unknown kind is refused when the engine is
  made;
- freshness: weights changed in place after the first call (an optimizer step in sync mode, where
  the engine shares the learner's model) are used by the next call — no stale packed copy;
- refusal: a model outside its scope (another architecture, sliding-window layers) or one whose probe
  logits disagree with its ``forward`` keeps the module path, and ``decode_path`` says why (then both engines
  run the very same module-path computation, so their logprobs agree bit for bit);
- the CPU attention (two batched matmuls, the mask as an additive bias) equals torch's fused attention to float
  rounding, for grouped queries, a boolean and an additive mask, and keys cut short of the cache's capacity;
- the config key ``generation.fast_decode`` reaches the engine the builder makes (false: the module path), and
  ``generation.projections`` the kind its fast step runs; a forced kind its step cannot take is refused in the
  config, each problem named at once.
"""

from __future__ import annotations

import pytest
import torch
from fakes.decoder_models import assert_same_completions, char_tokenizer, peaked_model, text_requests
from transformers import GPT2Config, GPT2LMHeadModel

from groupwise.config import ConfigError, config_from_dict
from groupwise.generation import Engine
from groupwise.generation.projections import ONEDNN_MIN_HIDDEN, onednn_available, projection_kind
from groupwise.trainer.builder import build_components
from groupwise.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.numerics

EOS = 2
# Many stop tokens, so rows finish at different steps and the batch is compacted mid-loop.
STOPS = (EOS, *range(10, 40))
FAST = "fast Llama decode step (no cuda graphs: the model is on cpu)"


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def _requests(tokenizer) -> list[GenerationRequest]:
    return text_requests(tokenizer, ["1+2=", "a much longer prompt: 81*7=", "9", "12+30="], 3)


def _both_paths(model, tokenizer, sampling: SamplingParams, projections: str = "auto"):
    fast = Engine(model, tokenizer, STOPS, projections=projections)
    module = Engine(model, tokenizer, STOPS, fast_decode=False)
    return fast, fast.generate(_requests(tokenizer), sampling), module, module.generate(_requests(tokenizer), sampling)


def _logprob_tolerance(model, tokenizer) -> float:
    """1e-5, or 16 float32 ulps of the largest logit on the test prompts when that is larger."""
    with torch.no_grad():
        scale = max(model(torch.tensor([r.prompt_token_ids])).logits.abs().max().item() for r in _requests(tokenizer))
    return max(1e-5, 16 * torch.finfo(torch.float32).eps * scale)


@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 6), (6, 2), (6, 1)])
@pytest.mark.parametrize("projections", ["dense", "onednn"])
def test_fast_step_samples_what_the_module_path_samples(tokenizer, heads, kv_heads, projections) -> None:
    if projections == "onednn" and not onednn_available():
        pytest.skip("this torch build has no oneDNN")
    model = peaked_model(len(tokenizer), seed=heads + kv_heads, num_attention_heads=heads, num_key_value_heads=kv_heads)
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.95)
    fast, got, module, expected = _both_paths(model, tokenizer, sampling, projections)
    assert fast.decode_path == FAST and fast.projection_kind == projections
    assert module.decode_path.startswith("transformers forward")
    lengths = {c.num_tokens for per in got for c in per}
    assert len(lengths) > 1, "rows should finish at different steps, so the batch is compacted mid-loop"
    assert_same_completions(got, expected, _logprob_tolerance(model, tokenizer))


@pytest.mark.parametrize(
    ("family", "overrides"), [("llama", {"attention_bias": True, "mlp_bias": True}), ("qwen2", {})]
)
def test_biased_projections_and_qwen2_take_the_fast_step(tokenizer, family, overrides) -> None:
    model = peaked_model(len(tokenizer), seed=5, family=family, **overrides)
    assert any(name.endswith("q_proj.bias") for name, _ in model.named_parameters())
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
    fast, got, _, expected = _both_paths(model, tokenizer, sampling)
    assert fast.decode_path == FAST
    assert_same_completions(got, expected, _logprob_tolerance(model, tokenizer))


@pytest.mark.parametrize("projections", ["dense", "onednn"])
def test_fast_step_uses_weights_changed_in_place(tokenizer, projections) -> None:
    if projections == "onednn" and not onednn_available():
        pytest.skip("this torch build has no oneDNN")
    model = peaked_model(len(tokenizer), seed=3)
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
    fast, before, module, _ = _both_paths(model, tokenizer, sampling, projections)
    assert fast.projection_kind == projections
    with torch.no_grad():  # what an optimizer step does to the shared model in sync mode
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn(parameter.shape, generator=generator))
    after, expected = fast.generate(_requests(tokenizer), sampling), module.generate(_requests(tokenizer), sampling)
    assert [[c.token_ids for c in per] for per in after] != [[c.token_ids for c in per] for per in before]
    assert_same_completions(after, expected, _logprob_tolerance(model, tokenizer))


def test_auto_takes_onednn_from_its_hidden_size_and_unknown_kinds_are_refused(tokenizer) -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    wanted = "onednn" if onednn_available() else "dense"
    assert projection_kind(cpu, torch.float32, ONEDNN_MIN_HIDDEN) == wanted
    assert projection_kind(cpu, torch.float32, ONEDNN_MIN_HIDDEN - 1) == "dense"
    assert projection_kind(cpu, torch.bfloat16, 4096) == "dense"
    assert projection_kind(gpu, torch.float32, 4096) == "dense"
    if onednn_available():
        assert projection_kind(cpu, torch.float32, 64, "onednn") == "onednn"
    small = Engine(peaked_model(len(tokenizer), seed=1), tokenizer, STOPS)
    small.generate(_requests(tokenizer), SamplingParams(max_new_tokens=2, temperature=1.0))
    assert small.decode_path == FAST and small.projection_kind == "dense"  # hidden size below ONEDNN_MIN_HIDDEN
    with pytest.raises(ValueError, match="projections='blocked' must be one of auto, dense, onednn"):
        Engine(peaked_model(len(tokenizer), seed=1), tokenizer, STOPS, projections="blocked")


def test_models_outside_the_scope_keep_the_module_path(tokenizer) -> None:
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64))
    engine = Engine(gpt2.eval(), tokenizer, (EOS,))
    completions = engine.generate(_requests(tokenizer), sampling)
    assert engine.decode_path == "transformers forward (GPT2LMHeadModel is not LlamaForCausalLM or Qwen2ForCausalLM)"
    assert all(len(per) == 3 and all(c.num_tokens >= 1 for c in per) for per in completions)
    sliding = peaked_model(len(tokenizer), seed=1, family="qwen2", use_sliding_window=True, sliding_window=4,
                     max_window_layers=1)  # fmt: skip
    windowed = Engine(sliding, tokenizer, (EOS,))
    windowed.generate(_requests(tokenizer)[:1], sampling)
    assert windowed.decode_path == (
        "transformers forward (layer types ['full_attention', 'sliding_attention'] (only full attention))"
    )


def test_a_failed_probe_keeps_the_module_path(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=2)
    model.config.rms_norm_eps = 10.0  # the modules keep their own eps; only the fast step would read this
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    fast, got, _, expected = _both_paths(model, tokenizer, sampling)
    assert fast.decode_path.startswith("transformers forward (probe logits differ from the model's forward by")
    assert_same_completions(got, expected, tolerance=0.0)


@pytest.mark.parametrize("fast_decode", [True, False])
def test_the_config_key_reaches_the_built_engine(fast_decode) -> None:
    cfg = config_from_dict({
        "model": {"source": "tiny", "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2}},
        "generation": {"max_new_tokens": 4, "fast_decode": fast_decode},
    })  # fmt: skip
    engine = build_components(cfg).engine
    engine.generate([GenerationRequest((5, 6, 7), 2, seed=0)], SamplingParams(max_new_tokens=4))
    assert engine.decode_path == (FAST if fast_decode else "transformers forward (off)")


@pytest.mark.parametrize("projections", ["auto", "dense", "onednn"])
def test_the_projections_key_reaches_the_built_engine(projections) -> None:
    if projections == "onednn" and not onednn_available():
        pytest.skip("this torch build has no oneDNN")
    cfg = config_from_dict({
        "model": {"source": "tiny", "device": "cpu", "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2}},
        "generation": {"max_new_tokens": 4, "projections": projections},
    })  # fmt: skip
    engine = build_components(cfg).engine
    engine.generate([GenerationRequest((5, 6, 7), 2, seed=0)], SamplingParams(max_new_tokens=4))
    # hidden 32 is below ONEDNN_MIN_HIDDEN: auto decodes on dense projections, a forced kind on its own
    assert engine.decode_path == FAST and engine.projection_kind == ("dense" if projections == "auto" else projections)


def test_a_forced_projection_kind_its_step_cannot_take_is_refused() -> None:
    with pytest.raises(ConfigError) as error:
        config_from_dict({
            "model": {"source": "tiny", "dtype": "bfloat16", "device": "cuda"},
            "generation": {"projections": "onednn", "fast_decode": False},
        })  # fmt: skip
    text = str(error.value)
    assert "generation.fast_decode: false turns off" in text
    assert "not model.dtype 'bfloat16'" in text and "not model.device 'cuda'" in text
    dense = config_from_dict({"model": {"source": "tiny", "device": "cuda"}, "generation": {"projections": "dense"}})
    assert dense.generation.projections == "dense"
    with pytest.raises(ConfigError) as error:
        config_from_dict({"model": {"source": "tiny"}, "generation": {"backend": "vllm", "projections": "dense"}})
    assert "generation.projections is a setting of the built-in engine" in str(error.value)


@pytest.mark.parametrize("additive", [False, True])
def test_cpu_matmul_attention_equals_fused_attention(additive) -> None:
    from groupwise.generation.llama_decode import matmul_attention

    generator = torch.Generator().manual_seed(0)
    rows, kv_heads, groups, dim, capacity, filled = 5, 2, 3, 8, 16, 11
    query = torch.randn(rows, kv_heads, groups, dim, generator=generator)
    cache = torch.randn(2, rows, kv_heads, capacity, dim, generator=generator)
    keys, values = cache[0, :, :, :filled], cache[1, :, :, :filled]  # views of a larger buffer, as in the engine
    allowed = torch.rand(rows, 1, 1, filled, generator=generator) > 0.4
    allowed[..., -1] = True  # every row attends to at least its newest key
    additive_mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    mask = additive_mask if additive else allowed
    expected = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=0.3)
    bias = additive_mask.expand(rows, kv_heads, groups, filled).reshape(rows * kv_heads, groups, filled)
    torch.testing.assert_close(matmul_attention(query, keys, values, bias, 0.3), expected, rtol=0, atol=1e-6)

