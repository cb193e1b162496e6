"""One decode step of a Llama-family model (Llama, Qwen2), straight from its weights.

Why: at the sizes this project trains on a CPU, a decode step through transformers' module tree is
mostly Python — module calls, keyword plumbing, mask and position bookkeeping — around a few small
matmuls. The same maths written as ~15 tensor ops per layer needs far less dispatch, and it is a plain
sequence of tensor ops with static shapes, which is what a CUDA graph can capture
(:mod:`groupwise.generation.slots`). Its projection weights are packed copies that follow the model:
refreshed whenever a parameter changes (an optimizer step, ``load_state_dict``), see :class:`LlamaDecoder`.
Results agree with the module path to float rounding (the matmuls run on a different layout), not bit for bit.

Scope and safety: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (optional biases on any projection, as
Qwen2's q/k/v and Llama's ``attention_bias``/``mlp_bias`` have), SiLU MLPs, full attention in every layer,
and a rotary embedding whose frequencies do not depend on the sequence length. Anything else — or a model
whose one-step logits on a probe differ from its own ``forward`` — keeps the module path;
:func:`fast_decoder_for` says why.

Per layer, for a batch of one new token per row (``x`` is ``[B, hidden]``; ``+ b`` only where a bias exists)::

    h = rms_norm(x) · w_in;   q, k, v = h Wqᵀ + bq, h Wkᵀ + bk, h Wvᵀ + bv;   q, k = rope(q), rope(k)
    x = x + attention(q, [K_cache; k], [V_cache; v]) Woᵀ + bo
    h = rms_norm(x) · w_post;   x = x + (silu(h Wgᵀ + bg) ⊙ (h Wuᵀ + bu)) Wdᵀ + bd

then ``logits = rms_norm(x) · w_final Wheadᵀ``. Grouped-query attention runs as plain attention with the
G = H / KV query heads of each KV head laid out as G query positions (one new token per row, so every query
of a row sees the same keys): ``q [B, KV, G, D]`` against ``K [B, KV, T, D]``, the key mask broadcast over
them. No K/V head is repeated and no backend needs grouped-query support.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.cache_utils import Cache

from groupwise.generation.masks import prefill_allowed
from groupwise.generation.projections import ParameterProjection, Projection, new_projection, projection_kind

log = logging.getLogger(__name__)

# (input_ids, mask, position_ids, cache) -> last-position logits: the engine's module path.
ModuleForward = Callable[[Tensor, Tensor, Tensor, Cache], Tensor]

# Model classes (and their config.model_type) whose decoder layers have the Llama structure.
_SUPPORTED_MODELS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
# Rotary types whose inverse frequencies are fixed at construction: cos/sin depend on the position only.
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# Max |fast − module| logit difference on the probe, relative to the logits' scale, per dtype.
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}


def probe_tolerance(dtype: torch.dtype, num_layers: int) -> float:
    """The probe's relative tolerance: fixed for float32/64; for bfloat16/float16 ``4 · 2⁻⁸ · √layers``.

    Both paths round every layer's output to 8 mantissa bits, in different places (fused adds, packed
    matmuls), so their difference grows like a random walk over the layers: 1.9% and 1.1% of the logits' scale
    were measured on CPU on random 24- and 30-layer models (Qwen2.5-0.5B and SmolLM2-135M shapes). The bound
    (0.03 at 4 layers, 0.08 at 24) leaves room for other kernels and still refuses a structural mismatch
    (a wrong norm epsilon or rotary table moves the logits by a large part of their scale).
    """
    return _PROBE_TOLERANCE.get(dtype, 4 * 2**-8 * math.sqrt(num_layers))


@dataclass(frozen=True)
class _LayerWeights:
    """One decoder layer's weights as the decode step multiplies them: q|k|v and gate|up packed into one projection
    each (a packed bias has zeros for the parts of q|k|v or gate|up that have none; no bias at all: ``None``)."""

    norm_in: Tensor
    qkv: Projection  # hidden -> (H + 2·KV)·D
    out: Projection  # H·D -> hidden
    norm_post: Tensor
    gate_up: Projection  # hidden -> 2·I
    down: Projection  # I -> hidden


@dataclass(frozen=True)
class DecoderWeights:
    """Every tensor one decode step reads. A CUDA graph captured from a step keeps reading these very storages,
    so dense projections are refreshed in place; a new ``DecoderWeights`` (see ``LlamaDecoder.generation``) means
    they moved."""

    embed: Tensor  # the model's input embedding (a view of its parameter)
    layers: tuple[_LayerWeights, ...]
    final_norm: Tensor
    head: Projection  # the LM head (dense: the parameter itself, the embedding when tied)
    cos_sin: Tensor  # [positions, 2·D]: cos | signed sin


class LlamaDecoder:
    """Next-token logits for one new token per row, writing its keys/values into the engine's cache.

    The projection weights are kept as packed copies (:mod:`groupwise.generation.projections`): q|k|v and
    gate|up packed into one matrix each (half the matmul calls), in oneDNN's blocked layout for float32 on CPU,
    else as contiguous ``[in, out]`` matrices; ``projections`` forces a kind (``"auto"``: choose). Norms and
    embedding are used in place; the LM head too on the dense kind (oneDNN keeps a blocked copy of it). Cost:
    one extra copy of the decoder layers' weights (and, on oneDNN, of the head).

    Freshness: :meth:`prepare` compares every source tensor's storage and in-place version counter with
    the last refresh. Changed values (an optimizer step, ``load_state_dict``) are copied into the packed
    copies (dense: in place, so their storage never moves); only a source whose storage moved (a parameter
    rebound, the model moved to another device or dtype) or a longer rotary table builds new ``DecoderWeights``
    and bumps :attr:`generation` — the signal for anything that captured a step (a CUDA graph) to capture again.
    """

    # Any (model, layer, projection): a Llama/Qwen2 module tree read by attribute; torch types every submodule
    # attribute as Tensor | Module, so these reads would not type-check without a cast each.
    def __init__(self, model: Any, projections: str = "auto") -> None:
        config = model.config
        self.model = model
        weight = model.lm_head.weight
        self.projection_kind = projection_kind(weight.device, weight.dtype, config.hidden_size, projections)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.eps = config.rms_norm_eps
        self.scaling = model.model.layers[0].self_attn.scaling  # head_dim^-0.5 for Llama; read, not assumed
        # Two matmuls on a CPU in float32/64; in half precision they would round the scores to 8 bits before the
        # softmax, where the fused kernel keeps them in float32.
        matmuls = weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.float64)
        self._attention_mask = self._attention_bias if matmuls else _as_is
        self._attend = matmul_attention if matmuls else sdpa_attention
        self.generation = 0
        self._weights: DecoderWeights | None = None
        self._storages: tuple[int, ...] = ()
        self._versions: tuple[int, ...] = ()

    @property
    def weights(self) -> DecoderWeights:
        assert self._weights is not None, "call prepare(capacity) before reading the weights"
        return self._weights

    def prepare(self, capacity: int) -> None:
        """Refresh the packed weights if the model changed; tabulate cos/sin for positions ``0 .. capacity-1``."""
        sources = _sources(self.model)
        storages = tuple(t.data_ptr() for t in sources)
        # Inference tensors keep no version counter, so in-place changes to them cannot be seen: repack always.
        versions = tuple(-1 if t.is_inference() else t._version for t in sources)
        with torch.no_grad():
            if self._weights is None or storages != self._storages:
                cos_sin = self._rotary_table(capacity)
                self._rebind(self._build(cos_sin))
            else:
                if versions != self._versions or -1 in versions:
                    for packed, layer in zip(self._weights.layers, self.model.model.layers, strict=True):
                        _repack_into(packed, layer)
                    self._weights.head.refresh(self.model.lm_head.weight, None)
                if self._weights.cos_sin.shape[0] < capacity:
                    self._rebind(dataclasses.replace(self._weights, cos_sin=self._rotary_table(capacity)))
        self._storages, self._versions = storages, versions

    def weights_stamp(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """What the model's weights are now, as :meth:`prepare` tells a change: every source tensor's storage and
        in-place version counter (equal stamps, same values). None when a change cannot be seen (inference
        tensors keep no version counter)."""
        sources = _sources(self.model)
        if any(t.is_inference() for t in sources):
            return None
        return tuple(t.data_ptr() for t in sources), tuple(t._version for t in sources)

    def _rebind(self, weights: DecoderWeights) -> None:
        self._weights = weights
        self.generation += 1

    def _build(self, cos_sin: Tensor) -> DecoderWeights:
        inner, kind = self.model.model, self.projection_kind
        head = self.model.lm_head.weight
        return DecoderWeights(
            embed=inner.embed_tokens.weight.detach(),
            layers=tuple(_pack(layer, kind) for layer in inner.layers),
            final_norm=inner.norm.weight.detach(),
            head=ParameterProjection(head, None) if kind == "dense" else new_projection(kind, head, None),
            cos_sin=cos_sin,
        )

    def _rotary_table(self, capacity: int) -> Tensor:
        like = self.model.model.embed_tokens.weight[:1]  # only its dtype and device matter
        cos, sin = self.model.model.rotary_emb(like, torch.arange(capacity, device=like.device)[None])
        half = self.head_dim // 2
        # sin with the first half negated: rotate_half(x)·sin == roll(x, half)·signed_sin (see _rope).
        signed_sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        return torch.cat([cos[0], signed_sin], dim=-1)

    def step(
        self, tokens: Tensor, positions: Tensor, key_mask: Tensor, cache: Any, weights: DecoderWeights | None = None
    ) -> Tensor:  # Any: a transformers Cache (its layers typed as a union without update) or the slots' cache
        """Logits ``[B, V]`` after feeding ``tokens [B]`` at ``positions [B]``; ``key_mask`` is ``[B, 1, 1, K]``.

        ``weights`` defaults to the current ones; a captured step passes the ones it was captured with.
        """
        weights = weights or self.weights
        cos_sin = F.embedding(positions, weights.cos_sin)[:, None, None, :]  # [B, 1, 1, 2·D], broadcast over heads
        cos, sin = cos_sin.split(self.head_dim, dim=-1)
        x = F.embedding(tokens, weights.embed)
        attention_mask = self._attention_mask(key_mask)  # once per step, in the form self._attend takes
        for index, layer in enumerate(weights.layers):
            x = self._attention(layer, cache.layers[index], x, cos, sin, attention_mask)
            x = self._mlp(layer, x)
        return weights.head(_rms_norm(x, weights.final_norm, self.eps))

    def _attention_bias(self, key_mask: Tensor) -> Tensor:
        """The key mask ``[B, 1, 1, K]`` (boolean, or additive 0 / -inf) as :func:`matmul_attention`'s additive bias
        ``[B·KV, G, K]`` in the weights' dtype, one copy per KV head and grouped query."""
        rows, groups = key_mask.shape[0], self.num_heads // self.num_kv_heads
        dtype = self.model.lm_head.weight.dtype
        if key_mask.dtype == torch.bool:
            bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill_(~key_mask, -math.inf)
        else:
            bias = key_mask.to(dtype)
        return bias.expand(rows, self.num_kv_heads, groups, -1).reshape(rows * self.num_kv_heads, groups, -1)

    def _attention(
        self, weights: _LayerWeights, cache_layer: Any, x: Tensor, cos: Tensor, sin: Tensor, attention_mask: Tensor
    ) -> Tensor:  # Any: one layer of that cache
        """``x + attention(...) Woᵀ``; q and k are rotated together (one rope for both)."""
        rows, heads, kv_heads, dim = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = weights.qkv(_rms_norm(x, weights.norm_in, self.eps))
        query_key = _rope(qkv[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, 1, dim), cos, sin)
        value = qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, 1, dim)
        keys, values = cache_layer.update(query_key[:, heads:], value)
        query = query_key[:, :heads].reshape(rows, kv_heads, heads // kv_heads, dim)  # query heads grouped per KV head
        attended = self._attend(query, keys, values, attention_mask, self.scaling)
        return weights.out(attended.reshape(rows, heads * dim), residual=x)

    def _mlp(self, weights: _LayerWeights, x: Tensor) -> Tensor:
        """``x + (silu(h Wgᵀ) ⊙ h Wuᵀ) Wdᵀ`` with ``h = rms_norm(x)``."""
        gate_up = weights.gate_up(_rms_norm(x, weights.norm_post, self.eps))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return weights.down(F.silu(gate).mul_(up), residual=x)


def matmul_attention(query: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scale: float) -> Tensor:
    """``softmax(s·Q Kᵀ + bias) V`` as two batched matmuls (the scale and the mask fused into the first), for
    float32/float64 inputs; ``query [B, KV, G, D]``, ``keys``/``values [B, KV, K, D]``, ``bias [B·KV, G, K]``
    (0 where a query may attend, -inf where not; see ``LlamaDecoder._attention_bias``).

    Why not ``scaled_dot_product_attention`` on a CPU: its fused kernel is built for long query blocks; with the
    decode step's G = H / KV query positions per KV head it took 1.6–2× as long as this (SmolLM2-135M's shape,
    2 cores: 2.2 vs 1.35 ms per layer at 128 rows and 64 keys). Every row may attend to at least one key (the
    engine guarantees it), so no softmax is over -inf alone.
    """
    rows, kv_heads, groups, dim = query.shape
    flat = rows * kv_heads
    scores = torch.baddbmm(bias, query.reshape(flat, groups, dim), keys.reshape(flat, -1, dim).transpose(1, 2),
                           alpha=scale)  # fmt: skip
    attended = torch.bmm(torch.softmax(scores, dim=-1), values.reshape(flat, -1, dim))
    return attended.view(rows, kv_heads, groups, dim)


def sdpa_attention(query: Tensor, keys: Tensor, values: Tensor, key_mask: Tensor, scale: float) -> Tensor:
    """torch's fused attention (CUDA: the kernel the slots pin, which a CUDA graph can capture)."""
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=key_mask, scale=scale)


