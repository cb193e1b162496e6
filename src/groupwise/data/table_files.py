"""Local data files read through Hugging Face ``datasets``: what a path is (a file of which format, a saved folder
with which splits) and its rows, in batches. Nothing is downloaded and nothing is copied.

- **A file** (parquet, arrow, JSON or JSON Lines, CSV) is read with ``load_dataset(format, data_files=[path],
  streaming=True)``. Its rows come :data:`BATCH_ROWS` at a time (parquet and arrow one record batch at a time, JSON
  and CSV in chunks), so the file is never whole in memory, and from a parquet file only the columns the mapping
  reads are read at all. A non-streamed ``load_dataset`` would first convert the file into an Arrow copy in the
  ``datasets`` cache (a second copy on disk, and a pass over the file before the first row). What streaming costs:
  nothing is cached, so every start (``config check``, ``train``, a resume) reads the files again.
- **A folder written by ``save_to_disk``** (a ``Dataset``, or a ``DatasetDict`` and one of its splits) is opened with
  ``load_from_disk``, which memory-maps its Arrow files where they lie: the OS pages in what is read, and nothing is
  copied.

Either way, what stays in memory is the prompts made from the rows (text, answer and metadata as Python objects),
which the trainer holds for the whole run: memory grows with the mapped columns, not with the file.

``datasets`` is imported only here, and only when a table is opened (pandas and pyarrow take most of a second). While
it reads, the cache directory ``load_dataset`` insists on is a temporary one, removed after reading, the library's
progress bars and log lines are silenced, and its use of torch is off (a stream would import torch, which ``config
check`` never loads); its errors become :class:`TableError`.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groupwise.data.table_rows import ColumnMap

FORMAT_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json",
                   ".csv": "csv"}  # fmt: skip
BATCH_ROWS = 1000
SAVED = "saved"
"""The format of a folder written by ``save_to_disk``."""


class TableError(Exception):
    """A table that cannot be found, opened or read; the message names the path and says why."""


@dataclass(frozen=True)
class Table:
    """One table: a file of ``format``, or a saved folder (``format`` :data:`SAVED`), ``split`` naming its
    ``DatasetDict`` split (None for a saved ``Dataset`` or a file)."""

    path: Path
    format: str
    split: str | None = None

    @property
    def label(self) -> str:
        """The uid prefix of its rows: the file's stem, or the folder's name (and ``/split``)."""
        if self.format != SAVED:
            return self.path.stem
        return self.path.name if self.split is None else f"{self.path.name}/{self.split}"

    @property
    def where(self) -> str:
        """The table as a message names it."""
        return str(self.path) if self.split is None else f"{self.path} (split {self.split!r})"


def locate(given: str, format_: str, split: str | None, split_key: str, split_set: bool) -> Table:
    """The table at path ``given``: a file read as ``format_`` (``auto``: by its suffix), or a saved folder and, for
    a ``DatasetDict``, its split ``split``. ``split_set``: the user named the split (with the config key
    ``split_key``), so a file or a saved ``Dataset``, which have none, refuse it."""
    path = Path(given).expanduser()
    if not path.exists():
        raise TableError(f"{given}: no such file or folder (relative paths are resolved against the working "
                         f"directory, here {Path.cwd()}, giving {path.absolute()})")
    splits = saved_splits(path) if path.is_dir() else None
    if splits is not None:
        if split is None:
            raise TableError(f"{path}: a saved DatasetDict with the splits {splits}; set {split_key} to one")
        if split not in splits:
            raise TableError(f"{path}: a saved DatasetDict without a split {split!r} ({split_key}); its splits: "
                             f"{splits}")
        return Table(path, SAVED, split)
    if split_set:
        what = "a saved Dataset" if path.is_dir() else "a file"
        raise TableError(f"{path}: {what} has no splits, so {split_key} ({split!r}) names nothing (splits belong "
                         "to a folder written by DatasetDict.save_to_disk)")
    if path.is_dir():
        return Table(path, SAVED)
    if format_ == "auto":
        if path.suffix.lower() not in FORMAT_SUFFIXES:
            raise TableError(f"{path}: cannot tell the format from the suffix {path.suffix!r} (known: "
                             f"{', '.join(FORMAT_SUFFIXES)}); set data.dataset.format")
        format_ = FORMAT_SUFFIXES[path.suffix.lower()]
    if path.stat().st_size == 0:
        raise TableError(f"{path}: the file is empty")
    return Table(path, format_)


def saved_splits(path: Path) -> list[str] | None:
    """The splits of a folder written by ``DatasetDict.save_to_disk``, or None for one written by
    ``Dataset.save_to_disk``; raises :class:`TableError` for any other folder."""
    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TableError(f"{path}: dataset_dict.json cannot be read ({type(exc).__name__}: {exc})") from exc
        return [str(split) for split in splits]
    if (path / "state.json").is_file():
        return None
    raise TableError(f"{path}: a folder, but not one written by save_to_disk (no dataset_dict.json or state.json); "
                     "name the data files in it instead")


def open_rows(table: Table, columns: ColumnMap) -> tuple[list[str], Iterator[dict[str, Any]]]:
    """The table's column names and an iterator over its rows, each a dict of the columns ``columns`` reads (of
    every column for JSON and CSV, which are parsed whole anyway). Raises :class:`TableError`, also from the
    iterator, when the table cannot be read."""
    with _reading(table) as cache_dir:
        names = _open(table, cache_dir, None).column_names
    if names is not None:  # parquet, arrow and saved folders know their columns before any row is read
        return list(names), _rows(_batches(table, columns.read_columns(list(names))))
    batches = _batches(table, None)  # JSON and CSV streams know their columns once the first batch is parsed
    first = next(batches, None)
    if first is None:
        raise TableError(f"{table.where}: no rows")
    return list(first), _rows(_chain(first, batches))


def _open(table: Table, cache_dir: str, read: list[str] | None) -> Any:  # Any: a Dataset or an IterableDataset
    import datasets

    if table.format == SAVED:
        dataset = datasets.load_from_disk(str(table.path))
        if table.split is not None:
            dataset = dataset[table.split]
        return dataset if read is None else dataset.select_columns(read)
    options = {"columns": read} if table.format == "parquet" and read is not None else {}
    return datasets.load_dataset(table.format, data_files=[str(table.path)], split="train", streaming=True,
                                 cache_dir=cache_dir, **options)  # fmt: skip


def _batches(table: Table, read: list[str] | None) -> Iterator[dict[str, list[Any]]]:
    """The table's batches, opened again inside the reading context (a stream is read lazily)."""
    with _reading(table) as cache_dir:
        yield from _open(table, cache_dir, read).iter(batch_size=BATCH_ROWS)


