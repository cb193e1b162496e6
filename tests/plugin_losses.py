"""Plug-in losses for the registry tests (``loss.type: "plugin_losses:<name>"``): fakes named as such."""

from __future__ import annotations

from groupwise.algo.loss import LossStats
from groupwise.algo.loss_menu import LossDeclaration
from groupwise.algo.loss_seam import LossInputs, LossResult, PolicyLoss


def reinforce(inputs: LossInputs) -> LossResult:
    """Plain REINFORCE: ``−Σ mask · A · logprob`` (a plain function: token-level, no reference, no entropy)."""
    mask = (inputs.mask > 0).to(inputs.logprobs.dtype)
    cur = inputs.logprobs.masked_fill(inputs.mask == 0, 0.0)
    loss = -(inputs.advantages[:, None] * cur * mask).sum() / inputs.normaliser
    return LossResult(loss, LossStats(num_tokens=float(mask.sum()), num_sequences=float(mask.shape[0])))


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
                                                                          needs_reference=True))
