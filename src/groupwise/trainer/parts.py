"""The parts a :class:`~groupwise.trainer.session.Session` holds, as the protocols the session and its loops use.

Two implementations satisfy each: the in-process one (``groupwise.model.loading.Policy``, the engine,
``groupwise.trainer.learner.Learner``, ``groupwise.trainer.rollout.RolloutWorker``) and the Ray one
(``groupwise.trainer.remote_policy.RemotePolicy``, ``RemoteEngine``, ``RayLearner``, ``RaySyncRollouts``), whose
weights and optimizer live in actors. The engine is a :class:`groupwise.generation.base.Generator` (on Ray a
``RemoteEngine``, which only generates: ``RaySession.publish_weights`` sends the weights to the workers itself).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from groupwise.batch import RowBatch
from groupwise.data.loader import LoadedPrompt
from groupwise.model.weights import ModelWeights
from groupwise.types import Group, Prompt, SampleOutcome, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from groupwise.generation.base import Generator


class TrainedPolicy(Protocol):
    """The policy being trained: its weights, its tokenizer, and ``save`` as a Hugging Face directory."""

    @property
    def model(self) -> ModelWeights: ...

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    def save(self, directory: str | Path) -> Path: ...


class StepLearner(Protocol):
    """The learner: one RL step as chunks of rows and one optimizer step; weight version; optimizer state."""

    version: int

    def train_chunk(self, rows: RowBatch) -> None: ...

    def finish_step(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class GroupRollouts(Protocol):
    """Whole scored groups from loaded prompts, and what evaluation needs to encode, sample and score."""

    @property
    def sampling(self) -> SamplingParams: ...

    @property
    def reward_fn(self) -> Callable[..., float]: ...

    @property
    def reward_kwargs(self) -> Mapping[str, Any]: ...

    def encode(self, prompt: Prompt) -> tuple[int, ...]: ...

    def sample_outcomes(
        self, generator: Generator, prompts: Sequence[Prompt], sampling: SamplingParams, k: int, seeds: Sequence[int]
    ) -> list[list[SampleOutcome]]: ...

    def generate_groups(
        self, items: Sequence[LoadedPrompt], group_ids: Sequence[int], attempts: Sequence[int] | None = None,
        start_versions: Sequence[int] | None = None,
    ) -> list[Group]: ...
