"""Cross-field rules of the model, data, GRPO, optimizer and runtime sections (all modes; the rules of the loss and
the advantages are in :mod:`groupwise.config.loss_rules`).

Each rule yields every violation it finds, naming the key path, the value given, the rule and the fix.
A key that has no effect in the chosen setting is an error (invariant 10 in docs/design.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.algorithm import MAX_REWARD_VALUE
from groupwise.config.checks import no_effect, rule
from groupwise.config.generation_schema import BUILTIN_ENGINE_KEYS
from groupwise.config.issues import ConfigIssue
from groupwise.config.model_schema import BUNDLED_GGUF_PATH
from groupwise.config.sections import builtin_reward_range_width, builtin_task_names

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


@rule("model")
def model_source_keys(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """model.source decides which of model.path, model.gguf_file and model.tiny are needed or allowed."""
    model = cfg.model
    if model.source in ("hf", "gguf") and model.path is None:
        if model.source == "hf":
            what, fix = "a Hugging Face model directory", "set model.path (relative to the working directory)"
        else:
            what = "the directory holding the GGUF file"
            fix = f"set model.path to that directory, or to '{BUNDLED_GGUF_PATH}' for the bundled SmolLM2 file"
        yield ConfigIssue("model.path", None, f"model.source '{model.source}' needs model.path ({what})", fix)
    if model.source == "gguf" and model.gguf_file is None and model.path not in (None, BUNDLED_GGUF_PATH):
        yield ConfigIssue(
            "model.gguf_file", None, "model.source 'gguf' needs model.gguf_file (the file name inside model.path)",
            "set model.gguf_file, e.g. 'model.Q8_0.gguf', or use model.path: smollm2 for the bundled file",
        )
    if model.source == "tiny" and model.path is not None:
        yield ConfigIssue(
            "model.path", model.path, "model.source 'tiny' builds a random-init model and reads no model.path",
            "remove model.path, or set model.source: hf to load that directory",
        )
    if model.source != "gguf" and model.gguf_file is not None:
        yield ConfigIssue(
            "model.gguf_file", model.gguf_file, f"model.gguf_file has no effect with model.source '{model.source}'",
            "remove model.gguf_file, or set model.source: gguf",
        )
    if model.source != "gguf" and model.gguf_cache != type(model).model_fields["gguf_cache"].default:
        yield ConfigIssue(
            "model.gguf_cache", model.gguf_cache, f"model.gguf_cache has no effect with model.source '{model.source}'",
            "remove model.gguf_cache, or set model.source: gguf",
        )
    if model.source != "tiny":
        yield from no_effect(model.tiny, "model.tiny", f"with model.source '{model.source}'",
                             "remove it, or set model.source: tiny")
    if model.source != "hf" and model.trust_remote_code:
        yield ConfigIssue(
            "model.trust_remote_code", True,
            f"model.trust_remote_code has no effect with model.source '{model.source}' (only a Hugging Face model "
            "folder can name code to run)", "remove model.trust_remote_code, or set model.source: hf",
        )


@rule("generation")
def continuous_batching_needs_the_fast_step(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """generation.continuous_batching needs generation.fast_decode (rows share the fast step's static slots)."""
    if cfg.generation.continuous_batching and not cfg.generation.fast_decode:
        yield ConfigIssue(
            "generation.continuous_batching", True,
            "continuous batching decodes on the fast step's static slots, which generation.fast_decode: false turns "
            "off", "remove generation.continuous_batching, or set generation.fast_decode: true",
        )


@rule("generation")
def builtin_engine_keys_need_the_builtin_backend(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """generation.fast_decode, cuda_graphs, compile and projections are the built-in engine's; another backend
    leaves them at their defaults."""
    gen = cfg.generation
    if gen.backend == "builtin":
        return
    defaults = type(gen)()
    for key in BUILTIN_ENGINE_KEYS:
        value = getattr(gen, key)
        if value != getattr(defaults, key):
            yield ConfigIssue(f"generation.{key}", value,
                              f"generation.{key} is a setting of the built-in engine, not of backend '{gen.backend}'",
                              f"remove generation.{key}, or set generation.backend: builtin")  # fmt: skip


@rule("model")
def tiny_model_heads(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """A tiny model needs model.tiny.hidden_size divisible by model.tiny.num_heads."""
    tiny = cfg.model.tiny
    if cfg.model.source == "tiny" and tiny.hidden_size % tiny.num_heads:
        yield ConfigIssue(
            "model.tiny.hidden_size", tiny.hidden_size,
            f"model.tiny.hidden_size must be divisible by model.tiny.num_heads ({tiny.num_heads})",
            f"use a multiple of {tiny.num_heads}, e.g. {tiny.num_heads * max(1, tiny.hidden_size // tiny.num_heads)}",
        )


@rule("model", "generation")
def tiny_model_positions(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """A tiny model needs model.tiny.max_position_embeddings > generation.max_new_tokens."""
    tiny = cfg.model.tiny
    if cfg.model.source == "tiny" and tiny.max_position_embeddings <= cfg.generation.max_new_tokens:
        yield ConfigIssue(
            "model.tiny.max_position_embeddings", tiny.max_position_embeddings,
            f"model.tiny.max_position_embeddings must exceed generation.max_new_tokens "
            f"({cfg.generation.max_new_tokens}) to leave room for the prompt",
            "raise model.tiny.max_position_embeddings or lower generation.max_new_tokens",
        )


@rule("model", "generation")
def cuda_graphs_need_cuda_and_the_fast_step(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """generation.cuda_graphs other than auto needs a model.device that can be CUDA and generation.fast_decode."""
    mode = cfg.generation.cuda_graphs
    if mode == "auto":
        return
    if cfg.model.device == "cpu":
        if mode == "on":
            yield ConfigIssue("generation.cuda_graphs", mode, "CUDA graphs need a CUDA device, not model.device 'cpu'",
                              "set model.device: cuda (or auto on a GPU machine), or generation.cuda_graphs: auto")
        else:
            yield ConfigIssue("generation.cuda_graphs", mode,
                              "generation.cuda_graphs 'off' has no effect with model.device 'cpu' (a CPU uses none)",
                              "remove generation.cuda_graphs")
    if not cfg.generation.fast_decode:
        yield ConfigIssue(
            "generation.cuda_graphs", mode,
            "CUDA graphs capture the fast decode step, which generation.fast_decode: false turns off",
            "remove generation.cuda_graphs (no graphs without the fast step), or set generation.fast_decode: true",
        )



@rule("data")
def data_task_keys(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """data.task jsonl needs data.jsonl.train_path; only the chosen task's sub-section may be changed."""
    data = cfg.data
    if data.task == "jsonl" and data.jsonl.train_path is None:
        yield ConfigIssue(
            "data.jsonl.train_path", None, "data.task 'jsonl' needs data.jsonl.train_path",
            "set data.jsonl.train_path to a JSON-lines file (relative to the working directory)",
        )
    for task in builtin_task_names():
        if task != data.task:
            yield from no_effect(getattr(data, task), f"data.{task}", f"with data.task '{data.task}'",
                                 f"remove it, or set data.task: {task}")
    if data.kwargs and data.task in builtin_task_names():
        yield ConfigIssue(
            "data.kwargs", data.kwargs, f"data.kwargs are for a plug-in task class; the built-in task '{data.task}' "
            f"takes its settings from data.{data.task}", f"move them to data.{data.task}, or remove data.kwargs",
        )
    if data.addition.min_digits > data.addition.max_digits:
        yield ConfigIssue(
            "data.addition.max_digits", data.addition.max_digits,
            f"data.addition.max_digits must be ≥ data.addition.min_digits ({data.addition.min_digits})",
            "raise data.addition.max_digits or lower data.addition.min_digits",
        )


@rule("grpo")
def dynamic_sampling_needs_groups(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Dynamic sampling needs G ≥ 2; leave-one-out baselines need G ≥ 2."""
    grpo = cfg.grpo
    g = grpo.num_generations_per_prompt
    if grpo.dynamic_sampling.enabled and g < 2:
        yield ConfigIssue(
            "grpo.num_generations_per_prompt", g,
            "dynamic sampling needs at least 2 generations per prompt (a group of 1 always has zero variance, "
            "so every group would be filtered)",
            "set grpo.num_generations_per_prompt ≥ 2, or grpo.dynamic_sampling.enabled: false",
        )
    if grpo.baseline == "leave_one_out" and g < 2:
        yield ConfigIssue(
            "grpo.baseline", grpo.baseline, "a leave-one-out baseline needs at least 2 generations per prompt",
            "set grpo.num_generations_per_prompt ≥ 2, or grpo.baseline: mean",
        )


@rule("grpo", "loss")
def one_generation_trains_nothing(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """G = 1 without an entropy or KL term trains nothing: a group of one is its own baseline, so every advantage
    is 0 and so is every gradient.

    (With ``loss.entropy_coef`` or ``loss.kl_coef`` > 0 the run still moves the weights, by that term alone: a
    hazard, warned about, not an error. With dynamic sampling G = 1 is refused by the rule above.)"""
    grpo, loss = cfg.grpo, cfg.loss
    if grpo.num_generations_per_prompt == 1 and not grpo.dynamic_sampling.enabled and not (
        loss.entropy_coef > 0 or loss.kl_coef > 0
    ):
        yield ConfigIssue(
            "grpo.num_generations_per_prompt", 1,
            "one completion per prompt is its own group baseline: every advantage is exactly 0, so the "
            "policy-gradient loss and every gradient are 0 and the run would train nothing",
            "set grpo.num_generations_per_prompt ≥ 2 (GRPO compares completions of one prompt)",
        )


@rule("grpo", "reward", "data", "episode")
def zero_variance_tol_below_the_reward_range(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """With dynamic sampling and a built-in reward (every built-in scores in [0, 1]),
    grpo.dynamic_sampling.zero_variance_tol < 1: at 1 or more every group counts as zero-variance and is filtered."""
    ds = cfg.grpo.dynamic_sampling
    width = builtin_reward_range_width(cfg.reward.function, cfg.data.task)
    if cfg.episode.enabled:  # the environment scores, in a range of its own
        return
    if ds.enabled and width is not None and ds.zero_variance_tol >= width:
        yield ConfigIssue(
            "grpo.dynamic_sampling.zero_variance_tol", ds.zero_variance_tol,
            f"the reward ({cfg.reward.function}) scores in [0, {width:g}], so max − min of a group's rewards is at "
            f"most {width:g} ≤ zero_variance_tol: every group would count as zero-variance and be filtered, and no "
            "step could fill",
            f"set zero_variance_tol below {width:g} (0 = filter only groups whose rewards are all equal)",
        )


@rule("mode", "grpo")
def sync_dynamic_sampling_off_keys(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Sync mode with dynamic sampling off: its knobs keep their defaults (so batch_multiplier == 1)."""
    ds = cfg.grpo.dynamic_sampling
    if cfg.mode == "sync" and not ds.enabled:
        # zero_variance_tol still defines the zero-variance metric, so it keeps an effect with DS off
        yield from no_effect(ds, "grpo.dynamic_sampling", "with grpo.dynamic_sampling.enabled false",
                             "remove it, or set grpo.dynamic_sampling.enabled: true",
                             keep=("enabled", "zero_variance_tol"))


@rule("mode", "grpo", "loss")
def carried_surplus_needs_importance_sampling(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Sync mode: grpo.dynamic_sampling.surplus carry needs loss.importance_sampling."""
    ds = cfg.grpo.dynamic_sampling
    if cfg.mode == "sync" and ds.enabled and ds.surplus == "carry" and not cfg.loss.importance_sampling:
        yield ConfigIssue(
            "grpo.dynamic_sampling.surplus", ds.surplus,
            "carried surplus groups are one version off-policy and need importance-sampling correction",
            "set loss.importance_sampling: true, or grpo.dynamic_sampling.surplus: discard",
        )


@rule("grpo")
def advantage_clip_order(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """grpo.advantage_clip_low < grpo.advantage_clip_high when both are set."""
    low, high = cfg.grpo.advantage_clip_low, cfg.grpo.advantage_clip_high
    if low is not None and high is not None and low >= high:
        yield ConfigIssue(
            "grpo.advantage_clip_low", low, f"grpo.advantage_clip_low must be < grpo.advantage_clip_high ({high})",
            "lower advantage_clip_low or raise advantage_clip_high (or set one to null)",
        )


@rule("grpo")
def reward_scaling_range(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Reward scaling needs source_max > source_min and target_max > target_min; off, its keys keep defaults."""
    scaling = cfg.grpo.reward_scaling
    if not scaling.enabled:
        yield from no_effect(scaling, "grpo.reward_scaling", "with grpo.reward_scaling.enabled false",
                             "remove it, or set grpo.reward_scaling.enabled: true", keep=("enabled",))
        return
    empty = False
    for side in ("source", "target"):
        low, high = getattr(scaling, f"{side}_min"), getattr(scaling, f"{side}_max")
        if high <= low:
            empty = True
            yield ConfigIssue(
                f"grpo.reward_scaling.{side}_max", high,
                f"grpo.reward_scaling.{side}_max must be > {side}_min ({low}); an empty range cannot be mapped",
                f"set {side}_max above {side}_min",
            )
    if not empty:
        slope = (scaling.target_max - scaling.target_min) / (scaling.source_max - scaling.source_min)
        if not slope <= MAX_REWARD_VALUE:
            yield ConfigIssue(
                "grpo.reward_scaling.source_max", scaling.source_max,
                f"the map's slope, target range ÷ source range = {slope:g}, must be at most {MAX_REWARD_VALUE:g}: "
                "beyond it scaled rewards overflow to inf or NaN",
                "widen the source range (source_min..source_max) or narrow the target range",
            )


@rule("grpo", "generation")
def overlong_shaping_lengths(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Overlong shaping needs its three settings, buffer < max_response_length, and a reachable penalty zone."""
    shaping = cfg.grpo.overlong_shaping
    prefix = "grpo.overlong_shaping"
    if not shaping.enabled:
        yield from no_effect(shaping, prefix, f"with {prefix}.enabled false",
                             f"remove it, or set {prefix}.enabled: true", keep=("enabled",))
        return
    missing = [k for k in ("max_response_length", "overlong_buffer_length", "overlong_buffer_penalty")
               if getattr(shaping, k) is None]
    for key in missing:
        yield ConfigIssue(f"{prefix}.{key}", None, f"overlong shaping needs {prefix}.{key}",
                          f"set {prefix}.{key}, or {prefix}.enabled: false")
    length, buffer = shaping.max_response_length, shaping.overlong_buffer_length
    if length is None or buffer is None:
        return  # reported as missing above
    if buffer >= length:
        yield ConfigIssue(
            f"{prefix}.overlong_buffer_length", buffer,
            f"overlong_buffer_length must be < max_response_length ({length})",
            "shorten the buffer or raise max_response_length",
        )
    elif length - buffer >= cfg.generation.max_new_tokens:
        yield ConfigIssue(
            f"{prefix}.max_response_length", length,
            f"the penalty starts after max_response_length − overlong_buffer_length = "
            f"{length - buffer} tokens, which no completion reaches "
            f"(generation.max_new_tokens is {cfg.generation.max_new_tokens})",
            "set max_response_length to generation.max_new_tokens, or disable overlong shaping",
        )



@rule("optimizer")
def weight_decay_below_one_per_update(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """optimizer.lr × optimizer.weight_decay < 1 (decoupled decay multiplies each weight by 1 − lr × decay)."""
    opt = cfg.optimizer
    if opt.lr * opt.weight_decay >= 1:
        yield ConfigIssue(
            "optimizer.weight_decay", opt.weight_decay,
            f"each update multiplies every weight by 1 − lr × weight_decay = {1 - opt.lr * opt.weight_decay:g} "
            f"(optimizer.lr is {opt.lr:g}): at lr × weight_decay ≥ 1 the weights are zeroed or flip sign",
            f"set optimizer.weight_decay below {1 / opt.lr:g} (typical values are 0 to 0.1)",
        )


@rule("optimizer")
def min_lr_needs_decay(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """optimizer.min_lr_ratio keeps its default with schedule constant."""
    opt = cfg.optimizer
    if opt.schedule == "constant" and opt.min_lr_ratio != type(opt).model_fields["min_lr_ratio"].default:
        yield ConfigIssue(
            "optimizer.min_lr_ratio", opt.min_lr_ratio, "optimizer.min_lr_ratio has no effect with schedule constant",
            "remove optimizer.min_lr_ratio, or set optimizer.schedule: linear or cosine",
        )


@rule("runtime")
def ray_keys_need_ray(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """runtime.ray keys keep their defaults unless runtime.backend is ray."""
    if cfg.runtime.backend != "ray":
        yield from no_effect(cfg.runtime.ray, "runtime.ray", f"with runtime.backend '{cfg.runtime.backend}'",
                             "remove it, or set runtime.backend: ray")


@rule("model")
def lora_keys_need_lora(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """model.lora keys keep their defaults unless model.lora.enabled is true."""
    if not cfg.model.lora.enabled:
        yield from no_effect(cfg.model.lora, "model.lora", "with model.lora.enabled false",
                             "remove it, or set model.lora.enabled: true", keep=("enabled",))


@rule("optimizer", "grpo")
def mini_batches_of_whole_groups(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """optimizer.mini_batches_per_step ≤ grpo.num_prompts_per_step (each mini-batch holds whole groups)."""
    k, p = cfg.optimizer.mini_batches_per_step, cfg.grpo.num_prompts_per_step
    if k > p:
        yield ConfigIssue(
            "optimizer.mini_batches_per_step", k,
            f"a mini-batch holds whole prompt groups, and a step has only grpo.num_prompts_per_step = {p}",
            f"set optimizer.mini_batches_per_step ≤ {p}, or raise grpo.num_prompts_per_step",
        )



@rule("learner")
def learner_ranks(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """learner.sharding and learner.collective_timeout_s need learner.num_ranks ≥ 2."""
    learner = cfg.learner
    if learner.num_ranks == 1:
        yield from no_effect(learner, "learner", "with learner.num_ranks 1 (one learner process)",
                             "remove it, or set learner.num_ranks to 2 or more", keep=("num_ranks",))
