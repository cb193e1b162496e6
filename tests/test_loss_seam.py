"""The loss seam and its registry (``loss.type``); the plug-in contract itself is tests/test_loss_plugins.py.

Invariants pinned:
- the default job (examples/addition.yaml: ``loss.type`` unset, so ``dapo``) trains as it did when the learner called
  the 20-parameter ``policy_loss`` field by field: the loss, gradient norm and entropy of three steps on fixed rows
  of the job's shape, with the shipped warm-start model, are the values recorded from that learner (bit for bit
  then; to 1e-6 here, so another CPU's rounding does not fail it);
- ``loss.type`` names each built-in loss and its declaration; a plug-in ``module:function`` (a plain function, or a
  ``PolicyLoss`` declaring its normaliser and inputs) trains, and receives the entropy only when it declares it;
- a plug-in that does not import, is not callable or takes other arguments is a config error at ``loss.type``,
  raised when the config loads, and the refusal carries no memory address; a clip key the chosen loss does not
  read is an error naming that key; ``dr_grpo`` with std-normalised advantages is an error naming
  ``grpo.normalize_advantages``;
- every loss gives the same update however the step is cut into chunks and micro-batches;
- the reference policy is scored only when the loss asks for it or ``loss.kl_coef > 0``.
"""

from __future__ import annotations

import copy
import random

import plugin_losses
import pytest
import torch

from groupwise.algo.loss_menu import BUILTIN_LOSSES
from groupwise.algo.loss_registry import resolve_loss
from groupwise.batch import RowBatch
from groupwise.config import ConfigError, load_config
from groupwise.config.algorithm import LossSection, OptimizerSection
from groupwise.model import load_policy
from groupwise.trainer.learner import Learner, LearnerSettings

pytestmark = pytest.mark.numerics

DEFAULT_JOB = "examples/addition.yaml"


def job_rows(seed: int, vocab: int, groups: int = 16, size: int = 8, max_new_tokens: int = 6) -> RowBatch:
    """Rows shaped like the default job's step: P groups of G completions of 1..max_new_tokens tokens, recorded
    logprobs near the policy's, half a version stale on some rows, advantages of both signs."""
    rng = random.Random(seed)
    cols: dict[str, list] = {k: [] for k in ("group_id", "prompt_ids", "completion_ids", "generation_logprobs",
                                             "version_spans", "advantage")}
    for group in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(5, 10))]
        for _ in range(size):
            completion = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, max_new_tokens + 1))]
            cols["group_id"].append(group)
            cols["prompt_ids"].append(prompt)
            cols["completion_ids"].append(completion)
            cols["generation_logprobs"].append([-rng.uniform(0.5, 8.0) for _ in completion])
            cols["version_spans"].append(((rng.choice((-1, 0)), len(completion)),))
            cols["advantage"].append(rng.uniform(-2.0, 2.0))
    return RowBatch({**cols, "advantage": torch.tensor(cols["advantage"], dtype=torch.float32)})


#: (loss/total, optim/grad_norm, loss/entropy) of the default job's first three steps on ``job_rows(0..2)``, recorded
#: from the learner that called ``policy_loss`` field by field (the new dapo matched it bit for bit).
RECORDED_STEPS = [
    (-0.023378379446895498, 1.3551504611968994, 0.9629653462192469),
    (0.007399831806217228, 0.9441541433334351, 1.4385400720544763),
    (-0.01072946408899819, 1.8343355655670166, 0.9941888035268847),
]


def test_default_job_trains_as_the_learner_that_called_policy_loss():
    cfg = load_config(DEFAULT_JOB)
    assert cfg.loss.type == "dapo"
    model = load_policy("hf", path=cfg.model.path, device="cpu", dtype=cfg.model.dtype).model
    learner = Learner(model, LearnerSettings.from_config(cfg))
    vocab = model.get_input_embeddings().num_embeddings
    for seed, recorded in enumerate(RECORDED_STEPS):
        metrics = learner.train_step(job_rows(seed, vocab))
        got = (metrics["loss/total"], metrics["optim/grad_norm"], metrics["loss/entropy"])
        assert got == pytest.approx(recorded, rel=1e-6, abs=1e-9)
        assert "loss/dual_clip_fraction" not in metrics  # loss.dual_clip_c is unset: nothing was measured


def test_every_builtin_loss_resolves_with_its_declaration():
    for name, declaration in BUILTIN_LOSSES.items():
        loss = resolve_loss(name)
        assert loss.name == name and loss.declaration is declaration
    assert resolve_loss("dapo").normalization(LossSection(normalization="sequence_level")) == "sequence_level"
    assert resolve_loss("grpo").normalization(LossSection()) == "sequence_level"
    assert resolve_loss("cispo").normalization(LossSection()) == "token_level"


def tiny_settings(loss: LossSection) -> LearnerSettings:
    return LearnerSettings(loss=loss, optimizer=OptimizerSection(lr=1e-3), total_steps=5, temperature=1.0,
                           max_completion_tokens=6)


