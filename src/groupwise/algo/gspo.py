"""GSPO: a sequence-level importance ratio, clipped per completion (``gspo``), and its token-gradient variant
(``gspo_token``). Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071.

For completion ``i`` with ``n_i`` valid tokens and advantage ``A_i``, the ratio is the geometric mean of the token
ratios, ``s_i = exp((1/n_i) Σ_t (logprob_it − prev_it))``, and over a step of ``N`` completions

    loss = (1/N) Σ_i w_i · max(−A_i·s_i, −A_i·clip(s_i, 1 − ε_low, 1 + ε_high))   (+ the penalties' row means)

``gspo_token`` uses ``s_it = sg[s_i] · exp(logprob_it − sg[logprob_it])`` per token (``sg`` = stop-gradient), which
equals ``s_i`` in value; its loss is ``(1/N) Σ_i (1/n_i) Σ_t w_i · max(−A_i·s_it, −A_i·clip(s_it, ...))``. With one
advantage per completion (ours) both give the same value and gradient; the token form is the one that admits
per-token advantages. The paper's clip range is narrow (ε of a few 1e-4), since a sequence ratio moves less than
a token ratio; set ``loss.epsilon_low`` / ``epsilon_high`` accordingly (they act only with several updates per
step). The behaviour correction is sequence-level too: ``w_i = exp((1/n_i) Σ_t (prev_it − gen_it))``, bounded
as ``loss.is_truncation`` says (``seq_mask_tis`` then drops the completions whose ``w_i`` leaves the bounds, like
``icepop``). The penalties (KL, entropy) are averaged per completion like the objective.
"""

from __future__ import annotations

import torch

from groupwise.algo.loss import clipped_objective
from groupwise.algo.loss_seam import LossInputs, LossResult
from groupwise.algo.loss_stats import chunk_stats
from groupwise.algo.loss_terms import add_penalties, cleaned, weights


def _sequence_ratio_loss(inputs: LossInputs, token_gradient: bool) -> LossResult:
    """The loss of the module docstring; ``token_gradient`` selects ``gspo_token``'s per-token ratio."""
    s = inputs.settings
    c = cleaned(inputs)
    sequence_ratio = torch.exp(c.row_mean(c.cur - c.prev))[:, None]
    if token_gradient:
        ratio = sequence_ratio.detach() * torch.exp(c.cur - c.cur.detach())
    else:
        ratio = sequence_ratio.expand_as(c.cur)
    advantages = inputs.advantages.detach()[:, None]
    objective, flags = clipped_objective(ratio, advantages, s.epsilon_low, s.epsilon_high, None)
    sequence = weights(inputs, c.row_mean(c.prev)[:, None].expand_as(c.cur),
                       c.row_mean(c.gen)[:, None].expand_as(c.cur), c.valid)  # fmt: skip
    per_token = sequence.applied * objective
    total, kl = add_penalties(per_token, inputs, c)
    loss = c.row_mean(total).sum() / inputs.normaliser
    stats = chunk_stats(c.valid, per_token, ratio, flags, sequence, kl, inputs.entropy)
    return LossResult(loss, stats)


def gspo(inputs: LossInputs) -> LossResult:
    """Sequence-level ratio, clipped per completion (module docstring)."""
    return _sequence_ratio_loss(inputs, token_gradient=False)


def gspo_token(inputs: LossInputs) -> LossResult:
    """Sequence-level ratio with a per-token gradient path (module docstring)."""
    return _sequence_ratio_loss(inputs, token_gradient=True)
