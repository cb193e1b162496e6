"""Hazards: settings that validate but are known to end runs badly. Each yields a warning (a
:class:`~groupwise.config.issues.ConfigIssue` whose ``rule`` says what goes wrong and ``fix`` what to use instead);
``groupwise config check``, ``config show``, ``train`` and ``simulate`` print them, and ``train`` also writes them
to ``events.log``. A warning never stops a run: the setting may be exactly what the user wants to study.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.checks import hazard
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


@hazard("mode", "async_")
def weight_fifo_stalls_after_a_failure(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Async weight_fifo stops with ControllerStalled within a few steps of the first rollout failure (warning)."""
    if cfg.mode != "async" or cfg.async_.sampler.name != "weight_fifo":
        return
    mode = cfg.async_.rollout_failure.on_dropped_prompt
    how = (
        "a spare that replaces a lost prompt, and every retry of a failed attempt, is generated under a newer "
        "weight version than the batch it belongs to"
        if mode == "replace"
        else "every retry of a failed attempt is generated under a newer weight version than its batch, and a loss "
        "shrinks the step being assembled, not the version bucket that lost the group"
    )
    yield ConfigIssue(
        "async.sampler.name", "weight_fifo",
        f"weight_fifo trains each step only from groups of one start version, oldest first; with on_dropped_prompt "
        f"{mode} {how}, so the oldest bucket can stay short for good and the run stops with ControllerStalled, "
        "typically within a few steps of the first infrastructure or data failure",
        "use async.sampler.name: ready_first (or in_order) whenever rollouts can fail (either on_dropped_prompt); "
        "keep weight_fifo for studies where they cannot",
    )  # fmt: skip


@hazard("grpo", "loss")
def one_generation_trains_only_the_regulariser(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """G = 1 with an entropy or KL term: every advantage is 0, so only that term moves the weights (warning)."""
    grpo, loss = cfg.grpo, cfg.loss
    if grpo.num_generations_per_prompt != 1 or not (loss.entropy_coef > 0 or loss.kl_coef > 0):
        return
    terms = " and ".join(name for name, on in (("loss.entropy_coef", loss.entropy_coef > 0),
                                               ("loss.kl_coef", loss.kl_coef > 0)) if on)
    yield ConfigIssue(
        "grpo.num_generations_per_prompt", 1,
        f"one completion per prompt is its own group baseline, so every advantage is 0: the reward never reaches "
        f"the gradient and only {terms} moves the weights",
        "set grpo.num_generations_per_prompt ≥ 2 to learn from the reward",
    )


@hazard("optimizer", "run")
def warmup_longer_than_the_run(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """optimizer.warmup_steps > run.max_steps: the warm-up is clamped to the run (warning)."""
    warmup, steps = cfg.optimizer.warmup_steps, cfg.run.max_steps
    if warmup > steps:
        yield ConfigIssue(
            "optimizer.warmup_steps", warmup,
            f"the warm-up is longer than the run (run.max_steps is {steps}), so it is clamped to {steps} step(s): "
            "the learning rate rises to its peak at the run's last step",
            f"nothing to do for a shortened run; otherwise set optimizer.warmup_steps ≤ {steps}",
        )  # fmt: skip


@hazard("sim")
def completion_cap_below_the_prompt(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """sim.job.lengths.max_tokens < prompt_tokens: likely read as the sequence length, which it is not (warning)."""
    job = cfg.sim.job
    if job is None or job.lengths.max_tokens >= job.lengths.prompt_tokens:
        return
    yield ConfigIssue(
        "sim.job.lengths.max_tokens", job.lengths.max_tokens,
        f"the completion cap is below the prompt length (sim.job.lengths.prompt_tokens = "
        f"{job.lengths.prompt_tokens}); max_tokens caps the completion alone (generation.max_new_tokens), not "
        "prompt + completion",
        "nothing to do if completions really are that short next to their prompts; if it was meant as the "
        "sequence length, set max_tokens to that length minus prompt_tokens",
    )  # fmt: skip
