"""A GGUF checkpoint as a plain float model and tokenizer, dequantised once and then read from the cache.

Where the cache lives and how an entry is keyed (by the file's content and the dtype):
:mod:`groupwise.model.gguf_files`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from groupwise.model.gguf_files import SOURCE_FILE, cache_entry, recorded_identity

Note = Callable[[str], None]
# transformers passes local_files_only on to everything but its adapter lookup, which needs it in adapter_kwargs
OFFLINE: dict[str, Any] = {"local_files_only": True, "adapter_kwargs": {"local_files_only": True}}
# transformers 5 turns Hub kernels on by default: layers may be swapped for code fetched from the Hub, and every
# train/eval switch (two a step: generation runs in eval mode) kernelizes the model again (0.7 ms a switch pair on
# the tiny model). A policy computes with torch's own layers, whatever the Hub serves.
TORCH_LAYERS: dict[str, Any] = {"use_kernels": False}


def dequantise_gguf(gguf: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise a GGUF checkpoint, then copy its weights into a plain model built from its config.

    transformers marks a GGUF-loaded model as quantized and refuses to ``save_pretrained`` it; the
    plain copy (same config minus ``quantization_config``) saves like any other model.
    """
    directory, filename = gguf.parent, gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename, local_files_only=True,
                                              trust_remote_code=False)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=dtype, **OFFLINE, **TORCH_LAYERS,
                                                  trust_remote_code=False)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.config.architectures = [type(plain).__name__]  # as save_pretrained records it: a cached copy is the same
    return plain, tokenizer


def load_gguf(
    gguf: Path, dtype: torch.dtype, cache_root: Path | None, note: Note
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` of ``gguf``: from its cache entry under ``cache_root`` when there is one, else
    dequantised (and stored there when ``cache_root`` is given). ``note`` hears which of the two happened.

    An entry that cannot be read (deleted files, say) is removed and made again; an entry that cannot be written
    (a read-only or full disk) leaves the run dequantising, with a note saying why."""
    if cache_root is None:
        note(f"dequantising {gguf.name} (no cache: model.gguf_cache is off)")
        return dequantise_gguf(gguf, dtype)
    entry = cache_entry(gguf, cache_root, str(dtype).removeprefix("torch."))
    if entry.is_dir():
        try:
            loaded = _load_entry(entry, dtype)
        except Exception as err:  # noqa: BLE001 — any unreadable entry is rebuilt, never trusted
            note(f"the cached copy {entry} could not be read ({type(err).__name__}: {err}); dequantising again")
            shutil.rmtree(entry, ignore_errors=True)
        else:
            note(f"read the dequantised {gguf.name} from the cache {entry}")
            return loaded
    note(f"dequantising {gguf.name} once; the float copy is cached in {entry}")
    model, tokenizer = dequantise_gguf(gguf, dtype)
    try:
        _store_entry(entry, model, tokenizer, recorded_identity(gguf, str(dtype).removeprefix("torch.")))
    except OSError as err:
        note(f"could not cache the dequantised copy in {entry} ({err}); the next run dequantises again")
    return model, tokenizer


def _load_entry(entry: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model = AutoModelForCausalLM.from_pretrained(entry, dtype=dtype, **OFFLINE, **TORCH_LAYERS, trust_remote_code=False)
    return model, AutoTokenizer.from_pretrained(entry, local_files_only=True, trust_remote_code=False)


def _store_entry(
    entry: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, identity: dict[str, object]
) -> None:
    """Write the entry into a temporary sibling, then rename it into place: readers see all of it or nothing. When
    another process got there first, its entry (of the same file) is kept and ours is dropped."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / SOURCE_FILE).write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(staging, entry)
        except OSError:
            if not entry.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
