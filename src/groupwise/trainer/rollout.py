"""Generate and score whole prompt groups: the one place where completions meet rewards.

Used by the sync loop and by the embedded async runtime alike. Each request's seed comes from
(run seed, prompt uid, epoch, attempt), so a prompt samples the same completions whatever batch it lands in.
The filter downstream sees ``raw_rewards``; advantages use ``rewards`` (scaled, then overlong-shaped).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.algo.reward_shaping import overlong_penalty, scale_rewards
from groupwise.data.loader import LoadedPrompt
from groupwise.data.scoring import RewardError, score_completions
from groupwise.generation.base import Generator
from groupwise.model.encode import encode_prompt
from groupwise.seeding import request_seed
from groupwise.types import Completion, GenerationCost, GenerationRequest, Group, Prompt, SamplingParams, attach_cost

if TYPE_CHECKING:
    from groupwise.config import GrpoSection


@dataclass(frozen=True)
class RewardPipeline:
    """Raw reward → scaled (optional) → overlong-shaped (optional). Settings mirror ``grpo.reward_scaling`` and
    ``grpo.overlong_shaping``; ``None`` disables a stage."""

    scaling: Mapping[str, float] | None = None
    overlong: Mapping[str, float] | None = None

    @classmethod
    def from_config(cls, grpo: GrpoSection) -> RewardPipeline:
        scaling = grpo.reward_scaling.model_dump(exclude={"enabled"}) if grpo.reward_scaling.enabled else None
        overlong = grpo.overlong_shaping.model_dump(exclude={"enabled"}) if grpo.overlong_shaping.enabled else None
        return cls(scaling=scaling, overlong=overlong)

    def apply(self, raw: Sequence[float], completions: Sequence[Completion]) -> list[float]:
        values = list(raw)
        if self.scaling is not None:
            values = scale_rewards(values, **self.scaling)
        if self.overlong is not None:
            values = [
                v + overlong_penalty(c.num_tokens, **self.overlong) for v, c in zip(values, completions, strict=True)
            ]
        return values


@dataclass
class RolloutWorker:
    """Turns loaded prompts into scored :class:`~groupwise.types.Group` objects."""

    generator: Generator
    tokenizer: Any
    reward_fn: Callable[..., float]
    sampling: SamplingParams
    group_size: int
    run_seed: int
    rewards: RewardPipeline = field(default_factory=RewardPipeline)
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    max_groups_per_call: int = 64
    _encoded: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def encode(self, prompt: Prompt) -> tuple[int, ...]:
        ids = self._encoded.get(prompt.uid)
        if ids is None:
            ids = encode_prompt(self.tokenizer, prompt, self.system_prompt)
            self._encoded[prompt.uid] = ids
        return ids

    def seed_for(self, item: LoadedPrompt, attempt: int) -> int:
        return request_seed(self.run_seed, f"{item.prompt.uid}@{item.epoch}", attempt)

    def generate_groups(
        self,
        items: Sequence[LoadedPrompt],
        group_ids: Sequence[int],
        attempts: Sequence[int] | None = None,
    ) -> list[Group]:
        """Sample G completions per prompt (``max_groups_per_call`` groups per engine call), score each group.

        ``attempts[i]`` numbers the attempts at ``items[i]`` (all 0 when omitted); it enters the seed so a
        retried prompt samples fresh completions. The first reward failure is raised (sync mode stops on it).
        """
        outcomes = self.generate_group_outcomes(items, group_ids, attempts)
        for outcome in outcomes:
            if isinstance(outcome, RewardError):
                raise outcome
        return outcomes  # type: ignore[return-value]

    def generate_group_outcomes(
        self,
        items: Sequence[LoadedPrompt],
        group_ids: Sequence[int],
        attempts: Sequence[int] | None = None,
    ) -> list[Group | RewardError]:
        """Like :meth:`generate_groups`, but each prompt's reward failure is returned in its group's place:
        prompts that share an engine call never share a reward failure (the async runtimes fail only the
        prompt whose completion raised)."""
        attempts = list(attempts) if attempts is not None else [0] * len(items)
        if not len(items) == len(group_ids) == len(attempts):
            raise ValueError(f"{len(items)} prompts, {len(group_ids)} group ids and {len(attempts)} attempts")
        start_version = self.generator.version
        requests = [
            GenerationRequest(self.encode(item.prompt), self.group_size, self.seed_for(item, attempt))
            for item, attempt in zip(items, attempts, strict=True)
        ]
        outputs: list[list[Completion]] = []
        for start in range(0, len(requests), self.max_groups_per_call):
            outputs += self.generator.generate(requests[start : start + self.max_groups_per_call], self.sampling)
        end_version = self.generator.version
        groups: list[Group | RewardError] = []
        for item, group_id, attempt, request, completions in zip(
            items, group_ids, attempts, requests, outputs, strict=True
        ):
            try:
                raw = score_completions(self.reward_fn, item.prompt, completions, self.reward_kwargs)
            except RewardError as error:  # its completions were generated: the runtime charges them to the attempt
                groups.append(attach_cost(error, GenerationCost(sum(c.num_tokens for c in completions))))
                continue
            groups.append(
                Group(
                    group_id=group_id,
                    prompt=item.prompt,
                    prompt_token_ids=request.prompt_token_ids,
                    completions=list(completions),
                    raw_rewards=list(raw),
                    rewards=self.rewards.apply(raw, completions),
                    start_version=start_version,
                    end_version=end_version,
                    epoch=item.epoch,
                    attempt=attempt,
                )
            )
        return groups
