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
  - by tokens, when the learner scores rows of one prompt against one pass over it (``optimizer.share_prompts``):
    the rows of each prompt kept together (prompts in descending order of their longest row, each prompt's rows
    longest first) and packed greedily while the positions the scorer will feed stay within the budget:
    ``min(U·Lp + R·(Lc − 1), R·(max(p + c) − 1))`` for U distinct prompts (longest ``Lp``) and R rows (longest
    completion ``Lc``), the cheaper of its two layouts. A group then fits a budget that its rows one by one would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from groupwise.model.shared_prompts import one_pass_positions, shared_positions


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


def micro_batches_by_shared_tokens(
    prompt_ids: Sequence[Sequence[int]], completion_lengths: Sequence[int], max_tokens: int, max_rows: int
) -> list[list[int]]:
    """Row indices with each prompt's rows together, packed greedily under the shared-layout cost (module
    docstring): a row joins the open micro-batch while the cost with it stays ≤ ``max_tokens`` and the rows ≤
    ``max_rows``; otherwise it opens the next one (so a row dearer than the budget is alone)."""
    if max_tokens < 1 or max_rows < 1:
        raise ValueError(f"max_tokens={max_tokens} and max_rows={max_rows} must be >= 1")
    keys = [tuple(prompt) for prompt in prompt_ids]
    totals = [len(p) + c for p, c in zip(prompt_ids, completion_lengths, strict=True)]
    longest_of: dict[tuple[int, ...], int] = {}
    for key, total in zip(keys, totals, strict=True):
        longest_of[key] = max(longest_of.get(key, 0), total)
    first_seen = {key: index for index, key in reversed(list(enumerate(keys)))}
    order = sorted(range(len(keys)), key=lambda r: (-longest_of[keys[r]], first_seen[keys[r]], -totals[r]))
    batches: list[list[int]] = []
    packed = _SharedCost()
    for row in order:
        grown = packed.plus(keys[row], completion_lengths[row])
        if batches and len(batches[-1]) < max_rows and grown.cost <= max_tokens:
            batches[-1].append(row)
            packed = grown
        else:
            batches.append([row])
            packed = _SharedCost().plus(keys[row], completion_lengths[row])
    return batches


@dataclass(frozen=True)
class _SharedCost:
    """What a micro-batch's cost is made of, kept as rows are added; :attr:`cost` is the cheaper layout's
    positions (``shared_positions`` or ``one_pass_positions`` of :mod:`groupwise.model.shared_prompts`)."""

    prompts: frozenset[tuple[int, ...]] = frozenset()
    longest_prompt: int = 0
    longest_completion: int = 0
    widest: int = 0
    rows: int = 0

    def plus(self, prompt: tuple[int, ...], completion: int) -> _SharedCost:
        return _SharedCost(
            self.prompts | {prompt}, max(self.longest_prompt, len(prompt)),
            max(self.longest_completion, completion), max(self.widest, len(prompt) + completion), self.rows + 1,
        )  # fmt: skip

    @property
    def cost(self) -> int:
        shared = shared_positions(len(self.prompts), self.longest_prompt, self.rows, self.longest_completion)
        return min(shared, one_pass_positions(self.rows, self.widest))


def padding_fraction(padded_tokens: int, real_tokens: int) -> float:
    """``1 − real / padded``: the share of positions fed through the model that were padding (0 when none fed)."""
    return 1.0 - real_tokens / padded_tokens if padded_tokens > 0 else 0.0
