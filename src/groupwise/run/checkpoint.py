"""Atomic, self-verifying checkpoints under ``checkpoints/step_<N>/`` (invariant 8 in docs/design.md).

The ``state`` dict a trainer passes to :func:`save_checkpoint` (every key optional, no others allowed)::

    "model":     {name: tensor}       policy state_dict      -> model.safetensors (tied weights stored once)
    "optimizer": torch-saveable        optimizer.state_dict() -> optimizer.pt
    "scheduler": torch-saveable        scheduler.state_dict() -> scheduler.pt
    "rng":       capture_rng_state()                          -> rng.pt
    "trainer":   JSON-able dict        step counters, loader position, versions -> trainer_state.json
    "extra":     {name: value}         a value that survives a JSON round trip unchanged -> extra/<name>.json,
                                       anything else (tensors, tuples, nested state dicts) -> extra/<name>.pt

:func:`load_checkpoint` returns the same dict shape. ``.pt`` pieces are read with ``torch.load(weights_only=True)``,
so they may hold tensors and plain containers (dict, list, tuple, str, int, float, bool, None) but no
arbitrary objects: convert dataclasses to dicts first.

Crash safety: pieces go into ``.tmp-step_<N>-<pid>/`` beside the final directory, each file is fsynced, then
a ``COMPLETE`` manifest (file names, sizes, sha256) is written and fsynced, and only then is the directory
renamed to ``step_<N>``. A directory without a verifying manifest is never treated as a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from groupwise.digests import file_sha256
from groupwise.run.rundir import RunDir

logger = logging.getLogger(__name__)

MANIFEST_FILE = "COMPLETE"
MANIFEST_FORMAT = 1
STATE_KEYS = ("model", "optimizer", "scheduler", "rng", "trainer", "extra")
_TORCH_PIECES = {"optimizer": "optimizer.pt", "scheduler": "scheduler.pt", "rng": "rng.pt"}
_STEP_DIR = re.compile(r"^step_(\d+)$")
_EXTRA_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class CheckpointError(RuntimeError):
    """A checkpoint directory is incomplete or does not match its manifest."""


# --- save ------------------------------------------------------------------------------------
def save_checkpoint(run_dir: RunDir | str | Path, step: int, state: Mapping[str, Any], keep_last: int) -> Path:
    """Write ``state`` atomically as ``checkpoints/step_<step>/`` and return that path.

    Afterwards keeps only the newest ``keep_last`` complete checkpoints at or below ``step`` (ones above
    it are left alone: they belong to a timeline this run rewound from) and removes stale ``.tmp-*`` dirs.
    Saving a step that already exists replaces it.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (the checkpoint just written is always kept), got {keep_last}")
    unknown = set(state) - set(STATE_KEYS)
    if unknown:
        raise ValueError(f"unknown checkpoint state keys {sorted(unknown)}; allowed keys are {list(STATE_KEYS)}")
    final = RunDir.of(run_dir).checkpoint_path(step)
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_dirs(parent)
    tmp = parent / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        _write_pieces(tmp, state)
        manifest = {"format": MANIFEST_FORMAT, "step": step, "files": _describe_files(tmp)}
        _write_file_synced(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1, sort_keys=True).encode())
        _fsync_dir(tmp)
        if final.exists():
            old = parent / f".tmp-{final.name}-old-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(parent, step, keep_last)
    return final


def _write_pieces(directory: Path, state: Mapping[str, Any]) -> None:
    import torch

    if state.get("model") is not None:
        _save_model(directory / "model.safetensors", state["model"])
    for key, filename in _TORCH_PIECES.items():
        if state.get(key) is not None:
            torch.save(state[key], directory / filename)
            _fsync_file(directory / filename)
    if state.get("trainer") is not None:
        _write_file_synced(directory / "trainer_state.json", _lossless_json(state["trainer"], "state['trainer']"))
    extra = state.get("extra") or {}
    if extra:
        (directory / "extra").mkdir()
    for name, value in extra.items():
        if not isinstance(name, str) or not _EXTRA_NAME.match(name):
            raise ValueError(f"extra piece name {name!r} must be a plain file stem like 'buffer' or 'spare_pool'")
        try:
            data = _lossless_json(value, f"state['extra'][{name!r}]")
        except ValueError:
            piece = directory / "extra" / f"{name}.pt"
            torch.save(value, piece)
            _fsync_file(piece)
            # Fail now, not at resume: the piece must load under weights_only=True like everything else.
            try:
                _torch_load(piece)
            except CheckpointError as err:
                raise ValueError(f"state['extra'][{name!r}] could not be checkpointed: {err}") from err
        else:
            _write_file_synced(directory / "extra" / f"{name}.json", data)


