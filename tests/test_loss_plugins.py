"""A plug-in loss's contract: its own settings in, its own metrics out, and what the learner and the config refuse.

Invariants pinned:
- a plug-in logs only the statistics it fills: a plain function filling none logs ``loss/total`` and no other
  ``loss/*`` key (no 0.0 for a clip or an importance weight it never measured);
- examples/plugin_loss.py (the code docs/learner.md shows, verbatim): ``loss.kwargs.advantage_scale`` reaches it
  (scale 2 doubles the loss of plain REINFORCE on the same rows), it logs the one LossStats field it fills
  (``loss/policy``) and its own ``loss/plugin/<name>`` metrics as the hand-computed means, the same however the step
  is cut into micro-batches (Σ total ÷ Σ count);
- the learner refuses a return that is not a LossResult, a loss that is not 0-dim or does not require grad, a bad
  metric name, and a NaN loss from finite inputs, naming ``loss.type`` and the contract, with no memory address,
  and leaves the weights as they were; a non-finite loss from non-finite logprobs is the model's (left to the
  non-finite guard);
- ``loss.kwargs`` with a built-in loss is an error at ``loss.kwargs``; a key a plug-in does not declare is an error
  at ``loss.kwargs.<key>`` suggesting the declared one; a plain function takes any;
- ``loss.entropy_coef > 0`` with a loss that does not take the entropy, and ``loss.kl_coef > 0`` with a plug-in
  that does not read the reference, are errors naming ``loss.type`` (never dropped silently).
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import torch
from test_loss_seam import config_errors, job_rows, tiny_settings

from groupwise.algo.loss_seam import LossContractError, LossInputs, LossResult, check_loss_result
from groupwise.config import load_config
from groupwise.config.algorithm import LossSection, OptimizerSection
from groupwise.model import load_policy
from groupwise.trainer.learner import Learner, LearnerSettings

pytestmark = pytest.mark.numerics

EXAMPLE = "examples/plugin_loss.py:scaled_reinforce"
DEFAULT_JOB = "examples/addition.yaml"


@pytest.fixture(scope="module")
def tiny():
    tiny = {"vocab": "full", "num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
    return load_policy("tiny", tiny=tiny, seed=3, device="cpu").model


def test_a_plugin_that_fills_no_statistic_logs_none(tiny):
    metrics = Learner(copy.deepcopy(tiny), tiny_settings(LossSection(type="plugin_losses:reinforce"))).train_step(
        job_rows(7, 90, groups=2, size=3)
    )
    assert [k for k in metrics if k.startswith("loss/")] == ["loss/total"]
    assert "mismatch/on_policy_fraction" in metrics  # the learner's own measurement, whatever the loss


def _example_settings(micro_batch_rows: int, **loss: object) -> LearnerSettings:
    section = LossSection(type=EXAMPLE, **loss)  # type: ignore[arg-type]  # pydantic validates the values
    optimizer = OptimizerSection(lr=1e-3, micro_batch_rows=micro_batch_rows)
    return LearnerSettings(loss=section, optimizer=optimizer, total_steps=5, temperature=1.0, max_completion_tokens=6)


def test_docs_show_the_example_plugin_verbatim():
    docs = (Path(__file__).parents[1] / "docs" / "learner.md").read_text(encoding="utf-8")
    section = docs[docs.index("**Your own loss.**") :]
    shown = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert shown is not None
    assert shown.group(1) in (Path(__file__).parents[1] / "examples" / "plugin_loss.py").read_text(encoding="utf-8")


def test_the_example_plugin_gets_its_kwargs_and_reports_its_own_metrics(tiny):
    rows = job_rows(7, 90, groups=2, size=3)
    cfg = load_config(DEFAULT_JOB, [f"loss.type={EXAMPLE}", "loss.kwargs.advantage_scale=2.0", "loss.entropy_coef=0"])
    assert cfg.loss.kwargs == {"advantage_scale": 2.0}
    learner = Learner(copy.deepcopy(tiny), _example_settings(6, kwargs=cfg.loss.kwargs))
    with torch.no_grad():
        scored = learner.scorer.score(learner.model, rows.sequence("prompt_ids"), rows.sequence("completion_ids"))
    mean_logprob = float(scored.logprobs[scored.mask].mean())
    advantages = [float(a) for a in rows["advantage"]]
    got = learner.train_step(rows)
    plain = Learner(copy.deepcopy(tiny), tiny_settings(LossSection(type="plugin_losses:reinforce"))).train_step(rows)
    assert got["loss/total"] == pytest.approx(2.0 * plain["loss/total"], rel=1e-6)
    assert got["loss/policy"] == pytest.approx(got["loss/total"], rel=1e-6)
    assert got["loss/plugin/advantage_abs"] == pytest.approx(2.0 * math.fsum(map(abs, advantages)) / 6, rel=1e-6)
    assert got["loss/plugin/logprob"] == pytest.approx(mean_logprob, rel=1e-5)
    assert not {"loss/clip_fraction", "loss/is_weight_mean", "loss/entropy", "loss/ratio_mean"} & set(got)
    split = Learner(copy.deepcopy(tiny), _example_settings(2, kwargs=cfg.loss.kwargs)).train_step(rows)
    for key in ("loss/plugin/advantage_abs", "loss/plugin/logprob", "loss/policy"):
        assert split[key] == pytest.approx(got[key], rel=1e-5), key


@pytest.mark.parametrize(("target", "words"), [
    ("returns_a_tuple", "returned a tuple, not a LossResult"),
    ("returns_a_vector", "returned a loss that is a tensor of shape (6,), not a 0-dim tensor"),
    ("returns_a_detached_loss", "returned a loss that does not require grad"),
    ("returns_a_bad_metric_name", "returned the metric 'Bad Name' as a Mean"),
    ("returns_nan", "returned a non-finite loss (nan) from finite inputs"),
])  # fmt: skip
def test_the_learner_refuses_a_return_that_breaks_the_contract(tiny, target, words):
    learner = Learner(copy.deepcopy(tiny), tiny_settings(LossSection(type=f"plugin_losses:{target}")))
    with pytest.raises(LossContractError) as info:
        learner.train_step(job_rows(7, 90, groups=2, size=3))
    message = str(info.value)
    assert message.startswith(f"loss.type 'plugin_losses:{target}' {words}")
    assert "; a loss returns LossResult(loss, stats, metrics) whose loss is a finite 0-dim tensor" in message
    assert "0x" not in message
    assert all(torch.equal(a, b) for a, b in zip(learner.model.parameters(), tiny.parameters(), strict=True))
    assert learner._step is None  # the step and its gradients were dropped


def test_a_non_finite_loss_from_non_finite_logprobs_is_left_to_the_non_finite_guard():
    logprobs = torch.tensor([[-1.0, math.nan]], requires_grad=True)
    zeros, mask = torch.zeros(1, 2), torch.ones(1, 2)
    inputs = LossInputs(logprobs, zeros, zeros, torch.ones(1), mask, LossSection(type="plugin_losses:returns_nan"))
    result = LossResult(logprobs.sum())
    assert check_loss_result(result, "plugin_losses:returns_nan", inputs, check_finite=True) is result
    finite = LossInputs(logprobs.detach().nan_to_num().requires_grad_(), zeros, zeros, torch.ones(1), mask,
                        LossSection(type="plugin_losses:returns_nan"))  # fmt: skip
    with pytest.raises(LossContractError, match="non-finite loss"):
        check_loss_result(LossResult(finite.logprobs.sum() * math.nan), "plugin_losses:returns_nan", finite, True)


def test_loss_kwargs_are_for_a_plugin_and_only_the_keys_it_declares():
    builtin = config_errors("loss.kwargs.scale=2")["loss.kwargs"]
    assert builtin.value == {"scale": 2} and "built-in loss 'dapo'" in builtin.rule
    typo = config_errors(f"loss.type={EXAMPLE}", "loss.entropy_coef=0", "loss.kwargs.advantage_scal=2")
    issue = typo["loss.kwargs.advantage_scal"]
    assert issue.value == 2 and "(advantage_scale)" in issue.rule
    assert issue.fix == "did you mean loss.kwargs.advantage_scale?"
    plain = ["loss.type=plugin_losses:reinforce", "loss.entropy_coef=0", "loss.kwargs.anything=[1, 2]"]
    assert load_config(DEFAULT_JOB, plain).loss.kwargs == {"anything": [1, 2]}


def test_a_penalty_the_loss_never_sees_is_refused_not_dropped():
    entropy = config_errors("loss.type=plugin_losses:reinforce")["loss.entropy_coef"]  # the job's 0.01
    assert entropy.value == 0.01 and "'plugin_losses:reinforce' does not take the entropy" in entropy.rule
    assert "needs_entropy=True" in entropy.fix
    load_config(DEFAULT_JOB, ["loss.type=plugin_losses:recording"])  # declares needs_entropy: the bonus is its own
    kl = config_errors("loss.type=plugin_losses:reinforce", "loss.entropy_coef=0", "loss.kl_coef=0.1",
                       "model.reference=initial")["loss.kl_coef"]  # fmt: skip
    assert "does not declare that it reads the reference" in kl.rule and "needs_reference=True" in kl.fix
    load_config(DEFAULT_JOB, ["loss.type=plugin_losses:with_reference", "loss.kl_coef=0.1", "model.reference=initial"])
    load_config(DEFAULT_JOB, ["loss.kl_coef=0.1", "model.reference=initial"])  # the built-ins add the KL term
