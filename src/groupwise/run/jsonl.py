"""The row-aligned JSONL writer behind ``train_data/step_<N>.jsonl`` (one line per trained row).

Every column must have one entry per row: a column from another row space (pre-filter rewards, say)
is refused rather than silently truncated: that is how misaligned rewards reach a training-data file when
columns are sliced one by one (docs/design.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from groupwise.run.journal import write_run_file


def _as_list(name: str, column: object) -> list:
    """A column as a plain list: tensors via ``.tolist()``, other sequences via ``list()``."""
    if isinstance(column, torch.Tensor):
        if column.dim() == 0:
            raise ValueError(f"column {name!r} is a 0-d tensor; it needs one entry per row")
        return column.tolist()
    if isinstance(column, (str, bytes)) or not isinstance(column, Sequence):
        raise TypeError(f"column {name!r} has type {type(column).__name__}; pass a tensor or a sequence of rows")
    return list(column)


def _json_safe(value: object) -> object:
    """NaN and ±inf become null so every line is strict JSON (readable by jq and non-Python tools)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, tuple):
        return [_json_safe(v) for v in value]
    return value


def write_rows_jsonl(path: str | Path, columns: Mapping[str, Sequence | torch.Tensor]) -> int:
    """Write one JSON object per row, ``{name: column[row] for name in columns}``; return the row count.

    Raises ValueError naming every column and its length if the lengths differ. Parent directories are
    created. Non-finite floats are written as ``null``.
    """
    if not columns:
        raise ValueError(f"write_rows_jsonl({str(path)!r}): no columns given; pass at least one column")
    lists = {name: _as_list(name, col) for name, col in columns.items()}
    lengths = {name: len(values) for name, values in lists.items()}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        raise ValueError(
            f"write_rows_jsonl({str(path)!r}): columns have different row counts ({detail}); every column must "
            "be aligned to the same rows — per-step data from another row set belongs in the step metrics"
        )
    num_rows = next(iter(lengths.values()))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for row in range(num_rows):
        record = {name: _json_safe(values[row]) for name, values in lists.items()}
        lines.append(json.dumps(record, allow_nan=False) + "\n")
    write_run_file(out, "".join(lines).encode("utf-8"))  # never through a symbolic link
    return num_rows
