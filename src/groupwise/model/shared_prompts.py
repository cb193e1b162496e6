"""Scoring the rows of a group with one pass over their prompt: the prompt's keys and values serve every completion.

A GRPO step scores G completions of each prompt, so a plain pass over ``prompt ++ completion`` rows runs every
prompt G times. Here each distinct prompt runs once (its decoder pass keeps the keys and values of every layer),
those keys and values are gathered to the rows that share the prompt, and a second pass runs only the
completions, attending to them. For a step of U distinct prompts (longest ``Lp``) and R rows (longest
completion ``Lc``) the passes feed ::

    shared:  U·Lp + R·(Lc − 1)     positions          plain:  R·(max_r(len p_r + len c_r) − 1)

(a row's last token predicts nothing that is scored, so the last column of either layout is never fed).

The gradient is the same function's: each prompt position's activations receive the sum of the gradients of
every row that attends to them (the gather's backward adds them up), which is what the plain pass computes
row by row. Numbers match the plain pass within float rounding (the matmuls have other shapes); a test pins
the logprobs, entropies and weight gradients.

The hidden state that predicts completion token ``j`` of row ``r`` is the prompt pass's last position for
``j = 0`` and the completion pass's position ``j − 1`` after that: both are gathered into the layout of the
completion mask ``[R, Lc]``, so the LM head sees exactly the positions the plain path would give it.

Only for models whose attention reads a plain key-value cache the same way in both passes: a model with
sliding-window or non-attention layers (a cache that drops or transforms earlier positions) is refused by
name (:func:`sharing_refusal`), and the scorer compares both paths on a few tokens before first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import Cache, PreTrainedModel
from transformers.utils import ModelOutput

from groupwise.model.logprobs import position_ids_from_mask, right_padded_ids


def shared_positions(prompts: int, longest_prompt: int, rows: int, longest_completion: int) -> int:
    """Positions the two passes feed: ``U·Lp + R·(Lc − 1)`` (U distinct prompts, R rows; a completion's last
    token is not fed, its hidden state would predict nothing scored)."""
    return prompts * longest_prompt + rows * max(longest_completion - 1, 0)


def one_pass_positions(rows: int, widest: int) -> int:
    """Positions one pass over right-padded ``prompt ++ completion`` rows feeds: ``R·(max(len p + len c) − 1)``,
    the last column predicting nothing scored (one column is fed when the rows are one token wide)."""
    return rows * fed_width(widest)


def fed_width(widest: int) -> int:
    """Columns of a ``widest``-wide right-padded layout that are fed: all but the last, which predicts no token."""
    return max(widest - 1, 1)


@dataclass(frozen=True)
class PromptSharing:
    """Which distinct prompt each row reads: ``prompts[owner[r]]`` is row r's prompt."""

    prompts: list[Sequence[int]]
    owner: list[int]

    @classmethod
    def of(cls, prompt_ids: Sequence[Sequence[int]]) -> PromptSharing:
        """Distinct prompts in first-seen order; rows with equal token ids share one."""
        index: dict[tuple[int, ...], int] = {}
        prompts: list[Sequence[int]] = []
        owner = []
        for prompt in prompt_ids:
            key = tuple(prompt)
            if key not in index:
                index[key] = len(prompts)
                prompts.append(prompt)
            owner.append(index[key])
        return cls(prompts, owner)

    def shared_positions(self, completion_ids: Sequence[Sequence[int]]) -> int:
        """:func:`shared_positions` of these rows."""
        longest_completion = max((len(c) for c in completion_ids), default=0)
        longest_prompt = max(len(p) for p in self.prompts)
        return shared_positions(len(self.prompts), longest_prompt, len(self.owner), longest_completion)

    def plain_positions(self, completion_ids: Sequence[Sequence[int]]) -> int:
        """:func:`one_pass_positions` of these rows."""
        widths = [len(self.prompts[u]) + len(c) for u, c in zip(self.owner, completion_ids, strict=True)]
        return one_pass_positions(len(widths), max(widths))

    def pays(self, completion_ids: Sequence[Sequence[int]]) -> bool:
        """Share when the two passes feed fewer positions than one plain pass (some prompt is read twice or
        more, or the rows' lengths make the plain pass's padding dearer)."""
        return self.shared_positions(completion_ids) < self.plain_positions(completion_ids)