def _save_model(path: Path, state_dict: Mapping[str, Any]) -> None:
    """Save a state_dict with safetensors; tensors that are views of one another (tied weights) are stored
    once and the other names recorded in the metadata ``aliases`` (safetensors refuses shared storage)."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state['model'][{name!r}] is a {type(tensor).__name__}; model holds only tensors")
        view_key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
            tensor.device,
        )
        if view_key in seen:
            aliases[name] = seen[view_key]
            continue
        seen[view_key] = name
        tensor = tensor.detach().to("cpu")
        if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.contiguous().clone()  # a view into a larger buffer: safetensors wants it standalone
        tensors[name] = tensor
    save_file(tensors, str(path), metadata={"aliases": json.dumps(aliases)})
    _fsync_file(path)


def _lossless_json(value: object, what: str) -> bytes:
    """JSON bytes for ``value``, only if reading them back gives an equal value (no tuple→list, int-key→str)."""
    try:
        text = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what} is not JSON-able: {err}") from err
    if json.loads(text) != value:
        raise ValueError(
            f"{what} changes in a JSON round trip (tuples, non-str dict keys?); use lists and str keys"
        )
    return text.encode()


# --- verify / find / load --------------------------------------------------------------------
def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Return the manifest of ``path`` after checking every listed file's size and sha256; raise otherwise."""
    path = Path(path)
    marker = path / MANIFEST_FILE
    if not marker.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST_FILE} marker: the save did not finish; it is not a checkpoint")
    try:
        manifest = json.loads(marker.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{marker} is not a valid manifest ({err}); the checkpoint is corrupted") from err
    for relpath, expected in files.items():
        file = path / relpath
        if not file.is_file():
            raise CheckpointError(f"{path}: manifest lists {relpath} but the file is missing")
        size = file.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{path}: {relpath} has {size} bytes, manifest says {expected['size']}")
        if file_sha256(file) != expected["sha256"]:
            raise CheckpointError(f"{path}: {relpath} does not match its sha256 in the manifest (corrupted)")
    return manifest


def list_checkpoints(run_dir: RunDir | str | Path) -> list[tuple[int, Path]]:
    """Every ``step_<N>`` directory (complete or not), ascending by step."""
    return _step_dirs(RunDir.of(run_dir).checkpoints_dir)


def _step_dirs(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint directory from its name (``step_<N>``), or None for another name."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def latest_checkpoint(run_dir: RunDir | str | Path) -> Path | None:
    """The newest checkpoint whose manifest verifies, skipping (and logging) incomplete or corrupted ones."""
    for step, path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
        except CheckpointError as err:
            logger.warning("skipping checkpoint step %d: %s", step, err)
            continue
        return path
    return None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Verify the manifest of ``path``, then load it into the ``state`` shape :func:`save_checkpoint` takes."""
    path = Path(path)
    manifest = verify_checkpoint(path)
    files = manifest["files"]
    state: dict[str, Any] = {}
    if "model.safetensors" in files:
        state["model"] = _load_model(path / "model.safetensors")
    for key, filename in _TORCH_PIECES.items():
        if filename in files:
            state[key] = _torch_load(path / filename)
    if "trainer_state.json" in files:
        state["trainer"] = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    extra: dict[str, Any] = {}
    for relpath in sorted(files):
        stem = Path(relpath)
        if stem.parent.name != "extra":
            continue
        if stem.suffix == ".json":
            extra[stem.stem] = json.loads((path / relpath).read_text(encoding="utf-8"))
        else:
            extra[stem.stem] = _torch_load(path / relpath)
    if extra:
        state["extra"] = extra
    return state


def _load_model(path: Path) -> dict[str, Any]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    tensors = load_file(str(path))
    for alias, source in json.loads(metadata.get("aliases", "{}")).items():
        tensors[alias] = tensors[source]
    return tensors


def _torch_load(path: Path) -> Any:  # Any: what torch.load unpickled (tensors and plain containers)
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError (and others) for disallowed globals
        raise CheckpointError(
            f"{path} holds objects torch will not load with weights_only=True ({err}); save tensors and plain "
            "containers (dict/list/tuple/str/int/float/bool/None) instead"
        ) from err


# --- RNG -------------------------------------------------------------------------------------
def capture_rng_state() -> dict[str, Any]:
    """The states of python ``random``, numpy's global generator, torch CPU and (when present) CUDA.

    Only tensors and plain containers, so it loads with ``weights_only=True``.
    """
    import numpy as np
    import torch

    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = numpy_state["state"]["key"].tolist()
    return {
        "python": random.getstate(),
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back states from :func:`capture_rng_state`; the next draws repeat those after the capture."""
    import numpy as np
    import torch

    random.setstate(_as_tuples(state["python"]))
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = dict(numpy_state["state"], key=np.asarray(numpy_state["state"]["key"], dtype=np.uint32))
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value: Any) -> Any:  # Any: a JSON-like RNG state, its lists turned back into tuples
    # random.setstate needs tuples; a state that went through JSON would hold lists.
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


# --- files -----------------------------------------------------------------------------------
def _describe_files(directory: Path) -> dict[str, dict[str, Any]]:
    return {
        file.relative_to(directory).as_posix(): {"size": file.stat().st_size, "sha256": file_sha256(file)}
        for file in sorted(directory.rglob("*"))
        if file.is_file()
    }


def _write_file_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    # Makes the directory entries (new files, the rename) durable; not supported on every platform.
    with contextlib.suppress(OSError):
        _fsync_file(path)


def remove_partial_checkpoints(run_dir: RunDir | str | Path) -> int:
    """Delete the ``.tmp-*`` directories a killed save or prune left under ``checkpoints/``; return how many."""
    parent = RunDir.of(run_dir).checkpoints_dir
    return _remove_stale_tmp_dirs(parent) if parent.is_dir() else 0


def _remove_stale_tmp_dirs(parent: Path) -> int:
    removed = 0
    for entry in parent.iterdir():
        if entry.name.startswith(".tmp-") and entry.is_dir():
            logger.info("removing stale partial checkpoint %s", entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _prune(parent: Path, current_step: int, keep_last: int) -> None:
    complete = [
        (step, path)
        for step, path in _step_dirs(parent)
        if step <= current_step and (path / MANIFEST_FILE).is_file()
    ]
    for step, path in complete[:-keep_last]:
        logger.info("pruning checkpoint step %d (keep_last=%d)", step, keep_last)
        # Rename first (atomic), then delete: a process killed mid-delete must not leave a step_<N> whose manifest
        # survives its files. The next save removes the leftover .tmp-* directory.
        doomed = parent / f".tmp-pruned-{path.name}-{os.getpid()}"
        path.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
