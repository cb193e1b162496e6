"""The cases of the config fuzz (``bench/config_fuzz.py``): hostile configs and data files, one mutation class each.

Every case starts from a valid tiny config and applies one mutation class (chosen round-robin, the variant and its
values drawn from a seeded RNG):

* ``bounds``: an alias bomb in ``reward.kwargs``, nesting past the depth limit, a 101–5,000 digit integer, more than
  1 MiB of YAML;
* ``duplicate_key``: two ``run:`` blocks, a nested key twice, a ``reward.kwargs`` key twice, an override given twice;
* ``yaml11_number``: base-60 (``1:30``) or leading-zero octal (``010``), in the file or in an override;
* ``run_name`` / ``seed`` / ``path``: a NUL byte, 300 characters, a slash or a newline in ``run.name``; 2^64, −1 or
  ``1:30`` as the seed; ``run.output_dir`` a file or under one, a missing or non-model ``model.path``, a missing
  JSONL file;
* ``data_line``: JSONL files with malformed JSON, empty prompts, missing answers, duplicate ids, non-objects;
* ``reward``: a reward module that does not import, a misspelled ``reward.kwargs`` key; ``prompt_count``: more
  prompts per step than the dataset holds;
* ``jsonl_input``: JSONL lines nested 65 to 100,000 deep, a lone surrogate escape (``\\ud800``) in the prompt, a
  chat turn, the answer, the id or metadata, a 5,000-digit integer;
* ``numeric_bound``: values whose training arithmetic overflows (``reward.timeout_s: 1e10``, ``optimizer.lr: 1e38``,
  lr × weight_decay ≥ 1, an AdamW eps of 1e-300, coefficients, clips and reward-scale values of 1e300);
* ``train_refuses``: what ``train`` used to refuse or fail on after ``config check`` passed: built-in verifier kwargs
  out of range, answers a numeric verifier cannot read (a word, 100,000 digits), ``run.output_dir`` under /proc,
  ``model.device: cuda`` without CUDA, a model folder whose ``config.json`` is not JSON or names custom code;
* ``meaningless``: G = 1 without dynamic sampling (every advantage 0), a zero-variance tolerance at or above the
  reward's range (every group filtered);
* ``value``: random values at random valid keys (the mutation test's values), which may be valid or not.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CLASSES = ("bounds", "duplicate_key", "yaml11_number", "run_name", "seed", "path", "data_line", "reward",
           "prompt_count", "jsonl_input", "numeric_bound", "train_refuses", "meaningless", "value")  # fmt: skip
TINY_MODEL = {"source": "tiny", "tiny": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 16,
                                         "max_position_embeddings": 32}}  # fmt: skip


@dataclass
class Case:
    """One fuzzed input: the config text, overrides and files (paths relative to the case directory)."""

    kind: str
    variant: str
    text: str
    overrides: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    must_refuse: bool = True
    key: str | None = None  # what the refusal must name (None: any message)


def base_config(workdir: Path) -> dict:
    return {
        "model": copy.deepcopy(TINY_MODEL),
        "run": {"name": "fuzz", "output_dir": str(workdir / "runs"), "max_steps": 1},
        "data": {"task": "addition", "addition": {"num_eval": 4}},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "dynamic_sampling": {"enabled": False}},
        "generation": {"max_new_tokens": 4},
        "logging": {"tensorboard": False, "progress": False},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"save_final": False},
    }


def dump(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=10_000)


def make_case(kind: str, rng: random.Random, workdir: Path) -> Case:
    """A case of mutation class ``kind``; its files go under ``workdir`` (see :func:`write_case`)."""
    config = base_config(workdir)
    return _MAKERS[kind](config, rng, workdir)


def _bounds(config: dict, rng: random.Random, workdir: Path) -> Case:
    variant = rng.choice(["alias_bomb", "deep", "huge_int", "oversized"])
    text = dump(config)
    if variant == "alias_bomb":
        levels = rng.randint(6, 9)
        lines = ["reward:", "  kwargs:", "    l0: &l0 [" + ", ".join(['"x"'] * 10) + "]"]
        lines += [f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
        return Case("bounds", variant, text + "\n".join(lines) + "\n")
    if variant == "deep":
        depth = rng.choice([33, 100, 1000, 20_000])
        return Case("bounds", variant, text + "reward:\n  kwargs:\n    x: " + "[" * depth + "]" * depth + "\n")
    if variant == "huge_int":
        digits = rng.randint(101, 5000)
        return Case("bounds", variant, text.replace("max_steps: 1", "max_steps: " + "7" * digits), key="run.max_steps")
    return Case("bounds", variant, text + "reward:\n  kwargs:\n    blob: '" + "a" * (1 << 20) + "'\n")


def _duplicate_key(config: dict, rng: random.Random, workdir: Path) -> Case:
    variant = rng.choice(["section", "nested", "kwargs", "override"])
    text = dump(config)
    if variant == "section":
        return Case("duplicate_key", variant, text + "run:\n  seed: 3\n", key="run")
    if variant == "nested":
        return Case("duplicate_key", variant, text.replace("  num_prompts_per_step: 2\n",
                                                           "  num_prompts_per_step: 2\n  num_prompts_per_step: 4\n"),
                    key="grpo.num_prompts_per_step")
    if variant == "kwargs":
        return Case("duplicate_key", variant, text, ["reward.kwargs={a: 1, a: 2}"], key="reward.kwargs.a")
    return Case("duplicate_key", variant, text, ["run.seed=1", "run.seed=2"], key="run.seed")


def _yaml11_number(config: dict, rng: random.Random, workdir: Path) -> Case:
    value = rng.choice(["1:30", "2:00:00", "010", "-1:45", "017"])
    key = rng.choice(["run.max_steps", "grpo.num_prompts_per_step", "run.seed", "reward.kwargs.t"])
    if rng.random() < 0.5:
        return Case("yaml11_number", f"override {value}", dump(config), [f"{key}={value}"], key=key)
    node = config
    for part in key.split(".")[:-1]:
        node = node.setdefault(part, {})
    node[key.rsplit(".", 1)[-1]] = "__VALUE__"
    return Case("yaml11_number", f"file {value}", dump(config).replace("__VALUE__", value), key=key)


def _run_name(config: dict, rng: random.Random, workdir: Path) -> Case:
    variant, name = rng.choice([("nul", "a\0b"), ("300 chars", "x" * 300), ("slash", "a/b"), ("newline", "a\nb"),
                                ("dot-dot", ".."), ("spaces", " padded "), ("tab", "a\tb")])
    config["run"]["name"] = name
    return Case("run_name", variant, dump(config), key="run.name")


def _seed(config: dict, rng: random.Random, workdir: Path) -> Case:
    variant, seed = rng.choice([("2^64", 2**64), ("2^63", 2**63), ("-1", -1), ("float", 1.5), ("string", "abc")])
    config["run"]["seed"] = seed
    return Case("seed", variant, dump(config), key="run.seed")


def _path(config: dict, rng: random.Random, workdir: Path) -> Case:
    variant = rng.choice(["output_dir is a file", "output_dir under a file", "missing model dir", "not a model dir",
                          "missing jsonl", "jsonl is a directory"])
    files: dict[str, str] = {}
    key = "run.output_dir"
    if variant == "output_dir is a file":
        files["runs"] = "a file\n"
    elif variant == "output_dir under a file":
        files["blocker"] = "a file\n"
        config["run"]["output_dir"] = str(workdir / "blocker" / "runs")
    elif variant in ("missing model dir", "not a model dir"):
        config["model"] = {"source": "hf", "path": str(workdir / "model")}
        if variant == "not a model dir":
            files["model/README"] = "no config.json here\n"
        key = "model.path"
    else:
        config["data"] = {"task": "jsonl", "jsonl": {"train_path": str(workdir / "train.jsonl")}}
        if variant == "jsonl is a directory":
            files["train.jsonl/README"] = "a directory\n"
        key = "data.jsonl.train_path"
    return Case("path", variant, dump(config), files=files, key=key)


_BAD_LINES = ['{"prompt": "1+1=", "answer": 2', '{"prompt": "", "answer": "1"}', '{"prompt": "1+1="}',
              '{"prompt": "a", "messages": [{"role": "user", "content": "b"}], "answer": "1"}', "[1, 2]",
              '{"prompt": "1+2=", "answer": true}', '{"messages": [], "answer": "1"}', '{"prompt": 5, "answer": "5"}',
              '{"prompt": "dup", "answer": "1", "id": "same"}']  # fmt: skip


def _data_line(config: dict, rng: random.Random, workdir: Path) -> Case:
    good = [json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) for i in range(rng.randint(4, 40))]
    bad = rng.sample(_BAD_LINES, rng.randint(1, 4))
    lines = good + bad + (['{"prompt": "dup2", "answer": "1", "id": "same"}'] if _BAD_LINES[-1] in bad else [])
    rng.shuffle(lines)
    config["data"] = {"task": "jsonl", "jsonl": {"train_path": str(workdir / "train.jsonl")}}
    return Case("data_line", f"{len(bad)} bad of {len(lines)}", dump(config), files={"train.jsonl": "\n".join(lines)},
                key="data.jsonl.train_path")


def _reward(config: dict, rng: random.Random, workdir: Path) -> Case:
    if rng.random() < 0.5:
        config["reward"] = {"function": rng.choice(["mytask.rewardz:fn", "json:no_such_function", "math:pi"])}
        return Case("reward", "does not import", dump(config), key="reward.function")
    config["reward"] = {"function": "exact_numeric", "kwargs": {rng.choice(["partial_credt", "credit", "x"]): 0.5}}
    return Case("reward", "misspelled kwarg", dump(config), key="reward.kwargs")


def _prompt_count(config: dict, rng: random.Random, workdir: Path) -> Case:
    prompts = rng.randint(1, 20)
    lines = [json.dumps({"prompt": f"{i}+0=", "answer": i}) for i in range(prompts)]
    config["data"] = {"task": "jsonl", "jsonl": {"train_path": str(workdir / "train.jsonl")}}
    config["grpo"]["num_prompts_per_step"] = prompts + rng.randint(1, 50)
    return Case("prompt_count", f"P > {prompts}", dump(config), files={"train.jsonl": "\n".join(lines)},
                key="grpo.num_prompts_per_step")


def _jsonl_input(config: dict, rng: random.Random, workdir: Path) -> Case:
    good = [json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) for i in range(rng.randint(4, 20))]
    depth = rng.choice([65, 1000, 20_000, 100_000])
    variant, bad = rng.choice([
        (f"nested {depth}", "[" * depth + "]" * depth),
        (f"metadata nested {depth}", '{"prompt": "1+1=", "answer": "2", "m": ' + "[" * depth + "]" * depth + "}"),
        ("surrogate in prompt", '{"prompt": "1+1=\\ud800", "answer": "2"}'),
        ("surrogate in a turn", '{"messages": [{"role": "user", "content": "\\udfff?"}], "answer": "2"}'),
        ("surrogate in answer", '{"prompt": "1+1=", "answer": "\\ud83d"}'),
        ("surrogate in id", '{"prompt": "1+1=", "answer": "2", "id": "q\\udc80"}'),
        ("surrogate in metadata", '{"prompt": "1+1=", "answer": "2", "tags": ["\\ud800"]}'),
        ("5000-digit integer", '{"prompt": "1+1=", "answer": ' + "9" * 5000 + "}"),
    ])  # fmt: skip
    lines = [*good, bad]
    rng.shuffle(lines)
    config["data"] = {"task": "jsonl", "jsonl": {"train_path": str(workdir / "train.jsonl")}}
    return Case("jsonl_input", variant, dump(config), files={"train.jsonl": "\n".join(lines)},
                key="data.jsonl.train_path")


# (key, overrides): values whose arithmetic overflows in training, each refused naming the key
_OVERFLOWS = [
    ("reward.timeout_s", ["reward.timeout_s=1e10"]), ("reward.timeout_s", ["reward.timeout_s=1e300"]),
    ("optimizer.lr", ["optimizer.lr=1e38"]), ("optimizer.lr", ["optimizer.lr=5"]),
    ("optimizer.weight_decay", ["optimizer.weight_decay=1e300"]), ("optimizer.eps", ["optimizer.eps=1e-300"]),
    ("loss.is_ratio_max", ["loss.is_ratio_max=1e300"]), ("loss.entropy_coef", ["loss.entropy_coef=1e38"]),
    ("loss.kl_coef", ["model.reference=initial", "loss.kl_coef=1e300"]),
    ("loss.kl_input_clamp", ["model.reference=initial", "loss.kl_coef=0.1", "loss.kl_input_clamp=1e300"]),
    ("loss.epsilon_low", ["optimizer.mini_batches_per_step=2", "loss.epsilon_low=1e300"]),
    ("model.lora.alpha", ["model.lora.enabled=true", "model.lora.alpha=1e300"]),
    ("grpo.overlong_shaping.overlong_buffer_penalty",
     ["grpo.overlong_shaping={enabled: true, max_response_length: 4, overlong_buffer_length: 2, "
      "overlong_buffer_penalty: 1e300}"]),
    ("grpo.reward_scaling.target_max", ["grpo.reward_scaling={enabled: true, target_max: 1e300}"]),
    ("grpo.reward_scaling.source_max", ["grpo.reward_scaling={enabled: true, source_max: 1e-300}"]),
    ("sft.lr", ["sft.lr=1e38"]),
]  # fmt: skip


def _numeric_bound(config: dict, rng: random.Random, workdir: Path) -> Case:
    key, overrides = rng.choice(_OVERFLOWS)
    return Case("numeric_bound", " ".join(overrides)[:80], dump(config), list(overrides), key=key)


def _cuda_is_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _train_refuses(config: dict, rng: random.Random, workdir: Path) -> Case:
    variant = rng.choice(["partial_credit", "format_reward", "word answer", "100,000-digit answer", "under /proc",
                          "cuda without CUDA", "config.json not JSON", "auto_map"])
    files: dict[str, str] = {}
    if variant == "partial_credit":
        config["reward"] = {"function": "exact_numeric", "kwargs": {"partial_credit": rng.choice([5.0, -1.0, 1.5])}}
        return Case("train_refuses", variant, dump(config), key="reward.kwargs")
    if variant == "format_reward":
        config["data"] = {"task": "countdown", "countdown": {"num_eval": 4, "num_train": 50}}
        config["reward"] = {"function": "countdown", "kwargs": {"format_reward": rng.choice([1.0, 2.0, -0.5])}}
        return Case("train_refuses", variant, dump(config), key="reward.kwargs")
    if variant in ("word answer", "100,000-digit answer"):
        answer = rng.choice(["four", "1/2", "3 apples", ""]) if variant == "word answer" else "7" * 100_000
        lines = [json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) for i in range(rng.randint(4, 20))]
        lines.insert(rng.randrange(len(lines) + 1), json.dumps({"prompt": "2+2=", "answer": answer}))
        config["data"] = {"task": "jsonl", "jsonl": {"train_path": str(workdir / "train.jsonl")}}
        return Case("train_refuses", variant, dump(config), files={"train.jsonl": "\n".join(lines)},
                    key="data.jsonl.train_path")
    if variant == "under /proc":
        config["run"]["output_dir"] = rng.choice(["/proc/groupwise-runs", "/proc/self/runs", "/sys/runs"])
        return Case("train_refuses", variant, dump(config), key="run.output_dir")
    if variant == "cuda without CUDA":
        config["model"]["device"] = "cuda"
        config["generation"]["cuda_graphs"] = rng.choice(["on", "auto"])
        return Case("train_refuses", variant, dump(config), key="model.device", must_refuse=not _cuda_is_available())
    config["model"] = {"source": "hf", "path": str(workdir / "model")}
    if variant == "config.json not JSON":
        files["model/config.json"] = rng.choice(['{"model_type": "llama", ', "[1, 2]", "not json", ""])
        return Case("train_refuses", variant, dump(config), files=files, key="model.path")
    files["model/config.json"] = json.dumps({"model_type": "llama", "auto_map": {"AutoConfig": "custom.Config"}})
    files["model/custom.py"] = "raise SystemExit('the folder code ran')\n"
    return Case("train_refuses", variant, dump(config), files=files, key="model.trust_remote_code")


def _meaningless(config: dict, rng: random.Random, workdir: Path) -> Case:
    if rng.random() < 0.5:
        config["grpo"]["num_generations_per_prompt"] = 1
        return Case("meaningless", "G = 1 without dynamic sampling", dump(config),
                    key="grpo.num_generations_per_prompt")
    tol = rng.choice([1, 1.0, 2.5, 1e6])
    config["grpo"]["dynamic_sampling"] = {"enabled": True, "zero_variance_tol": tol}
    config["reward"] = {"function": rng.choice(["auto", "exact_numeric"])}
    return Case("meaningless", f"zero_variance_tol {tol}", dump(config), key="grpo.dynamic_sampling.zero_variance_tol")


_VALUES = [None, True, False, 0, -1, 1, 2, 7, 10**20, 0.5, -0.0, 1e308, "", "x", "1:30", "auto", "tiny", "hf", "async",
           "in_order", "custom", [], [1, "a"], {}, {"k": 1}]  # fmt: skip


def _value(config: dict, rng: random.Random, workdir: Path) -> Case:
    from groupwise.config import config_from_dict

    resolved = config_from_dict(config).model_dump(mode="json", by_alias=True)
    paths = [p for p in _leaf_paths(resolved) if not p.startswith(("run.output_dir", "run.name", "model.path",
                                                                    "data.jsonl"))]  # stay in the case directory
    changes = []
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        current = resolved
        for part in path.split("."):
            current = current[part]
        value = _near(current, rng) if rng.random() < 0.6 else rng.choice(_VALUES)
        node = config
        for part in path.split(".")[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path.rsplit(".", 1)[-1]] = value
        changes.append(f"{path}={value!r}")
    return Case("value", "; ".join(changes), dump(config), must_refuse=False)


def _leaf_paths(tree: dict, prefix: str = "") -> list[str]:
    paths = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        paths.extend(_leaf_paths(value, f"{path}.") if isinstance(value, dict) and value else [path])
    return paths


def _near(current: object, rng: random.Random) -> object:
    """A value of the same type as ``current`` (a key's resolved value), often a valid one."""
    if isinstance(current, bool):
        return not current
    if isinstance(current, int):
        return rng.choice([0, 1, 2, current + 1, max(current - 1, 0), current * 2, 10**6])
    if isinstance(current, float):
        return rng.choice([0.0, 1e-6, 0.5, 1.0, current * 2, current / 2, 1e6])
    return rng.choice(_VALUES)


_MAKERS = {"bounds": _bounds, "duplicate_key": _duplicate_key, "yaml11_number": _yaml11_number,
           "run_name": _run_name, "seed": _seed, "path": _path, "data_line": _data_line, "reward": _reward,
           "prompt_count": _prompt_count, "jsonl_input": _jsonl_input, "numeric_bound": _numeric_bound,
           "train_refuses": _train_refuses, "meaningless": _meaningless, "value": _value}  # fmt: skip


def write_case(case: Case, workdir: Path) -> Path:
    """Write the case's files and config under ``workdir``; return the config path."""
    for relpath, content in case.files.items():
        target = workdir / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    config = workdir / "config.yaml"
    config.write_text(case.text, encoding="utf-8")
    return config
