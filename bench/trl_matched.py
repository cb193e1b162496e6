"""groupwise against TRL's GRPOTrainer on the same job, alternating runs, one table.

    make bench-trl                                            # builds .venv-trl once, then runs this
    .venv/bin/python bench/trl_matched.py [--job smollm2|tiny] [--rounds 2] [--warmup 1] [--steps 3] [--core 1]
                                          [--json] [KEY=VALUE ...]

TRL lives in its own environment (``scripts/install_trl.sh``, default ``.venv-trl``); it is not a groupwise
dependency. Each round runs TRL (``bench/trl_runner.py`` in ``.venv-trl``), then ``groupwise train``, each in a fresh
process pinned with ``taskset -c CORE`` to one core, with ``OMP_NUM_THREADS=1`` (one torch thread). Each run trains
``--warmup`` + ``--steps`` optimizer steps; the table is the median over every round's steps after the warm-up:
seconds per step, generation seconds, learner seconds, completion tokens per step, and groupwise ÷ TRL. A second
table gives each round's median step seconds and the load average when each run started: on a shared machine a
change of load during the benchmark shows there, and pooled medians that straddle it mean little.

Two jobs (``--job``), each a shipped example made matchable: temperature 1.0, no dynamic sampling (TRL's
GRPOTrainer has none), one optimizer step per batch, fp32 on the CPU, no LR warm-up, no KL or entropy term.

- ``smollm2`` (default): ``examples/smollm2_countdown.yaml``, SmolLM2-135M-Instruct, P = 2, G = 8, 48 new tokens;
- ``tiny``: the default job ``examples/addition.yaml`` (``models/addition-tiny``), P = 16, G = 8, 6 new tokens.

``--config``, ``--prompts`` and ``--generations`` change a job's example, P and G. KEY=VALUE overrides change the
groupwise config, and everything TRL is given is read from that config: the same learning rate, AdamW settings,
gradient clipping, clip ε (low/high), sampling settings, seed, reward function and its kwargs. What guarantees the
rest is the same:

- **weights**: TRL loads the directory groupwise loads: the model directory of a Hugging Face config, or
  groupwise's dequantised float copy of a GGUF file (its cache entry, ``model.gguf_cache``; made here first when
  missing);
- **prompts**: the driver draws every step's prompts with groupwise's own task and loader for the config, and TRL
  reads them in that order; after each run the driver checks TRL's prompt token ids against groupwise's encoding
  of them, and groupwise's trained prompt uids (``fates.jsonl``) against the same list;
- **reward**: TRL calls the config's groupwise reward function (``reward.function``, resolved by groupwise's own
  ``load_reward_fn``), imported from the source tree this driver imports.

Sampling draws differ between the two (two RNGs), so completion lengths, and with them the time, differ a little
from step to step: compare the completion-token column before reading a time ratio. Definitions: groupwise's
columns are ``perf/step_seconds``, ``perf/gen_seconds`` and ``perf/train_seconds`` from its ``metrics.jsonl``;
TRL's are in ``bench/trl_runner.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "bench" / "trl_runner.py"


@dataclass(frozen=True)
class Job:
    """A shipped example and what makes it the matched job: P, G, the new-token limit, and overrides."""

    title: str
    config: str
    prompts: int
    generations: int
    max_new_tokens: int
    overrides: tuple[str, ...] = ()


JOBS = {
    "smollm2": Job("SmolLM2-135M countdown", "examples/smollm2_countdown.yaml", 2, 8, 48),
    "tiny": Job("tiny default job (addition)", "examples/addition.yaml", 16, 8, 6, ("loss.entropy_coef=0.0",)),
}
DEFAULT_CONFIG = JOBS["smollm2"].config
MATCHED_TASKS = ("addition", "countdown")  # text or chat prompts whose metadata is JSON: what the runner rebuilds
SIDES = ("TRL", "groupwise")
KEYS = ("step_s", "gen_s", "learner_s", "completion_tokens")
HEADERS = ("step s", "gen s", "learner s", "completion tokens")
THREADS = 1


class BenchError(Exception):
    """A reason the benchmark cannot run or its runs do not match; printed as one message, exit 2."""


def trl_python(venv: Path) -> Path:
    """The interpreter of TRL's environment; a :class:`BenchError` naming the command that builds it if absent."""
    python = venv / "bin" / "python"
    if not python.is_file():
        raise BenchError(
            f"TRL's environment {venv} does not exist (no {python}); build it with `make bench-trl` "
            f"or `bash scripts/install_trl.sh {venv}`"
        )
    return python


