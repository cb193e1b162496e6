"""Pure sampling maths: a counter-based RNG, top-k/top-p filtering, inverse-CDF draws, recorded logprobs.

Why counter-based: a completion must depend only on (request seed, sample index, position), never
on which other rows shared its batch or in what order rows were scheduled. A stateful generator
(``torch.Generator``) hands out numbers in consumption order, so batching changes them; a hash of
the counter does not.

Limit (documented, not hidden): the *uniforms* are batch-independent, but the *logits* may differ
in the last bits between batch compositions (matmul blocking, padding length), so a draw that
lands within ~1e-7 of a CDF boundary, or a near-tie under greedy, can flip. On CPU float32 the
tests see identical tokens for the same request alone and in mixed batches.

Cost (the vocabulary is large: 49,152 for SmolLM2, 151,936 for Qwen2.5): a draw without top-k/top-p never forms
a float64 copy of the logits — exponentials in float32, summed per block of :data:`CDF_BLOCK` tokens in float64,
the block found first, then the token inside it (:func:`blockwise_pick`); top-p without top-k sorts only the
few hundred most likely tokens on a CPU unless the nucleus is wider (:func:`filtered_candidates`). Measured on one
core for 128 rows × 49,152: the unfiltered draw and its logprob went from 77 to ~15 ms, top-p 0.95 from 790 ms
to ~20 ms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from groupwise.model.logprobs import logprob_temperature
from groupwise.types import SamplingParams

_TWO_64 = 1 << 64
# Tokens per block of the unfiltered draw's two-level search (blockwise_pick).
CDF_BLOCK = 512
# Candidates a CPU top-p draw sorts first (times 16 until the nucleus fits, else the whole vocabulary).
_NUCLEUS_FIRST_K = 256


def _as_int64(constant: int) -> int:
    """The int64 bit pattern of an unsigned 64-bit constant (torch has no uint64 arithmetic)."""
    constant %= _TWO_64
    return constant - _TWO_64 if constant >= 1 << 63 else constant


_GOLDEN_GAMMA = _as_int64(0x9E3779B97F4A7C15)
_MIX_1 = _as_int64(0xBF58476D1CE4E5B9)
_MIX_2 = _as_int64(0x94D049BB133111EB)


def _shift_right_logical(x: Tensor, bits: int) -> Tensor:
    """``x >>> bits`` on the unsigned bit pattern: torch's ``>>`` on int64 is arithmetic, so mask the sign fill."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """The splitmix64 finaliser, elementwise on int64 bit patterns (all arithmetic mod 2^64)::

        z = x + 0x9E3779B97F4A7C15
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EB
        return z ^ (z >>> 31)

    A bijection on 64-bit words with full avalanche, so nearby counters give unrelated outputs.
    torch int64 ``+``/``*`` wrap around on overflow, which is exactly arithmetic mod 2^64.
    """
    z = x + _GOLDEN_GAMMA
    z = (z ^ _shift_right_logical(z, 30)) * _MIX_1
    z = (z ^ _shift_right_logical(z, 27)) * _MIX_2
    return z ^ _shift_right_logical(z, 31)


def seed_to_int64(seed: int) -> int:
    """Any Python int seed as an int64 bit pattern (``seed mod 2^64``)."""
    return _as_int64(seed)


def counter_uniforms(seeds: Tensor, sample_indices: Tensor, positions: Tensor | int) -> Tensor:
    """One uniform in [0, 1) per row from its counter (seed, sample index, position)::

        h = splitmix64(splitmix64(splitmix64(seed) ^ sample_index) ^ position)
        u = (h >>> 11) · 2^-53

    (float64, 53 random bits). ``seeds``/``sample_indices`` are int64 ``[N]``; ``positions`` is an
    int or int64 ``[N]`` (the index of the token within its completion).
    """
    return keyed_uniforms(counter_keys(seeds, sample_indices), positions)


def counter_keys(seeds: Tensor, sample_indices: Tensor) -> Tensor:
    """A row's key ``k = splitmix64(splitmix64(seed) ^ sample_index)``, fixed for its whole completion."""
    return splitmix64(splitmix64(seeds) ^ sample_indices)


def keyed_uniforms(keys: Tensor, positions: Tensor | int) -> Tensor:
    """``u = (splitmix64(k ^ position) >>> 11) · 2^-53``: :func:`counter_uniforms` with the key computed once."""
    return _shift_right_logical(splitmix64(keys ^ positions), 11).to(torch.float64) * (2.0**-53)


