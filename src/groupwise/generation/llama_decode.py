"""One decode step of a Llama-family model, straight from its weights.

Why: at the sizes this project trains on a CPU, a decode step through transformers' module tree is
mostly Python — module calls, keyword plumbing, mask and position bookkeeping — around a few small
matmuls. The same maths written as ~15 tensor ops per layer needs far less dispatch. Its projection
weights are packed copies that follow the model: they are rebuilt whenever a parameter changes (an
optimizer step, ``load_state_dict``), see :class:`LlamaDecoder`. Results agree with the module path to
float rounding (the matmuls run on a different layout), not bit for bit.

Scope and safety: only ``LlamaForCausalLM`` without biases, with SiLU MLPs and a rotary embedding whose
frequencies do not depend on the sequence length. Anything else — or a model whose one-step logits on
a probe differ from its own ``forward`` — keeps the module path; :func:`fast_decoder_for` says why.

Per layer, for a batch of one new token per row (``x`` is ``[B, hidden]``)::

    h = rms_norm(x) · w_in;   q, k, v = h Wqᵀ, h Wkᵀ, h Wvᵀ;   q, k = rope(q), rope(k)
    x = x + attention(q, [K_cache; k], [V_cache; v]) Woᵀ
    h = rms_norm(x) · w_post;   x = x + (silu(h Wgᵀ) ⊙ h Wuᵀ) Wdᵀ

then ``logits = rms_norm(x) · w_final Wheadᵀ``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from groupwise.generation.masks import prefill_allowed

log = logging.getLogger(__name__)

# (input_ids, mask, position_ids, cache) -> last-position logits: the engine's module path.
ModuleForward = Callable[[Tensor, Tensor, Tensor, Any], Tensor]

# Rotary types whose inverse frequencies are fixed at construction: cos/sin depend on the position only.
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# Max |fast − module| logit difference on the probe, relative to the logits' scale, per dtype.
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
_PROBE_TOLERANCE_LOW_PRECISION = 3e-2


@dataclass(frozen=True)
class _LayerWeights:
    """One decoder layer's weights as the decode step multiplies them: ``[in, out]``, q|k|v and gate|up packed."""

    norm_in: Tensor
    qkv: Tensor  # [hidden, (H + 2·KV)·D]
    out: Tensor  # [H·D, hidden]
    norm_post: Tensor
    gate_up: Tensor  # [hidden, 2·I]
    down: Tensor  # [I, hidden]


class LlamaDecoder:
    """Next-token logits for one new token per row, writing its keys/values into the engine's cache.

    The projection weights are kept as packed ``[in, out]`` copies: on CPU a small-batch ``x @ Wᵀ``
    with a transposed operand runs 1.1–2.6× slower than the same product on a contiguous ``[in, out]``
    matrix (measured, rows 16–64), and packing q|k|v and gate|up halves the matmul calls. The copies
    are refreshed whenever a source parameter changes (its storage or its in-place version counter),
    so an optimizer step or ``load_state_dict`` is picked up at the next :meth:`prepare`. Norms,
    embedding and LM head are used in place. Cost: one extra copy of the decoder layers' weights.
    """

    def __init__(self, model: Any) -> None:
        config = model.config
        self.model = model
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.eps = config.rms_norm_eps
        self.scaling = model.model.layers[0].self_attn.scaling  # head_dim^-0.5 for Llama; read, not assumed
        self._cos_sin: Tensor | None = None  # [positions, 2·D]: cos | signed sin
        self._layers: list[_LayerWeights] = []
        self._signature: tuple[tuple[int, int], ...] = ()

    def prepare(self, capacity: int) -> None:
        """Refresh the packed weights if the model changed; tabulate cos/sin for positions ``0 .. capacity-1``."""
        self._refresh_weights()
        like = self.model.model.embed_tokens.weight[:1]  # only its dtype and device matter
        cached = self._cos_sin
        fits = cached is not None and cached.shape[0] >= capacity
        if fits and (cached.dtype, cached.device) == (like.dtype, like.device):
            return
        cos, sin = self.model.model.rotary_emb(like, torch.arange(capacity, device=like.device)[None])
        half = self.head_dim // 2
        # sin with the first half negated: rotate_half(x)·sin == roll(x, half)·signed_sin (see _rope).
        signed_sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        self._cos_sin = torch.cat([cos[0], signed_sin], dim=-1)

    def _refresh_weights(self) -> None:
        sources = [p for layer in self.model.model.layers for p in _projections(layer)]
        # Inference tensors keep no version counter, so in-place changes to them cannot be seen: repack always.
        signature = tuple((p.data_ptr(), -1 if p.is_inference() else p._version) for p in sources)
        if signature == self._signature and -1 not in (version for _, version in signature):
            return
        with torch.no_grad():
            self._layers = [_pack(layer) for layer in self.model.model.layers]
        self._signature = signature

    def step(self, tokens: Tensor, positions: Tensor, key_mask: Tensor, cache: Any) -> Tensor:
        """Logits ``[B, V]`` after feeding ``tokens [B]`` at ``positions [B]``; ``key_mask`` is ``[B, 1, 1, K]``."""
        assert self._cos_sin is not None, "call prepare(capacity) before step()"
        cos_sin = F.embedding(positions, self._cos_sin)[:, None, None, :]  # [B, 1, 1, 2·D], broadcast over heads
        cos, sin = cos_sin.split(self.head_dim, dim=-1)
        inner = self.model.model
        x = F.embedding(tokens, inner.embed_tokens.weight)
        for index, weights in enumerate(self._layers):
            x = self._attention(weights, cache.layers[index], x, cos, sin, key_mask)
            x = self._mlp(weights, x)
        x = _rms_norm(x, inner.norm.weight, self.eps)
        return F.linear(x, self.model.lm_head.weight)

    def _attention(
        self, weights: _LayerWeights, cache_layer: Any, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor
    ) -> Tensor:
        """``x + attention(...) Woᵀ``; q and k are rotated together (one rope for both)."""
        rows, heads, kv_heads, dim = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = torch.mm(_rms_norm(x, weights.norm_in, self.eps), weights.qkv)
        query_key = _rope(qkv[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, 1, dim), cos, sin)
        value = qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, 1, dim)
        keys, values = cache_layer.update(query_key[:, heads:], value)
        attended = F.scaled_dot_product_attention(
            query_key[:, :heads], keys, values, attn_mask=key_mask, scale=self.scaling, enable_gqa=heads != kv_heads
        )
        return torch.addmm(x, attended.reshape(rows, heads * dim), weights.out)

    def _mlp(self, weights: _LayerWeights, x: Tensor) -> Tensor:
        """``x + (silu(h Wgᵀ) ⊙ h Wuᵀ) Wdᵀ`` with ``h = rms_norm(x)``."""
        gate_up = torch.mm(_rms_norm(x, weights.norm_post, self.eps), weights.gate_up)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return torch.addmm(x, F.silu(gate).mul_(up), weights.down)


