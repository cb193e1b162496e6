"""Shared pieces of the vLLM tier (``make test-vllm``): the shipped tiny model, its folder as vLLM loads it, the
engines (one of each kind per session: building one takes tens of seconds), and weight states to load.

Every test module of this folder is marked ``vllm`` and skips, with the reason, where vLLM is not installed, so
``make test`` (the normal environment) collects and skips them.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from vllm_tier import PROMPTS, TINY_MODEL

from groupwise.generation.vllm.setup import VllmSettings, write_model_folder
from groupwise.model import eos_token_ids, load_policy


@pytest.fixture(scope="session")
def policy():
    return load_policy("hf", path=str(TINY_MODEL), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def model_dir(policy, tmp_path_factory) -> str:
    """The policy written the way the backend writes it (the factory does so for any policy source)."""
    return str(write_model_folder(policy.model, policy.tokenizer, tmp_path_factory.mktemp("vllm-model")))


@pytest.fixture(scope="session")
def eos(policy) -> tuple[int, ...]:
    return eos_token_ids(policy.tokenizer, policy.model)


@pytest.fixture(scope="session")
def weight_names(policy) -> list[str]:
    return list(policy.model.state_dict())


@pytest.fixture(scope="session")
def settings(model_dir) -> VllmSettings:
    return VllmSettings(model_dir=model_dir, kv_cache_gib=1, max_num_seqs=64)


@pytest.fixture(scope="session")
def prompt_ids(policy) -> list[tuple[int, ...]]:
    return [tuple(policy.tokenizer(text)["input_ids"]) for text in PROMPTS]


@pytest.fixture(scope="session")
def original_state(policy) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in policy.model.state_dict().items()}


@pytest.fixture(scope="session")
def noisy_state(original_state) -> dict[str, torch.Tensor]:
    """Near-random weights (small noise matrices, the norms kept; the tied head equal to the embedding): next-token
    distributions close to uniform, so completions run long and EOS is rare."""
    generator = torch.Generator().manual_seed(0)
    state = {
        name: torch.randn(tensor.shape, generator=generator) * 0.02 if tensor.dim() == 2 else tensor.clone()
        for name, tensor in original_state.items()
    }
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


@pytest.fixture(scope="session")
def model_with():
    """A copy of the policy's model under another state dict (the reference forward for recorded logprobs)."""

    def build(policy, state):
        model = copy.deepcopy(policy.model)
        model.load_state_dict(state)
        return model.eval()

    return build


@pytest.fixture(scope="session")
def versions():
    """Increasing weight versions for one session's engines (a version never goes back)."""
    return itertools.count(1)
