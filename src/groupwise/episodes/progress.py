"""An in-flight episode group in a checkpoint, and continuing it after a resume.

Saved per episode (plain data): every token so far with its logprob, version and trainable flag, the text of each
model turn, how its last turn finished, and the tokens its turn on the stream had drawn (``turn``, or null). On
resume a fresh environment is reset and given the recorded model turns again, one by one; the episode continues at
its turn (and token: the unfinished turn is continued from its saved tokens) only when the rebuilt tokens equal
the saved ones, that is when the environment answered every turn as it did before. Otherwise the episode starts
over from its opening, and its record says so (``resume: restarted``; a continued one says ``continued``).
"""

from __future__ import annotations

from typing import Any

from groupwise.episodes.episode import Episode
from groupwise.episodes.group import EpisodeSettings, RunningGroup, finish_step, reopen_episode, start_step
from groupwise.types import Completion, FinishReason, RowPrefix, SamplingParams


def encode_group(
    group: RunningGroup, sampling: SamplingParams, turns: dict[int, RowPrefix | None]
) -> dict[str, Any] | None:
    """A running group's episodes as JSON-able data (``turns``: each episode's tokens on the stream, by sample)."""
    if group.error is not None or not any(e.token_ids or turns.get(e.sample_index) for e in group.episodes):
        return None  # nothing sampled yet: the attempt starts over at no cost
    return {
        "kind": "episodes", "seed": group.seed, "sampling": sampling.as_data(),
        "episodes": [_encode_episode(e, turns.get(e.sample_index)) for e in group.episodes],
    }  # fmt: skip


def _encode_episode(episode: Episode, turn: RowPrefix | None) -> dict[str, Any]:
    return {
        "sample_index": episode.sample_index, "token_ids": list(episode.token_ids),
        "logprobs": list(episode.logprobs), "versions": list(episode.versions), "trainable": list(episode.trainable),
        "assistant": list(episode.assistant), "last_finish": episode.last_finish,
        "turn": None if turn is None else {
            "token_ids": list(turn.token_ids), "logprobs": list(turn.logprobs),
            "token_versions": list(turn.token_versions), "finish_reason": turn.finish_reason,
        },
    }  # fmt: skip


def mismatch(data: dict[str, Any], group: RunningGroup, sampling: SamplingParams) -> str | None:
    """Why ``data`` cannot continue ``group`` (freshly opened for the same attempt), or None."""
    if data.get("kind") != "episodes":
        return "it was saved as a single-turn attempt"
    if data.get("seed") != group.seed:
        return "its seed differs (another run.seed, prompt or attempt numbering)"
    if data.get("sampling") != sampling.as_data():
        return "the sampling settings changed"
    if sorted(e.get("sample_index") for e in data.get("episodes", ())) != [e.sample_index for e in group.episodes]:
        return "its episodes are not this group's"
    return None


def take_back(
    settings: EpisodeSettings, group: RunningGroup, data: dict[str, Any], sampling: SamplingParams
) -> tuple[dict[int, RowPrefix], str | None]:
    """Rebuild the saved episodes of ``group`` (freshly opened for the same attempt): each continues at its turn
    or starts over; returns the saved tokens of the unfinished turns by sample, and why nothing could be continued
    (None when the saved group matched)."""
    why = mismatch(data, group, sampling)
    if why is not None:
        return {}, why
    saved = {e["sample_index"]: e for e in data["episodes"]}
    turns: dict[int, RowPrefix] = {}
    for position, episode in enumerate(list(group.episodes)):
        if not saved[episode.sample_index]["token_ids"] and saved[episode.sample_index].get("turn") is None:
            continue  # nothing was sampled: it simply starts
        try:
            turn = continue_episode(settings, group, episode, saved[episode.sample_index])
        except (ValueError, KeyError, TypeError, IndexError):
            reopen_episode(settings, group, position).resume = "restarted"
            if group.error is not None:  # its fresh environment failed to reset: the group fails as it would have
                return turns, None
            continue
        episode.resume = "continued"
        if turn is not None:
            turns[episode.sample_index] = turn
    return turns, None


def continue_episode(
    settings: EpisodeSettings, group: RunningGroup, episode: Episode, saved: dict[str, Any]
) -> RowPrefix | None:
    """Give ``episode`` (fresh) the saved model turns again; returns the saved tokens of its unfinished turn.

    Raises ``ValueError`` when the rebuilt episode differs from the saved one (the caller starts it over)."""
    trainable, tokens = saved["trainable"], saved["token_ids"]
    spans = _model_turns(trainable)
    if len(spans) != len(saved["assistant"]):
        raise ValueError(f"{len(spans)} model turns saved with {len(saved['assistant'])} texts")
    for index, (start, end) in enumerate(spans):
        finish: FinishReason = "length" if index == len(spans) - 1 and saved["last_finish"] == "length" else "stop"
        sampled = Completion(
            tuple(tokens[start:end]), tuple(saved["logprobs"][start:end]), saved["assistant"][index], finish,
            saved["versions"][end - 1], token_versions=tuple(saved["versions"][start:end]),
        )  # fmt: skip
        error = finish_step(settings, start_step(settings, group, episode, sampled))
        if error is not None:  # this replay's failure, not the episode's: it starts over instead
            raise ValueError(f"the environment failed when given turn {index + 1} again: {error}")
    kept = len(tokens)
    if episode.token_ids[:kept] != tokens or episode.trainable[:kept] != trainable:
        raise ValueError("the environment answered the saved turns differently")
    if len(episode.token_ids) != kept and saved.get("turn") is not None:
        raise ValueError("a turn was on the stream while its environment step was still running")
    turn: dict[str, Any] | None = saved.get("turn")
    if turn is None or episode.finished:
        return None
    return RowPrefix(tuple(turn["token_ids"]), tuple(turn["logprobs"]), tuple(turn["token_versions"]),
                     turn["finish_reason"])  # fmt: skip


def _model_turns(trainable: list[bool]) -> list[tuple[int, int]]:
    """The ``(start, end)`` of each run of trainable tokens: one per model turn."""
    spans: list[tuple[int, int]] = []
    for index, flag in enumerate(trainable):
        if flag and (index == 0 or not trainable[index - 1]):
            spans.append((index, index + 1))
        elif flag:
            spans[-1] = (spans[-1][0], index + 1)
    return spans
