"""Per-token logprobs and prompt encoding.

- ``completion_logprobs`` on a ragged batch (left-padded prompts, right-padded completions) equals,
  row by row, ``log_softmax(logits / T)`` of that row computed alone with no padding at all;
- the mask is positional: a sampled ``<pad>`` token inside a completion is scored, positions past
  a completion's end are masked and zero;
- entropy is ``-sum p log p`` of the tempered distribution; temperature 0 scores like temperature 1
  (the engine records greedy tokens under T=1);
- gradient flows to the weights when called under grad;
- ``token_logprobs(last=k)`` is the tail of the full result (within 1e-5: it computes logits for fewer
  positions, a differently shaped matrix product);
- floats: results of different computations (batched vs alone, a float64 reference) are compared within
  1e-5; exactly only where the computation is the same (temperature 0 scores as temperature 1);
- ``encode_prompt``: text with the tokenizer's BOS handling, messages through the chat template
  (with generation prompt, system prompt first); a chat with a tokenizer that has no template is refused;
- the model layer sits below generation: no module of ``groupwise/model/`` imports ``groupwise.generation``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from groupwise.model import completion_logprobs, encode_prompt, load_policy, token_logprobs
from groupwise.model.encode import ChatTemplateMissing
from groupwise.types import Prompt

pytestmark = pytest.mark.numerics

TINY = {"vocab": "full", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", tiny=TINY, seed=11, device="cpu")


def _alone(model, prompt: list[int], completion: list[int], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: one unpadded row, full-vocabulary log_softmax, no helper code shared with the library."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].double() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    chosen = log_probs.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


def test_ragged_batch_matches_each_row_alone(policy) -> None:
    prompts = [[1, 10, 11, 12], [1, 20], [1, 30, 31, 32, 33, 34, 35]]
    completions = [[40, 41, 2], [50, 51, 52, 53, 54, 55], [60]]
    logprobs, entropy, mask = completion_logprobs(policy.model, prompts, completions, 0.7, with_entropy=True)
    assert mask.tolist() == [[j < len(c) for j in range(6)] for c in completions]
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        expected, expected_entropy = _alone(policy.model, prompt, completion, 0.7)
        n = len(completion)
        torch.testing.assert_close(logprobs[row, :n].double(), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy[row, :n].double(), expected_entropy, atol=1e-5, rtol=0)
        assert torch.all(logprobs[row, n:] == 0) and torch.all(entropy[row, n:] == 0)


def test_sampled_pad_token_is_a_real_scored_token(policy) -> None:
    pad = policy.tokenizer.pad_token_id
    prompts, completions = [[1, 5, 6], [1, 7]], [[pad, 9, pad], [8]]
    logprobs, _, mask = completion_logprobs(policy.model, prompts, completions, 1.0)
    assert mask[0].tolist() == [True, True, True]
    expected, _ = _alone(policy.model, prompts[0], completions[0], 1.0)
    torch.testing.assert_close(logprobs[0].double(), expected, atol=1e-5, rtol=0)
    assert logprobs[0, 0] < 0 and logprobs[0, 2] < 0


def test_temperature_zero_scores_like_temperature_one(policy) -> None:
    prompts, completions = [[1, 5, 6]], [[7, 8, 9]]
    greedy, _, _ = completion_logprobs(policy.model, prompts, completions, 0.0)
    plain, _, _ = completion_logprobs(policy.model, prompts, completions, 1.0)
    hot, _, _ = completion_logprobs(policy.model, prompts, completions, 2.0)
    assert torch.equal(greedy, plain)
    assert not torch.allclose(plain, hot)
    with pytest.raises(ValueError, match="temperature=-1"):
        completion_logprobs(policy.model, prompts, completions, -1.0)


def test_gradient_flows_under_grad_and_not_under_no_grad(policy) -> None:
    model = policy.model
    model.zero_grad()
    logprobs, _, mask = completion_logprobs(model, [[1, 5, 6], [1, 7]], [[7, 8], [9]], 1.0)
    (logprobs * mask).sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    model.zero_grad()
    with torch.no_grad():
        detached, _, _ = completion_logprobs(model, [[1, 5, 6]], [[7, 8]], 1.0)
    assert not detached.requires_grad


def test_token_logprobs_last_is_the_tail_of_the_full_result(policy) -> None:
    ids = torch.tensor([[0, 0, 1, 5, 6, 7, 8], [1, 9, 10, 11, 12, 13, 14]])
    mask = (torch.arange(7) >= torch.tensor([[2], [0]])).long()
    with torch.no_grad():
        full, _ = token_logprobs(policy.model, ids, mask, 1.0)
        tail, _ = token_logprobs(policy.model, ids, mask, 1.0, last=3)
    assert full.shape == (2, 6)
    torch.testing.assert_close(tail, full[:, -3:], atol=1e-5, rtol=0)


def test_bad_rows_are_rejected(policy) -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        completion_logprobs(policy.model, [[1], [1]], [[2]], 1.0)
    with pytest.raises(ValueError, match="prompt of row 1 is empty"):
        completion_logprobs(policy.model, [[1], []], [[2], [3]], 1.0)


def test_encode_text_prompt_with_bos_and_optional_system_prompt(policy) -> None:
    tokenizer = policy.tokenizer
    prompt = Prompt(uid="t/0", answer="3", text="1+2=")
    assert encode_prompt(tokenizer, prompt) == tuple(tokenizer("1+2=")["input_ids"])
    with_system = encode_prompt(tokenizer, prompt, system_prompt="Add.")
    assert tokenizer.decode(with_system) == "<bos>Add.\n1+2="


def test_encode_messages_through_the_chat_template_and_refuses_without_one(policy) -> None:
    tokenizer = policy.tokenizer
    messages = ({"role": "user", "content": "1+2=?"},)
    prompt = Prompt(uid="t/1", answer="3", messages=messages)
    with pytest.raises(ChatTemplateMissing, match="'t/1' is a chat .* no chat template"):
        encode_prompt(tokenizer, prompt, system_prompt="Be brief.")
    templated = load_policy("tiny", tiny=TINY, device="cpu").tokenizer
    templated.chat_template = (
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    ids = encode_prompt(templated, prompt, system_prompt="Be brief.")
    assert templated.decode(ids) == "<bos>[system]Be brief.\n[user]1+2=?\n[assistant]"
    assert ids.count(templated.bos_token_id) == 1, "the template's BOS must not be doubled"


def test_encode_rejects_prompts_with_neither_or_both_fields(policy) -> None:
    with pytest.raises(ValueError, match="exactly one of text or messages"):
        encode_prompt(policy.tokenizer, Prompt(uid="t/2", answer=""))
    both = Prompt(uid="t/3", answer="", text="x", messages=({"role": "user", "content": "x"},))
    with pytest.raises(ValueError, match="'t/3' must set exactly one"):
        encode_prompt(policy.tokenizer, both)


def test_the_model_layer_imports_nothing_from_generation():
    model_dir = Path(__file__).resolve().parents[1] / "src" / "groupwise" / "model"
    found = []
    for path in sorted(model_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])  # fmt: skip
            found += [f"{path.name}: {name}" for name in names if name.startswith("groupwise.generation")]
    assert not found
