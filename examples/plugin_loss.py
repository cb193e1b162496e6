"""A plug-in loss with its own setting and its own metrics (docs/learner.md, "Your own loss").

REINFORCE with a scaled advantage, ``loss = −Σ_i Σ_t c · A_i · logprob_it / normaliser``, where ``c`` is the
plug-in's own knob ``loss.kwargs.advantage_scale`` (default 1):

    groupwise train examples/addition.yaml loss.type=examples/plugin_loss.py:scaled_reinforce \\
        loss.kwargs.advantage_scale=2.0 loss.entropy_coef=0

It logs ``loss/policy`` (the one ``LossStats`` field it fills; the clip and importance-weight keys it does not fill
are not logged) and two metrics of its own, ``loss/plugin/advantage_abs`` (per completion) and
``loss/plugin/logprob`` (per token).
"""

from __future__ import annotations

import torch

from groupwise.algo.loss_menu import LossDeclaration
from groupwise.algo.loss_seam import LossInputs, LossResult, PolicyLoss
from groupwise.algo.loss_stats import LossStats, Mean


def _scaled_reinforce(inputs: LossInputs) -> LossResult:
    scale = float(inputs.kwargs.get("advantage_scale", 1.0))
    mask = (inputs.mask > 0).to(inputs.logprobs.dtype)
    logprobs = inputs.logprobs.masked_fill(inputs.mask == 0, 0.0)  # padding may hold any value, even inf
    advantages = scale * inputs.advantages.detach()
    per_token = -advantages[:, None] * logprobs * mask
    with torch.no_grad():
        stats = LossStats(num_tokens=float(mask.sum()), policy_sum=float(per_token.sum()))
        metrics = {
            "advantage_abs": Mean(float(advantages.abs().sum()), float(advantages.numel())),
            "logprob": Mean(float(logprobs.sum()), float(mask.sum())),
        }
    return LossResult(per_token.sum() / inputs.normaliser, stats, metrics)


#: A token-level sum that needs neither the reference policy nor the entropy, and reads one ``loss.kwargs`` key.
scaled_reinforce = PolicyLoss(
    "scaled_reinforce",
    _scaled_reinforce,
    LossDeclaration("token_level", reads=frozenset(), needs_entropy=False, kwargs=frozenset({"advantage_scale"})),
)
