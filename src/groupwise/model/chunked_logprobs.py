"""Per-token logprobs and entropies from final hidden states, through the LM head a chunk of positions at a time.

Why: the plain path materialises ``[rows, T, V]`` float32 logits and a softmax of the same size, plus their
gradients; at V = 152k and 1k-token completions that is gigabytes per micro-batch. Here only ``chunk × V``
logits exist at any moment, in the forward and in the backward pass. A Python loop over chunks under autograd
would still keep every chunk's logits for the backward pass, so this is one ``torch.autograd.Function`` that
saves only the hidden states, the head weight (and bias), the targets, ``logZ`` and the entropy, and recomputes
each chunk's logits in its backward pass.

For scored position i with final hidden state ``h_i``, head ``W`` ``[V, H]`` (bias ``b``), temperature T::

    u_i = W h_i + b,   z_i = u_i / T,   logZ_i = logsumexp_v z_iv,   p_i = softmax(z_i)
    logprob_i = z_i[y_i] − logZ_i
    entropy_i = logZ_i − Σ_v p_iv z_iv

and the gradients the backward pass recomputes chunk by chunk::

    ∂logprob_i/∂z_i = onehot(y_i) − p_i
    ∂entropy_i/∂z_i = −p_i ⊙ (z_i − E_p[z_i]),   E_p[z_i] = logZ_i − entropy_i
    ∂u_i = ∂z_i / T;   ∂h_i = Wᵀ ∂u_i;   ∂W = Σ_i ∂u_i h_iᵀ;   ∂b = Σ_i ∂u_i

The entropy gradient is only formed when the entropy enters the loss (its output receives a gradient); the
statistics-only entropy costs the forward pass alone. Logits are computed in ``compute_dtype`` (bfloat16 under
CUDA mixed precision) and reduced in float32 (float64 inputs stay float64, for ``gradcheck``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs, the input dtype itself for float32 / float64."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """``z = (h Wᵀ + b) / T`` for one chunk, in the accumulation dtype (a fresh tensor the caller may overwrite)."""
    logits = hidden @ weight.t()
    if bias is not None:
        logits.add_(bias.to(logits.dtype))
    return logits.to(_accumulation_dtype(logits.dtype)).div_(temperature)


class _HeadLogprobs(torch.autograd.Function):
    """See the module docstring. Inputs: hidden ``[N, H]``, weight ``[V, H]``, bias ``[V]`` or None, targets
    ``[N]`` (long), temperature, chunk size, compute dtype. Outputs: logprobs and entropy, ``[N]`` each.

    Each chunk needs two ``[chunk, V]`` buffers (the logits and the probabilities), forward and backward: every
    other step works in place, and the weight gradient accumulates with ``addmm_`` (no ``[V, H]`` temporary).
    """

    @staticmethod
    def forward(
        ctx: Any,  # Any: autograd's context, which forward gives fields of its own (FunctionCtx declares none)
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        chunk_size: int,
        compute_dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        acc = _accumulation_dtype(compute_dtype)
        num = hidden.shape[0]
        logprobs = hidden.new_empty(num, dtype=acc)
        entropy = hidden.new_empty(num, dtype=acc)
        log_normaliser = hidden.new_empty(num, dtype=acc)
        w = weight.to(compute_dtype)
        for start in range(0, num, chunk_size):
            end = min(start + chunk_size, num)
            z = _chunk_logits(hidden[start:end].to(compute_dtype), w, bias, temperature)
            peak = z.amax(dim=-1, keepdim=True)
            probs = torch.sub(z, peak).exp_()
            total = probs.sum(dim=-1, keepdim=True)
            lz = (total.log() + peak).squeeze(-1)  # logsumexp, with the exponentials kept as probabilities
            log_normaliser[start:end] = lz
            logprobs[start:end] = z.gather(-1, targets[start:end, None]).squeeze(-1) - lz
            entropy[start:end] = lz - probs.div_(total).mul_(z).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, targets, log_normaliser, entropy)
        ctx.temperature, ctx.chunk_size, ctx.compute_dtype = temperature, chunk_size, compute_dtype
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    def backward(  # ctx: Any, as in forward
        ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, log_normaliser, entropy = ctx.saved_tensors
        temperature, chunk_size, compute_dtype = ctx.temperature, ctx.chunk_size, ctx.compute_dtype
        acc = _accumulation_dtype(compute_dtype)
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want_bias and bias is not None else None
        if grad_logprobs is None and grad_entropy is None:
            return grad_hidden, grad_weight, grad_bias, None, None, None, None
        w = weight.to(compute_dtype)
        for start in range(0, hidden.shape[0], chunk_size):
            end = min(start + chunk_size, hidden.shape[0])
            h = hidden[start:end].to(compute_dtype)
            grad_u = _chunk_grad(
                _chunk_logits(h, w, bias, temperature), log_normaliser[start:end, None], entropy[start:end, None],
                targets[start:end, None], grad_logprobs, grad_entropy, start, end, temperature,
            )  # fmt: skip
            if grad_hidden is not None:
                grad_hidden[start:end] = (grad_u.to(compute_dtype) @ w).to(hidden.dtype)
            if grad_weight is not None:
                if compute_dtype == acc:
                    grad_weight.addmm_(grad_u.t(), h)
                else:
                    grad_weight += (grad_u.t().to(compute_dtype) @ h).to(acc)
            if grad_bias is not None:
                grad_bias += grad_u.sum(dim=0)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def _chunk_grad(
    z: Tensor,
    lz: Tensor,
    entropy: Tensor,
    targets: Tensor,
    grad_logprobs: Tensor | None,
    grad_entropy: Tensor | None,
    start: int,
    end: int,
    temperature: float,
) -> Tensor:
    """``∂/∂u`` of one chunk from its logits ``z`` (overwritten): the module docstring's formulas, in place."""
    probs = torch.sub(z, lz).exp_()
    if grad_entropy is not None:  # z ← −p ⊙ (z − E_p[z]) · g_H
        z.sub_(lz - entropy).mul_(probs).mul_(grad_entropy[start:end, None].to(z.dtype).neg())
    if grad_logprobs is None:
        return z.div_(temperature)
    g = grad_logprobs[start:end, None].to(z.dtype)
    grad_z = probs.mul_(g.neg()).scatter_add_(-1, targets, g)  # (onehot − p) · g
    if grad_entropy is not None:
        grad_z.add_(z)
    return grad_z.div_(temperature)


def head_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: float,
    chunk_size: int,
    bias: Tensor | None = None,
    compute_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """Logprobs and entropies ``[N]`` of ``targets`` under ``softmax((hidden Wᵀ + b) / temperature)``.

    ``hidden`` is ``[N, H]`` (only the scored positions: no padding), ``weight`` the LM head's ``[V, H]``.
    Peak extra memory is a few ``chunk_size × V`` buffers; the gradient reaches ``hidden``, ``weight`` and
    ``bias``. ``compute_dtype`` (default: ``hidden``'s) is the dtype of the logits matmul.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [N, H] and weight {tuple(weight.shape)} [V, H]")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets {tuple(targets.shape)} must be [N] = [{hidden.shape[0]}]")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0 (greedy logprobs are scored at 1)")
    dtype = hidden.dtype if compute_dtype is None else compute_dtype
    return _HeadLogprobs.apply(hidden, weight, bias, targets.long(), float(temperature), int(chunk_size), dtype)