@pytest.fixture(scope="module")
def tiny():
    tiny = {"vocab": "full", "num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
    return load_policy("tiny", tiny=tiny, seed=3, device="cpu").model


def test_a_plain_function_plugin_trains_without_entropy_and_a_declared_one_gets_it(tiny):
    rows = job_rows(7, 90, groups=2, size=3)
    plain = Learner(copy.deepcopy(tiny), tiny_settings(LossSection(type="plugin_losses:reinforce")))
    metrics = plain.train_step(rows)
    assert "loss/entropy" not in metrics and metrics["optim/grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(plain.model.parameters(), tiny.parameters(), strict=True))
    plugin_losses.SEEN.clear()
    declared = Learner(copy.deepcopy(tiny), tiny_settings(LossSection(type="plugin_losses:recording")))
    declared.train_step(rows)
    (seen,) = plugin_losses.SEEN
    assert seen.entropy is not None and seen.ref_logprobs is None and seen.max_completion_tokens == 6
    assert seen.normaliser == 1.0 and seen.settings.type == "plugin_losses:recording"


def test_the_reference_is_scored_only_when_asked_for(tiny):
    learner = Learner(copy.deepcopy(tiny), tiny_settings(LossSection(type="gspo")))
    assert not learner.loss.scores_reference(learner.settings.loss)
    assert resolve_loss("gspo").scores_reference(LossSection(kl_coef=0.1))
    learner.train_step(job_rows(8, 90, groups=2, size=3))  # no reference model: scoring it would raise


def config_errors(*overrides: str):
    with pytest.raises(ConfigError) as info:
        load_config(DEFAULT_JOB, overrides)
    return {issue.path: issue for issue in info.value.errors}


@pytest.mark.parametrize(("target", "words"), [
    ("plugin_losses:two_arguments", "signature is (inputs: 'LossInputs', extra: 'int')"),
    ("plugin_losses:NOT_CALLABLE", "not a loss"),
    ("plugin_losses:missing", "has no 'missing'"),
    ("no_such_module_anywhere:loss", "cannot import module"),
    ("ppo", "must be a built-in loss"),
])  # fmt: skip
def test_an_unusable_loss_type_is_a_config_error_naming_the_key(target, words):
    issue = config_errors(f"loss.type={target}")["loss.type"]
    assert issue.value == target and words in issue.rule
    assert "0x" not in issue.rule and " at 0x" not in issue.fix  # no memory address: the same run, the same words


def test_a_clip_key_the_loss_does_not_read_is_an_error_naming_it():
    several = ("optimizer.epochs_per_step=2",)
    assert "loss.epsilon_high" in config_errors("loss.type=grpo", "loss.epsilon_high=0.3", *several)
    cispo = config_errors("loss.type=cispo", "loss.epsilon_low=0.1", *several)["loss.epsilon_low"]
    assert "no effect with loss.type 'cispo'" in cispo.rule and "loss.epsilon_high" in cispo.rule
    assert "loss.dual_clip_c" in config_errors("loss.type=gspo", "loss.dual_clip_c=3", *several)
    assert "loss.normalization" in config_errors("loss.type=grpo", "loss.normalization=sequence_level")
    load_config(DEFAULT_JOB, ["loss.type=grpo", "loss.epsilon_low=0.1", *several])  # what grpo reads is fine


def test_dr_grpo_needs_advantages_without_std():
    issue = config_errors("loss.type=dr_grpo")["grpo.normalize_advantages"]
    assert "dr_grpo" in issue.rule and "false" in issue.fix
    assert load_config(DEFAULT_JOB, ["loss.type=dr_grpo", "grpo.normalize_advantages=false"]).loss.type == "dr_grpo"


def test_batch_std_needs_std_normalisation_and_the_whole_step():
    assert "grpo.advantage_std" in config_errors("grpo.advantage_std=batch", "grpo.normalize_advantages=false")
    assert load_config(DEFAULT_JOB, ["grpo.advantage_std=batch"]).grpo.advantage_std == "batch"
    issue = config_errors("mode=async", "grpo.advantage_std=batch")["grpo.advantage_std"]
    assert "streamed chunks" in issue.rule


def test_a_plugin_that_declares_the_reference_needs_one_and_may_keep_it_without_kl():
    issue = config_errors("loss.type=plugin_losses:with_reference")["model.reference"]
    assert issue.value == "none" and "initial" in issue.fix
    cfg = load_config(DEFAULT_JOB, ["loss.type=plugin_losses:with_reference", "model.reference=initial"])
    assert cfg.loss.kl_coef == 0 and cfg.model.reference == "initial"


@pytest.mark.parametrize("loss_type", sorted(BUILTIN_LOSSES))
def test_every_loss_gives_the_same_update_however_the_step_is_cut(tiny, loss_type):
    """Each loss returns a sum and the learner normalises the step, so micro-batches and chunks do not matter."""
    rows = job_rows(9, 90, groups=4, size=3)
    loss = LossSection(type=loss_type, entropy_coef=0.01)
    updates = []
    for micro_rows, cuts in ((len(rows["advantage"]), [rows]),
                             (2, [rows.select_groups([0]), rows.select_groups([1, 2, 3])])):
        settings = LearnerSettings(loss=loss, optimizer=OptimizerSection(lr=1e-3, micro_batch_rows=micro_rows),
                                   total_steps=5, temperature=1.0, max_completion_tokens=6)
        learner = Learner(copy.deepcopy(tiny), settings)
        grads: list[list[torch.Tensor]] = []
        learner.optimizer.register_step_pre_hook(
            lambda *_, learner=learner, grads=grads: grads.append([p.grad.clone() for p in learner.model.parameters()]))
        for chunk in cuts:
            learner.train_chunk(chunk)
        learner.finish_step()
        updates.append(grads[0])
    for a, b in zip(*updates, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
