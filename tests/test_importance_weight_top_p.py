"""The importance weight under a truncated sampler (top-p < 1).

Invariant pinned: the engines record each token's log-probability under the FULL tempered distribution (not the
top-k/top-p renormalised one), the distribution the learner scores; so for a policy that has not changed since it
sampled, the importance weight ``exp(prev − generation)`` the loss applies is 1 on every token (within float32
rounding) and no token is out of the truncation bounds, even where top-p dropped most of the probability mass (the
fixture checks that it did: weights computed against the truncated distribution would sit far below 1).
"""

from __future__ import annotations

import pytest
import torch

from groupwise.batch import RowBatch
from groupwise.config.algorithm import LossSection, OptimizerSection
from groupwise.generation import Engine
from groupwise.generation.sampling import filtered_candidates
from groupwise.model import load_policy
from groupwise.trainer.learner import Learner, LearnerSettings
from groupwise.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.numerics

TINY = {"vocab": "full", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
TOP_P = 0.6


@pytest.fixture(scope="module")
def peaked():
    """A policy whose next-token distributions are far from uniform, so top-p drops real mass."""
    policy = load_policy("tiny", tiny=TINY, seed=4, device="cpu")
    with torch.no_grad():
        policy.model.model.norm.weight.fill_(12.0)
    return policy


def test_weight_is_one_for_an_unchanged_policy_under_top_p(peaked):
    prompts = [tuple(peaked.tokenizer(text)["input_ids"]) for text in ("2*3=", "17+25=", "9-4=")]
    engine = Engine(peaked.model, peaked.tokenizer, eos_token_ids=(2,))
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=TOP_P)
    out = engine.generate([GenerationRequest(p, 4, seed=i) for i, p in enumerate(prompts)], sampling)
    with torch.no_grad():
        logits = peaked.model(torch.tensor([prompts[0]])).logits[0, -1:]
    candidates, probs = filtered_candidates(logits, 1.0, 0, TOP_P)
    kept_mass = float(torch.softmax(logits.double(), -1)[0, candidates[0][probs[0] > 0]].sum())
    assert kept_mass < 0.9, "the fixture must make top-p drop a real share of the probability"

    cols: dict[str, list] = {k: [] for k in ("group_id", "prompt_ids", "completion_ids", "generation_logprobs",
                                             "version_spans", "advantage")}
    for group, (prompt, completions) in enumerate(zip(prompts, out, strict=True)):
        for i, completion in enumerate(completions):
            cols["group_id"].append(group)
            cols["prompt_ids"].append(prompt)
            cols["completion_ids"].append(completion.token_ids)
            cols["generation_logprobs"].append(list(completion.logprobs))
            cols["version_spans"].append(((0, len(completion.token_ids)),))
            cols["advantage"].append(1.0 if i % 2 else -1.0)
    rows = RowBatch({**cols, "advantage": torch.tensor(cols["advantage"])})
    settings = LearnerSettings(loss=LossSection(), optimizer=OptimizerSection(logprob_chunk_tokens=None),
                               total_steps=1, temperature=1.0)
    metrics = Learner(peaked.model, settings).train_step(rows)
    assert metrics["loss/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["loss/is_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["loss/is_oob_fraction"] == 0.0
    assert metrics["mismatch/logprob_abs_diff"] < 1e-4
