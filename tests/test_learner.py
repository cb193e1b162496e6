"""The learner: micro-batch and chunk invariance, today's update bit for bit, PPO mini-batches, memory options.

Invariants pinned:
- the gradient of a step does not depend on how it is cut — into streamed chunks of whole groups, into
  micro-batches by rows, or packed under a token budget (hypothesis over splits; token- and sequence-level
  normalisation): equal to the one-shot gradient within float rounding;
- with one update per step (K = E = 1) the learner reproduces the previous learner's arithmetic bit for bit
  (same parameters after several steps as a verbatim copy of that code, plain logprob path, its loss call now
  the built-in ``dapo`` on ``LossInputs``);
- PPO mini-batches: K × E optimizer updates per step, one weight version and one LR-schedule step per RL step;
  the first update equals the K·E = 1 update (old logprobs computed before it), later ones see a moved
  ratio and the clip acts; a step streamed in chunks equals the same step trained at once, bit for bit;
- token-budget packing: every row in exactly one micro-batch, the budget respected (a longer row alone), the
  row cap respected, and less padding than cutting by rows (``perf/padding_fraction``);
- the LR schedule: a linear warm-up to the peak, then constant / linear / cosine decay to ``min_lr_ratio`` at the
  last step; a warm-up longer than the run is clamped to it (the last step trains at the peak);
- settings are typed and pickle (the Ray learner actor receives them);
- gradient checkpointing recomputes the layers and gives the same gradients; with LoRA only the adapter
  weights change; the CUDA precision plan (float32 masters, bfloat16 autocast, fused AdamW) is what the
  docs say, and fused AdamW steps.
"""

from __future__ import annotations

import copy
import pickle
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groupwise.algo.clip_losses import dapo
from groupwise.algo.loss_seam import LossInputs
from groupwise.batch import RowBatch
from groupwise.config import config_from_dict
from groupwise.config.algorithm import LossSection, OptimizerSection
from groupwise.model import load_policy
from groupwise.model.logprobs import completion_logprobs
from groupwise.model.lora import apply_lora, lora_config
from groupwise.rows import pad_right
from groupwise.trainer.builder import enable_gradient_checkpointing
from groupwise.trainer.learner import Learner, LearnerSettings, lr_multiplier
from groupwise.trainer.micro_batches import micro_batches_by_tokens, mini_batch_groups
from groupwise.trainer.precision import LearnerPrecision, adamw, learner_precision

pytestmark = pytest.mark.numerics

TINY = {"vocab": "full", "num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="module")
def model():
    return load_policy("tiny", tiny=TINY, seed=5, device="cpu").model


def make_rows(seed: int, groups: int = 5, size: int = 3, first_group: int = 0) -> RowBatch:
    """Whole groups of ragged rows with random tokens, recorded logprobs and advantages."""
    rng = random.Random(seed)
    cols: dict[str, list] = {k: [] for k in ("group_id", "prompt_ids", "completion_ids", "generation_logprobs",
                                             "version_spans", "env_spans", "advantage")}
    for group in range(first_group, first_group + groups):
        prompt = [1] + [rng.randrange(4, 91) for _ in range(rng.randrange(1, 8))]
        for _ in range(size):
            completion = [rng.randrange(4, 91) for _ in range(rng.randrange(1, 11))]
            cols["group_id"].append(group)
            cols["prompt_ids"].append(prompt)
            cols["completion_ids"].append(completion)
            cols["generation_logprobs"].append([-rng.uniform(2.0, 6.0) for _ in completion])
            cols["version_spans"].append(((0, len(completion)),))
            cols["env_spans"].append(())
            cols["advantage"].append(rng.uniform(-1.5, 1.5))
    return RowBatch({**cols, "advantage": torch.tensor(cols["advantage"], dtype=torch.float32)})


def learner_settings(**overrides) -> LearnerSettings:
    """The learner's settings: ``loss``, ``total_steps``, ``temperature``, or any ``optimizer`` key."""
    loss = overrides.pop("loss", LossSection(entropy_coef=0.01))
    total_steps, temperature = overrides.pop("total_steps", 10), overrides.pop("temperature", 1.0)
    optimizer = OptimizerSection(**{"lr": 1e-3, "logprob_chunk_tokens": 16, **overrides})
    return LearnerSettings(loss=loss, optimizer=optimizer, total_steps=total_steps, temperature=temperature)


def run_step(model, chunks, **overrides):
    """One RL step on a copy of ``model``: the gradients of every optimizer update, the metrics, the learner."""
    learner = Learner(copy.deepcopy(model), learner_settings(**overrides))
    grads: list[list[torch.Tensor]] = []
    learner.optimizer.register_step_pre_hook(
        lambda *_: grads.append([p.grad.clone() for p in learner.model.parameters()])
    )
    for chunk in chunks:
        learner.train_chunk(chunk)
    return grads, learner.finish_step(), learner


def assert_grads_close(got, want, rtol=1e-5, atol=1e-6):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)


