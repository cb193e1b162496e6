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
from groupwise.data.scoring import RewardError, score_completions
from groupwise.episodes.group import EpisodeSettings, episode_opening
from groupwise.episodes.lockstep import run_episode_groups
from groupwise.generation.base import Generator
from groupwise.generation.factory import checked_outputs
from groupwise.harness.runner import HarnessError, HarnessRunner, SessionResult
from groupwise.model.encode import encode_prompt
from groupwise.seeding import request_seed
from groupwise.trainer.harness_groups import harness_completions
from groupwise.types import (
    Completion,
    GenerationCost,
    GenerationRequest,
    Group,
    LoaderItem,
    Prompt,
    RowPrefix,
    SampleOutcome,
    SamplingParams,
    attach_cost,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from groupwise.config import GrpoSection, OverlongSection, RewardScalingSection
    from groupwise.episodes.episode import Episode


@dataclass(frozen=True)
class RewardPipeline:
    """Raw reward → scaled (optional) → overlong-shaped (optional): the ``grpo.reward_scaling`` and
    ``grpo.overlong_shaping`` sections themselves; ``None`` disables a stage."""

    scaling: RewardScalingSection | None = None
    overlong: OverlongSection | None = None

    @classmethod
    def from_config(cls, grpo: GrpoSection) -> RewardPipeline:
        scaling = grpo.reward_scaling if grpo.reward_scaling.enabled else None
        overlong = grpo.overlong_shaping if grpo.overlong_shaping.enabled else None
        return cls(scaling=scaling, overlong=overlong)

    def apply(self, raw: Sequence[float], completions: Sequence[Completion]) -> list[float]:
        values = list(raw)
        if (s := self.scaling) is not None:
            values = scale_rewards(values, s.source_min, s.source_max, s.target_min, s.target_max)
        if (o := self.overlong) is not None:
            length, buffer, penalty = o.max_response_length, o.overlong_buffer_length, o.overlong_buffer_penalty
            assert length is not None and buffer is not None and penalty is not None, "the config rules require them"
            values = [v + overlong_penalty(c.num_tokens, length, buffer, penalty)
                      for v, c in zip(values, completions, strict=True)]  # fmt: skip
        return values


@dataclass
class RolloutWorker:
    """Turns loaded prompts into scored :class:`~groupwise.types.Group` objects.

    With ``episodes`` set each of a group's G completions is a multi-turn episode against the environment
    (:mod:`groupwise.episodes`), its reward the environment's; with ``harness`` set each is a session of the user's
    own agent against the endpoint (:mod:`groupwise.harness`); otherwise one sampled completion scored by
    ``reward_fn``."""

    generator: Generator
    tokenizer: PreTrainedTokenizerBase
    reward_fn: Callable[..., float]
    sampling: SamplingParams
    group_size: int
    run_seed: int
    rewards: RewardPipeline = field(default_factory=RewardPipeline)
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    max_groups_per_call: int = 64
    episodes: EpisodeSettings | None = None
    harness: HarnessRunner | None = None
    _encoded: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def encode(self, prompt: Prompt) -> tuple[int, ...]:
        ids = self._encoded.get(prompt.uid)
        if ids is None:
            if self.episodes is not None:  # what an episode's first turn continues (sample 0's)
                ids = episode_opening(self.episodes, prompt)
            elif self.harness is not None:  # what a harness that sends the prompt's messages as they are opens with
                ids = tuple(self.harness.settings.renderer.opening(_messages(prompt), ()))
            else:
                ids = encode_prompt(self.tokenizer, prompt, self.system_prompt)
            self._encoded[prompt.uid] = ids
        return ids

    def close(self) -> None:
        """Stop the harness endpoint, when this worker serves one."""
        if self.harness is not None:
            self.harness.close()

    def seed_for(self, item: LoaderItem, attempt: int) -> int:
        return request_seed(self.run_seed, f"{item.prompt.uid}@{item.epoch}", attempt)

    def generate_groups(
        self,
        items: Sequence[LoaderItem],
        group_ids: Sequence[int],
        attempts: Sequence[int] | None = None,
        start_versions: Sequence[int] | None = None,
    ) -> list[Group]:
        """Sample G completions per prompt (``max_groups_per_call`` groups per engine call), score each group.

        ``attempts[i]`` numbers the attempts at ``items[i]`` (all 0 when omitted); it enters the seed so a
        retried prompt samples fresh completions. ``start_versions[i]`` is the version the attempt was dispatched
        at (the generator's current one when omitted). The first reward failure is raised (sync mode stops on it).
        """
        outcomes = self.generate_group_outcomes(items, group_ids, attempts, start_versions)
        groups = []
        for outcome in outcomes:
            if isinstance(outcome, RewardError):
                raise outcome
            groups.append(outcome)
        return groups

    def generate_group_outcomes(
        self,
        items: Sequence[LoaderItem],
        group_ids: Sequence[int],
        attempts: Sequence[int] | None = None,
        start_versions: Sequence[int] | None = None,
    ) -> list[Group | RewardError]:
        """Like :meth:`generate_groups`, but each prompt's reward failure is returned in its group's place:
        prompts that share an engine call never share a reward failure (the async runtimes fail only the
        prompt whose completion raised)."""
        attempts = list(attempts) if attempts is not None else [0] * len(items)
        starts = list(start_versions) if start_versions is not None else [self.generator.version] * len(items)
        if not len(items) == len(group_ids) == len(attempts) == len(starts):
            raise ValueError(
                f"{len(items)} prompts, {len(group_ids)} group ids, {len(attempts)} attempts and {len(starts)} "
                "start versions"
            )
        if self.episodes is not None:
            return self._episode_outcomes(self.episodes, items, group_ids, attempts, starts)
        if self.harness is not None:
            return self._harness_outcomes(self.harness, items, group_ids, attempts, starts)
        requests = [self.request_for(item, attempt) for item, attempt in zip(items, attempts, strict=True)]
        outputs: list[list[Completion]] = []
        for start in range(0, len(requests), self.max_groups_per_call):
            chunk = requests[start : start + self.max_groups_per_call]
            outputs += checked_outputs(self.generator, chunk, self.generator.generate(chunk, self.sampling))
        end_version = self.generator.version
        return [
            self.score_group(item, group_id, attempt, request, completions, start_version, end_version)
            for item, group_id, attempt, request, completions, start_version in zip(
                items, group_ids, attempts, requests, outputs, starts, strict=True
            )
        ]

    def sample_outcomes(
        self, generator: Generator, prompts: Sequence[Prompt], sampling: SamplingParams, k: int, seeds: Sequence[int]
    ) -> list[list[SampleOutcome]]:
        """The raw rewards (and model turns) of ``k`` samples per prompt from ``generator`` (evaluation): single
        completions scored by ``reward_fn``, or whole episodes scored by their environment. A reward failure is
        raised."""
        if self.episodes is not None:
            results = run_episode_groups(generator, sampling, self.episodes, prompts, seeds, k)
            for result in results:
                if isinstance(result, RewardError):
                    raise result
            return [[SampleOutcome(sum(e.step_rewards), e.turns) for e in result]
                    for result in results if not isinstance(result, RewardError)]  # fmt: skip
        if self.harness is not None:
            sessions = self.harness.run_groups(generator, sampling, prompts, seeds, k)
            scored = [harness_completions(s, p, self.reward_fn, self.reward_kwargs, self._decode)
                      for s, p in zip(sessions, prompts, strict=True)]  # fmt: skip
            for outcome in scored:
                if isinstance(outcome, RewardError):
                    raise outcome
            return [[SampleOutcome(r, c.episode.turns if c.episode else 1) for c, r in zip(o[1], o[2], strict=True)]
                    for o in scored if not isinstance(o, RewardError)]  # fmt: skip
        requests = [GenerationRequest(self.encode(p), k, seed) for p, seed in zip(prompts, seeds, strict=True)]
        outputs = checked_outputs(generator, requests, generator.generate(requests, sampling))
        return [[SampleOutcome(r) for r in score_completions(self.reward_fn, prompt, completions, self.reward_kwargs)]
                for prompt, completions in zip(prompts, outputs, strict=True)]  # fmt: skip

    def _episode_outcomes(
        self, settings: EpisodeSettings, items: Sequence[LoaderItem], group_ids: Sequence[int],
        attempts: Sequence[int], starts: Sequence[int],
    ) -> list[Group | RewardError]:  # fmt: skip
        """Each prompt's G episodes as its group (or the environment failure of that prompt alone)."""
        seeds = [self.seed_for(item, attempt) for item, attempt in zip(items, attempts, strict=True)]
        results: list[list[Episode] | RewardError] = []
        for start in range(0, len(items), self.max_groups_per_call):
            chunk = slice(start, start + self.max_groups_per_call)
            prompts = [item.prompt for item in items[chunk]]
            results += run_episode_groups(self.generator, self.sampling, settings, prompts, seeds[chunk],
                                          self.group_size)  # fmt: skip
        end_version = self.generator.version
        return [
            self.episode_group(item, group_id, attempt, start_version, end_version, result)
            for item, group_id, attempt, start_version, result in zip(
                items, group_ids, attempts, starts, results, strict=True
            )
        ]

    def episode_group(
        self, item: LoaderItem, group_id: int, attempt: int, start_version: int, end_version: int,
        result: list[Episode] | RewardError,
    ) -> Group | RewardError:  # fmt: skip
        """One prompt's G finished episodes as its group (each episode one completion, its reward the
        environment's), or the environment failure of that prompt alone."""
        if isinstance(result, RewardError):
            return result
        shared = _shared_prefix([episode.prompt_ids for episode in result])
        completions = [e.completion(self._transcript(e, len(shared)), e.prompt_ids[len(shared):]) for e in result]
        raw = [c.episode.reward if c.episode is not None else 0.0 for c in completions]
        return Group(
            group_id=group_id, prompt=item.prompt, prompt_token_ids=shared, completions=completions,
            raw_rewards=raw, rewards=self.rewards.apply(raw, completions), start_version=start_version,
            end_version=end_version, epoch=item.epoch, attempt=attempt,
        )  # fmt: skip

    def _harness_outcomes(
        self, harness: HarnessRunner, items: Sequence[LoaderItem], group_ids: Sequence[int], attempts: Sequence[int],
        starts: Sequence[int],
    ) -> list[Group | RewardError]:  # fmt: skip
        """Each prompt's G harness sessions as its group (or the failure of that prompt alone)."""
        seeds = [self.seed_for(item, attempt) for item, attempt in zip(items, attempts, strict=True)]
        results: list[list[SessionResult] | HarnessError] = []
        for start in range(0, len(items), self.max_groups_per_call):
            chunk = slice(start, start + self.max_groups_per_call)
            results += harness.run_groups(self.generator, self.sampling, [item.prompt for item in items[chunk]],
                                          seeds[chunk], self.group_size)  # fmt: skip
        end_version = self.generator.version
        return [self.harness_group(item, group_id, attempt, start_version, end_version, result)
                for item, group_id, attempt, start_version, result in zip(
                    items, group_ids, attempts, starts, results, strict=True)]  # fmt: skip

    def harness_group(
        self, item: LoaderItem, group_id: int, attempt: int, start_version: int, end_version: int,
        result: list[SessionResult] | HarnessError,
    ) -> Group | RewardError:  # fmt: skip
        """One prompt's G finished sessions as its group (each session one completion, its branches rows of their
        own), or the failure of that prompt alone."""
        made = harness_completions(result, item.prompt, self.reward_fn, self.reward_kwargs, self._decode)
        if isinstance(made, RewardError):
            return made
        shared, completions, raw = made
        return Group(
            group_id=group_id, prompt=item.prompt, prompt_token_ids=shared, completions=completions, raw_rewards=raw,
            rewards=self.rewards.apply(raw, completions), start_version=start_version, end_version=end_version,
            epoch=item.epoch, attempt=attempt,
        )  # fmt: skip

    def _decode(self, ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(ids))
        assert isinstance(text, str), "one sequence decodes to one string"
        return text

    def _transcript(self, episode: Episode, shared: int) -> str:
        """The text of an episode's completion: its own opening tokens, every turn and every answer."""
        text = self.tokenizer.decode([*episode.prompt_ids[shared:], *episode.token_ids])
        assert isinstance(text, str), "one sequence decodes to one string"
        return text

    def request_for(
        self, item: LoaderItem, attempt: int, prefixes: tuple[RowPrefix | None, ...] = ()
    ) -> GenerationRequest:
        """The generation request of one attempt at ``item`` (G samples, the attempt's seed); ``prefixes`` continue
        samples an interrupted attempt had already generated."""
        return GenerationRequest(self.encode(item.prompt), self.group_size, self.seed_for(item, attempt), prefixes)

    def score_group(
        self, item: LoaderItem, group_id: int, attempt: int, request: GenerationRequest,
        completions: Sequence[Completion], start_version: int, end_version: int,
    ) -> Group | RewardError:  # fmt: skip
        """Score one prompt's completions into its group, or the reward failure that only this prompt gets."""
        try:
            raw = score_completions(self.reward_fn, item.prompt, completions, self.reward_kwargs)
        except RewardError as error:  # its completions were generated: the runtime charges them to the attempt
            return attach_cost(error, GenerationCost(sum(c.num_tokens for c in completions)))
        return Group(
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


def _messages(prompt: Prompt) -> list[dict[str, str]]:
    if prompt.messages is not None:
        return [dict(m) for m in prompt.messages]
    return [{"role": "user", "content": prompt.text or ""}]


def _shared_prefix(openings: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The longest prefix every episode's opening tokens share: the group's row prompt (what differs per episode
    goes into its completion as environment tokens)."""
    first = openings[0]
    length = len(first)
    for other in openings[1:]:
        length = next((i for i, (a, b) in enumerate(zip(first[:length], other, strict=False)) if a != b),
                      min(length, len(other)))  # fmt: skip
    return first[:length]
