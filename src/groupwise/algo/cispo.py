"""CISPO: the clipped importance weight as a detached coefficient on the log-probability, so no token loses its
gradient. MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
arXiv:2506.13585.

Per valid token, with ratio ``r = exp(logprob − prev)`` and the completion's advantage ``A``,

    ℓ = −w · sg[min(r, 1 + ε_high)] · A · logprob        loss = Σ_i Σ_t ℓ_it / Σ_i n_i   (token-level mean)

where ``sg`` is stop-gradient and ``w`` the behaviour importance weight of :mod:`groupwise.algo.importance`. The
gradient is ``−w · min(r, 1 + ε_high) · A · ∇logprob`` on EVERY token: where PPO's clip zeroes a token's gradient,
CISPO only caps its weight. As in the paper only the upper bound is applied (``loss.epsilon_low`` has no effect:
a config error). ``loss/clip_high_fraction`` counts the tokens whose coefficient was capped. Note that the loss
VALUE is in log-probability units (a surrogate whose gradient is the point), not comparable with the PPO family's.
"""

from __future__ import annotations

import torch

from groupwise.algo.loss_seam import LossInputs, LossResult
from groupwise.algo.loss_stats import chunk_stats
from groupwise.algo.loss_terms import add_penalties, cleaned, weights


def cispo(inputs: LossInputs) -> LossResult:
    """The token-level CISPO loss sum over ``normaliser`` (module docstring)."""
    s = inputs.settings
    c = cleaned(inputs)
    ratio = torch.exp(c.cur - c.prev)
    cap = 1.0 + s.epsilon_high
    coefficient = ratio.clamp(max=cap).detach()
    objective = -inputs.advantages.detach()[:, None] * coefficient * c.cur
    w = weights(inputs, c.prev, c.gen, c.valid)
    per_token = w.applied * objective
    total, kl = add_penalties(per_token, inputs, c)
    loss = (total * c.mask).sum() / inputs.normaliser
    capped = ratio.detach() > cap
    flags = {"clip": capped, "clip_high": capped}  # no lower bound: CISPO caps the weight from above only
    stats = chunk_stats(c.valid, per_token, ratio, flags, w, kl, inputs.entropy)
    return LossResult(loss, stats)
