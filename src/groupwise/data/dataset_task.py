"""The ``dataset`` task: prompts from local parquet, arrow, JSON or CSV files, or folders written by ``save_to_disk``,
read through Hugging Face ``datasets`` (:mod:`groupwise.data.table_files`) and mapped by column
(:mod:`groupwise.data.table_rows`).

The held-out split is one of:

- **by file**: ``eval_path`` (a ``DatasetDict`` folder's split named by ``eval_split``);
- **by name**: ``eval_split`` alone, a split of the ``DatasetDict`` folder of ``train_path``;
- **by fraction**: ``eval_fraction`` of the training rows, drawn with the run seed (``derive_seed("dataset_eval",
  seed)``), so the same seed holds out the same rows; the two splits never share a row, and each keeps file order.

A prompt's uid is its id column's value when ``columns.id`` is mapped, else ``{table label}/{row}`` (the file's stem,
or the folder's name and split, and the 0-based row in that table): the same row has the same uid in every run,
whatever the seed or the held-out fraction, which resume (the loader's fingerprint), fates and ``groupwise audit``
rely on.

Every table is read and every problem collected before anything is raised: one :class:`DatasetFilesError` lists,
under the config key each comes from, every missing or unreadable file, every missing column and every bad value
(grouped by column and message, with the rows), as the JSONL task lists its bad lines.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from groupwise.data.jsonl_dataset import DatasetError
from groupwise.data.table_files import Table, TableError, locate, open_rows
from groupwise.data.table_rows import ColumnMap, Problem, column_map, row_prompt
from groupwise.seeding import derive_seed
from groupwise.types import Prompt

MAX_PROBLEM_LINES = 20
"""Lines listed per table; the rest are counted."""
MAX_ROWS_LISTED = 5
"""Row numbers listed per problem; the rest are counted."""
MAX_COLUMNS_LISTED = 30
"""A table's column names listed when a mapped one is missing."""
INSTALL_HINT = "pip install 'groupwise[datasets]'"

_FILE_FIX = ("point {key} at a parquet, arrow, JSON or CSV file (data.dataset.format when its suffix does not say "
             "which) or a folder written by save_to_disk; relative paths start at the working directory")
_ROW_FIX = ("fix the rows listed, or map other columns (data.dataset.columns, data.dataset.preset; "
            "docs/datasets.md)")


@dataclass(frozen=True)
class DatasetProblem:
    """One problem, as a config issue says it: the key it comes from, the value given, the rule, the fix."""

    key: str
    value: object
    rule: str
    fix: str


class DatasetFilesError(DatasetError):
    """Every problem of a ``dataset`` task's files, each under the config key it comes from."""

    def __init__(self, problems: list[DatasetProblem]) -> None:
        super().__init__("\n".join(f"{problem.key}: {problem.rule}" for problem in problems))
        self.problems = problems