def _chain(first: dict[str, list[Any]], rest: Iterator[dict[str, list[Any]]]) -> Iterator[dict[str, list[Any]]]:
    yield first
    yield from rest


def _rows(batches: Iterator[dict[str, list[Any]]]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        names = list(batch)
        for values in zip(*batch.values(), strict=True):
            yield dict(zip(names, values, strict=True))


@contextmanager
def _reading(table: Table) -> Iterator[str]:
    """A temporary cache directory for ``load_dataset``, ``datasets`` quiet, and its errors as
    :class:`TableError` naming the table."""
    import datasets
    from pyarrow import ArrowException

    logger = logging.getLogger("datasets")
    level, bars_off = logger.level, datasets.utils.are_progress_bars_disabled()
    torch_available = datasets.config.TORCH_AVAILABLE
    logger.setLevel(logging.CRITICAL)
    datasets.disable_progress_bars()
    # A streamed dataset imports torch to share its epoch counter with DataLoader workers, which a stream read here
    # never has; without this, `config check` would import torch (seconds) for a file of prompts.
    datasets.config.TORCH_AVAILABLE = False
    what = "a saved dataset" if table.format == SAVED else f"{table.format}"
    try:
        with tempfile.TemporaryDirectory(prefix="groupwise-datasets-") as cache_dir:
            yield cache_dir
    # The library and its readers (pyarrow, pandas, json) raise many types for a bad file; these are the families
    # a file's content or its permissions give. Anything else is a bug and propagates.
    except (OSError, ValueError, TypeError, StopIteration, ArrowException, datasets.exceptions.DatasetsError) as exc:
        message = str(exc).strip() or type(exc).__name__
        raise TableError(f"{table.where}: cannot be read as {what} ({type(exc).__name__}: {message:.300})") from exc
    finally:
        datasets.config.TORCH_AVAILABLE = torch_available
        logger.setLevel(level)
        if not bars_off:
            datasets.enable_progress_bars()
