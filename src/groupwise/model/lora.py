"""LoRA adapters through peft, and the three weight views an adapted policy has.

An adapted policy is a ``peft.PeftModel`` around the causal LM: every targeted Linear ``W`` gets ``A`` ``[r, in]``
and ``B`` ``[out, r]`` (``B`` starts at zero), computes ``W x + s · B A x`` with ``s = alpha / r``, and only
``A``, ``B`` train. Its weights are seen three ways:

* **generator weights** (:func:`generator_state_dict`): a plain model's state dict with the adapters merged,
  ``W' = W + s · B A`` computed out of place in float32 and cast back to ``W``'s dtype. The engine's model stays a
  plain ``LlamaForCausalLM`` (its fast decode step keeps working) and the live weights are never touched, so
  no merge/unmerge drift can build up;
* **trained state** (:func:`trained_state_dict`): the adapter weights only, in peft's file naming — what a
  checkpoint stores (the frozen base is reloaded from ``model.path`` on resume);
* **the final directory** (:func:`save_adapted_policy`): the merged model (loads with plain transformers) plus
  ``adapter/`` (loads with ``peft.PeftModel.from_pretrained`` onto the base model).

A policy without adapters has one view: its own ``state_dict``. peft is imported only when adapters are used.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import Tensor
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from groupwise.model.weights import ModelWeights

if TYPE_CHECKING:
    from peft import LoraConfig, PeftConfig, PeftModel

ADAPTER_DIR = "adapter"
_ADAPTER = "default"  # peft's name for the one adapter we add


class LoraSetupError(ValueError):
    """The LoRA settings do not fit the model (no target module found, a target that is not a Linear)."""


def is_adapted(model: object) -> TypeGuard[PeftModel]:
    """Whether ``model`` is a peft model (without importing peft when nothing has)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def lora_config(rank: int, alpha: float, dropout: float, target_modules: list[str]) -> LoraConfig:
    """The ``peft.LoraConfig`` of ``model.lora`` (no bias training, causal-LM task)."""
    from peft import LoraConfig

    # peft annotates lora_alpha as int but only computes alpha / r with it; model.lora.alpha may be fractional.
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]
        lora_dropout=dropout,
        target_modules=list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: torch.nn.Module, config: LoraConfig) -> torch.nn.Module:
    """Wrap ``model`` (modified in place) with fresh adapters; only they require grad afterwards."""
    from peft import get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    try:
        adapted = get_peft_model(model, config)
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        raise LoraSetupError(f"model.lora.target_modules {sorted(config.target_modules or [])}: {err}") from err
    for name, module in adapted.get_base_model().named_modules():
        if isinstance(module, LoraLayer) and (
            type(module) is not LoraLinear or type(module.base_layer) is not torch.nn.Linear or module.fan_in_fan_out
        ):
            raise LoraSetupError(
                f"model.lora.target_modules matched {name} ({type(module.base_layer).__name__}); only plain "
                "torch.nn.Linear layers can be merged for the generator — list Linear projections only"
            )
    return adapted


def untargeted_parameters(model: torch.nn.Module, config: LoraConfig) -> list[torch.nn.Parameter]:
    """The parameters of the plain ``model`` outside every module ``config`` targets (peft's own name matching):
    LoRA never changes them — only the adapters train, and a merge rewrites only the targeted weights."""
    from peft.tuners.tuners_utils import check_target_module_exists

    targeted = {
        id(parameter)
        for name, module in model.named_modules()
        if name and check_target_module_exists(config, name)
        for parameter in module.parameters()
    }
    return [parameter for parameter in model.parameters() if id(parameter) not in targeted]


def merged_state_dict(model: PeftModel) -> dict[str, Tensor]:
    """The plain model's state dict with every adapter merged: ``W + s · B A`` (float32, out of place)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    state: dict[str, Tensor] = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" not in key:
            state[key.replace(".base_layer.", ".")] = tensor
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                weight = _linear_weight(module.base_layer)
                a, b = _linear_weight(module.lora_A[_ADAPTER]).float(), _linear_weight(module.lora_B[_ADAPTER]).float()
                delta = (b @ a).mul_(module.scaling[_ADAPTER])
                state[f"{name}.weight"] = (weight.float() + delta).to(weight.dtype)
    return state


def _linear_weight(module: torch.nn.Module) -> Tensor:
    if not isinstance(module, torch.nn.Linear):  # apply_lora admits only plain Linear layers
        raise LoraSetupError(f"expected a Linear layer in a LoRA module, found {type(module).__name__}")
    return module.weight


def generator_state_dict(model: ModelWeights) -> dict[str, Tensor]:
    """What the generator's plain model loads: merged weights for an adapted policy, else the state dict."""
    return merged_state_dict(model) if is_adapted(model) else model.state_dict()


def trained_state_dict(model: ModelWeights) -> dict[str, Tensor]:
    """What a checkpoint stores: the adapter weights of an adapted policy (peft naming), else the state dict."""
    if is_adapted(model):
        from peft import get_peft_model_state_dict

        # Embeddings are never adapted (model.lora.target_modules refuses them), so peft need not look for the base
        # model's config.json to compare vocabularies: for a GGUF-loaded model it would ask the Hub and warn.
        return get_peft_model_state_dict(model, save_embedding_layers=False)
    return model.state_dict()


def load_trained_state_dict(model: ModelWeights, state: Mapping[str, Tensor]) -> None:
    """Inverse of :func:`trained_state_dict` (strict: every adapter weight present, nothing unknown)."""
    with torch.no_grad():
        if is_adapted(model):
            _load_adapter_state(model, state)
        else:
            model.load_state_dict(dict(state))


def _load_adapter_state(model: PeftModel, state: Mapping[str, Tensor]) -> None:
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    expected = set(get_peft_model_state_dict(model, save_embedding_layers=False))
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"the checkpoint's model weights are not this run's LoRA adapter (missing {missing[:3]}, unexpected "
            f"{extra[:3]}); resume with the model.lora settings the run was started with"
        )
    set_peft_model_state_dict(model, dict(state))


def save_adapted_policy(directory: str | Path, model: PeftModel, tokenizer: PreTrainedTokenizerBase) -> Path:
    """``directory``: the merged model + tokenizer (plain transformers), and ``adapter/`` (peft)."""
    directory = Path(directory)
    base = model.get_base_model()
    if not isinstance(base, PreTrainedModel):
        raise TypeError(f"the adapted policy wraps a {type(base).__name__}, not a transformers model")
    plain = plain_model_with(base.config, merged_state_dict(model), base)
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    write_adapter(directory / ADAPTER_DIR, trained_state_dict(model), model.peft_config[_ADAPTER])
    return directory


def plain_model_with(config: PretrainedConfig, state: Mapping[str, Tensor], like: PreTrainedModel) -> PreTrainedModel:
    """A plain model of ``like``'s class built on the meta device and given ``state`` (no random init)."""
    with torch.device("meta"):
        plain = type(like)(config)
    plain.load_state_dict(dict(state), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = like.generation_config
    return plain.eval()


def write_adapter(directory: str | Path, adapter_state: Mapping[str, Tensor], config: PeftConfig) -> Path:
    """Write what ``PeftModel.save_pretrained`` writes: ``adapter_config.json`` + ``adapter_model.safetensors``."""
    from peft.utils.constants import SAFETENSORS_WEIGHTS_NAME
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(directory))
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in adapter_state.items()}
    save_file(tensors, str(directory / SAFETENSORS_WEIGHTS_NAME), metadata={"format": "pt"})
    return directory