@dataclass
class HeadInputs:
    """What a layout's decoder passes give the LM head (this module's two passes, or the scorer's one pass):
    ``hidden`` ``[N, H]`` at the positions that predict the ``N`` completion tokens (row-major, as ``mask`` lists
    them), ``targets`` ``[N]``, the completion ``mask`` ``[R, Lc]``, and the positions fed (``padded``) of which
    real tokens (``real``: each shared prompt once)."""

    hidden: Tensor
    targets: Tensor
    mask: Tensor
    padded: int
    real: int


def sharing_refusal(model: PreTrainedModel) -> str | None:
    """Why the prompt's cache cannot be reused exactly for ``model`` (a known departure), or None."""
    if _activation_checkpointing(model):
        return "gradient checkpointing is on (the model keeps no cache under it)"
    # Fields only some families' configs have (Qwen2, Mistral, Gemma): read as data, absent means "not used",
    # as the chunked path reads the logit-transform fields.
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ()
    others = sorted({kind for kind in layer_types if kind != "full_attention"})
    if others:
        return f"the model has {', '.join(others)} layers, whose cache is not the plain keys and values"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"the model attends through a sliding window ({config.sliding_window} positions)"
    return None


def _activation_checkpointing(model: PreTrainedModel) -> bool:
    """transformers' own flag, named ``is_activation_checkpointing`` from 5.24 on (5.17 has only the old name,
    deprecated since: a version check, not a capability of ours)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)


def _cache_of(output: object) -> Cache:
    """The key-value cache a decoder pass returned (its output's second field, whatever transformers names it)."""
    fields = output.to_tuple() if isinstance(output, ModelOutput) else ()
    cache = fields[1] if len(fields) > 1 else None
    if not isinstance(cache, Cache):
        raise TypeError(f"the decoder returned no key-value cache (got {type(cache).__name__})")
    return cache


def shared_prompt_hidden(
    decoder: torch.nn.Module,
    sharing: PromptSharing,
    completion_ids: Sequence[Sequence[int]],
    device: torch.device,
) -> HeadInputs:
    """Run each distinct prompt once and every completion against its prompt's cache (module docstring)."""
    for index, prompt in enumerate(sharing.prompts):
        if len(prompt) == 0:
            raise ValueError(f"distinct prompt {index} is empty; the first completion token needs a prompt token")
    prompt_lengths = torch.tensor([len(p) for p in sharing.prompts], device=device)
    prompt_ids, prompt_mask = right_padded_ids(sharing.prompts, int(prompt_lengths.max()), device)
    completion_width = max((len(c) for c in completion_ids), default=0)
    completions, completion_mask = right_padded_ids(completion_ids, completion_width, device)
    mask = completion_mask.bool()
    # The completions' last column is not fed: its hidden states would predict tokens after the completions.
    fed_ids, fed_mask = completions[:, :-1], completion_mask[:, :-1]
    real = int(prompt_mask.sum()) + int(fed_mask.sum())
    prompt_pass = decoder(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids_from_mask(prompt_mask),
        use_cache=True,
    )  # fmt: skip
    owner = torch.tensor(sharing.owner, device=device)
    last = prompt_pass.last_hidden_state[torch.arange(len(sharing.prompts), device=device), prompt_lengths - 1]
    padded = prompt_ids.numel()
    if completion_width <= 1:  # no completion pass: a one-token completion is predicted by its prompt's last
        predicting = last[owner][:, None][:, :completion_width]
        return HeadInputs(predicting[mask], completions[mask], mask, padded, real)
    cache = _cache_of(prompt_pass)
    # Every layer's keys and values gathered to the rows, [R, heads, Lp, d] (``owner`` is a long tensor; the
    # annotation asks for the legacy LongTensor type).
    cache.reorder_cache(owner)  # type: ignore[arg-type]
    # The cache goes in as the decoder's fourth positional parameter: its keyword was renamed within
    # transformers 5 (past_key_values, then cache), its place was not. A model whose decoder differs is refused
    # by the scorer's probe, which runs this function before first use.
    completion_pass = decoder(
        fed_ids,
        torch.cat([prompt_mask[owner], fed_mask], dim=1),
        prompt_lengths[owner][:, None] + torch.arange(completion_width - 1, device=device)[None],
        cache,
        use_cache=True,
    )
    predicting = torch.cat([last[owner][:, None], completion_pass.last_hidden_state], dim=1)
    return HeadInputs(predicting[mask], completions[mask], mask, padded + fed_ids.numel(), real)
