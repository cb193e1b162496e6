"""Cross-field rules of the loss and the advantages: a ``loss.type`` plug-in must import and take one argument, a
clip or normaliser key the chosen loss does not read keeps its default, ``loss.kwargs`` holds only the keys a
plug-in reads, an entropy or KL coefficient needs a loss that takes the entropy or the reference (never dropped
silently), ``dr_grpo`` trains on advantages not divided by a std, a batch-level std needs the whole step at once;
the KL term and its reference, the importance-weight bounds, and the clip keys that act only with several updates
per step.

Each rule yields every violation it finds, naming the key path, the value given, the rule and the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.algo.loss_menu import BUILTIN_LOSSES, PER_LOSS_KEYS, LossDeclaration
from groupwise.config.checks import rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


def _declaration(loss_type: str) -> tuple[LossDeclaration | None, str | None]:
    """(the loss's declaration, or None with why it cannot be used). A plug-in is imported here (torch too)."""
    if loss_type in BUILTIN_LOSSES:
        return BUILTIN_LOSSES[loss_type], None
    from groupwise.algo.loss_registry import loss_problem, resolve_loss

    problem = loss_problem(loss_type)
    return (None, problem) if problem else (resolve_loss(loss_type).declaration, None)


def declares_reference(loss_type: str) -> bool:
    """Whether the loss declares that it reads the reference policy's logprobs (False for one that cannot load)."""
    declaration, _ = _declaration(loss_type)
    return declaration is not None and declaration.needs_reference


@rule("loss", "model")
def declared_reference_needs_a_reference(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """A loss.type plug-in that declares needs_reference needs model.reference: initial."""
    if declares_reference(cfg.loss.type) and cfg.model.reference != "initial":
        yield ConfigIssue(
            "model.reference", cfg.model.reference,
            f"loss.type '{cfg.loss.type}' declares that it reads the reference policy's logprobs",
            "set model.reference: initial",
        )


@rule("loss")
def loss_type_reads_its_keys(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """loss.type names a built-in loss or a plug-in that imports and takes one argument (a LossInputs); the clip
    keys (epsilon_low, epsilon_high, dual_clip_c, normalization) the loss does not read keep their defaults;
    loss.kwargs is empty for a built-in loss and holds only the keys a plug-in declares, when it declares them."""
    loss = cfg.loss
    declaration, problem = _declaration(loss.type)
    if declaration is None:
        yield ConfigIssue("loss.type", loss.type, f"the loss plug-in cannot be used: {problem}",
                          "fix the target, or pick a built-in loss: " + ", ".join(BUILTIN_LOSSES))
        return
    for key in PER_LOSS_KEYS:
        value = getattr(loss, key)
        if key not in declaration.reads and value != type(loss).model_fields[key].default:
            reads = ", ".join(f"loss.{k}" for k in PER_LOSS_KEYS if k in declaration.reads) or "none of them"
            yield ConfigIssue(
                f"loss.{key}", value, f"loss.{key} has no effect with loss.type '{loss.type}' (it reads {reads})",
                f"remove loss.{key}, or pick a loss that reads it (docs/learner.md lists what each one reads)",
            )
    yield from _kwargs_issues(cfg, declaration)


def _kwargs_issues(cfg: RunConfig, declaration: LossDeclaration) -> Iterator[ConfigIssue]:
    """loss.kwargs are a plug-in's own settings: a built-in loss takes none, a plug-in that declares the keys it
    reads takes only those."""
    loss = cfg.loss
    if loss.kwargs and loss.type in BUILTIN_LOSSES:
        yield ConfigIssue(
            "loss.kwargs", loss.kwargs, f"loss.kwargs are a plug-in loss's own settings; the built-in loss "
            f"'{loss.type}' takes its settings from the loss section's keys",
            "remove loss.kwargs, or name a plug-in loss.type (package.module:name)",
        )  # fmt: skip
        return
    if declaration.kwargs is None:
        return
    for key in sorted(set(loss.kwargs) - declaration.kwargs):
        reads = ", ".join(sorted(declaration.kwargs)) or "none"
        near = difflib.get_close_matches(key, sorted(declaration.kwargs), n=1)
        yield ConfigIssue(
            f"loss.kwargs.{key}", loss.kwargs[key], f"loss.type '{loss.type}' declares the loss.kwargs it reads "
            f"({reads}), and not {key!r}",
            f"did you mean loss.kwargs.{near[0]}?" if near else f"remove loss.kwargs.{key}",
        )  # fmt: skip


@rule("loss")
def penalties_need_a_loss_that_takes_them(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """loss.entropy_coef > 0 needs a loss that takes the entropy (every built-in does; a plug-in declares
    needs_entropy), and with a plug-in loss.kl_coef > 0 needs one that declares needs_reference: a coefficient the
    loss never sees would be dropped silently."""
    loss = cfg.loss
    declaration, _ = _declaration(loss.type)
    if declaration is None:
        return  # loss_type_reads_its_keys names the unusable plug-in
    if loss.entropy_coef > 0 and not declaration.needs_entropy:
        yield ConfigIssue(
            "loss.entropy_coef", loss.entropy_coef, f"loss.type '{loss.type}' does not take the entropy (a plain "
            "function, or a LossDeclaration with needs_entropy=False), so the bonus would be dropped",
            "set loss.entropy_coef: 0, or declare needs_entropy=True in the plug-in's PolicyLoss and subtract "
            "entropy_coef · inputs.entropy in it (docs/learner.md, 'Your own loss')",
        )  # fmt: skip
    if loss.kl_coef > 0 and loss.type not in BUILTIN_LOSSES and not declaration.needs_reference:
        yield ConfigIssue(
            "loss.kl_coef", loss.kl_coef, f"loss.type '{loss.type}' does not declare that it reads the reference "
            "policy (needs_reference=False), so the KL term would be dropped",
            "set loss.kl_coef: 0, or declare needs_reference=True in the plug-in's PolicyLoss and add "
            "kl_coef · KL(inputs.ref_logprobs) in it",
        )  # fmt: skip


@rule("loss", "grpo")
def dr_grpo_advantages_without_std(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """loss.type dr_grpo needs grpo.normalize_advantages: false (Dr. GRPO removes the per-group std, whose
    division weights easy and hard prompts unequally)."""
    if cfg.loss.type == "dr_grpo" and cfg.grpo.normalize_advantages:
        yield ConfigIssue(
            "grpo.normalize_advantages", True,
            "loss.type 'dr_grpo' trains on advantages r − baseline, not divided by the group's std",
            "set grpo.normalize_advantages: false, or pick another loss.type",
        )


@rule("mode", "grpo")
def batch_std_needs_the_whole_step(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """grpo.advantage_std batch needs grpo.normalize_advantages: true and mode sync (the async controller trains a
    step in streamed chunks, so the step's batch is not known when its first chunk trains)."""
    grpo = cfg.grpo
    if grpo.advantage_std != "batch":
        return
    if not grpo.normalize_advantages:
        yield ConfigIssue("grpo.advantage_std", "batch", "grpo.advantage_std has no effect with "
                          "grpo.normalize_advantages false (advantages are not divided by any std)",
                          "remove grpo.advantage_std, or set grpo.normalize_advantages: true")
    if cfg.mode == "async":
        yield ConfigIssue("grpo.advantage_std", "batch", "a batch-level std needs the whole step at once, and "
                          "mode async trains a step in streamed chunks",
                          "set grpo.advantage_std: group, or mode: sync")


@rule("model", "loss")
def kl_needs_reference(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """loss.kl_coef > 0 needs model.reference: initial, and the reference (unless a plug-in loss declares that it
    reads it) and the KL clamps need kl_coef > 0."""
    loss = cfg.loss
    if loss.kl_coef > 0 and cfg.model.reference != "initial":
        yield ConfigIssue(
            "loss.kl_coef", loss.kl_coef, "a KL penalty needs a reference policy (model.reference is 'none')",
            "set model.reference: initial, or loss.kl_coef: 0",
        )
    if loss.kl_coef == 0:
        if cfg.model.reference != "none" and not declares_reference(loss.type):
            yield ConfigIssue(
                "model.reference", cfg.model.reference,
                "model.reference has no effect with loss.kl_coef 0 (a frozen copy nothing reads)",
                "set model.reference: none, or a positive loss.kl_coef",
            )
        for key in ("kl_input_clamp", "kl_output_clamp"):
            value = getattr(loss, key)
            if value != type(loss).model_fields[key].default:
                yield ConfigIssue(f"loss.{key}", value, f"loss.{key} has no effect with loss.kl_coef 0",
                                  f"remove loss.{key}, or set a positive loss.kl_coef")


@rule("loss")
def importance_sampling_bounds(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """is_ratio_min ≤ is_ratio_max; tis/icepop need importance_sampling; with no truncation the bounds keep defaults."""
    loss = cfg.loss
    if loss.is_truncation != "none" and not loss.importance_sampling:
        yield ConfigIssue(
            "loss.is_truncation", loss.is_truncation,
            f"is_truncation '{loss.is_truncation}' bounds importance weights, which "
            "loss.importance_sampling false turns off",
            "set loss.is_truncation: none, or loss.importance_sampling: true",
        )
    if loss.is_truncation == "none":
        for key in ("is_ratio_min", "is_ratio_max"):
            value = getattr(loss, key)
            if value != type(loss).model_fields[key].default:
                yield ConfigIssue(f"loss.{key}", value, f"loss.{key} has no effect with loss.is_truncation none",
                                  f"remove loss.{key}, or set loss.is_truncation: tis, icepop or seq_mask_tis")
    elif loss.is_ratio_min > loss.is_ratio_max:
        yield ConfigIssue(
            "loss.is_ratio_min", loss.is_ratio_min,
            f"loss.is_ratio_min must be ≤ loss.is_ratio_max ({loss.is_ratio_max})",
            "lower is_ratio_min or raise is_ratio_max",
        )


@rule("optimizer", "loss")
def clip_needs_several_updates(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """With one optimizer update per RL step (mini_batches_per_step × epochs_per_step = 1) the policy ratio is
    exactly 1, so loss.epsilon_low, epsilon_high and dual_clip_c keep their defaults."""
    opt, loss = cfg.optimizer, cfg.loss
    if opt.mini_batches_per_step * opt.epochs_per_step > 1:
        return
    for key in ("epsilon_low", "epsilon_high", "dual_clip_c"):
        value = getattr(loss, key)
        if value != type(loss).model_fields[key].default:
            yield ConfigIssue(
                f"loss.{key}", value,
                f"loss.{key} has no effect with one optimizer update per RL step: the old policy is the current "
                "one, so the ratio is exactly 1 and never clipped (a key with no effect is an error)",
                f"remove loss.{key}, or take several updates per step (optimizer.mini_batches_per_step or "
                "optimizer.epochs_per_step > 1)",
            )
