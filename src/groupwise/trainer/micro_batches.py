"""How one RL step's rows are cut for the learner: PPO mini-batches of whole groups, then micro-batches.

* With data-parallel ranks (``learner.num_ranks`` > 1), each mini-batch (the whole step when K = 1) is first
  split across the ranks by whole groups, balanced by tokens (:func:`rank_rows`); each rank cuts its share
  into micro-batches as below.

* A **mini-batch** is the data of one optimizer step. ``K = optimizer.mini_batches_per_step`` mini-batches
  split the step's groups in order into K runs of whole groups, as equal as they can be (sizes differ by at
  most one group; with fewer than K groups, each group is its own mini-batch).
* A **micro-batch** is one forward/backward pass; gradients of a mini-batch's micro-batches add up before its
  optimizer step, so the split never changes the result beyond float rounding (the loss normaliser covers
  the whole mini-batch). Two ways to cut them:

  - by rows (``optimizer.micro_batch_tokens`` null): consecutive runs of ``micro_batch_rows`` rows, in order;
  - by tokens: rows sorted longest first (prompt + completion), then packed greedily into micro-batches of
    whole rows whose *padded cost* — rows × the longest row — stays within ``micro_batch_tokens``, with at most
    ``micro_batch_rows`` rows. Sorting puts rows of similar length together, so little of each pass is padding;
    a row longer than the budget gets a micro-batch of its own.
"""

from __future__ import annotations

from collections.abc import Sequence


def mini_batch_groups(group_ids: Sequence[int], parts: int) -> list[list[int]]:
    """The distinct ``group_ids`` (in order) split into ``min(parts, groups)`` consecutive runs of near-equal size.

    With ``g`` groups and ``k`` runs, the first ``g mod k`` runs hold ``⌈g/k⌉`` groups and the rest ``⌊g/k⌋``.
    """
    if parts < 1:
        raise ValueError(f"parts={parts} must be >= 1")
    groups = list(dict.fromkeys(group_ids))
    count = min(parts, len(groups))
    if count == 0:
        return []
    size, extra = divmod(len(groups), count)
    runs, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        runs.append(groups[start:end])
        start = end
    return runs


def rank_rows(group_ids: Sequence[int], lengths: Sequence[int], ranks: int) -> list[list[int]]:
    """Row indices per data-parallel rank: whole groups, balanced by tokens.

    Groups in descending order of their token total ``Σ lengths`` (ties: the group seen first) each go to the
    rank holding the fewest tokens so far (ties: the lowest rank), the greedy longest-processing-time split; a
    rank's rows keep their order in the step. With fewer groups than ranks some ranks get none.
    """
    if ranks < 1:
        raise ValueError(f"ranks={ranks} must be >= 1")
    rows_of: dict[int, list[int]] = {}
    for row, group in enumerate(group_ids):
        rows_of.setdefault(group, []).append(row)
    totals = {group: sum(lengths[row] for row in rows) for group, rows in rows_of.items()}
    load, owner = [0] * ranks, {}
    for group in sorted(rows_of, key=lambda g: -totals[g]):  # sorted() is stable: ties keep first-seen order
        rank = min(range(ranks), key=lambda r: load[r])
        owner[group] = rank
        load[rank] += totals[group]
    return [[row for row, group in enumerate(group_ids) if owner[group] == rank] for rank in range(ranks)]


def micro_batches_by_rows(num_rows: int, max_rows: int) -> list[list[int]]:
    """Consecutive runs of ``max_rows`` row indices; the last holds the remainder."""
    if max_rows < 1:
        raise ValueError(f"max_rows={max_rows} must be >= 1")
    return [list(range(start, min(start + max_rows, num_rows))) for start in range(0, num_rows, max_rows)]


def micro_batches_by_tokens(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[list[int]]:
    """Row indices sorted by ``lengths`` (longest first, ties in row order), packed greedily.

    A micro-batch takes the next row while ``(rows + 1) × longest ≤ max_tokens`` and ``rows + 1 ≤ max_rows``
    (``longest`` is its first row's length: the order is descending); otherwise that row opens the next one.
    """
    if max_tokens < 1 or max_rows < 1:
        raise ValueError(f"max_tokens={max_tokens} and max_rows={max_rows} must be >= 1")
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    batches: list[list[int]] = []
    for row in order:
        current = batches[-1] if batches else None
        if current is not None and len(current) < max_rows and (len(current) + 1) * lengths[current[0]] <= max_tokens:
            current.append(row)
        else:
            batches.append([row])
    return batches


def padding_fraction(padded_tokens: int, real_tokens: int) -> float:
    """``1 − real / padded``: the share of positions fed through the model that were padding (0 when none fed)."""
    return 1.0 - real_tokens / padded_tokens if padded_tokens > 0 else 0.0
