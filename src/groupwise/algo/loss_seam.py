"""The seam between the learner and a loss: one typed value in (:class:`LossInputs`), one typed value out
(:class:`LossResult`), and the loss itself (:class:`PolicyLoss`: its function and its declaration).

Every built-in loss and every plug-in (``loss.type: package.module:name``) has the same contract, so adding a loss
touches no learner code. The learner hands over the tensors of one micro-batch and ``normaliser = 1``: the loss
returns a SUM over the micro-batch (tokens, or per-completion means, as its declaration says), and the learner
divides the step's summed gradients by the step-wide count of what the declaration normalises over. So a loss's
value and gradient do not depend on how the step is cut into chunks and micro-batches. The learner checks what a
loss returns (:func:`check_loss_result`): a :class:`LossResult` whose loss is a finite 0-dim tensor that requires
grad; anything else stops the run with :class:`LossContractError` naming ``loss.type`` and the contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from groupwise.algo.loss_menu import LossDeclaration, Normalization
from groupwise.algo.loss_stats import METRIC_NAME, LossStats, Mean

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
    ``settings``: the run's ``loss`` section (:attr:`kwargs` is its ``loss.kwargs``, a plug-in's own knobs).
    ``max_completion_tokens``: ``generation.max_new_tokens`` (the constant of ``dr_grpo``). ``ref_logprobs`` and
    ``entropy`` are given only when the loss's declaration asks for them (and for the built-in losses' KL term,
    when ``loss.kl_coef > 0``), else ``None``.
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

    @property
    def kwargs(self) -> Mapping[str, Any]:  # Any: the values a user wrote under loss.kwargs (YAML scalars, lists)
        """``loss.kwargs``: the plug-in's own knobs, as written in the config."""
        return self.settings.kwargs


@dataclass(frozen=True, eq=False)
class LossResult:
    """What a loss returns: its value (a 0-dim tensor carrying the gradient, the micro-batch's SUM), the statistics
    it measured (:class:`~groupwise.algo.loss_stats.LossStats`: sums over valid tokens, ``None`` where not
    measured, so a field left unset is not logged) and its own metrics by name (each a
    :class:`~groupwise.algo.loss_stats.Mean`, logged as ``loss/plugin/<name>``; names of ``[a-z0-9_]``)."""

    loss: torch.Tensor
    stats: LossStats = field(default_factory=LossStats)
    metrics: Mapping[str, Mean] = field(default_factory=dict)


class LossContractError(ValueError):
    """A loss returned something the learner cannot train on; the message names ``loss.type`` and the contract."""


CONTRACT = (
    "a loss returns LossResult(loss, stats, metrics) whose loss is a finite 0-dim tensor computed from "
    "inputs.logprobs (so it requires grad), stats a LossStats and metrics a mapping of names ([a-z0-9_]) to Mean "
    "(docs/learner.md, 'Your own loss')"
)


def check_loss_result(result: object, loss_type: str, inputs: LossInputs, check_finite: bool) -> LossResult:
    """``result`` if it keeps the contract, else :class:`LossContractError` naming ``loss_type``. With
    ``check_finite`` a non-finite loss from finite inputs is refused too (the loss's own arithmetic failed); a
    non-finite loss from non-finite logprobs is the model's doing, left to the learner's non-finite guard."""

    def refuse(what: str) -> LossContractError:
        return LossContractError(f"loss.type {loss_type!r} {what}; {CONTRACT}")

    if not isinstance(result, LossResult):
        raise refuse(f"returned a {type(result).__name__}, not a LossResult")
    loss = result.loss
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise refuse(f"returned a loss that is {shape}, not a 0-dim tensor (sum the micro-batch)")
    if not loss.requires_grad:
        raise refuse("returned a loss that does not require grad (detached, or not computed from inputs.logprobs)")
    if not isinstance(result.stats, LossStats):
        raise refuse(f"returned stats of type {type(result.stats).__name__}, not a LossStats")
    if not isinstance(result.metrics, Mapping):
        raise refuse(f"returned metrics of type {type(result.metrics).__name__}, not a mapping")
    for name, mean in result.metrics.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name) or not isinstance(mean, Mean):
            raise refuse(f"returned the metric {str(name)[:80]!r} as a {type(mean).__name__}")
    if check_finite and not math.isfinite(float(loss.detach())) and _finite_inputs(inputs):
        raise refuse(f"returned a non-finite loss ({float(loss.detach())}) from finite inputs")
    return result


def _finite_inputs(inputs: LossInputs) -> bool:
    """Whether the policy's logprobs (and the entropy, when given) are finite on every valid token."""
    valid = inputs.mask > 0
    tensors = [inputs.logprobs] + ([inputs.entropy] if inputs.entropy is not None else [])
    return all(bool(torch.isfinite(t.detach()[valid]).all()) for t in tensors)


LossFunction = Callable[[LossInputs], LossResult]


@dataclass(frozen=True)
class PolicyLoss:
    """A loss the learner can call: its name, its function and what it declares it needs.

    A plug-in target (``loss.type: package.module:name``) names either one of these (to declare a normaliser,
    a reference policy, the entropy or the ``loss.kwargs`` it reads) or a plain function ``(inputs: LossInputs) ->
    LossResult``, taken as a token-level sum needing neither and reading any ``loss.kwargs``.
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