def groupwise_overrides(
    prompts: int, generations: int, total_steps: int, extra: list[str], max_new_tokens: int = 48
) -> list[str]:
    """The config overrides that turn the example into the matched job (``extra`` last, so it wins); no
    evaluation, checkpoint or tracker, so a run is only its training steps."""
    matched = [
        f"grpo.num_prompts_per_step={prompts}", f"grpo.num_generations_per_prompt={generations}",
        f"generation.max_new_tokens={max_new_tokens}", "generation.temperature=1.0",
        "grpo.dynamic_sampling.enabled=false",
        f"optimizer.micro_batch_rows={prompts * generations}", "optimizer.warmup_steps=0", "model.device=cpu",
        "model.dtype=float32", f"run.max_steps={total_steps}", "eval.at_start=false", "eval.every=0",
        "eval.at_end=false", "checkpoint.every=0", "checkpoint.save_final=false", "logging.progress=false",
        "logging.backends=[]", "logging.train_data=false",
    ]  # fmt: skip
    given = {override.partition("=")[0] for override in extra}
    return [o for o in matched if o.partition("=")[0] not in given] + extra


def unmatched(cfg: Any) -> list[str]:
    """What in the groupwise config TRL's side cannot reproduce (empty when the job is matched)."""
    wanted: list[tuple[str, object, object]] = [
        ("mode", cfg.mode, "sync"),
        ("data.system_prompt", cfg.data.system_prompt, None),
        ("model.device", cfg.model.device, "cpu"),
        ("model.dtype", cfg.model.dtype, "float32"),
        ("model.lora.enabled", cfg.model.lora.enabled, False),
        ("generation.stop", list(cfg.generation.stop), []),
        ("grpo.dynamic_sampling.enabled", cfg.grpo.dynamic_sampling.enabled, False),
        ("grpo.normalize_advantages", cfg.grpo.normalize_advantages, True),
        ("grpo.advantage_std", cfg.grpo.advantage_std, "group"),
        ("loss.type", cfg.loss.type, "dapo"),
        ("loss.kl_coef", cfg.loss.kl_coef, 0.0),
        ("loss.entropy_coef", cfg.loss.entropy_coef, 0.0),
        ("optimizer.warmup_steps", cfg.optimizer.warmup_steps, 0),
        ("optimizer.schedule", cfg.optimizer.schedule, "constant"),
        ("optimizer.epochs_per_step", cfg.optimizer.epochs_per_step, 1),
        ("optimizer.mini_batches_per_step", cfg.optimizer.mini_batches_per_step, 1),
    ]
    problems = [f"{key}={got!r} (TRL's side runs {want!r})" for key, got, want in wanted if got != want]
    if cfg.data.task not in MATCHED_TASKS:
        problems.append(f"data.task={cfg.data.task!r} (TRL's side runs the tasks {', '.join(MATCHED_TASKS)})")
    return problems


def plan_prompts(cfg: Any, total_steps: int) -> list[list[Any]]:
    """Every step's prompts, drawn with groupwise's own task and training loader for ``cfg``."""
    from groupwise.data.registry import build_task
    from groupwise.data.skipping_loader import build_training_loader

    task = build_task(cfg.data.task, cfg.data, cfg.run.seed)
    loader = build_training_loader(cfg, task.train_prompts())
    return [[item.prompt for item in loader.take(cfg.grpo.num_prompts_per_step)] for _ in range(total_steps)]