def tempered_logprobs_of(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """``log_softmax(logits / T)[token]`` per row, T = :func:`logprob_temperature` — unfiltered.

    Top-k/top-p only restrict which tokens may be drawn; the recorded logprob is always under the
    full tempered distribution, the same one :func:`groupwise.model.completion_logprobs` computes,
    so sampling-time and training-time logprobs are directly comparable.
    """
    scaled = _tempered(logits, logprob_temperature(temperature))
    return scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


def _tempered(logits: Tensor, temperature: float) -> Tensor:
    """``logits / T`` in float32 (no copy when they already are float32 and T is 1: division by 1 is exact)."""
    scaled = logits.float()
    return scaled if temperature == 1.0 else scaled / temperature


def filtered_candidates(logits: Tensor, temperature: float, top_k: int, top_p: float) -> tuple[Tensor, Tensor]:
    """The candidate token ids ``[N, K]`` and their renormalised probabilities ``[N, K]`` (float64).

    Order of operations (as in Hugging Face ``generate``): temperature, then top-k keeps the k most
    likely tokens, then top-p keeps the shortest most-likely-first prefix whose probability under
    the top-k-renormalised distribution reaches ``top_p`` (token i is kept iff the mass before it
    is < top_p, so the most likely token always survives); dropped tokens get probability 0 and
    the rest is renormalised. With no filter the candidates are the whole vocabulary in id order.
    """
    scaled = _tempered(logits, temperature)
    if top_k <= 0 and top_p >= 1.0:
        candidates = torch.arange(logits.shape[-1], device=logits.device).expand(logits.shape[0], -1)
        return candidates, torch.softmax(scaled.double(), dim=-1)
    if 0 < top_k < logits.shape[-1]:
        values, candidates = torch.topk(scaled, top_k, dim=-1, sorted=True)
        probs = torch.softmax(values.double(), dim=-1)
    else:
        values, candidates, probs = _nucleus_order(scaled, top_p)
    if top_p < 1.0:
        mass_before = torch.cumsum(probs, dim=-1) - probs
        probs = probs * (mass_before < top_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return candidates, probs


def _nucleus_order(scaled: Tensor, top_p: float) -> tuple[Tensor, Tensor, Tensor]:
    """The most likely tokens in descending order (ties: lower id first) with their float64 probabilities under
    the whole vocabulary: enough of them to hold every row's top-p nucleus, or all of them.

    On CUDA (and where the nucleus is wide) that is one stable sort of the vocabulary. On a CPU, where that sort
    costs ~6 ms per row, the ``k`` most likely (k = 256, then 16× more) are sorted instead, and taken when every
    row's nucleus ends strictly before its ``k``-th candidate, at a larger logit than the ``k``-th: then no token
    outside the candidates could rank inside the nucleus, so the kept prefix equals the full sort's.
    """
    vocab = scaled.shape[-1]
    k = _NUCLEUS_FIRST_K if scaled.device.type == "cpu" else vocab
    if k < vocab:  # p_i = exp(z_i − max z) / Σ_j exp(z_j − max z), the sum in float64
        peak = scaled.amax(dim=-1, keepdim=True)
        total = torch.sub(scaled, peak).exp_().sum(dim=-1, keepdim=True, dtype=torch.float64)
    while k < vocab:
        top_values, top_ids = torch.topk(scaled, k, dim=-1, sorted=False)
        ids, by_id = top_ids.sort(dim=-1)  # ties broken by id, as the stable sort of the whole vocabulary does
        values, order = torch.sort(top_values.gather(-1, by_id), dim=-1, descending=True, stable=True)
        candidates = ids.gather(-1, order)
        probs = (values - peak).exp_().double().div_(total)
        kept = (torch.cumsum(probs, dim=-1) - probs < top_p).sum(dim=-1, keepdim=True)
        last_kept = values.gather(-1, kept - 1)
        if bool(((kept < k) & (last_kept > values[:, -1:])).all()):
            return values, candidates, probs
        k *= 16
    values, candidates = torch.sort(scaled, dim=-1, descending=True, stable=True)
    return values, candidates, torch.softmax(values.double(), dim=-1)


def blockwise_pick(weights: Tensor, uniforms: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`inverse_cdf_pick` on unnormalised float32 ``weights [N, V]`` without a float64 copy of them; also
    returns each row's total ``Σ_j w_j`` (float64).

    The vocabulary is cut into blocks of :data:`CDF_BLOCK` (the last one zero-padded). With block sums ``S_b``
    (float32, pairwise: relative error ~1e-7 of the block's own mass), ``C_b = Σ_{c≤b} S_c`` (float64) and the
    target ``t = u · C_last``, the block is ``b = min{b : C_b > t}`` and the token
    ``i = min{i in b : C_{b−1} + Σ_{j in b, j≤i} w_j > t}`` (the sum inside the block in float64): the first index
    whose cumulative weight exceeds ``u · total``, as in :func:`inverse_cdf_pick`. Every boundary moves by at most
    ~1e-7 of the mass before it (a float32 cumulative sum over the vocabulary would move the boundaries of the
    last tokens by ~1e-7 in absolute terms, more than the probability of many of them). Zero-weight tokens are
    never picked: the cumulative weight does not rise on them, and where rounding leaves ``t`` past the block's
    last rise the pick is the block's last token of positive weight.
    """
    rows, vocab = weights.shape
    blocks = -(-vocab // CDF_BLOCK)
    padded = F.pad(weights, (0, blocks * CDF_BLOCK - vocab)) if vocab % CDF_BLOCK else weights
    tiles = padded.view(rows, blocks, CDF_BLOCK)
    block_cdf = tiles.sum(dim=-1).double().cumsum_(dim=-1)
    total = block_cdf[:, -1:]
    targets = uniforms.to(torch.float64).unsqueeze(-1) * total
    block = torch.searchsorted(block_cdf, targets, right=True).clamp_(max=blocks - 1)
    before = F.pad(block_cdf, (1, 0)).gather(-1, block)
    inside = tiles.gather(1, block.unsqueeze(-1).expand(rows, 1, CDF_BLOCK)).squeeze(1)
    inner_cdf = torch.cumsum(inside, dim=-1, dtype=torch.float64).add_(before)
    positions = torch.arange(CDF_BLOCK, device=weights.device)
    last_rise = torch.where(inside > 0, positions, 0).amax(dim=-1, keepdim=True)
    offset = torch.minimum(torch.searchsorted(inner_cdf, targets, right=True), last_rise)
    return (block * CDF_BLOCK + offset).squeeze(-1), total.squeeze(-1)


def sample_with_logprobs(
    logits: Tensor, uniforms: Tensor, temperature: float, top_k: int, top_p: float
) -> tuple[Tensor, Tensor]:
    """:func:`sample_tokens` and :func:`tempered_logprobs_of` of the drawn tokens, in one pass over the logits when
    nothing filters: ``w = exp(z − max z)`` (float32) feeds both the draw and ``logprob = z_y − max z − log Σ w``."""
    if temperature == 0 or top_k > 0 or top_p < 1.0:
        tokens = sample_tokens(logits, uniforms, temperature, top_k, top_p)
        return tokens, tempered_logprobs_of(logits, tokens, temperature)
    scaled = _tempered(logits, temperature)
    peak = scaled.amax(dim=-1, keepdim=True)
    tokens, total = blockwise_pick(torch.sub(scaled, peak).exp_(), uniforms)
    log_normaliser = peak.squeeze(-1) + total.log().to(scaled.dtype)
    return tokens, scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_normaliser


def inverse_cdf_pick(probs: Tensor, uniforms: Tensor) -> Tensor:
    """The index i of the first candidate whose cumulative probability exceeds ``u · total``::

        i = min{ i : sum_{j<=i} p_j > u · sum_j p_j }

    Zero-probability candidates can never be picked (the CDF does not rise on them).
    """
    cdf = torch.cumsum(probs, dim=-1)
    targets = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    picks = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return picks.clamp_(max=probs.shape[-1] - 1)


def sample_tokens(logits: Tensor, uniforms: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """One token per row of ``logits [N, V]``: argmax when ``temperature == 0`` (ties → lowest id),
    else an inverse-CDF draw with ``uniforms [N]`` from :func:`filtered_candidates` (without a filter, from the
    tempered softmax by :func:`blockwise_pick`)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    if top_k <= 0 and top_p >= 1.0:
        return sample_with_logprobs(logits, uniforms, temperature, top_k, top_p)[0]
    candidates, probs = filtered_candidates(logits, temperature, top_k, top_p)
    picks = inverse_cdf_pick(probs, uniforms)
    return candidates.gather(-1, picks.unsqueeze(-1)).squeeze(-1)


def check_sampling_params(sampling: SamplingParams) -> None:
    """Reject settings the engine cannot honour, naming the field, the value and the fix."""
    if not isinstance(sampling.max_new_tokens, int) or sampling.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={sampling.max_new_tokens!r} must be an integer >= 1")
    if sampling.temperature < 0:
        raise ValueError(f"temperature={sampling.temperature} must be >= 0 (0 means greedy)")
    if not 0.0 < sampling.top_p <= 1.0:
        raise ValueError(f"top_p={sampling.top_p} must be in (0, 1]; 1.0 disables nucleus filtering")
    if not isinstance(sampling.top_k, int) or sampling.top_k < 0:
        raise ValueError(f"top_k={sampling.top_k!r} must be an integer >= 0; 0 disables top-k filtering")
    if any(not stop for stop in sampling.stop):
        raise ValueError(f"stop={sampling.stop!r} contains an empty string, which would stop every row at once")
