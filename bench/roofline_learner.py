"""The learner step's row of ``bench/roofline.py``: one full fine-tuning update of SmolLM2, bound vs measured.

R rows in groups of 8 (one prompt of p tokens each, U = R / 8 distinct prompts), completions of n tokens. The
model FLOPs, as MFU counts them (a backward pass costs twice its forward), per layout the learner runs:

    one pass per row (optimizer.share_prompts off), T = p + n − 1 positions a row fed (the last token predicts
    nothing scored):
        FLOPs = 3·(2·R·T·P_layers + 2·R·n·P_head + 2·R·L·H·D·T²)      (causal attention: half of T² computed)
    one pass per distinct prompt, then the completions but their last token (m = n − 1) against its keys and values
    (share_prompts on):
        FLOPs = 3·(2·(U·p + R·m)·P_layers + 2·R·n·P_head + 2·L·H·D·(U·p² + R·(2·m·p + m²)))
    bound = FLOPs / matmul rate + AdamW's bytes / copy rate,  AdamW bytes = 28 · trained parameters

(AdamW reads weight, gradient and two moments and writes three: 7 float32 tensors.) MFU = FLOPs / seconds /
matmul rate. The two layouts compute the same function; the second does less work, so compare their measured
seconds for the speed-up and each ratio for how close that layout runs to the machine's rate. Work the formula
does not count shows up in the profile: the chunked LM head recomputes its logits in the backward pass (a fourth
head pass); norms, activations and softmaxes are bandwidth-bound.

Target (issue 32): the step within 1.3× of its bound.
"""

from __future__ import annotations

import torch
from roofline_parts import Row, Shape, best_seconds, profiled

from groupwise.batch import RowBatch
from groupwise.config.algorithm import LossSection, OptimizerSection
from groupwise.model.loading import Policy
from groupwise.trainer.learner import Learner, LearnerSettings
from groupwise.trainer.precision import LearnerPrecision

LEARNER_TARGET = 1.3
GROUP_SIZE = 8


def learner_flops(shape: Shape, rows: int, prompt: int, completion: int, prompts: int | None = None) -> float:
    """The step's model FLOPs (module docstring): one pass per row when ``prompts`` is None, else one pass over
    each of ``prompts`` distinct prompts and the completions against them."""
    attention = 2 * shape.layers * shape.heads * shape.head_dim
    fed = completion - 1  # a completion's last token predicts nothing scored: the learner does not feed it
    if prompts is None:
        positions, pairs = rows * (prompt + fed), rows * (prompt + fed) ** 2
    else:
        positions = prompts * prompt + rows * fed
        pairs = prompts * prompt**2 + rows * (2 * fed * prompt + fed**2)
    forward = 2 * positions * shape.layer_params + 2 * rows * completion * shape.head_params + attention * pairs
    return 3 * forward


def learner_rows(rows: int, prompt: int, completion: int, vocab: int) -> RowBatch:
    """``rows`` rows in groups of 8 (one prompt each) with random tokens and advantages of ±1."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, vocab, (rows // GROUP_SIZE, prompt), generator=gen).tolist()
    return RowBatch({
        "group_id": [r // GROUP_SIZE for r in range(rows)],
        "prompt_ids": [prompts[r // GROUP_SIZE] for r in range(rows)],
        "completion_ids": torch.randint(1, vocab, (rows, completion), generator=gen).tolist(),
        "generation_logprobs": (-torch.rand(rows, completion, generator=gen) * 4 - 1).tolist(),
        "version_spans": [((0, completion),)] * rows,
        "advantage": torch.tensor([1.0 if r % 2 else -1.0 for r in range(rows)]),
    })  # fmt: skip


def measure_learner(
    policy: Policy, shape_of_step: tuple[int, int, int], rates: tuple[float, float], args, adamw: str, share: str
) -> tuple[Row, str]:
    """One learner row: the best of ``args.learner_repeats`` steps with the given AdamW and prompt layout."""
    rows, prompt, completion = shape_of_step
    optimizer = OptimizerSection(lr=1e-6, share_prompts=share == "on")
    settings = LearnerSettings(LossSection(), optimizer, total_steps=1000, temperature=1.0)
    dtype = next(policy.model.parameters()).dtype
    learner = Learner(policy.model, settings, precision=LearnerPrecision(dtype, fused_adamw=adamw == "fused"))
    policy.model.train()
    batch = learner_rows(rows, prompt, completion, policy.model.config.vocab_size)
    seconds = best_seconds(lambda: learner.train_step(batch), args.learner_repeats)
    shape = Shape.of(policy.model.config)
    trained = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    distinct = rows // GROUP_SIZE if share == "on" else None
    flops, adamw_bytes = learner_flops(shape, rows, prompt, completion, distinct), 28 * trained
    bound = flops / rates[0] + adamw_bytes / rates[1]
    layout = "one pass per prompt" if share == "on" else "one pass per row"
    row = Row(
        f"learner step, {rows} rows × ({prompt} + {completion}), {layout}",
        flops,
        adamw_bytes,
        bound,
        "FLOPs + AdamW",
        seconds,
        LEARNER_TARGET,
        rates,
        f"{learner.logprob_path.split(':')[0]} LM head, {adamw} AdamW",
    )
    profile = ""
    if args.profile:
        profile = profiled(lambda: learner.train_step(batch)).table(
            f"Learner step, {layout}: where the time goes (under the profiler)", 1, args.top
        )
    policy.model.eval()
    return row, profile