def trl_job(cfg: Any, plan: list[list[Any]], warmup: int, steps: int, model_dir: Path, src: Path) -> dict[str, Any]:
    """The job file ``bench/trl_runner.py`` reads: every setting read from the groupwise config ``cfg``."""
    return {
        "model_dir": str(model_dir), "src": str(src), "threads": THREADS, "seed": cfg.run.seed,
        "warmup": warmup, "steps": steps, "num_prompts": cfg.grpo.num_prompts_per_step,
        "num_generations": cfg.grpo.num_generations_per_prompt, "max_new_tokens": cfg.generation.max_new_tokens,
        "temperature": cfg.generation.temperature, "top_p": cfg.generation.top_p, "top_k": cfg.generation.top_k,
        "lr": cfg.optimizer.lr, "betas": list(cfg.optimizer.betas), "adam_eps": cfg.optimizer.eps,
        "weight_decay": cfg.optimizer.weight_decay, "max_grad_norm": cfg.optimizer.max_grad_norm,
        "epsilon_low": cfg.loss.epsilon_low, "epsilon_high": cfg.loss.epsilon_high,
        "reward": cfg.reward.function, "task_reward": task_reward(cfg), "reward_kwargs": dict(cfg.reward.kwargs),
        "prompts": [
            [{"uid": p.uid, "answer": p.answer, "text": p.text,
              "messages": None if p.messages is None else [dict(m) for m in p.messages],
              "metadata": dict(p.metadata)} for p in step]
            for step in plan
        ],
    }  # fmt: skip


def task_reward(cfg: Any) -> str:
    """The reward ``reward.function: auto`` stands for with the config's task."""
    from groupwise.data.registry import build_task

    return str(build_task(cfg.data.task, cfg.data, cfg.run.seed).default_reward)


def model_directory(cfg: Any) -> Path:
    """The model directory groupwise loads: a Hugging Face config's ``model.path``, or groupwise's float copy of
    the config's GGUF model (dequantised and cached here when missing)."""
    from groupwise.model.gguf_files import cache_entry, cache_root, resolve_gguf

    if cfg.model.source == "hf":
        return Path(cfg.model.path).resolve()
    if cfg.model.source != "gguf":
        raise BenchError(f"model.source={cfg.model.source!r}: TRL loads a Hugging Face directory or a GGUF file")
    root = cache_root(cfg.model.gguf_cache)
    if root is None:
        raise BenchError("model.gguf_cache=off: TRL loads groupwise's cached float copy; leave the cache on")
    gguf = resolve_gguf(cfg.model.path, cfg.model.gguf_file)
    entry = cache_entry(gguf, root, "float32")
    if not entry.is_dir():
        import torch

        from groupwise.model.gguf_loading import load_gguf

        load_gguf(gguf, torch.float32, root, lambda line: print(line, file=sys.stderr))
    return entry


def pinned_env() -> dict[str, str]:
    """The environment of both sides' processes: one OpenMP / MKL thread."""
    return {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}


