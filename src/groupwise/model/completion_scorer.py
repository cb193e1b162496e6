"""Scoring completions under a policy for the learner: per-token logprobs, entropies and the completion mask.

Two paths, same numbers (within float rounding; a test pins 1e-5):

* **chunked** (``chunk_tokens`` set, the default): rows laid out as ``prompt ++ completion``, right-padded to
  the longest row; the model's decoder gives the final hidden states, only the positions that predict a
  completion token are kept (padding and prompt positions never reach the LM head), and
  :func:`~groupwise.model.chunked_logprobs.head_logprobs` projects them through the head ``chunk_tokens`` at a
  time, so peak memory is O(chunk × V) instead of O(rows × T × V).
  Rows that share a prompt (a group's G completions) read it from one pass over the prompt
  (:mod:`groupwise.model.shared_prompts`) when that feeds fewer positions, unless ``share_prompts`` is off.
* **plain** (``chunk_tokens`` null, or a model the chunked path cannot score exactly):
  :func:`~groupwise.model.logprobs.completion_logprobs`, the model's own forward with full logits.

The chunked path reads the head's weight and bias directly, so it needs a model whose logits are exactly
``lm_head(decoder(x))``: a plain ``nn.Linear`` head (tied embeddings and a bias are fine), no logit soft-capping
or scaling (Gemma 2, Cohere, Granite), no adapter on the head. Known departures are refused by name; anything
else is caught by a probe at first use that compares both paths on a few tokens. A refused model is scored
on the plain path and :meth:`CompletionScorer.describe` says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from groupwise.model.chunked_logprobs import head_logprobs
from groupwise.model.loading import pretrained
from groupwise.model.logprobs import (
    completion_logprobs,
    logprob_temperature,
    position_ids_from_mask,
    right_padded_ids,
)
from groupwise.model.lora import is_adapted
from groupwise.model.shared_prompts import (
    HeadInputs,
    PromptSharing,
    fed_width,
    shared_prompt_hidden,
    sharing_refusal,
)

# Max |chunked − forward| logit difference on the probe, relative to the logits' scale.
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
_PROBE_TOLERANCE_LOW_PRECISION = 3e-2
# Config attributes of model families whose forward changes the logits after the head (value = "no change").
_LOGIT_TRANSFORMS = {"final_logit_softcapping": None, "logit_softcapping": None, "logit_scale": 1.0,
                     "logits_scaling": 1.0}


@dataclass
class ScoredRows:
    """One micro-batch scored: ``[R, Tc]`` tensors (masked entries 0) and what its forward pass cost."""

    logprobs: Tensor
    entropy: Tensor | None
    mask: Tensor
    padded_tokens: int  # positions fed through the model (rows × width)
    real_tokens: int  # of which prompt or completion tokens


def unwrap_adapter(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM inside a peft wrapper (its modules carry the adapters), or ``model`` itself."""
    return model.get_base_model() if is_adapted(model) else model


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear]:
    """The decoder submodule (final hidden states) and the plain Linear LM head of a model the chunked path
    scores; :func:`chunked_path_refusal` says why a model has none."""
    base = pretrained(unwrap_adapter(model))
    decoder, head = getattr(base, base.base_model_prefix, None), base.get_output_embeddings()
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{type(base).__name__} has no decoder submodule and Linear head for the chunked path")
    return decoder, head


def chunked_path_refusal(model: torch.nn.Module) -> str | None:
    """Why the chunked path cannot score ``model`` exactly (a known departure), or None."""
    base = unwrap_adapter(model)
    if not isinstance(base, PreTrainedModel):
        return f"{type(base).__name__} is not a transformers model (no decoder submodule and LM head to split)"
    prefix = base.base_model_prefix
    decoder = getattr(base, prefix, None) if prefix else None
    if not isinstance(decoder, torch.nn.Module) or decoder is base:
        return f"{type(base).__name__} has no decoder submodule to take final hidden states from"
    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return f"the output head is a {type(head).__name__}, not a plain Linear (an adapter on the LM head?)"
    config = getattr(base, "config", None)
    for key, neutral in _LOGIT_TRANSFORMS.items():
        value = getattr(config, key, neutral)
        if value is not None and value != neutral:
            return f"the model transforms its logits after the head ({key}={value})"
    return None