class DatasetTask:
    """Prompts from local files through ``datasets``; default reward ``exact_numeric``, demonstration the answer
    (or a ``demonstration`` metadata column)."""

    name = "dataset"
    default_reward = "exact_numeric"

    def __init__(self, train_path: str | list[str] | None, eval_path: str | list[str] | None = None,
                 format: str = "auto", train_split: str = "train", eval_split: str | None = None,
                 eval_fraction: float | None = None, preset: str = "none",
                 columns: Mapping[str, Any] | None = None, seed: int = 0) -> None:  # fmt: skip
        if train_path is None:
            raise DatasetError("the dataset task needs training data: set data.dataset.train_path")
        self._columns = column_map(preset, columns or {})
        self._format = format
        self._problems: list[DatasetProblem] = []
        try:
            import datasets  # noqa: F401  (whether it is installed; the tables import it when read)
        except ImportError:
            raise DatasetFilesError([DatasetProblem(
                "data.task", self.name, "data.task 'dataset' reads files through the Hugging Face datasets library, "
                "which is not installed", INSTALL_HINT)]) from None  # fmt: skip
        split_key = "data.dataset.train_split"
        self._train = self._read("data.dataset.train_path", train_path, train_split, split_key, train_split != "train")
        self._eval: list[Prompt] = []
        if eval_path is not None:
            self._eval = self._read("data.dataset.eval_path", eval_path, eval_split, "data.dataset.eval_split",
                                    eval_split is not None)
        elif eval_split is not None:
            self._eval = self._read("data.dataset.eval_split", train_path, eval_split, "data.dataset.eval_split", True)
        elif eval_fraction is not None and not self._problems:
            self._train, self._eval = self._held_out(eval_fraction, seed)
        if self._problems:
            raise DatasetFilesError(self._problems)

    def train_prompts(self) -> list[Prompt]:
        return list(self._train)

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def demonstration(self, prompt: Prompt) -> str:
        """The completion an SFT recipe trains on: a ``demonstration`` metadata column's string, else the answer."""
        demonstration = prompt.metadata.get("demonstration")
        return demonstration if isinstance(demonstration, str) else prompt.answer

    def _read(self, key: str, given: str | list[str], split: str | None, split_key: str,
              split_set: bool) -> list[Prompt]:  # fmt: skip
        """The prompts of every table ``given`` names (problems recorded under ``key``). ``split``: the
        ``DatasetDict`` split to read, ``split_set``: whether the user named it (a file or a saved ``Dataset`` then
        refuses it)."""
        prompts: list[Prompt] = []
        seen: dict[str, str] = {}
        for path in [given] if isinstance(given, str) else given:
            try:
                table = locate(path, self._format, split, split_key, split_set)
                names, rows = open_rows(table, self._columns)
            except TableError as exc:
                self._problems.append(DatasetProblem(key, given, str(exc), _FILE_FIX.format(key=key)))
                continue
            missing = self._columns.missing(names)
            if missing:
                listed = f"{names[:MAX_COLUMNS_LISTED]}" + (f" and {len(names) - MAX_COLUMNS_LISTED} more"
                                                             if len(names) > MAX_COLUMNS_LISTED else "")
                self._problems.extend(DatasetProblem(
                    key, given, f"{table.where}: no column {name!r} ({self._columns.role(name)}); its columns: "
                    f"{listed}", _ROW_FIX) for name in missing)  # fmt: skip
                continue
            try:
                prompts.extend(self._table_prompts(key, given, table, names, rows, seen))
            except TableError as exc:
                self._problems.append(DatasetProblem(key, given, str(exc), _FILE_FIX.format(key=key)))
        return prompts

    def _table_prompts(self, key: str, given: object, table: Table, names: list[str], rows: Iterator[dict[str, Any]],
                       seen: dict[str, str]) -> list[Prompt]:  # fmt: skip
        """The prompts of one table's rows, or none and a problem listing its bad rows."""
        metadata = self._columns.metadata_columns(names)
        prompts: list[Prompt] = []
        bad: dict[Problem, list[int]] = {}
        duplicates: list[str] = []
        count = 0
        for index, row in enumerate(rows):
            count += 1
            made = row_prompt(row, self._columns, metadata, f"{table.label}/{index}")
            if isinstance(made, list):
                for problem in made:
                    bad.setdefault(problem, []).append(index)
                continue
            where = f"row {index} of {table.where}"
            if made.uid in seen:
                duplicates.append(f"row {index}: uid {made.uid!r} again (first: {seen[made.uid]}); uids must be "
                                  "unique in a split")
            else:
                seen[made.uid] = where
                prompts.append(made)
        if count == 0:
            self._problems.append(DatasetProblem(key, given, f"{table.where}: no rows", _FILE_FIX.format(key=key)))
        elif bad or duplicates:
            self._problems.append(DatasetProblem(key, given, _bad_rows(table, count, bad, duplicates, self._columns),
                                                 _ROW_FIX))  # fmt: skip
        return prompts

    def _held_out(self, fraction: float, seed: int) -> tuple[list[Prompt], list[Prompt]]:
        """``(train, held out)``: ``round(fraction × rows)`` rows (at least 1, leaving at least 1) drawn with the
        seed; both keep file order."""
        total = len(self._train)
        if total < 2:
            self._problems.append(DatasetProblem(
                "data.dataset.eval_fraction", fraction, f"the training data holds {total} row(s): holding out any "
                "leaves none to train on", "add rows, or remove data.dataset.eval_fraction"))  # fmt: skip
            return self._train, []
        size = min(total - 1, max(1, round(fraction * total)))
        held = set(random.Random(derive_seed("dataset_eval", seed)).sample(range(total), size))
        train = [prompt for i, prompt in enumerate(self._train) if i not in held]
        return train, [prompt for i, prompt in enumerate(self._train) if i in held]


def _bad_rows(table: Table, count: int, bad: dict[Problem, list[int]], duplicates: list[str],
              columns: ColumnMap) -> str:  # fmt: skip
    """One message listing a table's bad values (grouped by column and problem, with their rows) and duplicate
    uids, at most :data:`MAX_PROBLEM_LINES` lines."""
    lines = []
    for (column, message), rows in bad.items():
        shown = ", ".join(str(row) for row in rows[:MAX_ROWS_LISTED])
        more = f" and {len(rows) - MAX_ROWS_LISTED} more" if len(rows) > MAX_ROWS_LISTED else ""
        lines.append(f"  column {column!r} ({columns.role(column)}), row{'s' if len(rows) > 1 else ''} "
                     f"{shown}{more}: {message}")
    lines.extend(f"  {line}" for line in duplicates)
    rows_bad = len({row for rows in bad.values() for row in rows}) + len(duplicates)
    shown_lines = lines[:MAX_PROBLEM_LINES]
    tail = f"\n  ... and {len(lines) - len(shown_lines)} more" if len(lines) > len(shown_lines) else ""
    return (f"{table.where}: {rows_bad} bad row(s) of {count} (rows counted from 0):\n" + "\n".join(shown_lines)
            + tail)