def run_logged(command: list[str], log: Path, what: str) -> None:
    """Run ``command`` from the repository root with its output in ``log``; a failure shows the log's tail."""
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.run(command, cwd=ROOT, env=pinned_env(), stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise BenchError(f"{what} failed (exit {code}); the end of its output:\n{tail}")


def run_trl(python: Path, job: dict[str, Any], core: int, tmp: Path) -> dict[str, Any]:
    """One TRL run of ``job`` on ``core``: the runner's result (versions and per-step records)."""
    job_file, out = tmp / "trl_job.json", tmp / "trl_result.json"
    job_file.write_text(json.dumps(job), encoding="utf-8")
    command = ["taskset", "-c", str(core), str(python), str(RUNNER), "--job", str(job_file), "--out", str(out)]
    run_logged(command, tmp / "trl.log", "the TRL run")
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def run_groupwise(
    config: str, overrides: list[str], core: int, tmp: Path
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """One ``groupwise train`` run on ``core``: per-step records from ``metrics.jsonl`` and the uids each step
    trained (``fates.jsonl``)."""
    command = [
        "taskset", "-c", str(core), sys.executable, "-m", "groupwise.cli", "train", config,
        f"run.output_dir={tmp}", "run.name=groupwise", *overrides,
    ]  # fmt: skip
    run_logged(command, tmp / "groupwise.log", "the groupwise run")
    run_dir = tmp / "groupwise"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "perf/step_seconds" in m]
    records = [
        {"step": i, "step_s": m["perf/step_seconds"], "gen_s": m["perf/gen_seconds"],
         "learner_s": m["perf/train_seconds"], "completion_tokens": m["perf/train_tokens"]}
        for i, m in enumerate(steps)
    ]  # fmt: skip
    trained: list[list[str]] = [[] for _ in steps]
    for line in (run_dir / "fates.jsonl").read_text().splitlines():
        fate = json.loads(line)
        if fate["fate"] == "trained":
            trained[fate["step"]].append(fate["prompt_uid"])
    return records, trained


def check_same_prompts(
    plan: list[list[Any]], trl_ids: list[list[list[int]]], trained: list[list[str]], encode: Any
) -> None:
    """Raise unless TRL generated from groupwise's encoding of the planned prompts and groupwise trained the
    planned prompts, step by step (groupwise's order within a step is not compared: it trains a step as a set)."""
    expected_ids = [[list(encode(p)) for p in step] for step in plan]
    if trl_ids != expected_ids:
        raise BenchError("TRL's prompt token ids differ from groupwise's encoding of the same prompts")
    if [sorted(uids) for uids in trained] != [sorted(p.uid for p in step) for step in plan]:
        raise BenchError(f"groupwise trained other prompts than planned: {trained}")


def summarize(records: dict[str, list[dict[str, Any]]], warmup: int) -> dict[str, dict[str, float]]:
    """Per side, the median of each column over the records of steps ≥ ``warmup``; and groupwise ÷ TRL."""
    summary: dict[str, dict[str, float]] = {}
    for side in SIDES:
        timed = [r for r in records[side] if r["step"] >= warmup]
        if not timed:
            raise BenchError(f"{side} has no step after the {warmup} warm-up steps")
        summary[side] = {key: float(statistics.median(r[key] for r in timed)) for key in KEYS}
    summary["groupwise / TRL"] = {key: summary["groupwise"][key] / summary["TRL"][key] for key in KEYS}
    return summary


def format_table(summary: dict[str, dict[str, float]]) -> str:
    """The summary as a markdown table: one row per side, then the ratio row."""
    lines = ["| | " + " | ".join(HEADERS) + " |", "|---" * (len(HEADERS) + 1) + "|"]
    for side, row in summary.items():
        if side in SIDES:  # seconds to 2 decimals, tokens whole
            cells = [f"{row[key]:.0f}" if key == "completion_tokens" else f"{row[key]:.2f}" for key in KEYS]
        else:
            cells = [f"{row[key]:.2f}×" for key in KEYS]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_rounds(records: dict[str, list[dict[str, Any]]], warmup: int) -> str:
    """Each round's median step seconds per side (after the warm-up), the 1-minute load average when each run
    started, and the round's ratio: a machine whose load changed during the benchmark shows here."""
    lines = ["| round | TRL step s | load at start | groupwise step s | load at start | groupwise / TRL |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for index in sorted({r["round"] for r in records["TRL"]}):
        cells: list[str] = []
        medians = []
        for side in SIDES:
            rows = [r for r in records[side] if r["round"] == index and r["step"] >= warmup]
            medians.append(float(statistics.median(r["step_s"] for r in rows)))
            cells += [f"{medians[-1]:.2f}", f"{rows[0]['load']:.2f}"]
        lines.append(f"| {index + 1} | " + " | ".join(cells) + f" | {medians[1] / medians[0]:.2f}× |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=sorted(JOBS), default="smollm2", help="the matched job (see above)")
    parser.add_argument("--config", help="the groupwise example the job starts from (default: the job's)")
    parser.add_argument("--trl-venv", type=Path, default=ROOT / ".venv-trl", help="TRL's environment")
    parser.add_argument("--rounds", type=int, default=2, help="TRL run then groupwise run, this many times")
    parser.add_argument("--warmup", type=int, default=1, help="first steps of each run left out of the medians")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--core", type=int, default=1, help="the CPU core both sides are pinned to (taskset -c)")
    parser.add_argument("--prompts", type=int, help="P: prompts per step (default: the job's)")
    parser.add_argument("--generations", type=int, help="G: completions per prompt (default: the job's)")
    parser.add_argument("--json", action="store_true", help="print the summary and every record as JSON")
    parser.add_argument("overrides", nargs="*", help="groupwise config overrides (TRL follows them or it refuses)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be >= 1, --warmup >= 0")
    job = JOBS[args.job]
    args.config = args.config or job.config
    args.prompts = args.prompts or job.prompts
    args.generations = args.generations or job.generations
    args.overrides = [*job.overrides, *args.overrides]
    args.title, args.max_new_tokens = job.title, job.max_new_tokens
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        python = trl_python(args.trl_venv)
        if shutil.which("taskset") is None:
            raise BenchError("`taskset` (util-linux) is needed to pin both sides to one core")
        result = bench(args, python)
    except BenchError as err:
        print(f"trl_matched: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(result["header"])
        print(format_table(result["summary"]))
        print()
        print(format_rounds(result["records"], args.warmup))
    return 0


def bench(args: argparse.Namespace, python: Path) -> dict[str, Any]:
    """The alternating runs and their summary."""
    from transformers import AutoTokenizer

    import groupwise
    from groupwise.config import load_config
    from groupwise.model.encode import encode_prompt

    total = args.warmup + args.steps
    overrides = groupwise_overrides(args.prompts, args.generations, total, args.overrides, args.max_new_tokens)
    cfg = load_config(ROOT / args.config, overrides)
    problems = unmatched(cfg)
    if problems:
        raise BenchError("the job cannot be matched on TRL's side: " + "; ".join(problems))
    plan = plan_prompts(cfg, total)
    model_dir = model_directory(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    src = Path(groupwise.__file__).resolve().parents[1]
    job = trl_job(cfg, plan, args.warmup, args.steps, model_dir, src)
    records: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    versions: dict[str, str] = {}
    for round_index in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"round {round_index + 1}/{args.rounds}: TRL", file=sys.stderr, flush=True)
            trl_load = os.getloadavg()[0]
            trl = run_trl(python, job, args.core, Path(tmp))
            print(f"round {round_index + 1}/{args.rounds}: groupwise", file=sys.stderr, flush=True)
            our_load = os.getloadavg()[0]
            ours, trained = run_groupwise(args.config, overrides, args.core, Path(tmp))
        check_same_prompts(
            plan,
            [r["prompt_ids"] for r in trl["records"]],
            trained,
            lambda p: encode_prompt(tokenizer, p, cfg.data.system_prompt),
        )
        versions = trl["versions"]
        tags = {"round": round_index}
        records["TRL"] += [{k: r[k] for k in ("step", *KEYS)} | tags | {"load": trl_load} for r in trl["records"]]
        records["groupwise"] += [r | tags | {"load": our_load} for r in ours]
    header = (
        f"{args.title}, P={cfg.grpo.num_prompts_per_step} G={cfg.grpo.num_generations_per_prompt} "
        f"{cfg.generation.max_new_tokens} new tokens, lr {cfg.optimizer.lr:g}, clip {cfg.loss.epsilon_low}/"
        f"{cfg.loss.epsilon_high}, seed {cfg.run.seed}; core {args.core}, {THREADS} thread; {args.rounds} rounds × "
        f"({args.warmup} warm-up + {args.steps} timed steps), medians; TRL {versions['trl']}, transformers "
        f"{versions['transformers']}, torch {versions['torch']}"
    )
    summary = summarize(records, args.warmup)
    return {"header": header, "summary": summary, "records": records, "versions": versions, "model_dir": str(model_dir)}


if __name__ == "__main__":
    sys.exit(main())