class CompletionScorer:
    """Scores completions on the chunked path when the model allows it, else the plain path (module docstring).

    ``temperature`` is the sampling temperature (greedy scores at 1, as the engine records); ``chunk_tokens``
    the positions per LM-head chunk (None = plain path); ``compute_dtype`` runs the forward under autocast
    (CUDA mixed precision), None = the weights' dtype; ``share_prompts`` lets the chunked path run each distinct
    prompt once for the rows that share it.
    """

    def __init__(
        self, temperature: float, chunk_tokens: int | None, compute_dtype: torch.dtype | None = None,
        share_prompts: bool = True,
    ):  # fmt: skip
        if chunk_tokens is not None and chunk_tokens < 1:
            raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1 (or None for the plain path)")
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens
        self.compute_dtype = compute_dtype
        self.share_prompts = share_prompts
        self._refusals: dict[int, str | None] = {}  # id(model) -> why not chunked (None = chunked)
        self._sharing_refusals: dict[int, str | None] = {}  # id(model) -> why prompts are not shared

    def describe(self, model: torch.nn.Module) -> str:
        """Which path scores ``model`` and, for the plain path, why."""
        if self.chunk_tokens is None:
            return "plain: full [rows, T, V] logits (optimizer.logprob_chunk_tokens is null)"
        refusal = self._refusal(model)
        if refusal is not None:
            return f"plain: full [rows, T, V] logits ({refusal})"
        chunked = f"chunked: {self.chunk_tokens} positions per LM-head chunk, padding dropped"
        if not self.share_prompts:
            return f"{chunked}; every row runs its own prompt (optimizer.share_prompts is off)"
        sharing = self._sharing_refusal(model)
        if sharing is not None:
            return f"{chunked}; every row runs its own prompt ({sharing})"
        return f"{chunked}; one pass per distinct prompt"

    def shares_prompts(self, model: torch.nn.Module) -> bool:
        """Whether rows of one prompt are scored against one pass over it (where that feeds fewer positions)."""
        if not self.share_prompts or self.chunk_tokens is None or self._refusal(model) is not None:
            return False
        return self._sharing_refusal(model) is None

    def score(
        self,
        model: torch.nn.Module,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        with_entropy: bool = False,
    ) -> ScoredRows:
        """Logprobs (and entropies) ``[R, Tc]`` of each completion given its prompt; gradient when under grad."""
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions; one prompt per row")
        if self.chunk_tokens is None or self._refusal(model) is not None:
            with self._autocast(model):
                logprobs, entropy, mask = completion_logprobs(
                    model, prompt_ids, completion_ids, self.temperature, with_entropy
                )
            width = max(len(p) for p in prompt_ids) + mask.shape[1]
            real = sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True))
            return ScoredRows(logprobs, entropy, mask, len(prompt_ids) * width, real)
        return self._chunked(model, prompt_ids, completion_ids, with_entropy, self.chunk_tokens)

    def _chunked(
        self,
        model: torch.nn.Module,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        with_entropy: bool,
        chunk_tokens: int,
    ) -> ScoredRows:
        decoder, head = decoder_and_head(model)
        sharing = PromptSharing.of(prompt_ids)
        share = sharing.pays(completion_ids) and self.shares_prompts(model)
        with self._autocast(model):
            if share:
                rows = shared_prompt_hidden(decoder, sharing, completion_ids, head.weight.device)
            else:
                rows = one_pass_hidden(decoder, prompt_ids, completion_ids, head.weight.device)
        logprobs, entropy = head_logprobs(
            rows.hidden, head.weight, rows.targets, logprob_temperature(self.temperature), chunk_tokens,
            bias=head.bias, compute_dtype=self.compute_dtype,
        )  # fmt: skip
        mask = rows.mask
        out_logprobs = logprobs.new_zeros(mask.shape).masked_scatter(mask, logprobs)
        out_entropy = entropy.new_zeros(mask.shape).masked_scatter(mask, entropy) if with_entropy else None
        return ScoredRows(out_logprobs, out_entropy, mask, rows.padded, rows.real)

    @contextlib.contextmanager
    def _autocast(self, model: torch.nn.Module) -> Iterator[None]:
        if self.compute_dtype is None:
            yield
            return
        device = next(model.parameters()).device
        with torch.autocast(device_type=device.type, dtype=self.compute_dtype):
            yield

    def _refusal(self, model: torch.nn.Module) -> str | None:
        key = id(model)
        if key not in self._refusals:
            self._refusals[key] = chunked_path_refusal(model) or self._probe(model)
        return self._refusals[key]

    def _sharing_refusal(self, model: torch.nn.Module) -> str | None:
        base = pretrained(unwrap_adapter(model))
        known = sharing_refusal(base)
        if known is not None:
            return known  # not cached: gradient checkpointing can be switched on after the first call
        key = id(model)
        if key not in self._sharing_refusals:
            self._sharing_refusals[key] = self._probe_sharing(model)
        return self._sharing_refusals[key]

    def _probe_sharing(self, model: torch.nn.Module) -> str | None:
        """Score a few rows with and without the shared prompt pass; a reason when their hidden states differ."""
        decoder, head = decoder_and_head(model)
        vocab = head.weight.shape[0]
        prompts = [[t % vocab for t in p] for p in ([1, 2, 3], [1, 2, 3], [4, 5])]
        completions = [[t % vocab for t in c] for c in ([6], [7, 8, 9], [10, 11])]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                shared = shared_prompt_hidden(decoder, PromptSharing.of(prompts), completions, head.weight.device)
                plain = one_pass_hidden(decoder, prompts, completions, head.weight.device)
        except (AttributeError, TypeError, ValueError, RuntimeError) as exc:  # a cache or decoder of another shape
            return f"the prompt pass's cache could not be reused ({type(exc).__name__}: {exc})"
        finally:
            model.train(was_training)
        difference = float((shared.hidden.float() - plain.hidden.float()).abs().max())
        scale = max(1.0, float(plain.hidden.abs().max()))
        tolerance = _PROBE_TOLERANCE.get(head.weight.dtype, _PROBE_TOLERANCE_LOW_PRECISION)
        if difference > tolerance * scale:
            return f"the shared prompt pass's hidden states differ from one pass's by {difference:.3g}"
        return None

    def _probe(self, model: torch.nn.Module) -> str | None:
        """Compare ``head(decoder(x))`` with the model's own logits on a few tokens; a reason when they differ."""
        decoder, head = decoder_and_head(model)
        ids = (torch.arange(4, device=head.weight.device) % head.weight.shape[0])[None]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                expected = model(input_ids=ids, use_cache=False).logits.float()
                got = head(decoder(input_ids=ids, use_cache=False).last_hidden_state).float()
        finally:
            model.train(was_training)
        if got.shape != expected.shape:
            return f"probe logits have shape {tuple(got.shape)}, the model's forward {tuple(expected.shape)}"
        difference = float((got - expected).abs().max())
        scale = max(1.0, float(expected.abs().max()))
        tolerance = _PROBE_TOLERANCE.get(head.weight.dtype, _PROBE_TOLERANCE_LOW_PRECISION)
        if difference > tolerance * scale:
            return f"probe logits differ from the model's forward by {difference:.3g} (scale {scale:.3g})"
        return None


