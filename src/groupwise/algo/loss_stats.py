"""What a loss reports besides its value, and how a step's micro-batches (and data-parallel ranks) add up to the
step's ``loss/*`` metrics.

:class:`LossStats` holds sums over the valid tokens of one micro-batch; :meth:`LossStats.merge` adds micro-batches,
:meth:`LossStats.as_metrics` divides by the tokens (or completions) they cover. A statistic a loss does not measure
stays ``None`` and is not logged: a plug-in loss that fills none of the PPO-shaped fields logs none of them, never
a 0.0 that reads as measured. A plug-in's own metrics are :class:`Mean` values, logged as ``loss/plugin/<name>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

import torch

from groupwise.algo.importance import BehaviourWeights

#: What a plug-in metric's name may be (it becomes ``loss/plugin/<name>``).
METRIC_NAME = re.compile(r"[a-z0-9_]{1,64}")
PLUGIN_PREFIX = "loss/plugin/"


@dataclass(frozen=True)
class Mean:
    """A plug-in loss's own metric on one micro-batch: ``total`` over ``count`` items (tokens or completions, the
    loss's choice). The step logs ``Σ total / Σ count`` over its micro-batches and ranks; a count of 0 logs nothing."""

    total: float
    count: float

    def __add__(self, other: Mean) -> Mean:
        return Mean(self.total + other.total, self.count + other.count)


#: ``loss/*`` key → the :class:`LossStats` field it is the token mean of.
_PER_TOKEN = {
    "loss/policy": "policy_sum",
    "loss/clip_fraction": "clip_count",
    "loss/clip_low_fraction": "clip_low_count",
    "loss/clip_high_fraction": "clip_high_count",
    "loss/dual_clip_fraction": "dual_clip_count",
    "loss/is_weight_mean": "is_weight_sum",
    "loss/is_oob_fraction": "is_oob_count",
    "loss/ratio_mean": "ratio_sum",
    "loss/kl": "kl_sum",
    "loss/entropy": "entropy_sum",
}


@dataclass
class LossStats:
    """Sums over the valid tokens of one micro-batch (``None``: not measured by this loss).

    ``num_tokens`` / ``num_sequences``: the valid tokens and the completions with at least one, which the sums are
    over. ``policy_sum``: the weighted objective ``w·ℓ``; ``clip_*_count``: tokens where that bound of the clip bound
    the objective; ``is_weight_sum`` / ``is_weight_max`` / ``is_oob_count``: the raw behaviour weight and the tokens
    whose raw weight left ``[is_ratio_min, is_ratio_max]``; ``is_seq_masked_count``: completions ``seq_mask_tis``
    dropped; ``ratio_sum``: the PPO ratio; ``kl_sum``: the k3 KL (before ``kl_coef``); ``entropy_sum``: the entropy.
    ``plugin``: a plug-in's own metrics by name.
    """

    num_tokens: float = 0.0
    num_sequences: float = 0.0
    policy_sum: float | None = None
    clip_count: float | None = None
    clip_low_count: float | None = None
    clip_high_count: float | None = None
    dual_clip_count: float | None = None
    kl_sum: float | None = None
    entropy_sum: float | None = None
    is_weight_sum: float | None = None
    is_weight_max: float | None = None
    is_oob_count: float | None = None
    is_seq_masked_count: float | None = None
    ratio_sum: float | None = None
    plugin: dict[str, Mean] = field(default_factory=dict)

    def merge(self, other: LossStats) -> LossStats:
        """Add ``other``'s sums into these (``is_weight_max`` takes the max; a ``None`` side is skipped); ``self``."""
        for f in fields(self):
            if f.name == "plugin":
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if theirs is None:
                continue
            if mine is None:
                setattr(self, f.name, theirs)
            else:
                setattr(self, f.name, max(mine, theirs) if f.name == "is_weight_max" else mine + theirs)
        for name, mean in other.plugin.items():
            self.plugin[name] = self.plugin[name] + mean if name in self.plugin else mean
        return self

    def as_metrics(self, total_loss: float | None = None) -> dict[str, float]:
        """Step means of the measured statistics, plus ``loss/total`` when the loss is passed in (docs/metrics.md).

        Token means divide by ``num_tokens``; ``loss/is_seq_masked_fraction`` by ``num_sequences``; a plug-in's
        ``loss/plugin/<name>`` is its ``Σ total / Σ count``. Nothing measured over no tokens is logged.
        """
        metrics: dict[str, float] = {}
        if total_loss is not None:
            metrics["loss/total"] = float(total_loss)
        if self.num_tokens:
            for key, name in _PER_TOKEN.items():
                value = getattr(self, name)
                if value is not None:
                    metrics[key] = value / self.num_tokens
            if self.is_weight_max is not None:
                metrics["loss/is_weight_max"] = self.is_weight_max
        if self.num_sequences and self.is_seq_masked_count is not None:
            metrics["loss/is_seq_masked_fraction"] = self.is_seq_masked_count / self.num_sequences
        for name, mean in sorted(self.plugin.items()):
            if mean.count:
                metrics[PLUGIN_PREFIX + name] = mean.total / mean.count
        return metrics


def chunk_stats(
    valid: torch.Tensor,
    per_token: torch.Tensor,
    ratio: torch.Tensor,
    flags: dict[str, torch.Tensor],
    weights: BehaviourWeights,
    kl: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> LossStats:
    """A built-in loss's sums over the ``valid`` tokens of one micro-batch (no gradient). ``flags``: boolean
    ``[R, T]`` masks of where each clip bound (``clip`` and whichever of ``clip_low``, ``clip_high``, ``dual_clip``
    the loss has); the KL and the entropy are counted when given."""
    with torch.no_grad():

        def total(t: torch.Tensor) -> float:
            return float(torch.where(valid, t.to(per_token.dtype), torch.zeros_like(per_token)).sum())

        def flagged(name: str) -> float | None:
            return total(flags[name]) if name in flags else None

        num_tokens = float(valid.sum())
        rows = valid.any(dim=1)
        masked = weights.masked_rows
        return LossStats(
            num_tokens=num_tokens,
            num_sequences=float(rows.sum()),
            policy_sum=total(per_token),
            clip_count=flagged("clip"),
            clip_low_count=flagged("clip_low"),
            clip_high_count=flagged("clip_high"),
            dual_clip_count=flagged("dual_clip"),
            kl_sum=total(kl) if kl is not None else None,
            entropy_sum=total(entropy) if entropy is not None else None,
            is_weight_sum=total(weights.raw),
            is_weight_max=float(weights.raw[valid].max()) if num_tokens else None,
            is_oob_count=total(weights.out_of_bounds),
            is_seq_masked_count=float((masked & rows).sum()) if masked is not None else None,
            ratio_sum=total(ratio),
        )
