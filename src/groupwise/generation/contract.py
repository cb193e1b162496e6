"""The Generator contract, checked on what a backend answers.

``generate(requests, sampling)`` returns, per request, ``num_samples`` :class:`~groupwise.types.Completion` objects
(the count is :func:`groupwise.generation.factory.checked_outputs`'s check), each with finite logprobs, non-negative
integer token ids below the model's vocabulary, weight versions no newer than the generator's ``version`` and a
finish reason of ``stop`` or ``length``. A plug-in backend that breaks it would otherwise fail far from the cause
(an ``AttributeError`` on a string; NaN logprobs or impossible tokens that filter every group until the run ends
as ``DynamicSamplingExhausted``). Here it is named: ``generation.backend``, the generator, the request and
completion, and what was wrong.

Every answer of a plug-in's batch ``generate`` is checked (single-turn rollouts, evaluation, episode turns; the
shipped backends' answers are groupwise's own and pass unchecked). A plug-in's first answer is also checked when
it is built, on one probe request, where the model's vocabulary is known (:func:`probe_problem`), so a backend that
always breaks the contract is a config error before training starts. Streams are not checked.
"""

from __future__ import annotations

import math
import typing
from typing import TYPE_CHECKING

from groupwise.types import Completion, FinishReason, GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from groupwise.generation.base import Generator
    from groupwise.generation.factory import GeneratorSpec

FINISH_REASONS = typing.get_args(FinishReason)


class GeneratorContractError(RuntimeError):
    """A generator answered something the Generator contract does not allow (the message says what)."""


def completion_problem(completion: object, version: int, vocab: int | None = None) -> str | None:
    """What is wrong with one answered ``completion`` of a generator at ``version`` (``vocab``: the number of
    token ids, when known), or None."""
    if not isinstance(completion, Completion):
        return f"a {type(completion).__name__}, not a Completion (groupwise.types.Completion)"
    if completion.finish_reason not in FINISH_REASONS:
        return f"the finish reason {completion.finish_reason!r}, not one of {', '.join(FINISH_REASONS)}"
    logprobs = completion.logprobs
    if not set(map(type, logprobs)) <= {float, int} or not all(map(math.isfinite, logprobs)):  # at C speed
        bad = next(lp for lp in logprobs if type(lp) not in (float, int) or not math.isfinite(lp))
        return f"the logprob {bad!r}; every sampled token's logprob must be a finite Python float"
    ids = completion.token_ids
    if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or (vocab is not None and max(ids) >= vocab)):
        bad = next(t for t in ids if type(t) is not int or t < 0 or (vocab is not None and t >= vocab))
        limit = f" (the model has {vocab} token ids)" if vocab is not None else ""
        return f"the token id {bad!r}, which is not a token of the model{limit}"
    versions = (*completion.token_versions, completion.weight_version)
    if set(map(type, versions)) != {int} or min(versions) < 0 or max(versions) > version:
        bad = next(v for v in versions if type(v) is not int or not 0 <= v <= version)
        return (f"the weight version {bad!r} while the generator holds version {version}; a token's version is "
                "the version of the weights that sampled it")  # fmt: skip
    return None


def is_plug_in(generator: Generator) -> bool:
    """Whether ``generator`` is a plug-in's (its class defined outside groupwise): the shipped backends' answers are
    groupwise's own, and a NaN logprob there means the model diverged, which the learner reports
    (``NonFiniteTrainingError``), not a broken backend."""
    return not type(generator).__module__.startswith("groupwise.")


def check_completions(generator: Generator, outputs: list[list[Completion]], vocab: int | None = None) -> None:
    """Raise :class:`GeneratorContractError` naming the first completion of ``outputs`` (one list per request,
    counts already checked) that breaks the contract; a shipped backend's answers pass unchecked
    (:func:`is_plug_in`)."""
    if not is_plug_in(generator):
        return
    version = generator.version
    for request, per_request in enumerate(outputs):
        for index, completion in enumerate(per_request):
            problem = completion_problem(completion, version, vocab)
            if problem is not None:
                raise GeneratorContractError(
                    f"the generation.backend generator {type(generator).__name__} returned {problem} (request "
                    f"{request}, completion {index})"
                )


def probe_problem(generator: Generator, spec: GeneratorSpec) -> str | None:
    """What breaks the contract in ``generator``'s answer to one small probe request (two samples of a few
    tokens, the run's sampling settings), checked against the model's vocabulary; None when nothing does."""
    from groupwise.generation.factory import checked_outputs

    prompt = tuple(int(i) for i in spec.tokenizer("Hello", add_special_tokens=False)["input_ids"])
    request = GenerationRequest(prompt or (int(spec.eos_token_ids[0]),), 2, seed=0)
    gen = spec.generation
    sampling = SamplingParams(min(4, gen.max_new_tokens), gen.temperature, gen.top_p, gen.top_k, tuple(gen.stop))
    try:
        outputs = checked_outputs(generator, [request], generator.generate([request], sampling))
        check_completions(generator, outputs, vocabulary_size(spec))
    except GeneratorContractError as exc:
        return str(exc)
    except Exception as exc:  # the plug-in's own failure on a plain request
        return f"generate() raised {type(exc).__name__}: {exc} on a probe request"
    return None


def vocabulary_size(spec: GeneratorSpec) -> int:
    """The number of token ids the model has: its embedding's (padded vocabularies included), at least the
    tokenizer's."""
    from transformers import PreTrainedModel

    size = len(spec.tokenizer)
    if isinstance(spec.model, PreTrainedModel):
        size = max(size, int(spec.model.config.vocab_size))
    return size

