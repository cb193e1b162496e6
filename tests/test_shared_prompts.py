"""One pass per distinct prompt: the learner scores a group's completions against its prompt's cache.

Invariants pinned:
- scoring with the shared prompt pass gives the one-pass logprobs, entropies and parameter gradients: within
  1e-12 in float64 (the same function, other matmul shapes; transformers' RMSNorm rounds through float32, so
  the float64 case runs it in float64) and 1e-5 in float32, on ragged rows (prompts of several lengths, each
  shared by several rows, completions from one token long, a sampled pad id, temperature);
- the same with a LoRA adapter on the attention and MLP projections (its gradient reaches the adapter only);
- the passes feed ``U·Lp + R·(Lc − 1)`` positions (each distinct prompt once; a row's last token predicts nothing
  scored and is not fed, in either layout) and count each shared prompt's tokens once as real tokens; one-token
  completions need only the prompt pass; rows whose prompts all differ, where sharing would feed more, run one
  pass as before;
- a learner step with ``optimizer.share_prompts`` on updates the weights as one with it off (float32 rounding);
- token-budget packing under sharing keeps each prompt's rows together and every micro-batch's positions fed
  (the cheaper layout's) within the budget and the row cap, every row exactly once (hypothesis); a group whose
  rows one by one would need several micro-batches fits one, and the learner step equals the one-pass step;
- refused, with the reason in the scorer's description, for gradient checkpointing and for models with
  sliding-window or non-attention layers; ``share_prompts: false`` turns it off; and when the two layouts
  disagree at first use (a cache gather that hands rows the wrong prompt), the probe refuses and the scores are
  the one-pass scores.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_learner import learner_settings, make_rows
from transformers import Cache
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from groupwise.batch import RowBatch
from groupwise.model import load_policy
from groupwise.model.completion_scorer import CompletionScorer
from groupwise.model.lora import apply_lora, lora_config
from groupwise.model.shared_prompts import PromptSharing, sharing_refusal
from groupwise.trainer.builder import enable_gradient_checkpointing
from groupwise.trainer.learner import Learner
from groupwise.trainer.micro_batches import micro_batches_by_shared_tokens, micro_batches_by_tokens

pytestmark = pytest.mark.numerics

TINY = {"vocab": "full", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
GROUPS = {
    (1, 10, 11, 12): [[40, 41, 2], [50, 51, 52, 53, 54, 55, 56, 57], [60]],
    (1, 20): [[0, 61, 0, 62, 2], [63, 64]],  # 0 = a sampled pad id
    (1, 30, 31, 32, 33, 34, 35): [[70, 71], [72], [73, 74, 75, 76]],
}
PROMPTS = [list(p) for p, rows in GROUPS.items() for _ in rows]
COMPLETIONS = [c for rows in GROUPS.values() for c in rows]


@pytest.fixture(scope="module")
def model():
    return load_policy("tiny", tiny=TINY, seed=3, device="cpu").model.train()


def scored_with_gradients(model, share: bool, temperature: float = 0.7):
    """Logprobs, entropies and every trainable parameter's gradient of a loss that uses both."""
    model.zero_grad()
    scored = CompletionScorer(temperature, 4, share_prompts=share).score(model, PROMPTS, COMPLETIONS, True)
    weights = torch.linspace(-1.0, 1.0, scored.mask.numel()).view_as(scored.mask)
    ((scored.logprobs * weights).sum() + 0.1 * scored.entropy.sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return scored, grads


def rms_norm_in_its_own_dtype(self, hidden):
    """``LlamaRMSNorm`` without its float32 round trip (which would cap a float64 comparison at float32's
    rounding, differently for differently shaped batches)."""
    return self.weight * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_shared_prompt_pass_equals_one_pass(model, dtype, tolerance, monkeypatch):
    if dtype == torch.float64:
        monkeypatch.setattr(LlamaRMSNorm, "forward", rms_norm_in_its_own_dtype)
    typed = copy.deepcopy(model).to(dtype)
    one, one_grads = scored_with_gradients(typed, share=False)
    shared, shared_grads = scored_with_gradients(typed, share=True)
    assert torch.equal(shared.mask, one.mask)
    torch.testing.assert_close(shared.logprobs, one.logprobs, rtol=0, atol=tolerance)
    torch.testing.assert_close(shared.entropy, one.entropy, rtol=0, atol=tolerance)
    for name, grad in one_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(shared_grads[name], grad, rtol=0, atol=tolerance * scale, msg=name)


def test_shared_prompt_pass_equals_one_pass_with_lora(model):
    adapted = apply_lora(copy.deepcopy(model), lora_config(4, 8.0, 0.0, ["q_proj", "v_proj", "down_proj"]))
    for name, parameter in adapted.named_parameters():
        if "lora_B" in name:  # B starts at 0: move it, so the adapter changes the scores and gets a gradient
            torch.nn.init.normal_(parameter, std=0.1, generator=torch.Generator().manual_seed(len(name)))
    one, one_grads = scored_with_gradients(adapted, share=False)
    shared, shared_grads = scored_with_gradients(adapted, share=True)
    torch.testing.assert_close(shared.logprobs, one.logprobs, rtol=0, atol=1e-5)
    assert set(shared_grads) == set(one_grads) and all("lora_" in name for name in one_grads)
    for name, grad in one_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=0, atol=1e-5, msg=name)


