"""In-flight attempts in a checkpoint: what a generation stream had generated of one, as plain data, and back.

The async controller saves, per running attempt, whatever its rollout client gives it (``progress(group_id)``)
and hands it back on resume (``rollout(..., resume=data)``). The stream-fed clients (embedded and Ray) save

    {"seed": s, "prompt_token_ids": [...], "sampling": {...}, "rows": [null | {"token_ids": [...],
     "logprobs": [...], "token_versions": [...], "finish_reason": null | "stop" | "length"}, ...]}

one row per sample. On resume :func:`prefixes_from` checks that the attempt would be sampled exactly as before —
the same seed (run seed, prompt, attempt), the same encoded prompt, the same sampling settings and group size —
and returns the rows as :class:`~groupwise.types.RowPrefix` es to continue; anything else starts the attempt
over, with a note saying why (its draws would differ, so continuing would splice two different samples).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from groupwise.types import GenerationRequest, LoaderItem, RowPrefix, SamplingParams

if TYPE_CHECKING:
    from groupwise.trainer.rollout import RolloutWorker


def encode_progress(
    request: GenerationRequest, sampling: SamplingParams, rows: tuple[RowPrefix | None, ...]
) -> dict[str, Any] | None:
    """An attempt's progress as JSON-able data; None when no sample has a token yet (nothing worth keeping)."""
    if all(row is None for row in rows):
        return None
    return {
        "seed": request.seed,
        "prompt_token_ids": list(request.prompt_token_ids),
        "sampling": sampling.as_data(),
        "rows": [
            None if row is None else {
                "token_ids": list(row.token_ids), "logprobs": list(row.logprobs),
                "token_versions": list(row.token_versions), "finish_reason": row.finish_reason,
            }
            for row in rows
        ],
    }  # fmt: skip


def kept_tokens(data: dict[str, Any] | None) -> int:
    """Tokens an attempt's saved progress holds (what continuing it does not generate again)."""
    if not data:
        return 0
    if data.get("kind") == "episodes":  # an episode group: its episodes' sampled tokens and their turns on the stream
        return sum(sum(e["trainable"]) + len((e.get("turn") or {}).get("token_ids", ())) for e in data["episodes"])
    return sum(len(row["token_ids"]) for row in data.get("rows", ()) if row)


def prefixes_from(
    data: dict[str, Any], request: GenerationRequest, sampling: SamplingParams
) -> tuple[tuple[RowPrefix | None, ...], str | None]:
    """The saved rows of ``data`` as prefixes for ``request`` (the attempt as this run would sample it), or ``()``
    and why they cannot be continued."""
    why = None
    rows = data.get("rows") or []
    if data.get("seed") != request.seed:
        why = "its seed differs (another run.seed, prompt or attempt numbering)"
    elif tuple(data.get("prompt_token_ids", ())) != request.prompt_token_ids:
        why = "the prompt encodes differently now (another tokenizer, template or data.system_prompt)"
    elif data.get("sampling") != sampling.as_data():
        why = f"the sampling settings changed ({data.get('sampling')} then, {sampling.as_data()} now)"
    elif len(rows) != request.num_samples:
        why = f"it had {len(rows)} samples, this run generates {request.num_samples} per prompt"
    if why is not None:
        return (), why
    try:
        prefixes = tuple(
            None if row is None else RowPrefix(
                tuple(row["token_ids"]), tuple(row["logprobs"]), tuple(row["token_versions"]), row["finish_reason"]
            )
            for row in rows
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as error:
        return (), f"its saved rows are malformed ({type(error).__name__}: {error})"
    return prefixes, None


def continuation(
    worker: RolloutWorker, item: LoaderItem, group_id: int, attempt: int, data: dict[str, Any],
    on_event: Callable[[str], None],
) -> tuple[RowPrefix | None, ...]:
    """The prefixes that continue a resumed attempt at ``item`` on ``worker`` (a ``RolloutWorker``), or ``()`` (the
    attempt starts over) with an event saying why."""
    prefixes, why = prefixes_from(data, worker.request_for(item, attempt), worker.sampling)
    if why is not None:
        on_event(f"resume: group {group_id} ({item.prompt.uid!r}) starts over instead of continuing: {why}")
    return prefixes


def prefix_tokens(prefixes: tuple[RowPrefix | None, ...]) -> int:
    """Tokens the prefixes hold: what continuing them does not generate again."""
    return sum(len(prefix.token_ids) for prefix in prefixes if prefix is not None)


def attach_progress(state: dict[str, Any], progress: dict[int, dict[str, Any] | None]) -> int:
    """Fill in the progress of the running attempts of a controller snapshot ``state`` from ``progress`` (by group
    id), read after the snapshot was taken (a later token boundary of the same attempts, so still a prefix of each);
    slots that already carry progress keep it. Returns the attempts filled in."""
    filled = 0
    for slot in state["inflight_slots"]:
        data = progress.get(slot["group_id"]) if slot["group_id"] is not None else None
        if slot["progress"] is None and data is not None:
            slot["progress"] = data
            filled += 1
    return filled
