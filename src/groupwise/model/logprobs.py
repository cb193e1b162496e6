"""Per-token logprobs (and entropies) of realised tokens under a policy, with gradient when wanted.

The distribution is ``log_softmax(logits / T)`` with T the sampling temperature (1 for greedy),
the same one the generation engine records at sampling time, so the two can be compared token by
token (importance weights, mismatch metrics).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def logprob_temperature(temperature: float) -> float:
    """The temperature logprobs are recorded under: the sampling temperature, or 1 for greedy (temperature 0)."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 means greedy)")
    return temperature if temperature > 0 else 1.0


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Position of each token among the real tokens of its row: ``cumsum(mask) - 1``, clamped at 0 on padding."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_(min=0)


def right_padded_ids(rows: Sequence[Sequence[int]], width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Token-id ``rows`` as ``[R, width]`` ids, right-padded with 0, and their attention mask (1 on real tokens)."""
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate(rows):
        ids[row, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
        mask[row, : len(tokens)] = 1
    return ids.to(device), mask.to(device)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float,
    with_entropy: bool = False,
    last: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Logprobs ``[B, T-1]`` of ``input_ids[:, 1:]``, each under the logits of the position before it::

        logprob[b, t] = z[b, t, x[b, t+1]] - logsumexp_v z[b, t, v],   z = logits / T
        entropy[b, t] = logsumexp_v z[b, t, v] - sum_v softmax(z)[b, t, v] · z[b, t, v]

    Position ids follow the attention mask, so left padding does not shift positions. ``last``
    scores only the final ``last`` tokens (``[B, last]``), computing logits for just those
    positions, which saves memory on long prompts. Values at padded positions are meaningless:
    mask them. Gradient flows when called under grad.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
            "must have the same [B, T] shape"
        )
    num_scored = input_ids.shape[1] - 1 if last is None else last
    if not 0 <= num_scored <= input_ids.shape[1] - 1:
        raise ValueError(f"last={last} must be between 0 and T-1={input_ids.shape[1] - 1}")
    if num_scored == 0:
        empty = input_ids.new_zeros((input_ids.shape[0], 0), dtype=torch.float32)
        return empty, (empty.clone() if with_entropy else None)
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=num_scored + 1,
    )
    scaled = outputs.logits[:, :-1, :].float() / logprob_temperature(temperature)
    targets = input_ids[:, -num_scored:]
    log_normaliser = torch.logsumexp(scaled, dim=-1)
    logprobs = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_normaliser
    entropy = None
    if with_entropy:
        entropy = log_normaliser - (torch.softmax(scaled, dim=-1) * scaled).sum(dim=-1)
    return logprobs, entropy


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    temperature: float,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Per-token logprobs ``[R, Tc]`` of each realised completion given its prompt, plus entropy and mask.

    Layout: prompts left-padded to the longest prompt, completions right-padded to the longest
    completion (Tc). ``mask[r, j]`` is True iff ``j < len(completion_ids[r])``: positional, never
    ``token != pad``, because a sampled pad token is a real token. Masked entries are 0.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions; pass one prompt per row")
    for row, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt of row {row} is empty; the first completion token needs a prompt token before it")
    device = next(model.parameters()).device
    input_ids, attention_mask, prompt_width = _left_right_padded(prompt_ids, completion_ids, device)
    completion_width = input_ids.shape[1] - prompt_width
    lengths = torch.tensor([len(c) for c in completion_ids], device=device, dtype=torch.long)
    mask = torch.arange(completion_width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    logprobs, entropy = token_logprobs(model, input_ids, attention_mask, temperature, with_entropy, completion_width)
    logprobs = logprobs.masked_fill(~mask, 0.0)
    if entropy is not None:
        entropy = entropy.masked_fill(~mask, 0.0)
    return logprobs, entropy, mask


def _left_right_padded(
    prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], device: torch.device
) -> tuple[Tensor, Tensor, int]:
    """``[R, P + C]`` ids and mask: prompt r right-aligned in the first P columns, completion r left-aligned after.

    Padding positions hold id 0; they are masked out, so the id does not matter.
    """
    num_rows = len(prompt_ids)
    prompt_width = max((len(p) for p in prompt_ids), default=0)
    completion_width = max((len(c) for c in completion_ids), default=0)
    input_ids = torch.zeros((num_rows, prompt_width + completion_width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        start, end = prompt_width - len(prompt), prompt_width + len(completion)
        input_ids[row, start:prompt_width] = torch.as_tensor(list(prompt), dtype=torch.long)
        input_ids[row, prompt_width:end] = torch.as_tensor(list(completion), dtype=torch.long)
        attention_mask[row, start:end] = 1
    return input_ids.to(device), attention_mask.to(device), prompt_width
