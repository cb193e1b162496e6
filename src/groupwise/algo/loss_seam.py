"""The seam between the learner and a loss: one typed value in (:class:`LossInputs`), one typed value out
(:class:`LossResult`), and the loss itself (:class:`PolicyLoss`: its function and its declaration).

Every built-in loss and every plug-in (``loss.type: package.module:name``) has the same contract, so adding a loss
touches no learner code. The learner hands over the tensors of one micro-batch and ``normaliser = 1``: the loss
returns a SUM over the micro-batch (tokens, or per-completion means, as its declaration says), and the learner
divides the step's summed gradients by the step-wide count of what the declaration normalises over. So a loss's
value and gradient do not depend on how the step is cut into chunks and micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from groupwise.algo.loss import LossStats
from groupwise.algo.loss_menu import LossDeclaration, Normalization

if TYPE_CHECKING:
    from groupwise.config.algorithm import LossSection


@dataclass(frozen=True, eq=False)
class LossInputs:
    """What the learner hands a loss for one micro-batch of ``R`` completions padded to ``T`` tokens.

    ``logprobs`` ``[R, T]`` carries the gradient (the policy being trained, at the sampling temperature);
    ``prev_logprobs`` (π_old: the weights before this step's first update) and ``generation_logprobs`` (what
    the sampler recorded when it drew each token) are data. ``advantages`` ``[R]``, one per completion.
    ``mask`` ``[R, T]``: 1 on a trainable completion token, 0 on padding (padded positions may hold any value,
    even inf). ``normaliser``: what the loss divides its sum by (the learner passes 1 and normalises the step).
    ``settings``: the run's ``loss`` section. ``max_completion_tokens``: ``generation.max_new_tokens`` (the
    constant of ``dr_grpo``). ``ref_logprobs`` and ``entropy`` are given only when the loss's declaration
    asks for them (and for the built-in losses' KL term, when ``loss.kl_coef > 0``), else ``None``.
    """

    logprobs: torch.Tensor
    prev_logprobs: torch.Tensor
    generation_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    settings: LossSection
    normaliser: float = 1.0
    max_completion_tokens: int | None = None
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class LossResult:
    """A loss's value (a 0-dim tensor carrying the gradient) and its statistics (sums over valid tokens)."""

    loss: torch.Tensor
    stats: LossStats


LossFunction = Callable[[LossInputs], LossResult]


@dataclass(frozen=True)
class PolicyLoss:
    """A loss the learner can call: its name, its function and what it declares it needs.

    A plug-in target (``loss.type: package.module:name``) names either one of these (to declare a normaliser,
    a reference policy or the entropy) or a plain function ``(inputs: LossInputs) -> LossResult``, taken as
    a token-level sum needing neither.
    """

    name: str
    compute: LossFunction
    declaration: LossDeclaration

    def __call__(self, inputs: LossInputs) -> LossResult:
        return self.compute(inputs)

    def normalization(self, settings: LossSection) -> Normalization:
        """What the step normaliser counts for this loss (``loss.normalization`` when the loss leaves it open)."""
        return self.declaration.normalization or settings.normalization

    def scores_reference(self, settings: LossSection) -> bool:
        """Whether the learner must score the reference policy: the loss asks for it, or a KL term is on."""
        return self.declaration.needs_reference or settings.kl_coef > 0