def test_positions_fed_count_each_shared_prompt_once(model):
    shared, _ = scored_with_gradients(model, share=True)
    one, _ = scored_with_gradients(model, share=False)
    prompts, rows = [list(p) for p in GROUPS], len(COMPLETIONS)
    longest_prompt, longest_completion = max(map(len, prompts)), max(map(len, COMPLETIONS))
    # The last column of either layout predicts nothing scored and is not fed.
    assert shared.padded_tokens == len(prompts) * longest_prompt + rows * (longest_completion - 1)
    fed_completion_tokens = sum(min(len(c), longest_completion - 1) for c in COMPLETIONS)
    assert shared.real_tokens == sum(map(len, prompts)) + fed_completion_tokens
    widest = max(len(p) + len(c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True))
    assert one.padded_tokens == rows * (widest - 1)
    assert one.real_tokens == sum(min(len(p) + len(c), widest - 1) for p, c in zip(PROMPTS, COMPLETIONS, strict=True))
    assert shared.padded_tokens < one.padded_tokens


def test_one_token_completions_need_no_completion_pass(model):
    """Each completion is predicted by its prompt's last position: the prompt pass alone is fed."""
    completions = [[c[0]] if i % 3 else [] for i, c in enumerate(COMPLETIONS)]
    shared = CompletionScorer(0.7, 4).score(model, PROMPTS, completions)
    one = CompletionScorer(0.7, 4, share_prompts=False).score(model, PROMPTS, completions)
    assert torch.equal(shared.mask, one.mask) and int(shared.mask.sum()) == sum(map(len, completions))
    torch.testing.assert_close(shared.logprobs, one.logprobs, rtol=0, atol=1e-5)
    assert shared.padded_tokens == len(GROUPS) * max(map(len, GROUPS))


def test_distinct_prompts_run_one_pass(model):
    prompts, completions = [[1, 5, 6], [1, 7, 8], [1, 9, 10]], [[20, 21], [22], [23, 24, 25]]
    assert not PromptSharing.of(prompts).pays(completions)
    scored = CompletionScorer(1.0, 4).score(model, prompts, completions)
    assert scored.padded_tokens == 3 * 5  # one pass: rows × (the longest prompt + completion − 1)
    assert PromptSharing.of(prompts + prompts).pays(completions + completions)


def test_a_learner_step_with_shared_prompts_updates_the_weights_as_without(model):
    after, lr = {}, 1e-3
    for share in (False, True):
        policy = copy.deepcopy(model)
        learner = Learner(policy, learner_settings(lr=lr, share_prompts=share))
        stats = learner.train_step(make_rows(21, groups=4, size=4))
        after[share] = (stats["loss/policy"], [p.detach().clone() for p in policy.parameters()])
    assert after[True][0] == pytest.approx(after[False][0], abs=1e-6)
    for shared, one in zip(after[True][1], after[False][1], strict=True):
        # AdamW's first update is ±lr wherever the gradient is not ~0; where it is, float32 rounding of the
        # gradient can move the update by a fraction of lr: within 1 % of lr, and most weights bit for bit.
        torch.testing.assert_close(shared, one, rtol=0, atol=0.01 * lr)
    assert any(not torch.equal(p, q) for p, q in zip(after[True][1], model.parameters(), strict=True))