def _as_is(key_mask: Tensor) -> Tensor:
    return key_mask


def _projections(layer: Any) -> tuple[Any, ...]:  # Any: a decoder layer and its Linear modules (see LlamaDecoder)
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)


def _sources(model: Any) -> list[Tensor]:  # Any: as in LlamaDecoder
    """Every model tensor the step reads (weights and biases of every projection, norms, embedding, head)."""
    inner = model.model
    tensors = [inner.embed_tokens.weight, inner.norm.weight, model.lm_head.weight]
    for layer in inner.layers:
        tensors += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        for projection in _projections(layer):
            tensors += [projection.weight] + ([projection.bias] if projection.bias is not None else [])
    return tensors


def _packed_bias(projections: tuple[Any, ...]) -> Tensor | None:  # Any: as in LlamaDecoder
    """The concatenated biases of ``projections`` (zeros for one without), or ``None`` when none has a bias."""
    if all(p.bias is None for p in projections):
        return None
    return torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in projections])


def _packed(layer: Any) -> dict[str, tuple[Tensor, Tensor | None]]:  # Any: as in LlamaDecoder
    """Each projection's ``[out, in]`` weight (q|k|v and gate|up concatenated) and bias, as fresh values."""
    q, k, v, o, gate, up, down = _projections(layer)
    return {
        "qkv": (torch.cat([q.weight, k.weight, v.weight]), _packed_bias((q, k, v))),
        "out": (o.weight, o.bias),
        "gate_up": (torch.cat([gate.weight, up.weight]), _packed_bias((gate, up))),
        "down": (down.weight, down.bias),
    }