ROWS = make_rows(0)
_ONE_SHOT: dict[str, list[torch.Tensor]] = {}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    normalization=st.sampled_from(["token_level", "sequence_level"]),
    cuts=st.lists(st.integers(1, 4), min_size=0, max_size=3, unique=True),
    max_tokens=st.one_of(st.none(), st.integers(1, 120)),
    max_rows=st.integers(1, 16),
)
def test_step_gradient_does_not_depend_on_chunks_or_micro_batches(model, normalization, cuts, max_tokens, max_rows):
    loss = LossSection(entropy_coef=0.01, normalization=normalization)
    if normalization not in _ONE_SHOT:
        _ONE_SHOT[normalization] = run_step(model, [ROWS], loss=loss, micro_batch_rows=len(ROWS))[0][0]
    groups = ROWS.group_ids()
    bounds = [0, *sorted(cuts), len(groups)]
    chunks = [ROWS.select_groups(groups[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    grads, _, _ = run_step(model, chunks, loss=loss, micro_batch_tokens=max_tokens, micro_batch_rows=max_rows)
    assert len(grads) == 1
    assert_grads_close(grads[0], _ONE_SHOT[normalization])


def _previous_learner_step(model, optimizer, scheduler, rows, micro_batch_rows):
    """The learner's step before PPO mini-batches and chunked logprobs, verbatim (one update per step)."""
    optimizer.zero_grad(set_to_none=True)
    model.train()
    normaliser = 0.0
    for micro in rows.iter_slices(micro_batch_rows):
        logprobs, entropy, mask = completion_logprobs(model, micro["prompt_ids"], micro["completion_ids"], 1.0,
                                                      with_entropy=True)
        generation = pad_right(micro["generation_logprobs"], logprobs.shape[1])
        # the loss as the built-in dapo computes it (the 20-parameter policy_loss this called is now that function)
        loss = dapo(LossInputs(logprobs, logprobs.detach(), generation, micro["advantage"], mask,
                               LossSection(entropy_coef=0.01), entropy=entropy)).loss  # fmt: skip
        loss.backward()
        normaliser += float(int(mask.sum().item()))
    scale = 1.0 / max(normaliser, 1.0)
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        p.grad.mul_(scale)
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def test_one_update_per_step_reproduces_the_previous_learner_bit_for_bit(model):
    steps = [make_rows(seed, groups=4) for seed in (1, 2, 3)]
    learner = Learner(copy.deepcopy(model), learner_settings(micro_batch_rows=4, logprob_chunk_tokens=None))
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-3,
                                  betas=(0.9, 0.999), weight_decay=0.0, eps=1e-8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    for rows in steps:
        learner.train_step(rows)
        _previous_learner_step(reference, optimizer, scheduler, rows, micro_batch_rows=4)
    for (name, got), want in zip(learner.model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, want), name
    assert learner.version == 3


def test_first_ppo_update_is_the_on_policy_update_and_later_ones_see_the_moved_ratio(model):
    rows = make_rows(4, groups=4)
    (on_policy,), one, _ = run_step(model, [rows], lr=5e-2)
    grads, two, learner = run_step(model, [rows], lr=5e-2, epochs_per_step=2)
    assert len(grads) == 2 and learner.version == 1
    assert_grads_close(grads[0], on_policy)
    assert max(float((a - b).abs().max()) for a, b in zip(grads[1], on_policy, strict=True)) > 1e-4
    assert one["loss/ratio_mean"] == 1.0 and one["loss/clip_fraction"] == 0.0
    assert two["loss/ratio_mean"] != 1.0


def test_k_mini_batches_take_k_updates_and_the_clip_acts(model):
    rows = make_rows(5, groups=8)
    grads, metrics, learner = run_step(model, [rows], lr=5e-2, mini_batches_per_step=4)
    assert len(grads) == 4 and learner.version == 1
    assert metrics["loss/clip_fraction"] > 0.0
    assert metrics["perf/train_tokens"] == sum(len(c) for c in rows["completion_ids"])


def test_ppo_step_streamed_in_chunks_equals_the_step_at_once(model):
    rows = make_rows(6, groups=6)
    groups = rows.group_ids()
    options = dict(mini_batches_per_step=2, epochs_per_step=2, micro_batch_tokens=40, micro_batch_rows=5)
    _, at_once, whole = run_step(model, [rows], **options)
    chunks = [rows.select_groups(groups[:1]), rows.select_groups(groups[1:4]), rows.select_groups(groups[4:])]
    _, streamed, parts = run_step(model, chunks, **options)
    for a, b in zip(whole.model.parameters(), parts.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert at_once == {**streamed, "perf/train_seconds": at_once["perf/train_seconds"],
                       "perf/train_tokens_per_s": at_once["perf/train_tokens_per_s"]}


def test_lr_schedule_counts_rl_steps_not_updates(model):
    learner = Learner(copy.deepcopy(model), learner_settings(warmup_steps=4, mini_batches_per_step=2))
    seen = []
    learner.optimizer.register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
    lrs = [learner.train_step(make_rows(seed, groups=2))["optim/lr"] for seed in (7, 8)]
    assert lrs == pytest.approx([1e-3 / 4, 2e-3 / 4]) and seen == pytest.approx([1e-3 / 4] * 2 + [2e-3 / 4] * 2)


def test_lr_schedule_values_and_a_warm_up_clamped_to_the_run():
    def schedule(total, warmup, kind="constant", floor=0.0):
        return [lr_multiplier(s, warmup_steps=warmup, total_steps=total, schedule=kind, min_lr_ratio=floor)
                for s in range(total)]  # fmt: skip

    assert schedule(5, 2) == [0.5, 1.0, 1.0, 1.0, 1.0]
    assert schedule(5, 1, "linear", 0.2) == pytest.approx([1.0, 1.0, 0.8, 0.6, 0.4])
    assert schedule(3, 1, "cosine") == pytest.approx([1.0, 1.0, 0.5])
    assert schedule(1, 5) == [1.0]  # run.max_steps=1 with the example's 5 warm-up steps: the peak
    assert schedule(3, 5) == pytest.approx([1 / 3, 2 / 3, 1.0])  # clamped to the run: the peak at the last step
    assert schedule(3, 3) == schedule(3, 5)


@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=30),
    max_tokens=st.integers(1, 200),
    max_rows=st.integers(1, 8),
)
def test_token_budget_packing_keeps_whole_rows_within_budget_and_cap(lengths, max_tokens, max_rows):
    batches = micro_batches_by_tokens(lengths, max_tokens, max_rows)
    assert sorted(row for batch in batches for row in batch) == list(range(len(lengths)))
    order = [row for batch in batches for row in batch]
    assert [lengths[r] for r in order] == sorted(lengths, reverse=True)
    for batch in batches:
        assert len(batch) <= max_rows
        assert len(batch) == 1 or len(batch) * max(lengths[r] for r in batch) <= max_tokens


def test_mini_batches_hold_whole_groups_in_order_and_near_equal():
    assert mini_batch_groups([3, 3, 5, 5, 7, 8, 8, 9, 9], 3) == [[3, 5], [7, 8], [9]]
    assert mini_batch_groups([1, 2], 4) == [[1], [2]]
    runs = mini_batch_groups(list(range(10)), 4)
    assert [len(r) for r in runs] == [3, 3, 2, 2] and sum(runs, []) == list(range(10))


def test_packing_by_tokens_reports_less_padding(model):
    rows = make_rows(9, groups=6)
    one_pass = {"share_prompts": False}  # rows × width per micro-batch (shared prompts: test_shared_prompts.py)
    _, by_rows, _ = run_step(model, [rows], micro_batch_rows=6, **one_pass)
    _, by_tokens, _ = run_step(model, [rows], micro_batch_tokens=60, micro_batch_rows=6, **one_pass)
    totals = [len(p) + len(c) for p, c in zip(rows["prompt_ids"], rows["completion_ids"], strict=True)]
    batches = [totals[i : i + 6] for i in range(0, len(totals), 6)]
    # each micro-batch feeds 6 rows × (its widest row − 1): the last column predicts nothing scored
    padded = sum(6 * (max(batch) - 1) for batch in batches)
    real = sum(min(total, max(batch) - 1) for batch in batches for total in batch)
    assert by_rows["perf/padding_fraction"] == pytest.approx(1 - real / padded)
    assert by_tokens["perf/padding_fraction"] < by_rows["perf/padding_fraction"]


def test_settings_are_typed_and_pickle():
    cfg = config_from_dict({"loss": {"entropy_coef": 0.02, "kl_coef": 0.1},
                            "model": {"source": "tiny", "reference": "initial"},
                            "optimizer": {"micro_batch_tokens": 256, "mini_batches_per_step": 2}})
    learner_cfg = LearnerSettings.from_config(cfg)
    assert isinstance(learner_cfg.loss, LossSection) and learner_cfg.loss.entropy_coef == 0.02
    assert learner_cfg.updates_per_step == 2 and learner_cfg.optimizer.micro_batch_tokens == 256
    assert pickle.loads(pickle.dumps(learner_cfg)) == learner_cfg


def test_gradient_checkpointing_recomputes_layers_and_keeps_gradients(model):
    rows = make_rows(10, groups=3)

    def layer_calls_and_gradient(policy):
        calls = []
        # A pre-hook inside the layer: the recomputation re-enters the layer's modules, not the layer's own hooks,
        # and stops early, before a forward hook would run. deepcopy keeps the hook.
        policy.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
        # One pass per micro-batch on both sides: checkpointing keeps no cache, so it never shares prompts.
        (grads,), _, _ = run_step(policy, [rows], share_prompts=False)
        return len(calls), grads

    plain_calls, plain = layer_calls_and_gradient(copy.deepcopy(model))
    checkpointed = copy.deepcopy(model)
    enable_gradient_checkpointing(checkpointed)
    recomputed_calls, recomputed = layer_calls_and_gradient(checkpointed)
    assert recomputed_calls == plain_calls + 1  # the one micro-batch's layer runs again in the backward pass
    assert_grads_close(recomputed, plain)


def test_lora_trains_only_the_adapter(model):
    base = copy.deepcopy(model)
    adapted = apply_lora(copy.deepcopy(model), lora_config(4, 8.0, 0.0, ["q_proj", "v_proj", "down_proj"]))
    learner = Learner(adapted, learner_settings(lr=1e-2))
    trained = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    adapter = {id(p) for name, p in adapted.named_parameters() if "lora_" in name}
    assert trained == adapter
    for seed in (11, 12):
        learner.train_step(make_rows(seed, groups=3))
    inner = adapted.get_base_model()
    for name, tensor in base.state_dict().items():
        key = name.replace("q_proj.", "q_proj.base_layer.").replace("v_proj.", "v_proj.base_layer.")
        key = key.replace("down_proj.", "down_proj.base_layer.")
        assert torch.equal(inner.state_dict()[key], tensor), name
    assert any(float(p.detach().abs().max()) > 0 for n, p in adapted.named_parameters() if "lora_B" in n)


def test_precision_plans_use_fused_adamw_and_it_updates_as_the_loop_does():
    assert learner_precision(torch.device("cuda"), "bfloat16") == LearnerPrecision(torch.float32, torch.bfloat16, True)
    assert learner_precision(torch.device("cuda"), "float32") == LearnerPrecision(torch.float32, None, True)
    assert learner_precision(torch.device("cpu"), "bfloat16") == LearnerPrecision(torch.bfloat16, None, True)
    assert learner_precision(torch.device("cpu"), "float32") == LearnerPrecision(torch.float32, None, True)
    gen = torch.Generator().manual_seed(5)
    start = [torch.randn(shape, generator=gen) for shape in ((64, 32), (32,))]
    weights = {fused: [torch.nn.Parameter(w.clone()) for w in start] for fused in (True, False)}
    optimizers = {fused: adamw(weights[fused], LearnerPrecision(fused_adamw=fused), lr=0.01, weight_decay=0.1)
                  for fused in (True, False)}  # fmt: skip
    assert optimizers[True].defaults["fused"] is True and optimizers[False].defaults["fused"] is None
    for _ in range(4):  # the CPU's fused kernel takes the same AdamW steps as the per-parameter loop
        grads = [torch.randn(w.shape, generator=gen) for w in start]
        for fused in (True, False):
            for weight, grad in zip(weights[fused], grads, strict=True):
                weight.grad = grad.clone()
            optimizers[fused].step()
    for fused_weight, loop_weight, first in zip(weights[True], weights[False], start, strict=True):
        torch.testing.assert_close(fused_weight, loop_weight, rtol=1e-6, atol=1e-7)
        assert not torch.equal(fused_weight, first)