def test_refusals_say_why_and_score_one_pass(model):
    checkpointed = copy.deepcopy(model)
    enable_gradient_checkpointing(checkpointed)
    scorer = CompletionScorer(1.0, 4)
    assert "gradient checkpointing" in scorer.describe(checkpointed)
    scored = scorer.score(checkpointed, PROMPTS, COMPLETIONS)
    widest = max(len(p) + len(c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True))
    assert scored.padded_tokens == len(PROMPTS) * (widest - 1)
    assert scorer.describe(model).endswith("one pass per distinct prompt")
    assert "share_prompts is off" in CompletionScorer(1.0, 4, share_prompts=False).describe(model)

    sliding = copy.deepcopy(model)
    sliding.config.layer_types = ["full_attention", "sliding_attention"]
    assert "sliding_attention" in sharing_refusal(sliding)
    windowed = copy.deepcopy(model)
    windowed.config.sliding_window = 4
    assert "sliding window (4 positions)" in sharing_refusal(windowed)


def cheaper_layout_positions(prompts, completions) -> int:
    sharing = PromptSharing.of(prompts)
    return min(sharing.shared_positions(completions), sharing.plain_positions(completions))


@given(
    groups=st.lists(
        st.tuples(st.integers(1, 30), st.lists(st.integers(0, 20), min_size=1, max_size=6)), min_size=1, max_size=8
    ),
    max_tokens=st.integers(1, 200),
    max_rows=st.integers(1, 8),
)
def test_shared_packing_keeps_groups_together_within_budget_and_cap(groups, max_tokens, max_rows):
    prompts = [[group] * length for group, (length, rows) in enumerate(groups) for _ in rows]
    completions = [[7] * c for _, rows in groups for c in rows]
    batches = micro_batches_by_shared_tokens(prompts, [len(c) for c in completions], max_tokens, max_rows)
    order = [row for batch in batches for row in batch]
    assert sorted(order) == list(range(len(prompts)))
    owners = [prompts[row][0] for row in order]
    assert all(owners.index(o) == i or owners[i - 1] == o for i, o in enumerate(owners))  # each prompt contiguous
    for batch in batches:
        assert len(batch) <= max_rows
        cost = cheaper_layout_positions([prompts[r] for r in batch], [completions[r] for r in batch])
        assert len(batch) == 1 or cost <= max_tokens


def test_a_group_fits_the_budget_its_rows_alone_would_not(model):
    prompts, completions = [[1] + [9] * 39] * 8, [[20 + i] * 10 for i in range(8)]
    assert len(micro_batches_by_tokens([50] * 8, 200, 64)) == 2  # 4 rows × 50 positions per pass
    assert micro_batches_by_shared_tokens(prompts, [10] * 8, 200, 64) == [list(range(8))]  # 40 + 8 × 10 = 120
    rows = RowBatch({
        "group_id": [0] * 8, "prompt_ids": prompts, "completion_ids": completions,
        "generation_logprobs": [[-3.0] * 10] * 8, "version_spans": [((0, 10),)] * 8, "env_spans": [()] * 8,
        "advantage": torch.linspace(-1.0, 1.0, 8),
    })  # fmt: skip
    steps = {}
    for share in (False, True):
        learner = Learner(copy.deepcopy(model), learner_settings(micro_batch_tokens=200, share_prompts=share))
        passes = len(learner._micro_batches(rows))
        steps[share] = passes, learner.train_step(rows), [p.detach().clone() for p in learner.model.parameters()]
    assert (steps[False][0], steps[True][0]) == (2, 1)
    assert steps[True][1]["loss/policy"] == pytest.approx(steps[False][1]["loss/policy"], abs=1e-6)
    for shared, one in zip(steps[True][2], steps[False][2], strict=True):
        torch.testing.assert_close(shared, one, rtol=0, atol=1e-5)


def test_the_probe_refuses_a_cache_that_gives_rows_the_wrong_prompt(model, monkeypatch):
    original = Cache.reorder_cache

    def reversed_rows(self, owner):
        original(self, owner.flip(0))

    monkeypatch.setattr(Cache, "reorder_cache", reversed_rows)
    probed = copy.deepcopy(model)
    scorer = CompletionScorer(1.0, 4)
    assert "differ from one pass's" in scorer.describe(probed)
    one = CompletionScorer(1.0, 4, share_prompts=False).score(probed, PROMPTS, COMPLETIONS)
    got = scorer.score(probed, PROMPTS, COMPLETIONS)
    assert torch.equal(got.logprobs, one.logprobs) and got.padded_tokens == one.padded_tokens
