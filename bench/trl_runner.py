"""TRL's side of ``bench/trl_matched.py``: trains one job with TRL's ``GRPOTrainer`` and times every step.

    .venv-trl/bin/python bench/trl_runner.py --job JOB.json --out RESULT.json

Runs in TRL's own environment (``scripts/install_trl.sh``), never in groupwise's. The job file, written by the
driver, holds everything that defines the job: the float model directory (groupwise's dequantised SmolLM2 cache
entry), the prompts of every step in the order groupwise's loader draws them, the sampling and optimizer settings,
and the directory of the groupwise source tree the driver runs. The reward is the config's groupwise reward
function (``countdown``, ``exact_numeric``, ...) resolved by groupwise's ``load_reward_fn`` from that tree, called
on a ``Prompt`` and ``Completion`` built the way groupwise's engine builds them (text decoded with special tokens
kept and a final EOS dropped; ``finish_reason`` "stop" when it ended on EOS), so both sides score completions with
the same code.

The result file holds one record per optimizer step: ``step_s`` (``on_step_begin`` to ``on_step_end`` of the
Trainer loop: the whole step), ``gen_s`` (TRL's ``_generate_and_score_completions``: prompt rendering, sampling,
reward, padding; groupwise's ``perf/gen_seconds`` is its generation round, sampling and reward), ``learner_s``
(``training_step`` without that generation, then gradient clipping and ``optimizer.step()``: the forward/backward
passes and the update, as groupwise's ``perf/train_seconds``) and ``completion_tokens``; and, per step, the distinct
prompt token ids TRL generated from, so the driver can check they are the ids groupwise encodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def grpo_config_kwargs(job: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """``GRPOConfig`` arguments for ``job``: P prompts × G completions in one batch, one optimizer step per
    generation batch (no reuse, so no old-policy pass), the job's sampling, clip, AdamW and clipping settings,
    no KL term, DAPO's token-level loss with group-std advantages (groupwise's ``dapo`` loss), fp32 on the CPU, and
    the dataset read in file order (the driver wrote it in groupwise's draw order)."""
    rows = job["num_prompts"] * job["num_generations"]
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": rows,
        "num_generations": job["num_generations"],
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_iterations": 1,
        "max_completion_length": job["max_new_tokens"],
        "temperature": job["temperature"],
        "top_p": job["top_p"],
        "top_k": job["top_k"],
        "learning_rate": job["lr"],
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "adam_beta1": job["betas"][0],
        "adam_beta2": job["betas"][1],
        "adam_epsilon": job["adam_eps"],
        "weight_decay": job["weight_decay"],
        "max_grad_norm": job["max_grad_norm"],
        "epsilon": job["epsilon_low"],
        "epsilon_high": job["epsilon_high"],
        "beta": 0.0,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "mask_truncated_completions": False,
        "max_steps": job["warmup"] + job["steps"],
        "seed": job["seed"],
        "shuffle_dataset": False,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "log_completions": False,
    }


def dataset_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per prompt, every step's prompts in order: TRL's ``prompt`` (the text, or the chat messages) plus
    the columns the reward needs (TRL passes extra columns to reward functions by name); the metadata as JSON, so
    one column type holds any task's."""
    return [
        {"prompt": p["text"] if p["messages"] is None else p["messages"], "uid": p["uid"], "answer": p["answer"],
         "metadata": json.dumps(p["metadata"])}
        for step in job["prompts"]
        for p in step
    ]  # fmt: skip


