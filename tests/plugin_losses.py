"""Plug-in losses for the registry and contract tests (``loss.type: "plugin_losses:<name>"``): fakes named as such."""

from __future__ import annotations

import torch

from groupwise.algo.loss_menu import LossDeclaration
from groupwise.algo.loss_seam import LossInputs, LossResult, PolicyLoss
from groupwise.algo.loss_stats import Mean


def reinforce(inputs: LossInputs) -> LossResult:
    """Plain REINFORCE: ``−Σ mask · A · logprob`` (a plain function: token-level, no reference, no entropy, and no
    statistics: it fills no LossStats field, so none is logged)."""
    mask = (inputs.mask > 0).to(inputs.logprobs.dtype)
    cur = inputs.logprobs.masked_fill(inputs.mask == 0, 0.0)
    return LossResult(-(inputs.advantages[:, None] * cur * mask).sum() / inputs.normaliser)


SEEN: list[LossInputs] = []


def _recording(inputs: LossInputs) -> LossResult:
    SEEN.append(inputs)
    return reinforce(inputs)


#: Declares a per-completion normaliser and the entropy; records what it was handed.
recording = PolicyLoss("recording", _recording, LossDeclaration("sequence_level", frozenset(), needs_entropy=True))


def two_arguments(inputs: LossInputs, extra: int) -> LossResult:
    """Not a loss: it needs two arguments."""
    raise AssertionError("never called")


NOT_CALLABLE = 3


#: Declares that it reads the reference policy (so it needs ``model.reference: initial``).
with_reference = PolicyLoss("with_reference", reinforce, LossDeclaration("token_level", frozenset(),
                                                                          needs_reference=True))  # fmt: skip


# --- losses that break the contract (the learner refuses what they return) --------------------------------------
def returns_a_tuple(inputs: LossInputs) -> tuple[torch.Tensor, None]:
    return reinforce(inputs).loss, None


def returns_a_vector(inputs: LossInputs) -> LossResult:
    return LossResult(-(inputs.advantages[:, None] * inputs.logprobs.masked_fill(inputs.mask == 0, 0.0)).sum(dim=1))


def returns_a_detached_loss(inputs: LossInputs) -> LossResult:
    return LossResult(reinforce(inputs).loss.detach())


def returns_nan(inputs: LossInputs) -> LossResult:
    return LossResult(reinforce(inputs).loss * float("nan"))


def returns_a_bad_metric_name(inputs: LossInputs) -> LossResult:
    return LossResult(reinforce(inputs).loss, metrics={"Bad Name": Mean(1.0, 1.0)})
