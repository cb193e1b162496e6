"""The losses users pick by name (``loss.type``) and what each declares about itself, without torch.

A declaration says what the learner must do for a loss, so nothing is computed for a loss that does not use it:
what the step normaliser counts (valid tokens or completions), whether the reference policy must be scored,
whether the per-token entropy must be computed, and which of the clip and normaliser keys of the ``loss`` section
it reads (one a loss ignores is a config error naming it). The config layer reads these declarations; the functions that
compute each loss live in :mod:`groupwise.algo.loss_registry` (they need torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Normalization = Literal["token_level", "sequence_level"]

#: The ``loss`` keys only some losses read; every built-in loss reads the others (KL, entropy, importance weight).
PER_LOSS_KEYS = ("epsilon_low", "epsilon_high", "dual_clip_c", "normalization")


@dataclass(frozen=True)
class LossDeclaration:
    """What a loss needs from the learner.

    ``normalization``: what the step's normaliser counts (``token_level``: valid tokens; ``sequence_level``:
    completions with at least one valid token); ``None`` = the ``loss.normalization`` key decides (``dapo`` only).
    ``needs_reference``: the learner scores the reference policy and hands its logprobs over (built-in losses
    need them only for the KL term, i.e. when ``loss.kl_coef > 0``). ``needs_entropy``: the learner computes the
    per-token entropy and hands it over (a loss that takes it applies ``loss.entropy_coef`` itself; with a loss that
    does not, ``entropy_coef > 0`` is a config error). ``reads``: the keys of :data:`PER_LOSS_KEYS` the loss uses.
    ``kwargs``: the ``loss.kwargs`` keys the loss reads (any other is a config error naming it); ``None`` = any.
    """

    normalization: Normalization | None
    reads: frozenset[str]
    needs_reference: bool = False
    needs_entropy: bool = True
    kwargs: frozenset[str] | None = None


def _reads(*keys: str) -> frozenset[str]:
    return frozenset(keys)


_NONE: frozenset[str] = frozenset()  # the built-ins read no loss.kwargs: their settings are the section's keys

#: The built-in losses (formulas and papers: :mod:`groupwise.algo.clip_losses`, :mod:`groupwise.algo.gspo`,
#: :mod:`groupwise.algo.cispo`, and docs/learner.md).
BUILTIN_LOSSES: dict[str, LossDeclaration] = {
    "dapo": LossDeclaration(None, _reads("epsilon_low", "epsilon_high", "dual_clip_c", "normalization"), kwargs=_NONE),
    "grpo": LossDeclaration("sequence_level", _reads("epsilon_low", "dual_clip_c"), kwargs=_NONE),
    "dr_grpo": LossDeclaration("sequence_level", _reads("epsilon_low", "epsilon_high", "dual_clip_c"), kwargs=_NONE),
    "gspo": LossDeclaration("sequence_level", _reads("epsilon_low", "epsilon_high"), kwargs=_NONE),
    "gspo_token": LossDeclaration("sequence_level", _reads("epsilon_low", "epsilon_high"), kwargs=_NONE),
    "cispo": LossDeclaration("token_level", _reads("epsilon_high"), kwargs=_NONE),
}

DEFAULT_LOSS = "dapo"

#: What a plug-in given as a plain function is taken to declare: a token-level sum, no reference, no entropy, and
#: any ``loss.kwargs`` (it declares none, so none can be checked).
PLAIN_FUNCTION = LossDeclaration("token_level", frozenset(PER_LOSS_KEYS) - {"normalization"}, needs_entropy=False)