def right_padded_rows(
    prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``prompt ++ completion`` per row, right-padded: ids and attention mask ``[R, L]``, ``scored`` ``[R, L]``
    (True at the positions whose next token is a completion token) and the completion mask ``[R, Tc]``.

    Padding positions hold id 0 and are masked; the masks are positional (a sampled pad id is a real token).
    """
    for row, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt of row {row} is empty; the first completion token needs a prompt token before it")
    lengths = [(len(p), len(c)) for p, c in zip(prompt_ids, completion_ids, strict=True)]
    width = max(p + c for p, c in lengths)
    completion_width = max(c for _, c in lengths)
    rows = [[*prompt, *completion] for prompt, completion in zip(prompt_ids, completion_ids, strict=True)]
    input_ids, attention_mask = right_padded_ids(rows, width, device)
    scored = torch.zeros((len(lengths), width), dtype=torch.bool)
    mask = torch.zeros((len(lengths), completion_width), dtype=torch.bool)
    for row, (p, c) in enumerate(lengths):
        scored[row, p - 1 : p + c - 1] = True
        mask[row, :c] = True
    return input_ids, attention_mask, scored.to(device), mask.to(device)


def one_pass_hidden(
    decoder: torch.nn.Module, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
    device: torch.device,
) -> HeadInputs:  # fmt: skip
    """One decoder pass over right-padded ``prompt ++ completion`` rows: the hidden states at the positions that
    predict a completion token (position t predicts token t + 1), in the completion mask's order."""
    input_ids, attention_mask, scored, mask = right_padded_rows(prompt_ids, completion_ids, device)
    # The last column predicts no token (``scored`` is False there), so it is not fed.
    fed = fed_width(input_ids.shape[1])
    fed_ids, fed_mask = input_ids[:, :fed], attention_mask[:, :fed]
    hidden = decoder(
        input_ids=fed_ids, attention_mask=fed_mask, position_ids=position_ids_from_mask(fed_mask), use_cache=False
    ).last_hidden_state
    targets = input_ids[:, 1:][scored[:, :-1]]
    return HeadInputs(hidden[scored[:, :fed]], targets, mask, fed_ids.numel(), int(fed_mask.sum()))