def _pack(layer: Any, kind: str) -> _LayerWeights:  # Any: as in LlamaDecoder
    projections = {name: new_projection(kind, weight, bias) for name, (weight, bias) in _packed(layer).items()}
    return _LayerWeights(
        norm_in=layer.input_layernorm.weight.detach(),
        norm_post=layer.post_attention_layernorm.weight.detach(),
        **projections,
    )


def _repack_into(weights: _LayerWeights, layer: Any) -> None:  # Any: as in LlamaDecoder
    """Give the layer's current values to its projections (dense: copied into their storage, which captured graphs
    read). Norms are views of the parameters themselves, current by construction."""
    for name, (weight, bias) in _packed(layer).items():
        getattr(weights, name).refresh(weight, bias)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``weight · x / sqrt(mean(x²) + eps)``, normalised in float32 like transformers' ``LlamaRMSNorm``."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotary embedding ``x·cos + rotate_half(x)·sin``, ``rotate_half([a, b]) = [−b, a]``.

    Written as ``x·cos + roll(x, D/2)·[−sin₁, sin₂]`` (``roll([a, b]) = [b, a]``): three ops, not six.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the fast path cannot take this model (``None`` when its structure is supported)."""
    config = getattr(model, "config", None)
    name = type(model).__name__
    if name not in _SUPPORTED_MODELS or getattr(config, "model_type", None) != _SUPPORTED_MODELS[name]:
        return f"{name} is not LlamaForCausalLM or Qwen2ForCausalLM"
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return f"layer types {sorted(set(layer_types))} (only full attention)"
    hidden_act = getattr(config, "hidden_act", None)
    if hidden_act != "silu":
        return f"hidden_act={hidden_act!r} (only silu)"
    rope_parameters = getattr(config, "rope_parameters", None) or {}
    rope_type = rope_parameters.get("rope_type", "default")
    if rope_type not in _STATIC_ROPE_TYPES:
        return f"rope_type={rope_type!r} depends on the sequence length"
    attention = getattr(config, "_attn_implementation", "sdpa")
    if attention not in ("sdpa", "eager"):
        return f"attention implementation {attention!r}"
    return None


def fast_decoder_for(
    model: Any, forward: ModuleForward, new_cache: Callable[[int], Cache], as_mask: Callable[[Tensor], Tensor],
    projections: str = "auto",
) -> tuple[LlamaDecoder | None, str]:  # Any: as in LlamaDecoder
    """The fast decoder if the model is supported and agrees with its own forward on a probe; else why not.

    The probe: two left-padded prompts of different lengths, prefilled through ``forward`` (the
    engine's module path), then one decode step both ways; the logits must agree within
    :func:`probe_tolerance` of their scale (float32: 1e-4). ``new_cache(capacity)`` builds the engine's
    cache, ``as_mask(allowed)`` turns a boolean mask into the one the model's attention takes; ``projections``
    is :class:`LlamaDecoder`'s.
    """
    reason = unsupported_reason(model)
    if reason is not None:
        return None, reason
    decoder = LlamaDecoder(model, projections)
    difference, scale = _probe_difference(model, decoder, forward, new_cache, as_mask)
    tolerance = probe_tolerance(model.dtype, len(model.model.layers))
    if not difference <= tolerance * max(1.0, scale):  # also catches NaN
        log.warning("fast decode path disabled: probe logits differ from the model's forward by %.3g", difference)
        return None, f"probe logits differ from the model's forward by {difference:.3g} (scale {scale:.3g})"
    return decoder, "fast Llama decode step"


@torch.inference_mode()
def _probe_difference(
    model: Any, decoder: LlamaDecoder, forward: ModuleForward, new_cache: Callable[[int], Cache],
    as_mask: Callable[[Tensor], Tensor],
) -> tuple[float, float]:  # Any: as in LlamaDecoder
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
