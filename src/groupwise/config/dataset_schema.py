"""The ``dataset`` task's settings (``data.task: dataset``): local parquet, arrow, JSON or CSV files, or a folder
written by ``datasets``' ``save_to_disk``, a column mapping with presets, and the held-out split by file, by name or
by fraction.

What the files hold is checked by ``config check`` (:mod:`groupwise.data.dataset_task`), not here: the schema checks
only what the config says (which keys go together).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationInfo, field_validator

from groupwise.config.base import Section, TaskSection, check_path_text, invalid
from groupwise.config.checks import rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig

DatasetFormat = Literal["auto", "parquet", "arrow", "json", "csv"]
DatasetPreset = Literal["none", "verl"]


class DatasetColumns(Section):
    """Which column holds what; ``null`` = what ``data.dataset.preset`` says. A dotted name
    (``reward_model.ground_truth``) reaches into a struct column when no column has that exact name."""

    prompt: str | None = Field(None, min_length=1)
    """Column of plain prompt strings. ``null`` = ``prompt`` with preset ``none`` (unless ``messages`` is set), none
    with ``verl``. At most one of ``prompt`` and ``messages``."""
    messages: str | None = Field(None, min_length=1)
    """Column of chat turns (a non-empty list of ``{role, content}`` strings), rendered with the tokenizer's chat
    template. ``null`` = none with preset ``none``, ``prompt`` with ``verl`` (unless ``prompt`` is set)."""
    answer: str | None = Field(None, min_length=1)
    """Column of answers (a string or a finite number, stored as its string form). ``null`` = ``answer`` (preset
    ``none``), ``reward_model.ground_truth`` (``verl``)."""
    id: str | None = Field(None, min_length=1)
    """Column of prompt uids (non-empty strings or integers, unique in a split). ``null`` = none: the uid is
    ``{source}/{row}``, the file's stem (a saved folder's name, and ``/{split}`` for a ``DatasetDict``) and the
    row's 0-based index in it, so it does not change with the seed or the held-out fraction."""
    metadata: list[str] | None = None
    """Columns copied into ``Prompt.metadata`` (what a reward function or environment reads), each value JSON
    (strings, finite numbers, booleans, null, lists, string-keyed structs). ``null`` = every column not mapped above
    (preset ``none``), ``[data_source, extra_info]`` (``verl``); ``[]`` = none. Only mapped columns are read from a
    parquet file."""

    @field_validator("metadata")
    @classmethod
    def _names_are_names(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and (any(not name for name in names) or len(set(names)) < len(names)):
            raise invalid("data.dataset.columns.metadata must list distinct, non-empty column names",
                          "list each column once, e.g. [data_source, extra_info]")
        return names


class DatasetSection(TaskSection):
    """Prompts from local files through Hugging Face ``datasets`` (``data.task: dataset``; ``pip install
    'groupwise[datasets]'``). Nothing is downloaded: every path is a file or folder on this machine."""

    train_path: str | list[str] | None = None
    """Training data: a file, a list of files of one format (shards, read in order), or a folder written by
    ``save_to_disk``. Required with ``task: dataset``; relative to the working directory."""
    eval_path: str | list[str] | None = None
    """Held-out data by file, like ``train_path`` (a ``DatasetDict`` folder's split is named by ``eval_split``).
    At most one way to hold out: ``eval_path`` (with or without ``eval_split``), ``eval_split`` alone, or
    ``eval_fraction``; none of them = no held-out data."""
    format: DatasetFormat = "auto"
    """The files' format; ``auto`` = from each file's suffix (``.parquet``/``.pq``, ``.arrow``, ``.json``/``.jsonl``,
    ``.csv``). A folder is always read as a saved dataset."""
    train_split: str = Field("train", min_length=1)
    """The split of a saved ``DatasetDict`` folder that trains (files and a saved ``Dataset`` have no splits)."""
    eval_split: str | None = Field(None, min_length=1)
    """Held-out data by name: a split of the ``DatasetDict`` folder of ``eval_path``, or of ``train_path`` when
    ``eval_path`` is null."""
    eval_fraction: float | None = Field(None, gt=0, lt=1)
    """Held-out data by fraction (0 < f < 1): ``round(f × rows)`` of the training rows (at least 1, leaving at
    least 1), drawn with ``run.seed``: the same seed holds out the same rows, and the two splits never share a
    row. Each split keeps the file order."""
    preset: DatasetPreset = "none"
    """Column defaults: ``none`` (``prompt``, ``answer``, every other column as metadata) or ``verl`` (verl's parquet
    layout: ``prompt`` as chat messages, ``reward_model.ground_truth`` as the answer, ``data_source`` and
    ``extra_info`` as metadata). A key set in ``columns`` overrides the preset's."""
    columns: DatasetColumns = Field(default_factory=DatasetColumns)
    """Which column holds what."""

    @field_validator("train_path", "eval_path")
    @classmethod
    def _paths_are_paths(cls, paths: str | list[str] | None, info: ValidationInfo) -> str | list[str] | None:
        key = f"data.dataset.{info.field_name}"
        if isinstance(paths, list) and not paths:
            raise invalid(f"{key} must name at least one file", f"set {key} to a file, a list of files or a folder")
        for path in [paths] if not isinstance(paths, list) else paths:
            check_path_text(key, path)
        return paths


@rule("data")
def dataset_keys(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """data.task dataset needs data.dataset.train_path; one way to hold out prompts (eval_path with or without
    eval_split, eval_split alone, or eval_fraction); at most one of columns.prompt and columns.messages."""
    data = cfg.data
    dataset = data.dataset
    if data.task != "dataset":
        return
    if dataset.train_path is None:
        yield ConfigIssue(
            "data.dataset.train_path", None, "data.task 'dataset' needs data.dataset.train_path",
            "set data.dataset.train_path to a parquet, arrow, JSON or CSV file, or a save_to_disk folder",
        )
    if dataset.eval_fraction is not None and (dataset.eval_path is not None or dataset.eval_split is not None):
        given = "data.dataset.eval_path" if dataset.eval_path is not None else "data.dataset.eval_split"
        yield ConfigIssue(
            "data.dataset.eval_fraction", dataset.eval_fraction,
            f"data.dataset.eval_fraction holds out training rows, but {given} names the held-out data already",
            f"remove data.dataset.eval_fraction, or {given}",
        )
    columns = dataset.columns
    if columns.prompt is not None and columns.messages is not None:
        yield ConfigIssue(
            "data.dataset.columns.messages", columns.messages,
            f"a prompt is plain text (columns.prompt: {columns.prompt}) or chat turns (columns.messages), not both",
            "remove data.dataset.columns.prompt or data.dataset.columns.messages",
        )
