"""``loss.type`` → the loss the learner calls: a built-in name, or ``package.module:name`` for a plug-in.

A plug-in names a :class:`~groupwise.algo.loss_seam.PolicyLoss` (its function and declaration) or a plain function
``(inputs: LossInputs) -> LossResult`` (declared as :data:`~groupwise.algo.loss_menu.PLAIN_FUNCTION`: a token-level
sum needing neither the reference policy nor the entropy). :func:`loss_problem` is what the config check runs
before any model loads: it imports the target and checks that it can be called with one argument. Messages name
the target as the user wrote it and never carry an object's repr (a memory address differs from run to run and
means nothing to the reader).
"""

from __future__ import annotations

import inspect

from groupwise.algo.cispo import cispo
from groupwise.algo.clip_losses import dapo, dr_grpo, grpo
from groupwise.algo.gspo import gspo, gspo_token
from groupwise.algo.loss_menu import BUILTIN_LOSSES, PLAIN_FUNCTION
from groupwise.algo.loss_seam import LossFunction, PolicyLoss
from groupwise.plugins import import_plugin

_FUNCTIONS: dict[str, LossFunction] = {
    "dapo": dapo, "grpo": grpo, "dr_grpo": dr_grpo, "gspo": gspo, "gspo_token": gspo_token, "cispo": cispo,
}
assert set(_FUNCTIONS) == set(BUILTIN_LOSSES), "every declared built-in loss has a function, and no other"


class LossPluginError(ValueError):
    """A ``loss.type`` plug-in that cannot be used; the message names the target, what is wrong and the fix."""


def _takes_one_argument(function: object) -> bool:
    try:
        inspect.signature(function).bind(None)  # type: ignore[arg-type]  # any callable; bind checks arity only
    except (TypeError, ValueError):
        return False
    return True


def _signature(function: object) -> str:
    """The parameters of ``function`` as text (never its repr, which carries a memory address)."""
    try:
        return str(inspect.signature(function))  # type: ignore[arg-type]  # any callable
    except (TypeError, ValueError):
        return "unreadable"


def resolve_loss(loss_type: str) -> PolicyLoss:
    """The loss ``loss_type`` names. Raises :class:`LossPluginError` (or the plug-in import error, a ValueError)."""
    if loss_type in _FUNCTIONS:
        return PolicyLoss(loss_type, _FUNCTIONS[loss_type], BUILTIN_LOSSES[loss_type])
    found = import_plugin(loss_type, "loss.type plug-in")
    loss = found if isinstance(found, PolicyLoss) else None
    if loss is None:
        if not callable(found) or isinstance(found, type):
            raise LossPluginError(
                f"loss.type plug-in {loss_type!r} is a {type(found).__name__}, not a loss: name a function "
                "(inputs: LossInputs) -> LossResult, or a groupwise.algo.loss_seam.PolicyLoss"
            )
        loss = PolicyLoss(loss_type, found, PLAIN_FUNCTION)
    if not _takes_one_argument(loss.compute):
        raise LossPluginError(
            f"loss.type plug-in {loss_type!r}: its function cannot be called with one argument (its signature is "
            f"{_signature(loss.compute)}); a loss takes one LossInputs and returns a LossResult"
        )
    return loss


def loss_problem(loss_type: str) -> str | None:
    """Why ``loss_type`` cannot be used (the config check's message), or None when it can."""
    try:
        resolve_loss(loss_type)
    except ValueError as exc:  # LossPluginError, PluginImportError
        return str(exc)
    return None
