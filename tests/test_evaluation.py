"""Held-out evaluation's metrics from the samples it scores.

Invariants pinned:
- ``eval/accuracy`` is the share of held-out prompts whose greedy sample is correct (raw reward ≥ 1.0), and the
  greedy samples are drawn at temperature 0;
- with episodes, ``eval/solved_turns_mean`` is the mean model turns of the correct greedy episodes only; it is
  absent when none was solved, and absent from a single-turn run;
- ``eval/pass_at_k`` counts a prompt once when any of its ``eval.pass_k`` samples at the training temperature is
  correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from test_episode_runs import episode_config

from groupwise.trainer.evaluation import evaluate_policy
from groupwise.types import Prompt, SampleOutcome, SamplingParams


@dataclass
class ScriptedRollouts:
    """A test fake: answers every evaluation call with the outcomes scripted per prompt uid, ``k`` times over."""

    outcomes: dict[str, list[SampleOutcome]]
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.7, max_new_tokens=4))
    calls: list[tuple[float, int]] = field(default_factory=list)

    def sample_outcomes(self, generator, prompts, sampling, k, seeds):
        self.calls.append((sampling.temperature, k))
        return [self.outcomes[p.uid][:k] for p in prompts]


def prompts(n: int) -> list[Prompt]:
    return [Prompt(uid=f"p{i}", answer="1", text="guess") for i in range(n)]


def test_solved_turns_average_only_the_solved_episodes(tmp_path):
    cfg = episode_config(tmp_path, eval={"num_prompts": None, "pass_k": 2})
    rollouts = ScriptedRollouts({
        "p0": [SampleOutcome(1.2, 2), SampleOutcome(0.0, 3)],
        "p1": [SampleOutcome(0.0, 3), SampleOutcome(1.0, 3)],  # unsolved greedily: its 3 turns are not counted
        "p2": [SampleOutcome(1.0, 3), SampleOutcome(1.0, 1)],
        "p3": [SampleOutcome(0.5, 1), SampleOutcome(0.0, 3)],
    })  # fmt: skip
    metrics = evaluate_policy(None, rollouts, prompts(4), cfg)
    assert metrics["eval/accuracy"] == 2 / 4
    assert metrics["eval/solved_turns_mean"] == (2 + 3) / 2
    assert metrics["eval/pass_at_k"] == 3 / 4
    assert rollouts.calls == [(0.0, 1), (0.7, 2)]


def test_no_solved_turns_without_a_solved_episode_or_without_episodes(tmp_path):
    unsolved = ScriptedRollouts({f"p{i}": [SampleOutcome(0.0, 3)] for i in range(4)})
    metrics = evaluate_policy(None, unsolved, prompts(4), episode_config(tmp_path))
    assert metrics == {"eval/accuracy": 0.0}
    with_episodes = episode_config(tmp_path)
    single_turn = with_episodes.model_copy(update={"episode": type(with_episodes.episode)()})
    solved = ScriptedRollouts({f"p{i}": [SampleOutcome(1.0)] for i in range(4)})
    assert evaluate_policy(None, solved, prompts(4), single_turn) == {"eval/accuracy": 1.0}
