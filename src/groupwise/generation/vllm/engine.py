"""The vLLM backend's synchronous generator: a :class:`~groupwise.generation.base.Generator` over ``vllm.LLM``.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, :mod:`groupwise.generation.vllm.setup`)
from a Hugging Face folder of the policy (:func:`~groupwise.generation.vllm.setup.write_model_folder`); new weights
are reloaded into it in place (:func:`~groupwise.generation.vllm.weights.reload_in_process`) and every completion is
stamped with the version they were loaded under. What is sampled and recorded, and how it differs from the
built-in engine, is in :mod:`groupwise.generation.vllm.rows`. For continuous batching and partial rollouts use the
stream (:mod:`groupwise.generation.vllm.stream`), which runs ``AsyncLLM``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from groupwise.generation.request_limits import generate_by_limit, has_own_limits
from groupwise.generation.sampling import check_sampling_params
from groupwise.generation.vllm.rows import (
    RowOutput,
    assemble,
    check_source,
    expand_rows,
    package,
    package_finished,
    recorded_logprobs,
    sampling_params_for,
)
from groupwise.generation.vllm.setup import VllmSettings, engine_kwargs, import_vllm, process_state_kept
from groupwise.generation.vllm.weights import check_names, reload_in_process
from groupwise.types import Completion, GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# vLLM keeps its parallel state (process groups) per process: a second in-process engine would share it, and closing
# either tears it down under the other. One at a time (the stream's engine runs in a process of its own).
_open_engines: list[VllmGenerator] = []


class VllmGenerator:
    """``generate`` / ``load_weights`` / ``version`` over an in-process ``vllm.LLM``.

    ``tokenizer`` writes the completions' text (the policy's own, as for the built-in engine); ``eos_token_ids``
    end a completion (:func:`groupwise.model.eos_token_ids`); ``weight_names`` are the policy's state-dict keys,
    which every ``load_weights`` must match. Building takes seconds to minutes (vLLM's import, its engine start, and
    a one-off compile of its logprob-rank kernel at the first call).
    """

    def __init__(
        self, settings: VllmSettings, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Sequence[int],
        weight_names: Sequence[str], version: int = 0,
    ) -> None:  # fmt: skip
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty; pass groupwise.model.eos_token_ids(tokenizer, model)")
        self.settings = settings
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(token) for token in eos_token_ids)
        self._weight_names = set(weight_names)
        self._version = int(version)
        if _open_engines:
            raise RuntimeError(
                "a vLLM engine already runs in this process (vLLM's process groups are per process); shutdown() it "
                "before building another, or use VllmStream, whose engine runs in a process of its own"
            )
        self._vllm = import_vllm(settings)
        with process_state_kept():
            self.llm = self._vllm.LLM(**engine_kwargs(settings))
        # vLLM's CPU kernels check that the OpenMP team size they run with is the one their metadata (and the
        # weights' repacking at a reload) was made with; torch's thread count is per calling thread, and the
        # runtimes call from several threads (the learner's set to its own count): every call runs at this one.
        self._threads = torch.get_num_threads()
        _open_engines.append(self)

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``request.num_samples`` completions per request, in request order (see ``Generator``)."""
        check_sampling_params(sampling)
        check_source(self.settings.logprobs, sampling)
        if has_own_limits(requests):
            return generate_by_limit(requests, sampling, self.generate)
        rows, finished = expand_rows(requests, sampling.max_new_tokens)
        params = [
            sampling_params_for(self._vllm, row, sampling, self.eos_token_ids, self.settings.logprobs) for row in rows
        ]
        prompts = [{"prompt_token_ids": list(row.prompt)} for row in rows]
        with self._engine_threads():
            outputs = self.llm.generate(prompts, params, use_tqdm=False) if rows else []
        generated = [self._row_output(output, sampling) for output in outputs]
        completions = package(rows, generated, self.eos_token_ids, self.tokenizer)
        completions += package_finished(finished, self.eos_token_ids, self.tokenizer)
        return assemble(requests, [*rows, *finished], completions)

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None:
        """Reload a full state dict (same names as the policy, LoRA merged) into the engine and set the version."""
        if version < self._version:
            raise ValueError(
                f"load_weights(version={version}) would move the engine back from version {self._version}; "
                "weight versions only increase — pass the learner's current version"
            )
        check_names(state, self._weight_names)
        with self._engine_threads():
            reload_in_process(self.llm, state)
        self._version = int(version)

    def shutdown(self) -> None:
        """Shut the engine core down (its KV cache, workers and process groups); the generator is unusable
        afterwards, and another in-process engine may be built."""
        if self in _open_engines:
            self.llm.llm_engine.engine_core.shutdown()
            _open_engines.remove(self)

    @contextlib.contextmanager
    def _engine_threads(self) -> Iterator[None]:
        """The calling thread at the engine's thread count for the call, then back at its own."""
        threads = torch.get_num_threads()
        torch.set_num_threads(self._threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def _row_output(self, output: Any, sampling: SamplingParams) -> RowOutput:  # Any: a vllm.RequestOutput
        completion = output.outputs[0]
        tokens = [int(token) for token in completion.token_ids]
        logprobs = recorded_logprobs(tokens, completion.logprobs, self.settings.logprobs, sampling.temperature)
        return RowOutput(tokens, logprobs, [self._version] * len(tokens), str(completion.finish_reason))
