"""`RowBatch`: named columns that always share one row count (invariants 1 and 2 in docs/design.md).

A column is either a torch tensor whose leading dimension is the row dimension, or a sequence (list or tuple)
with one element per row. Every operation applies one row index to every column, so a column can never be
sliced, filtered or concatenated against a different row space than its neighbours (the misaligned-rewards
bug of docs/design.md). Data computed on another row set (pre-filter rewards, say) does not belong here: it
lives in the step tally (:class:`groupwise.algo.tally.StepTally`).

A column cannot be changed behind the batch's back, because an in-place edit would skip the row-count check:
sequence columns are stored and read as **tuples** (immutable, so a read costs nothing: the learner reads the id
columns every micro-batch), and tensor columns are copied when written and **read as copies** (torch has no
read-only tensor; the tensors held here are per-row scalars, so a copy is cheap next to any forward pass). Row
values themselves are kept as given; :func:`groupwise.rows.build_rows` gives tuples.

Every batch carries a ``group_id`` column so whole-group operations never regroup rows by prompt text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from groupwise.types import Group

Column = torch.Tensor | list | tuple
GROUP_ID = "group_id"


def _column_length(name: str, column: object) -> int:
    """Row count of one column, or a ValueError saying which column has an unsupported form."""
    if isinstance(column, torch.Tensor):
        if column.dim() == 0:
            raise ValueError(
                f"column {name!r} is a 0-d tensor; columns need a leading row dimension (use tensor.reshape(1) "
                "for a single row)"
            )
        return int(column.shape[0])
    if isinstance(column, (list, tuple)):
        return len(column)
    raise TypeError(
        f"column {name!r} has type {type(column).__name__}; a column must be a torch.Tensor (rows on dim 0) "
        "or a list or tuple with one element per row"
    )


def _frozen(column: Column) -> torch.Tensor | tuple:
    """What the batch stores for a column it was handed: a tuple, or a copy of the tensor (the caller keeps
    no handle on the batch's own storage)."""
    return column.clone() if isinstance(column, torch.Tensor) else tuple(column)


class _ColumnsView(Mapping):
    """``RowBatch.columns``: a read-only mapping whose values are read as ``batch[name]`` is."""

    def __init__(self, batch: RowBatch) -> None:
        self._batch = batch

    def __getitem__(self, name: str) -> Column:
        return self._batch[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._batch._columns)

    def __len__(self) -> int:
        return len(self._batch._columns)


class RowBatch:
    """Named, row-aligned columns; ``group_id`` is required.

    Construction and ``batch[name] = column`` reject any column whose row count differs from the batch's
    ``num_rows``. ``select``, ``slice`` and ``concat`` return new batches whose tensors are new tensors
    (no aliasing of the source), so editing one batch never changes another. Copying a column under a
    new name (``batch["filtered_reward"] = batch["reward"]``) is allowed: it is the same row space.
    """

    def __init__(self, columns: Mapping[str, Column]) -> None:
        if GROUP_ID not in columns:
            raise ValueError(
                f"RowBatch needs a {GROUP_ID!r} column (one group id per row) so whole-group operations never "
                f"regroup rows by prompt; got columns {sorted(columns)}"
            )
        lengths = {name: _column_length(name, col) for name, col in columns.items()}
        num_rows = lengths[GROUP_ID]
        mismatched = {name: n for name, n in lengths.items() if n != num_rows}
        if mismatched:
            raise ValueError(
                f"RowBatch columns disagree on the row count: {GROUP_ID!r} has {num_rows} rows but "
                + ", ".join(f"{name!r} has {n}" for name, n in mismatched.items())
                + "; every column must have one entry per row"
            )
        self._num_rows = num_rows
        self._columns: dict[str, torch.Tensor | tuple] = {name: _frozen(col) for name, col in columns.items()}

    @classmethod
    def _of_new_columns(cls, columns: dict[str, torch.Tensor | tuple]) -> RowBatch:
        """A batch over columns this module just built (new tensors, tuples): checked, not copied again."""
        batch = cls.__new__(cls)
        lengths = {name: _column_length(name, col) for name, col in columns.items()}
        if len(set(lengths.values())) > 1:
            raise AssertionError(f"RowBatch operation built columns of different lengths: {lengths}")
        batch._num_rows = lengths[GROUP_ID]
        batch._columns = columns
        return batch

    # --- reading and writing -------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def columns(self) -> Mapping[str, Column]:
        """A read-only view of the columns, read like ``batch[name]`` (write with ``batch[name] = column``)."""
        return _ColumnsView(self)

    def __len__(self) -> int:
        return self._num_rows

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __getitem__(self, name: str) -> Column:
        """The column ``name``: a tuple, or a copy of the tensor (see the module docstring)."""
        if name not in self._columns:
            raise KeyError(f"RowBatch has no column {name!r}; columns are {sorted(self._columns)}")
        column = self._columns[name]
        return column.clone() if isinstance(column, torch.Tensor) else column

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor column ``name`` (a copy); TypeError when it is a sequence column."""
        column = self[name]
        if not isinstance(column, torch.Tensor):
            raise TypeError(f"RowBatch column {name!r} is a {type(column).__name__}, not a tensor")
        return column

    def sequence(self, name: str) -> tuple[Any, ...]:
        """The sequence column ``name`` (a tuple, one value per row); TypeError when it is a tensor column."""
        column = self[name]
        if isinstance(column, torch.Tensor):
            raise TypeError(f"RowBatch column {name!r} is a tensor, not a sequence")
        return tuple(column)

    def __setitem__(self, name: str, column: Column) -> None:
        n = _column_length(name, column)
        if n != self._num_rows:
            raise ValueError(
                f"cannot write column {name!r} with {n} rows into a RowBatch of {self._num_rows} rows; a column "
                "computed on another row set (e.g. pre-filter rewards) belongs in the step tally, not the batch"
            )
        self._columns[name] = _frozen(column)

    def __repr__(self) -> str:
        return f"RowBatch(num_rows={self._num_rows}, columns={list(self._columns)})"

    # --- row-index operations ------------------------------------------------------------------------

    def select(self, indices: Sequence[int] | torch.Tensor) -> RowBatch:
        """The rows at ``indices`` (in that order, repeats allowed) from every column."""
        raw = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        if any(isinstance(i, bool) for i in raw):
            raise TypeError("select takes row indices, not a boolean mask; use torch.nonzero(mask).flatten()")
        index = [int(i) for i in raw]
        bad = [i for i in index if not 0 <= i < self._num_rows]
        if bad:
            raise IndexError(
                f"select indices {bad[:10]} are outside 0..{self._num_rows - 1} ({self._num_rows} rows); "
                "negative indices are not accepted"
            )
        index_tensor = torch.tensor(index, dtype=torch.long)
        selected: dict[str, torch.Tensor | tuple] = {}
        for name, col in self._columns.items():
            if isinstance(col, torch.Tensor):
                selected[name] = col.index_select(0, index_tensor.to(col.device))
            else:
                selected[name] = tuple(col[i] for i in index)
        return RowBatch._of_new_columns(selected)

    def slice(self, start: int, stop: int) -> RowBatch:
        """Rows ``start`` to ``stop`` (exclusive). Raises instead of truncating when out of range."""
        if not 0 <= start <= stop <= self._num_rows:
            raise IndexError(
                f"slice({start}, {stop}) is out of range for a RowBatch of {self._num_rows} rows; need "
                f"0 <= start <= stop <= {self._num_rows} (a batch is never silently truncated)"
            )
        sliced: dict[str, torch.Tensor | tuple] = {}
        for name, col in self._columns.items():
            sliced[name] = col[start:stop].clone() if isinstance(col, torch.Tensor) else col[start:stop]
        return RowBatch._of_new_columns(sliced)

    def iter_slices(self, rows_per_slice: int) -> Iterator[RowBatch]:
        """Consecutive slices of ``rows_per_slice`` rows; the last one holds the remainder."""
        if rows_per_slice < 1:
            raise ValueError(f"rows_per_slice must be >= 1, got {rows_per_slice}")
        for start in range(0, self._num_rows, rows_per_slice):
            yield self.slice(start, min(start + rows_per_slice, self._num_rows))

    @staticmethod
    def concat(batches: Sequence[RowBatch], pad_values: Mapping[str, float | int] | None = None) -> RowBatch:
        """Rows of every batch, in order. Column sets must be identical.

        Tensors are concatenated along dim 0. Tensors with 2 or more dims whose widths (dim 1) differ are
        right-padded on dim 1 to the widest, with ``pad_values[name]`` (default 0) — e.g. pass
        ``{"mask": 0, "input_ids": pad_token_id}``. Any other shape, dtype or kind mismatch raises.
        """
        if not batches:
            raise ValueError("RowBatch.concat needs at least one batch")
        names = list(batches[0].columns)
        for k, batch in enumerate(batches[1:], start=1):
            if set(batch.columns) != set(names):
                missing = sorted(set(names) - set(batch.columns))
                extra = sorted(set(batch.columns) - set(names))
                raise ValueError(
                    f"RowBatch.concat: batch {k} has different columns from batch 0 (missing {missing}, extra "
                    f"{extra}); add or drop those columns so every batch has the same set"
                )
        pads = dict(pad_values or {})
        merged = {name: _concat_column(name, [b._columns[name] for b in batches], pads.get(name, 0)) for name in names}
        return RowBatch._of_new_columns(merged)

    # --- whole-group operations ----------------------------------------------------------------------

    def row_group_ids(self) -> list[int]:
        """The group id of every row, in row order."""
        col = self._columns[GROUP_ID]
        return [int(g) for g in (col.tolist() if isinstance(col, torch.Tensor) else col)]

    def group_ids(self) -> list[int]:
        """The distinct group ids in order of first appearance."""
        return list(dict.fromkeys(self.row_group_ids()))

    def select_groups(self, group_ids: Sequence[int]) -> RowBatch:
        """Every row of each listed group, groups in the order given, rows in their original order."""
        rows_of: dict[int, list[int]] = {}
        for row, gid in enumerate(self.row_group_ids()):
            rows_of.setdefault(gid, []).append(row)
        wanted = [int(g) for g in group_ids]
        unknown = [g for g in wanted if g not in rows_of]
        if unknown:
            raise KeyError(f"select_groups: group ids {unknown} are not in this batch (it has {list(rows_of)})")
        repeated = [g for g, n in Counter(wanted).items() if n > 1]
        if repeated:
            raise ValueError(f"select_groups: group ids {repeated} are listed more than once; list each group once")
        return self.select([row for g in wanted for row in rows_of[g]])

    def assert_whole_groups(self, group_sizes: Mapping[int, int] | int) -> None:
        """Raise ValueError unless every group present has all its rows.

        ``group_sizes`` is either one size G for every group, or a mapping group id -> expected rows.
        """
        counts = Counter(self.row_group_ids())
        problems = []
        for gid, n in counts.items():
            if isinstance(group_sizes, int):
                expected = group_sizes
            elif gid in group_sizes:
                expected = group_sizes[gid]
            else:
                problems.append(f"group {gid} has {n} rows but no expected size was given")
                continue
            if n != expected:
                problems.append(f"group {gid} has {n} of {expected} rows")
        if problems:
            raise ValueError("RowBatch holds partial groups: " + "; ".join(problems))

    @classmethod
    def from_groups(cls, groups: Sequence[Group]) -> RowBatch:
        """One row per completion, groups in order: the per-row scalars every trainer needs.

        Columns: ``group_id``, ``prompt_uid``, ``completion_index``, ``raw_reward``, ``reward``,
        ``num_tokens``, ``finish_reason``, ``start_version``, ``end_version`` (all tuples; the names are the ones
        :func:`groupwise.rows.build_rows` and ``train_data`` use).
        Token-level tensors are built by the caller, which knows the tokenizer's padding.
        """
        columns: dict[str, list] = {
            name: []
            for name in (
                GROUP_ID, "prompt_uid", "completion_index", "raw_reward", "reward", "num_tokens",
                "finish_reason", "start_version", "end_version",
            )
        }
        for group in groups:
            for i, completion in enumerate(group.completions):
                columns[GROUP_ID].append(group.group_id)
                columns["prompt_uid"].append(group.prompt.uid)
                columns["completion_index"].append(i)
                columns["raw_reward"].append(float(group.raw_rewards[i]))
                columns["reward"].append(float(group.rewards[i]))
                columns["num_tokens"].append(completion.num_tokens)
                columns["finish_reason"].append(completion.finish_reason)
                columns["start_version"].append(group.start_version)
                columns["end_version"].append(group.end_version)
        return cls(columns)


def _concat_column(name: str, parts: list[torch.Tensor | tuple], pad_value: float | int) -> torch.Tensor | tuple:
    """Concatenate one column's parts (all tuples, or all tensors of one dtype and trailing shape)."""
    if all(isinstance(p, tuple) for p in parts):
        return tuple(item for p in parts for item in p)
    if not all(isinstance(p, torch.Tensor) for p in parts):
        kinds = [type(p).__name__ for p in parts]
        raise TypeError(f"RowBatch.concat: column {name!r} is a tensor in some batches, a sequence in others: {kinds}")
    tensors: list[torch.Tensor] = parts  # type: ignore[assignment]
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(f"RowBatch.concat: column {name!r} has mixed dtypes {sorted(map(str, dtypes))}; cast first")
    dims = {t.dim() for t in tensors}
    if len(dims) > 1:
        raise ValueError(f"RowBatch.concat: column {name!r} has tensors of different ranks {sorted(dims)}")
    if tensors[0].dim() >= 2:
        trailing = {tuple(t.shape[2:]) for t in tensors}
        if len(trailing) > 1:
            raise ValueError(f"RowBatch.concat: column {name!r} has mismatched shapes beyond dim 1: {trailing}")
        width = max(t.shape[1] for t in tensors)
        tensors = [_right_pad(t, width, pad_value) for t in tensors]
    return torch.cat(tensors, dim=0)


def _right_pad(tensor: torch.Tensor, width: int, pad_value: float | int) -> torch.Tensor:
    """``tensor`` widened on dim 1 to ``width`` with ``pad_value`` on the right."""
    if tensor.shape[1] == width:
        return tensor
    padded = torch.full((tensor.shape[0], width, *tensor.shape[2:]), pad_value, dtype=tensor.dtype,
                        device=tensor.device)
    padded[:, : tensor.shape[1]] = tensor
    return padded
