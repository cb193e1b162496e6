"""Non-finite training is a failure, never a success: no NaN update, no NaN weights on disk, a non-zero exit.

Pinned:
- ``check_finite_step`` passes finite (loss, gradient norm) and raises ``NonFiniteTrainingError`` naming the step for
  a NaN or infinite one; ``check_finite_weights`` names the first parameter holding NaN or inf;
- sync and async runs whose training logprobs are NaN (the learner at temperature 1e-300, what
  ``generation.temperature=1e-300`` did) stop at step 0 with ``NonFiniteTrainingError``; the weights are still the
  initial, finite ones; no checkpoint and no ``final/`` are written; the step's groups end ``pending`` saying why
  (none ``trained``);
- a checkpoint of non-finite weights is refused and leaves no checkpoint directory;
- ``groupwise train`` of a run whose policy is not finite (a model folder holding an infinite weight) exits 1
  naming the error, with no ``final/``; the learning rate that used to make one (1e30) is refused at load;
- a temperature below 0.01 (0, 1e-300) is a config error naming ``generation.temperature``;
- searched: a step under extreme temperatures, learning rates and advantages (hypothesis) either leaves the weights
  unchanged (its loss or gradient was not finite) or updates them, and a checkpoint is written only of finite
  weights.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sync_trainer import tiny_config

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.model.loading import load_policy
from groupwise.run.checkpoint import latest_checkpoint
from groupwise.run.fates_file import read_fates
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session
from groupwise.trainer.finite import NonFiniteTrainingError, check_finite_step, check_finite_weights


def test_the_guard_passes_finite_steps_and_names_the_step_of_a_non_finite_one():
    check_finite_step(0.25, 3.0, step=4)
    for loss, norm in ((math.nan, 1.0), (0.1, math.inf), (-math.inf, 0.0)):
        with pytest.raises(NonFiniteTrainingError, match="optimizer step 4: .*the step was not taken"):
            check_finite_step(loss, norm, step=4)
    check_finite_weights({"a": torch.ones(2), "steps": torch.tensor([3])}, "x")
    with pytest.raises(NonFiniteTrainingError, match="parameter 'b' holds NaN or infinite values, so the x was not"):
        check_finite_weights({"a": torch.ones(2), "b": torch.tensor([1.0, math.inf])}, "the x")


def nan_session(tmp_path, mode):
    cfg = tiny_config(tmp_path, run={"name": mode, "max_steps": 2}, eval={"at_start": False, "at_end": False},
                      grpo={"dynamic_sampling": {"enabled": False}}, checkpoint={"every": 1})  # fmt: skip
    if mode == "async":
        data = cfg.model_dump(by_alias=True)
        data["mode"] = "async"
        data["grpo"]["dynamic_sampling"] = {"enabled": False}
        data["async"] = {"sampler": {"name": "in_order", "max_lookahead_versions": 0},
                         "max_buffered_rollouts": 8, "rollout_failure": {"on_dropped_prompt": "shrink"}}  # fmt: skip
        cfg = config_from_dict(data)
    session = build_session(cfg)
    # The learner scores completions at temperature 1e-300 (the engine still samples at 1): logits / T overflow.
    session.learner.settings = dataclasses.replace(session.learner.settings, temperature=1e-300)
    session.learner.scorer.temperature = 1e-300
    return session


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_nan_logprobs_stop_the_run_before_any_update_or_save(tmp_path, mode):
    session = nan_session(tmp_path, mode)
    initial = {name: t.detach().clone() for name, t in session.policy.model.state_dict().items()}
    with pytest.raises(NonFiniteTrainingError, match="optimizer step 0: the loss is nan"):
        run_sync(session) if mode == "sync" else run_async(session)
    for name, tensor in session.policy.model.state_dict().items():
        assert torch.equal(tensor, initial[name]), name  # no update was applied
    root = session.run_dir.path
    assert latest_checkpoint(root) is None and not (root / "final").exists()
    lines = read_fates(session.run_dir.fates_path)
    assert lines and not any(line["fate"] == "trained" for line in lines)
    step_zero = [line for line in lines if line["fate"] == "pending" and line["step"] == 0]
    assert len(step_zero) == session.cfg.grpo.num_prompts_per_step
    assert all("NonFiniteTrainingError" in line["detail"] or "optimizer step failed" in line["detail"]
               for line in step_zero)  # fmt: skip


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    session = build_session(tiny_config(tmp_path, run={"name": "w"}))
    with torch.no_grad():
        next(session.policy.model.parameters()).fill_(math.nan)
    with pytest.raises(NonFiniteTrainingError, match="so the checkpoint of step 0 was not written"):
        session.save_checkpoint()
    checkpoints = session.run_dir.path / "checkpoints"
    assert latest_checkpoint(session.run_dir.path) is None
    assert not checkpoints.exists() or not list(checkpoints.iterdir())


def test_a_diverging_run_exits_1_without_a_final_policy(tmp_path, capsys):
    plain = {"dynamic_sampling": {"enabled": False}}
    cfg = tiny_config(tmp_path, run={"name": "diverge"}, eval={"at_start": False, "at_end": False}, grpo=plain)
    policy = load_policy("tiny", tiny=cfg.model.tiny.model_dump(), seed=0, device="cpu")
    with torch.no_grad():  # a policy that already diverged: one weight is infinite
        next(p for name, p in policy.model.named_parameters() if "mlp" in name).view(-1)[0] = math.inf
    policy.save(tmp_path / "diverged")
    data = cfg.model_dump(by_alias=True, mode="json")
    data["model"] = {"source": "hf", "path": str(tmp_path / "diverged")}
    path = tmp_path / "diverge.yaml"
    path.write_text(config_from_dict(data).to_yaml())
    assert main(["train", str(path)]) == 1
    err = capsys.readouterr().err
    assert "the run failed: NonFiniteTrainingError" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "diverge" / "final").exists()
    assert main(["train", str(path), "optimizer.lr=1e30"]) == 2  # what used to diverge is refused at load
    assert "optimizer.lr" in capsys.readouterr().err


@pytest.mark.parametrize("temperature", [0.0, 1e-300, 0.009])
def test_a_temperature_whose_logit_scaling_overflows_is_refused(temperature):
    tiny = {"model": {"source": "tiny"}}
    with pytest.raises(ConfigError, match=r"generation.temperature.*≥ 0.01") as info:
        config_from_dict({**tiny, "generation": {"temperature": temperature}})
    assert len(info.value.errors) == 1
    assert config_from_dict({**tiny, "generation": {"temperature": 0.01}}).generation.temperature == 0.01


@pytest.fixture(scope="module")
def stepping(tmp_path_factory):
    """One tiny session, a fixed batch of rows, and the initial weights to restore before every example."""
    from groupwise.rows import build_rows

    root = tmp_path_factory.mktemp("nonfinite")
    session = build_session(tiny_config(root, run={"name": "fuzz"}, checkpoint={"keep_last": 1}))
    items = session.loader.take(2)
    groups = session.rollouts.generate_groups(items, [0, 1])
    initial = {name: t.detach().clone() for name, t in session.policy.model.state_dict().items()}
    return session, groups, initial, build_rows


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    temperature=st.sampled_from([1e-300, 1e-40, 1e-8, 0.01, 1.0]),
    lr=st.sampled_from([1e-3, 1.0, 1e20]),  # 1e38 overflows inside torch.optim.Adam itself (a config bound)
    advantage=st.sampled_from([1.0, 1e20, 1e38]),
    max_grad_norm=st.sampled_from([None, 1.0]),
)
def test_searched_steps_never_leave_non_finite_weights_on_disk(stepping, temperature, lr, advantage, max_grad_norm):
    session, groups, initial, build_rows = stepping
    with torch.no_grad():
        session.policy.model.load_state_dict(initial)
    settings = session.learner.settings  # model_copy: the search goes past the config's bounds on purpose
    optimizer = settings.optimizer.model_copy(update={"lr": lr, "max_grad_norm": max_grad_norm})
    settings_ = dataclasses.replace(settings, temperature=temperature, optimizer=optimizer)
    from groupwise.trainer.learner import Learner

    session.learner = Learner(session.policy.model, settings_)
    rows = build_rows(groups, [[advantage * (i % 2 - 0.5) for i in range(len(g.completions))] for g in groups])
    session.state.step += 1
    try:
        session.learner.train_step(rows)
    except NonFiniteTrainingError:
        for name, tensor in session.policy.model.state_dict().items():  # the NaN step changed nothing
            assert torch.equal(tensor, initial[name]), name
    try:
        path = session.save_checkpoint()
    except NonFiniteTrainingError:
        assert latest_checkpoint(session.run_dir.path) is None or latest_checkpoint(session.run_dir.path) != (
            session.run_dir.path / "checkpoints" / f"step_{session.state.step}")
        return
    from groupwise.run.checkpoint import load_checkpoint

    saved = load_checkpoint(path)["model"]
    assert all(bool(torch.isfinite(t).all()) for t in saved.values() if t.is_floating_point())