def groupwise_reward(job: dict[str, Any], tokenizer: Any, eos_ids: set[int]) -> Any:
    """A TRL reward function that scores with the job's groupwise reward function (imported from ``job["src"]``)."""
    sys.path.insert(0, job["src"])
    from groupwise.data.rewards import load_reward_fn
    from groupwise.types import Completion, Prompt

    reward_fn = load_reward_fn(job["reward"], job["task_reward"])
    kwargs = job["reward_kwargs"]

    def reward(prompts: list, completion_ids: list, uid: list, answer: list, metadata: list, **_: Any) -> list[float]:
        scores = []
        for shown, ids, prompt_uid, target, meta in zip(prompts, completion_ids, uid, answer, metadata, strict=True):
            stopped = bool(ids) and ids[-1] in eos_ids
            text = tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
            chat = not isinstance(shown, str)
            prompt = Prompt(uid=prompt_uid, answer=target, text=None if chat else shown,
                            messages=tuple(shown) if chat else None, metadata=json.loads(meta))  # fmt: skip
            completion = Completion(tuple(ids), (0.0,) * len(ids), text, "stop" if stopped else "length", 0)
            scores.append(reward_fn(prompt, completion, **kwargs))
        return scores

    reward.__name__ = job["reward"]
    return reward


def timed_classes(records: list[dict[str, Any]]) -> tuple[type, type]:
    """A ``GRPOTrainer`` subclass and a Trainer callback that, together, append one timing record per optimizer
    step to ``records``."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    current: dict[str, Any] = {}  # the open step's clocks and counts, shared by the trainer and the callback

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids: list, *args: Any, **kwargs: Any) -> Any:
            # each prompt comes G times in a row (TRL's repeat sampler): keep one copy of each, in order
            for ids in prompt_ids:
                if not current["prompt_ids"] or current["prompt_ids"][-1] != list(ids):
                    current["prompt_ids"].append(list(ids))
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            loss = super().training_step(*args, **kwargs)
            current["train_end"] = time.perf_counter()
            current["learner_s"] += current["train_end"] - start  # generation is taken out in on_optimizer_step
            return loss

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            start = time.perf_counter()
            output = super()._generate_and_score_completions(inputs)
            current["gen_s"] += time.perf_counter() - start
            current["completion_tokens"] += int(output["completion_mask"].sum())
            return output

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            current.update(start=time.perf_counter(), gen_s=0.0, learner_s=0.0, completion_tokens=0, prompt_ids=[])

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # training_step ran the generation inside it; clipping and optimizer.step() came after it
            current["learner_s"] += time.perf_counter() - current["train_end"] - current["gen_s"]

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            records.append({
                "step": len(records), "step_s": time.perf_counter() - current["start"], "gen_s": current["gen_s"],
                "learner_s": current["learner_s"], "completion_tokens": current["completion_tokens"],
                "prompt_ids": current["prompt_ids"],
            })  # fmt: skip

    return TimedGRPOTrainer, StepTimer


def timed_trainer(job: dict[str, Any], output_dir: str) -> tuple[Any, list[dict[str, Any]]]:
    """A ``GRPOTrainer`` for ``job`` that records each step's timings, and the list they are appended to."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    records: list[dict[str, Any]] = []
    trainer_class, step_timer = timed_classes(records)
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32, local_files_only=True)
    eos = model.generation_config.eos_token_id
    eos_ids = {tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else eos or [])}
    config_kwargs = grpo_config_kwargs(job, output_dir)
    if "activation_checkpointing" in {f.name for f in dataclasses.fields(GRPOConfig)}:
        config_kwargs["activation_checkpointing"] = False  # newer transformers' name; the old one only warns
    trainer = trainer_class(
        model=model,
        reward_funcs=[groupwise_reward(job, tokenizer, eos_ids)],
        args=GRPOConfig(**config_kwargs),
        train_dataset=Dataset.from_list(dataset_rows(job)),
        processing_class=tokenizer,
        callbacks=[step_timer()],
    )
    return trainer, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", required=True, help="the job file bench/trl_matched.py wrote")
    parser.add_argument("--out", required=True, help="where to write the per-step records (JSON)")
    args = parser.parse_args()
    job = json.loads(Path(args.job).read_text(encoding="utf-8"))

    import torch
    import transformers
    import trl

    torch.set_num_threads(job["threads"])  # OMP_NUM_THREADS is set too; this makes the count certain
    torch.manual_seed(job["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer, records = timed_trainer(job, tmp)
        trainer.train()
    result = {
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads": torch.get_num_threads(),
        "records": records,
    }
    Path(args.out).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
