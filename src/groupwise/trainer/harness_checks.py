"""The harness keys checked before any model loads (the function imports and takes a session, the command's
program exists), and resolved against the loaded tokenizer into what running sessions needs."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.config import ConfigError, ConfigIssue
from groupwise.harness.launch import HarnessSpec
from groupwise.plugins import PluginImportError, import_plugin

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from groupwise.config import RunConfig
    from groupwise.harness.runner import HarnessSettings


def harness_spec(cfg: RunConfig) -> tuple[HarnessSpec | None, list[ConfigIssue]]:
    """``(the harness, [])``, ``(None, [])`` without one, or ``(None, [the issue])``."""
    ep = cfg.episode
    if ep.harness is not None:
        fix = "name a function taking one argument (the session), as 'package.module:function' or 'file.py:function'"
        try:
            function = import_plugin(ep.harness, "episode.harness")
        except PluginImportError as exc:
            return None, [ConfigIssue("episode.harness", ep.harness, str(exc), fix)]
        if not callable(function) or not _takes_one_argument(function):
            return None, [
                ConfigIssue(
                    "episode.harness", ep.harness, "it is not a function taking one argument (the session)", fix
                )
            ]
        return HarnessSpec(ep.harness, function=function), []
    if ep.harness_command is not None:
        program = ep.harness_command[0]
        if shutil.which(program) is None and not Path(program).is_file():
            return None, [
                ConfigIssue(
                    "episode.harness_command",
                    ep.harness_command,
                    f"its program {program!r} is neither on PATH nor a file here",
                    "give the program's name on PATH or its path (relative to the working directory)",
                )
            ]
        return HarnessSpec(" ".join(ep.harness_command), command=tuple(ep.harness_command)), []
    return None, []


def _takes_one_argument(function: object) -> bool:
    try:
        inspect.signature(function).bind(None)  # type: ignore[arg-type]  # checked callable by the caller
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): leave it to the run
        return True
    return True


def harness_settings(
    cfg: RunConfig, spec: HarnessSpec, tokenizer: PreTrainedTokenizerBase, positions: int | None
) -> HarnessSettings:
    """The harness keys resolved against the loaded tokenizer: :class:`ConfigError` when there is no chat template
    to render requests with. A template that rewrites earlier turns is accepted: a request whose history it
    rewrote starts a new sequence (docs/harnesses.md)."""
    # the endpoint's pieces import torch (the generator interface): not needed by the checks above, which run first
    from groupwise.episodes.failure_streak import FailureStreak
    from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE
    from groupwise.episodes.tool_formats import tool_format
    from groupwise.harness.endpoint import EndpointSettings
    from groupwise.harness.live import SessionLimits
    from groupwise.harness.render import RequestRenderer
    from groupwise.harness.runner import HarnessSettings
    from groupwise.model.encode import has_chat_template

    ep = cfg.episode
    template = PLAIN_CHAT_TEMPLATE if ep.chat_template == "plain" else ep.chat_template
    if template is None and not has_chat_template(tokenizer):
        raise ConfigError(
            [
                ConfigIssue(
                    "episode.chat_template",
                    None,
                    "the tokenizer has no chat template to render a harness's messages",
                    "set episode.chat_template: plain, or give a Jinja chat template",
                )
            ]
        )
    template_text = template if template is not None else str(tokenizer.chat_template)
    renderer = RequestRenderer(tokenizer, template, tool_format(ep.tool_format, template_text))
    max_new = cfg.generation.max_new_tokens
    limits = SessionLimits(ep.max_turns, ep.token_budget(max_new), max_new, ep.max_observation_tokens, positions)
    endpoint = EndpointSettings(ep.endpoint.host, ep.endpoint.port, ep.endpoint.max_body_bytes, ep.endpoint.model_name)
    streak = FailureStreak(ep.max_consecutive_failures, f"harness {spec.name!r}")
    return HarnessSettings(
        spec,
        renderer,
        limits,
        ep.harness_timeout_s,
        endpoint,
        ep.endpoint.batch_window_s,
        retries=ep.retry_failed_episodes,
        streak=streak,
    )
