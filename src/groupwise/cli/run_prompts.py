"""Which prompts a run trained on: what ``groupwise audit`` checks a run's fates against.

A trained run's prompts are its task's training split; a simulated run's are the simulator's workload. Both are
rebuilt from the run's resolved ``config.yaml`` (a task and a workload are deterministic in the run seed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from transformers import PreTrainedTokenizerBase

    from groupwise.config import RunConfig
    from groupwise.episodes.replay import ReplayReport
    from groupwise.harness.replay import SessionReplayReport


def training_uids(cfg: RunConfig, simulated: bool) -> list[str]:
    """The uids of the prompts the run trained on: the task's, or the simulator's for a simulated run."""
    if simulated:
        from groupwise.sim.workload import SimWorkload, make_sim_prompts

        prompts, _ = make_sim_prompts(SimWorkload.from_config(cfg))
        return [prompt.uid for prompt in prompts]
    from groupwise.data.registry import build_task

    return [prompt.uid for prompt in build_task(cfg.data.task, cfg.data, cfg.run.seed).train_prompts()]


def replay_run_episodes(run_dir: Path) -> ReplayReport:
    """Replay the trained episodes of the run in ``run_dir`` (``groupwise audit --replay-episodes``); ValueError
    when the run has no ``episode.environment`` or it cannot be made."""
    from groupwise.config import config_from_dict
    from groupwise.config.load import read_config_file
    from groupwise.data.registry import build_task
    from groupwise.environments import ENVIRONMENTS
    from groupwise.episodes.environment import environment_factory
    from groupwise.episodes.replay import replay_train_data
    from groupwise.run.rundir import RunDir

    run = RunDir.of(run_dir)
    cfg = config_from_dict(read_config_file(run.config_path), source=str(run.config_path))
    if cfg.episode.environment is None:
        raise ValueError(f"{run.path} is not a run with episode.environment: there are no episodes to replay")
    factory = environment_factory(cfg.episode.environment, cfg.episode.kwargs, ENVIRONMENTS)
    prompts = {p.uid: p for p in build_task(cfg.data.task, cfg.data, cfg.run.seed).train_prompts()}
    steps = sorted(run.path.glob("train_data/step_*.jsonl"))
    return replay_train_data(steps, factory, prompts, cfg.episode.step_timeout_s)


def replay_run_sessions(run_dir: Path) -> SessionReplayReport:
    """Render every logged request of the run's trained harness sessions again and compare the sequences they
    give with the trained rows (``groupwise audit --replay-sessions``); ValueError when the run has no harness."""
    from groupwise.config import config_from_dict
    from groupwise.config.load import read_config_file
    from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE
    from groupwise.episodes.tool_formats import tool_format
    from groupwise.harness.render import RequestRenderer
    from groupwise.harness.replay import replay_sessions
    from groupwise.run.rundir import RunDir

    run = RunDir.of(run_dir)
    cfg = config_from_dict(read_config_file(run.config_path), source=str(run.config_path))
    if not cfg.episode.harnessed:
        raise ValueError(f"{run.path} is not a run with episode.harness: there are no sessions to replay")
    tokenizer = run_tokenizer(cfg, run.final_dir)
    template = PLAIN_CHAT_TEMPLATE if cfg.episode.chat_template == "plain" else cfg.episode.chat_template
    text = template if template is not None else str(tokenizer.chat_template)
    renderer = RequestRenderer(tokenizer, template, tool_format(cfg.episode.tool_format, text))
    steps = sorted(run.path.glob("train_data/step_*.jsonl"))

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False))

    return replay_sessions(steps, renderer, decode, cfg.episode.max_observation_tokens)


def run_tokenizer(cfg: RunConfig, final_dir: Path) -> PreTrainedTokenizerBase:
    """The run's tokenizer: the one saved with its final policy, else the one its model source loads."""
    from transformers import AutoTokenizer

    from groupwise.model import build_char_tokenizer
    from groupwise.model.gguf_files import resolve_gguf

    if (final_dir / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(final_dir), local_files_only=True)
    model = cfg.model
    if model.source == "tiny":
        return build_char_tokenizer(model.tiny.vocab)
    if model.source == "gguf":
        gguf = resolve_gguf(model.path, model.gguf_file)
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    return AutoTokenizer.from_pretrained(str(model.path), local_files_only=True)
