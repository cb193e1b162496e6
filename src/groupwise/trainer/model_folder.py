"""What ``config check`` reads inside a Hugging Face model folder, and whether ``model.device`` exists here.

- ``config.json`` must be a JSON object: a damaged file otherwise fails deep inside transformers, after the run
  started loading.
- A folder whose ``config.json`` or ``tokenizer_config.json`` has an ``auto_map`` names Python code of its own.
  groupwise always passes ``trust_remote_code=False`` to transformers unless ``model.trust_remote_code: true``
  says otherwise (then the code runs when the model loads), so such a folder is refused up front, naming the
  entries, rather than failing to load or asking on the terminal whether to run the code.
- ``model.device: cuda`` (and ``generation.cuda_graphs: on``) need a CUDA device on this machine; without one the
  model would fail to load and the error would name the model instead of the device. Only these settings import
  torch to ask; every other config check stays torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.config import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config import ModelSection, RunConfig

REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")


def model_folder_issues(model: ModelSection, folder: Path) -> list[ConfigIssue]:
    """Problems of an existing model folder that holds a ``config.json``: unreadable JSON, custom code."""
    issues: list[ConfigIssue] = []
    auto_maps: dict[str, list[str]] = {}
    for name in REMOTE_CODE_FILES:
        file = folder / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            reason = str(exc) if not isinstance(exc, RecursionError) else "nested too deep"
            issues.append(ConfigIssue(
                "model.path", model.path, f"{file.absolute()} is not readable JSON ({reason}), so the folder is not a "
                "usable model", f"restore {name} from where the model came from (it must be a JSON object)",
            ))
            continue
        if not isinstance(data, dict):
            issues.append(ConfigIssue(
                "model.path", model.path, f"{file.absolute()} holds a JSON {type(data).__name__}, not an object",
                f"restore {name} from where the model came from (it must be a JSON object)",
            ))
            continue
        auto_map = data.get("auto_map")
        if auto_map:
            auto_maps[name] = sorted(auto_map) if isinstance(auto_map, dict) else [str(auto_map)]
    if auto_maps and not model.trust_remote_code:
        named = "; ".join(f"{name}: auto_map {entries}" for name, entries in auto_maps.items())
        issues.append(ConfigIssue(
            "model.trust_remote_code", False,
            f"{folder.absolute()} names custom Python code ({named}); groupwise never runs a model folder's code "
            "unless model.trust_remote_code is true",
            "read the folder's .py files and set model.trust_remote_code: true if you trust them, or use a copy of "
            "the model without auto_map (transformers' own class for its model_type)",
        ))
    return issues


def device_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """``model.device: cuda``, or ``generation.cuda_graphs: on``, on a machine where torch sees no CUDA device."""
    wants_cuda = cfg.model.device == "cuda"
    wants_graphs = cfg.generation.cuda_graphs == "on" and cfg.model.device == "auto"
    if not (wants_cuda or wants_graphs):
        return []
    import torch  # only for these settings: asking whether CUDA exists needs it

    if torch.cuda.is_available():
        return []
    why = "this torch build has no CUDA support" if torch.version.cuda is None else "torch sees no CUDA device"
    if wants_cuda:
        return [ConfigIssue(
            "model.device", "cuda", f"model.device is cuda, but {why} on this machine",
            "set model.device: auto (CUDA when there is one, else the CPU) or cpu, or run on a machine with a GPU",
        )]
    return [ConfigIssue(
        "generation.cuda_graphs", "on", f"CUDA graphs need a CUDA device; model.device 'auto' is the CPU here ({why})",
        "run on a machine with a CUDA GPU, or set generation.cuda_graphs: auto",
    )]