def _projections(layer: Any) -> tuple[Tensor, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight,
            mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)  # fmt: skip


def _pack(layer: Any) -> _LayerWeights:
    q, k, v, o, gate, up, down = _projections(layer)
    return _LayerWeights(
        norm_in=layer.input_layernorm.weight.detach(),
        qkv=torch.cat([q, k, v]).t().contiguous(),
        out=o.t().contiguous(),
        norm_post=layer.post_attention_layernorm.weight.detach(),
        gate_up=torch.cat([gate, up]).t().contiguous(),
        down=down.t().contiguous(),
    )


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``weight · x / sqrt(mean(x²) + eps)``, in float32 like transformers' ``LlamaRMSNorm``."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotary embedding ``x·cos + rotate_half(x)·sin``, ``rotate_half([a, b]) = [−b, a]``.

    Written as ``x·cos + roll(x, D/2)·[−sin₁, sin₂]`` (``roll([a, b]) = [b, a]``): three ops, not six.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def unsupported_reason(model: Any) -> str | None:
    """Why the fast path cannot take this model (``None`` when its structure is supported)."""
    config = getattr(model, "config", None)
    if type(model).__name__ != "LlamaForCausalLM" or getattr(config, "model_type", None) != "llama":
        return f"{type(model).__name__} is not LlamaForCausalLM"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "the model has attention or MLP biases"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act={config.hidden_act!r} (only silu)"
    rope_parameters = getattr(config, "rope_parameters", None) or {}
    rope_type = rope_parameters.get("rope_type", "default")
    if rope_type not in _STATIC_ROPE_TYPES:
        return f"rope_type={rope_type!r} depends on the sequence length"
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return f"attention implementation {config._attn_implementation!r}"
    return None


def fast_decoder_for(
    model: Any, forward: ModuleForward, new_cache: Any, as_mask: Any
) -> tuple[LlamaDecoder | None, str]:
    """The fast decoder if the model is supported and agrees with its own forward on a probe; else why not.

    The probe: two left-padded prompts of different lengths, prefilled through ``forward`` (the
    engine's module path), then one decode step both ways; the logits must agree within the dtype's
    tolerance (float32: 1e-4 of the logits' scale). ``new_cache(capacity)`` builds the engine's cache,
    ``as_mask(allowed)`` turns a boolean mask into the one the model's attention takes.
    """
    reason = unsupported_reason(model)
    if reason is not None:
        return None, reason
    decoder = LlamaDecoder(model)
    difference, scale = _probe_difference(model, decoder, forward, new_cache, as_mask)
    tolerance = _PROBE_TOLERANCE.get(model.dtype, _PROBE_TOLERANCE_LOW_PRECISION)
    if not difference <= tolerance * max(1.0, scale):  # also catches NaN
        log.warning("fast decode path disabled: probe logits differ from the model's forward by %.3g", difference)
        return None, f"probe logits differ from the model's forward by {difference:.3g} (scale {scale:.3g})"
    return decoder, "fast Llama decode step"


@torch.inference_mode()
def _probe_difference(
    model: Any, decoder: LlamaDecoder, forward: ModuleForward, new_cache: Any, as_mask: Any
) -> tuple[float, float]:
    device = model.lm_head.weight.device
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (2, 6), generator=generator).to(device)
    padding = torch.ones((2, 5), dtype=torch.bool, device=device)
    padding[1, :2] = False  # row 1 is a shorter, left-padded prompt
    positions = (padding.long().cumsum(1) - 1).clamp(min=0)
    step_mask = as_mask(torch.cat([padding, padding.new_ones((2, 1))], dim=1)[:, None, None, :])
    token, next_position = prompt[:, 5], positions[:, -1] + 1
    logits = []
    for fast in (False, True):
        cache = new_cache(6)
        forward(prompt[:, :5], as_mask(prefill_allowed(padding))[:, None], positions, cache)
        if fast:
            decoder.prepare(6)
            logits.append(decoder.step(token, next_position, step_mask, cache))
        else:
            logits.append(forward(token[:, None], step_mask, next_position[:, None], cache))
    reference, fast_logits = (tensor.float() for tensor in logits)
    return float((reference - fast_logits).abs().max()), float(reference.abs().max())
