"""LoRA runs end to end: what the generator samples from, what checkpoints hold, what ``final/`` holds.

Invariants pinned:
- the merged weights ``W + s·BA`` give the adapted model's logits (float rounding), and the engine — a plain
  model of its own, on its fast decode step — holds exactly the merged weights of the current version after
  every step, so it samples from the adapted policy (its recorded logprobs match the adapted model's);
- the engine's copy shares every weight LoRA never changes (embedding, tied head, norms) with the policy instead of
  holding a second copy of it, and has its own copy of every targeted projection;
- in async mode the embedded runtime's weight sync also hands the engine the merged weights;
- a checkpoint's model piece holds the adapter weights only; stop after k steps + resume gives bit-identical
  adapter weights to an uninterrupted run, and the same trained prompts;
- ``final/`` loads with plain transformers (the merged model) and ``final/adapter`` with peft onto a fresh base,
  both giving the trained policy's logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from test_sync_trainer import _trained_prompts, tiny_config
from transformers import AutoModelForCausalLM

from groupwise.config import config_from_dict
from groupwise.model import load_policy
from groupwise.model.logprobs import completion_logprobs
from groupwise.model.lora import merged_state_dict
from groupwise.run.checkpoint import latest_checkpoint
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session
from groupwise.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.numerics

LORA = {"lora": {"enabled": True, "rank": 4, "alpha": 8.0}}
QUIET = {"eval": {"at_start": False, "at_end": False}, "optimizer": {"lr": 2e-2}}


def lora_run(tmp_path: Path, name: str, max_steps: int, resume: bool = False, **sections):
    cfg = tiny_config(tmp_path, run={"name": name, "max_steps": max_steps}, model=LORA, **QUIET, **sections)
    session = build_session(cfg, resume=resume)
    run_sync(session)
    return session


def adapter_weights(session) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in session.learner.model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return lora_run(tmp_path_factory.mktemp("lora"), "lora", 3, checkpoint={"every": 1})


def test_engine_samples_from_the_merged_weights_of_the_current_version(trained):
    learner_model, engine = trained.learner.model, trained.engine
    assert engine.model is not learner_model and engine.decode_path.startswith("fast Llama decode step")
    merged = merged_state_dict(learner_model)
    assert engine.version == trained.learner.version == 3
    assert set(engine.model.state_dict()) == set(merged)
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, merged[name]), name
    assert any(float(p.detach().abs().max()) > 0 for n, p in learner_model.named_parameters() if "lora_B" in n)
    prompt = (1, 14, 15, 16)
    (completion,), = engine.generate([GenerationRequest(prompt, 1, seed=5)], SamplingParams(max_new_tokens=4))
    with torch.no_grad():
        logprobs, _, mask = completion_logprobs(learner_model, [prompt], [completion.token_ids], 1.0)
    torch.testing.assert_close(logprobs[mask], torch.tensor(completion.logprobs), rtol=0, atol=1e-4)


def test_engine_shares_the_untargeted_weights_and_copies_the_targeted_ones(trained):
    engine_model, base = trained.engine.model, trained.learner.model.get_base_model()
    assert engine_model.model.embed_tokens.weight is base.model.embed_tokens.weight
    assert engine_model.lm_head.weight is engine_model.model.embed_tokens.weight  # still tied
    assert engine_model.model.norm.weight is base.model.norm.weight
    for engine_layer, base_layer in zip(engine_model.model.layers, base.model.layers, strict=True):
        assert engine_layer.input_layernorm.weight is base_layer.input_layernorm.weight
        engine_q, base_q = engine_layer.self_attn.q_proj.weight, base_layer.self_attn.q_proj.base_layer.weight
        assert engine_q.data_ptr() != base_q.data_ptr()
        assert not torch.equal(engine_q, base_q)  # the engine's holds the merged W + s·BA, the base W


def test_checkpoint_holds_only_the_adapter(trained):
    path = latest_checkpoint(trained.run_dir.path)
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == len(adapter_weights(trained))


def test_final_loads_merged_with_transformers_and_as_an_adapter_with_peft(trained):
    from peft import PeftModel

    final = trained.run_dir.final_dir
    ids = torch.tensor([[1, 20, 21, 22, 23]])
    with torch.no_grad():
        want = trained.learner.model(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(final)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=0, atol=1e-5)
        tiny = trained.cfg.model.tiny.model_dump()
        base = load_policy("tiny", tiny=tiny, seed=trained.cfg.run.seed, device="cpu").model
        adapted = PeftModel.from_pretrained(base, final / "adapter")
        torch.testing.assert_close(adapted(input_ids=ids).logits, want, rtol=0, atol=1e-6)


def test_lora_resume_equals_continuing(tmp_path, trained):
    common = {"checkpoint": {"every": 1}}
    lora_run(tmp_path, "resumed", 2, **common)
    resumed = lora_run(tmp_path, "resumed", 3, resume=True, **common)
    straight = adapter_weights(trained)
    assert adapter_weights(resumed).keys() == straight.keys()
    for name, tensor in adapter_weights(resumed).items():
        assert torch.equal(tensor, straight[name]), name
    assert _trained_prompts(trained.run_dir.path) == _trained_prompts(resumed.run_dir.path)


@pytest.mark.parametrize("continuous_batching", [False, True])
def test_async_weight_sync_hands_the_engine_merged_weights(tmp_path, continuous_batching):
    cfg = tiny_config(tmp_path, run={"name": "async-lora", "max_steps": 2}, model=LORA,
                      generation={"continuous_batching": continuous_batching}, **QUIET)  # fmt: skip
    data = cfg.model_dump(by_alias=True)
    data["mode"] = "async"
    data["grpo"]["dynamic_sampling"] = {"enabled": True}
    data["async"] = {"max_buffered_rollouts": 8, "max_inflight_prompts": 8,
                     "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 8}}
    session = build_session(config_from_dict(data))
    run_async(session)
    merged = merged_state_dict(session.learner.model)
    assert session.engine.version == session.learner.version == 2
    for name, tensor in session.engine.model.state_dict().items():
        assert torch.equal(tensor, merged[name]), name
