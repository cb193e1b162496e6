"""Rollout–trainer mismatch: how far the logprobs recorded at sampling time are from the learner's own, on the
tokens the learner's current weights sampled.

A token drawn under weight version ``v`` and trained at a step whose weights are version ``v`` (staleness 0) has
two logprobs of the same policy: ``g``, what the generator recorded when it drew it, and ``ℓ``, what the learner
computes for it now (π_old, before the step's update). They differ only by how the two compute: another engine
(vLLM's kernels), another precision (a bfloat16 generator copy), batch shapes. With ``δ = ℓ − g`` per token:

* ``mismatch/logprob_abs_diff`` = ``mean |δ|``;
* ``mismatch/kl_k3`` = ``mean (exp(δ) − 1 − δ)``, the k3 estimate of ``KL(π_gen ‖ π_learner)`` from tokens the
  generator sampled (unbiased, never negative);

both over the step's on-policy tokens only: a stale token's gap is the policy's own change, which importance
sampling corrects and which is not a mismatch. Every backend reports them (docs/metrics.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MismatchStats:
    """The mismatch sums of a step's micro-batches: ``abs_sum`` ``Σ |δ|`` and ``k3_sum`` ``Σ (exp(δ) − 1 − δ)``
    over the ``on_policy_tokens``, out of the ``scored_tokens`` (every valid token the learner scored)."""

    abs_sum: float = 0.0
    k3_sum: float = 0.0
    on_policy_tokens: float = 0.0
    scored_tokens: float = 0.0

    def merge(self, other: MismatchStats) -> MismatchStats:
        """Add ``other``'s sums into these; returns ``self``."""
        self.abs_sum += other.abs_sum
        self.k3_sum += other.k3_sum
        self.on_policy_tokens += other.on_policy_tokens
        self.scored_tokens += other.scored_tokens
        return self

    def as_metrics(self) -> dict[str, float]:
        """``mismatch/on_policy_fraction`` when any token was scored; the gap and the KL when any was on-policy."""
        metrics = {}
        if self.scored_tokens:
            metrics["mismatch/on_policy_fraction"] = self.on_policy_tokens / self.scored_tokens
        if self.on_policy_tokens:
            metrics["mismatch/logprob_abs_diff"] = self.abs_sum / self.on_policy_tokens
            metrics["mismatch/kl_k3"] = self.k3_sum / self.on_policy_tokens
        return metrics


def on_policy_tokens(token_versions: torch.Tensor, version: int, mask: torch.Tensor) -> torch.Tensor:
    """``[R, T]`` mask of the valid tokens (``mask``) sampled under weight ``version`` (``token_versions``: each
    token's version, any value where ``mask`` is 0)."""
    return mask.bool() & (token_versions == version)


def mismatch_stats(learner_logprobs: torch.Tensor, generation_logprobs: torch.Tensor, on_policy: torch.Tensor,
                   mask: torch.Tensor) -> MismatchStats:  # fmt: skip
    """The mismatch sums of one micro-batch (module docstring): ``Σ |δ|``, ``Σ (exp(δ) − 1 − δ)`` and the count over
    the ``on_policy`` tokens, ``δ = ℓ − g`` in float32 (``learner_logprobs`` detached), out of ``mask``'s valid
    tokens."""
    delta = (learner_logprobs.detach().float() - generation_logprobs.float())[on_policy]
    return MismatchStats(
        abs_sum=float(delta.abs().sum()),
        k3_sum=float((torch.expm1(delta) - delta).sum()),
        on_policy_tokens=float(delta.numel()),
        scored_tokens=float((mask > 0).sum()),
    )
