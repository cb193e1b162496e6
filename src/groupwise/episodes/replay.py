"""Replaying recorded episodes: ``groupwise audit --replay-episodes``.

Each ``train_data`` row of an episode holds what the model said each turn (``episode.assistant``), what the
environment answered (``episode.observations``, as shown to the model: cut when it was truncated) and each turn's
reward. Replaying the model's turns into a fresh environment of the run's ``episode.environment`` must give back
the same answers and rewards, and their sum must be the row's raw reward — for a deterministic environment. A
mismatch says the environment is not deterministic in its inputs, or that the row does not hold what happened.
An environment that raises, hangs past the run's ``episode.step_timeout_s`` or answers something that is not a
result is a mismatch of its row too, naming the call; the replay goes on with the next row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groupwise.episodes.deadline import call_with_deadline
from groupwise.episodes.environment import Environment
from groupwise.episodes.episode import TRUNCATION_MARK
from groupwise.episodes.group import checked_result
from groupwise.episodes.record import EpisodeRecord
from groupwise.types import Prompt


@dataclass
class ReplayReport:
    """How many episodes were replayed, and each mismatch (row and reason)."""

    replayed: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def format_lines(self) -> str:
        head = f"episodes: {self.replayed} replayed into a fresh environment, {len(self.mismatches)} mismatch(es)\n"
        return head + "".join(f"  {line}\n" for line in self.mismatches[:20])


def replay_mismatch(
    factory: Callable[[], Environment], prompt: Prompt, sample_index: int, record: EpisodeRecord, timeout_s: float
) -> str | None:
    """Why replaying ``record``'s model turns into a fresh environment does not give its answers and rewards, or
    None. Every call (the constructor, ``reset``, each ``step``) runs under ``timeout_s``; one that raises, runs
    past it or answers something that is not a result is a mismatch naming the call, never an exception."""
    try:
        env = call_with_deadline(factory, timeout_s, "groupwise-replay-make")
    except Exception as exc:  # the user's constructor: this row's problem, named
        return f"the environment could not be created: {type(exc).__name__}: {exc}"
    try:
        call_with_deadline(lambda: env.reset(prompt, sample_index), timeout_s, "groupwise-replay-reset")
    except Exception as exc:
        return f"reset() failed: {type(exc).__name__}: {exc}"
    for turn, text in enumerate(record.assistant):
        try:
            result = checked_result(call_with_deadline(_stepping(env, text), timeout_s, "groupwise-replay-step"))
        except Exception as exc:
            return f"turn {turn + 1}: step() failed: {type(exc).__name__}: {exc}"
        if turn >= len(record.step_rewards) or result.reward != record.step_rewards[turn]:
            recorded = record.step_rewards[turn] if turn < len(record.step_rewards) else None
            return f"turn {turn + 1}: the environment gave the reward {result.reward!r}, the row holds {recorded!r}"
        shown = record.observations[turn] if turn < len(record.observations) else ()
        if not _same_answer(result.messages, shown):
            return (f"turn {turn + 1}: the environment answered {list(result.messages)!r:.160}, the row holds "
                    f"{list(shown)!r:.160}")  # fmt: skip
    if sum(record.step_rewards) != record.reward:
        return f"the turn rewards sum to {sum(record.step_rewards)!r} but the episode's reward is {record.reward!r}"
    return None


def _stepping(env: Environment, text: str) -> Callable[[], object]:
    return lambda: env.step({"role": "assistant", "content": text})


def _same_answer(answer: Sequence[Mapping[str, str]], shown: Sequence[Mapping[str, str]]) -> bool:
    """The recorded answer is the environment's, or its truncation (a cut content ending in the mark)."""
    if len(answer) != len(shown):
        return False
    for got, kept in zip(answer, shown, strict=True):
        if got["role"] != kept["role"]:
            return False
        content = kept["content"]
        if content.endswith(TRUNCATION_MARK):
            if not got["content"].startswith(content[: -len(TRUNCATION_MARK)]):
                return False
        elif got["content"] != content:
            return False
    return True


def replay_train_data(
    train_data: Sequence[Path], factory: Callable[[], Any], prompts: Mapping[str, Prompt], timeout_s: float
) -> ReplayReport:
    """Replay every episode row of the ``train_data`` step files (rows without an episode are skipped), each
    environment call under ``timeout_s`` (the run's ``episode.step_timeout_s``)."""
    report = ReplayReport()
    for path in train_data:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            row = json.loads(line) if line.strip() else {}
            if not row.get("episode"):
                continue
            where = f"{path.name}:{number} (prompt {row['prompt_uid']!r}, sample {row['completion_index']})"
            prompt = prompts.get(row["prompt_uid"])
            if prompt is None:
                report.mismatches.append(f"{where}: the prompt is not in the run's training data")
                continue
            record = EpisodeRecord.from_dict(row["episode"])
            report.replayed += 1
            problem = replay_mismatch(factory, prompt, row["completion_index"], record, timeout_s)
            if problem is None and record.reward != row["raw_reward"]:
                problem = f"the episode's reward {record.reward!r} is not the row's raw reward {row['raw_reward']!r}"
            if problem is not None:
                report.mismatches.append(f"{where}: {problem}")
    return report
