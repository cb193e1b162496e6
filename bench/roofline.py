"""This machine's roofline for SmolLM2-135M: a decode step at 16 and 128 rows and a learner step, bound vs measured.

    .venv/bin/python bench/roofline.py                 # SmolLM2-135M-Instruct (the shipped GGUF), ~6 min on 2 cores
    .venv/bin/python bench/roofline.py --profile       # and a torch profiler table per measured row
    .venv/bin/python bench/roofline.py --smoke         # a small random Llama: seconds, proves the script runs

**The machine's two rates** (best of 3 × ``--repeats``, torch's threads as set by ``--threads``; measured again
just before each row, which uses its own):

* matmul: ``C = A B`` with float32 ``2048 × 2048`` operands, ``2·n³`` FLOPs per call → GFLOP/s;
* copy: a 256 MiB float32 tensor copied into another, bytes read + bytes written per call → GB/s.

**A decode step** at B rows, every row at context c (its prompt and the tokens drawn so far), per layer l of L,
with P = the parameters the step multiplies (every layer's projections and the LM head)::

    FLOPs = 2·B·P + 4·B·L·H·D·c                 (the projections and head; QKᵀ and AV over c keys)
    bytes = 4·P + 8·B·L·KV·D·c                  (float32 weights once; the cached keys and values)
    bound = max(FLOPs / matmul rate, bytes / copy rate)

Measured: the engine's marginal decode step — ``generate`` with 1 and with 1 + N new tokens on the same
requests (P prompts × 8 samples), (t₁₊N − t₁) / N, best of ``--repeats``. That is everything a step costs
(sampling with logprobs, the stop checks, the bookkeeping), not the model alone. Every row runs to the end: the
engine's end-of-sequence id is a token the rows never draw (checked; the table says if one stopped early).

**A learner step** (full fine-tuning, one optimizer update) on R rows of prompt p and completion n tokens, at
T = p + n positions a row; the model FLOPs, as MFU counts them (a backward pass costs twice its forward)::

    FLOPs = 3·(2·R·T·P_layers + 2·R·n·P_head + 2·R·L·H·D·T²)     (causal attention: half of T² is computed)
    bound = FLOPs / matmul rate + AdamW's bytes / copy rate,  AdamW bytes = 28 · trained parameters

(AdamW reads weight, gradient and two moments and writes three: 7 float32 tensors.) MFU = FLOPs / seconds /
matmul rate. Work the formula does not count shows up in the profile: the chunked LM head recomputes its
logits in the backward pass (a fourth head pass), norms, activations and softmaxes are bandwidth-bound.

The script leaves libgomp's wait policy as it is (threads spin a while before sleeping), where ``groupwise`` sets
``OMP_WAIT_POLICY=PASSIVE`` for busy machines: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/roofline.py``
measures what a run's engine and learner get.

Targets (the engine and the learner at the machine's limit): decode ≤ 2× its bound at 16 rows and
≤ 1.3× at 128; the learner step within 1.5× of its bound.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from groupwise.batch import RowBatch
from groupwise.config.algorithm import LossSection, OptimizerSection
from groupwise.generation.engine import Engine
from groupwise.model.loading import Policy, load_policy
from groupwise.trainer.learner import Learner, LearnerSettings
from groupwise.trainer.precision import LearnerPrecision
from groupwise.types import GenerationRequest, SamplingParams

QUESTIONS = [
    "What is 7 times 8?",
    "Name three prime numbers.",
    "What is the capital of France?",
    "Add 123 and 456.",
    "Spell 'banana' backwards.",
    "What is 12 squared?",
    "Is 91 a prime?",
    "Count from 1 to 5.",
]
SMOKE_TINY = {
    "vocab": "full",
    "num_layers": 2,
    "hidden_size": 64,
    "num_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}
TARGETS = {16: 2.0, 128: 1.3}  # decode rows -> the ratio to meet
LEARNER_TARGET = 1.5
GROUP_SIZE = 8


@dataclass(frozen=True)
class Shape:
    """The sizes the FLOP and byte counts read from a Llama-family config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config) -> Shape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            config.intermediate_size,
            config.vocab_size,
        )

    @property
    def layer_params(self) -> int:
        """Every layer's q, k, v, o and gate, up, down weights: ``L·(h·(H + 2·KV)·D + H·D·h + 3·h·I)``."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        attention = qkv + self.heads * self.head_dim * self.hidden
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab


def decode_flops(shape: Shape, rows: int, context: float) -> float:
    """``2·B·P + 4·B·L·H·D·c`` (module docstring)."""
    params = shape.layer_params + shape.head_params
    return 2 * rows * params + 4 * rows * shape.layers * shape.heads * shape.head_dim * context


def decode_bytes(shape: Shape, rows: int, context: float) -> float:
    """``4·P + 8·B·L·KV·D·c``: float32 weights read once, the cached keys and values read once."""
    params = shape.layer_params + shape.head_params
    return 4 * params + 8 * rows * shape.layers * shape.kv_heads * shape.head_dim * context


def learner_flops(shape: Shape, rows: int, prompt: int, completion: int) -> float:
    """``3·(2·R·T·P_layers + 2·R·n·P_head + 2·R·L·H·D·T²)`` with ``T = p + n`` (module docstring)."""
    positions = prompt + completion
    forward = (
        2 * rows * positions * shape.layer_params
        + 2 * rows * completion * shape.head_params
        + 2 * rows * shape.layers * shape.heads * shape.head_dim * positions**2
    )
    return 3 * forward


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocations, oneDNN primitive caches, the decoder's probe
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_rate(repeats: int, n: int = 2048) -> float:
    """FLOP/s of a float32 ``n × n`` matmul."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return 2 * n**3 / best_seconds(lambda: torch.mm(a, b, out=out), repeats)


def copy_rate(repeats: int, mib: int = 256) -> float:
    """Bytes per second read + written by a float32 copy of ``mib`` MiB."""
    source = torch.randn(mib * 2**20 // 4)
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / best_seconds(lambda: target.copy_(source), repeats)


def cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    return names[0] if names else platform.processor()


def machine_rates(args) -> tuple[float, float]:
    """The matmul and copy rates now: measured again before every row, since a shared or throttled machine's
    rates drift (133–183 GFLOP/s within one hour on the 2-core VM of bench/RESULTS.md)."""
    return matmul_rate(args.repeats * 3), copy_rate(args.repeats * 3)


def chat_prompts(policy: Policy, count: int) -> list[tuple[int, ...]]:
    tokenizer = policy.tokenizer
    prompts = []
    for index in range(count):
        question = QUESTIONS[index % len(QUESTIONS)] + " " * (index // len(QUESTIONS))
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        else:
            ids = tokenizer.encode(question)
        prompts.append(tuple(int(i) for i in ids))
    return prompts


def never_drawn_token(policy: Policy) -> int:
    """The token the model finds least likely after a short prompt: used as the engine's end-of-sequence id, so
    every row runs to its last token (the table reports any that did not)."""
    ids = torch.tensor([chat_prompts(policy, 1)[0]])
    with torch.inference_mode():
        return int(policy.model(ids).logits[0, -1].argmin())


@dataclass(frozen=True)
class DecodeRun:
    engine: Engine
    requests: list[GenerationRequest]

    def generate(self, new_tokens: int) -> list[int]:
        sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
        return [c.num_tokens for per in self.engine.generate(self.requests, sampling) for c in per]


def decode_run(policy: Policy, rows: int) -> DecodeRun:
    prompts = chat_prompts(policy, rows // GROUP_SIZE)
    engine = Engine(policy.model, policy.tokenizer, [never_drawn_token(policy)], max_batch_rows=max(256, rows))
    return DecodeRun(engine, [GenerationRequest(p, GROUP_SIZE, seed=i) for i, p in enumerate(prompts)])


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


@dataclass(frozen=True)
class Profile:
    """Per operator (calls, self CPU seconds) of what ran under the torch profiler, and its wall seconds."""

    ops: dict[str, tuple[int, float]]
    wall_s: float

    def minus(self, other: Profile) -> Profile:
        """What this profile has beyond ``other`` (the extra decode steps of a longer call)."""
        ops = {
            key: (calls - other.ops.get(key, (0, 0.0))[0], seconds - other.ops.get(key, (0, 0.0))[1])
            for key, (calls, seconds) in self.ops.items()
        }
        return Profile(ops, self.wall_s - other.wall_s)

    def share(self, seconds: float) -> str:
        return f"{100 * seconds / self.wall_s:.1f} %"

    def table(self, title: str, per: int, top: int) -> str:
        """The ``top`` operators by self time, per step (``per`` steps profiled), with their share of the profiled
        wall time; the last line is the rest (other operators and the Python between them)."""
        lines = [f"\n{title}\n", "| operator | calls/step | self ms/step | share |", "|---|---|---|---|"]
        ranked = sorted(self.ops.items(), key=lambda item: -item[1][1])[:top]
        for name, (calls, seconds) in ranked:
            lines.append(f"| {name} | {calls / per:.0f} | {1e3 * seconds / per:.2f} | {self.share(seconds)} |")
        rest = self.wall_s - sum(seconds for _, (_, seconds) in ranked)
        lines.append(f"| (the rest: other operators, Python) | | {1e3 * rest / per:.2f} | {self.share(rest)} |")
        return "\n".join(lines)


def profiled(fn: Callable[[], object]) -> Profile:
    """One call of ``fn`` under the torch profiler (CPU activities)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    return Profile({e.key: (e.count, e.self_cpu_time_total / 1e6) for e in prof.key_averages()}, wall)


@dataclass(frozen=True)
class Row:
    label: str
    flops: float
    bytes: float
    bound_s: float
    bound_by: str
    measured_s: float
    target: float
    rates: tuple[float, float]  # the matmul FLOP/s and copy bytes/s measured just before this row
    note: str = ""

    def markdown(self) -> str:
        ratio = self.measured_s / self.bound_s
        mfu = self.flops / self.measured_s / self.rates[0]
        verdict = "met" if ratio <= self.target else "missed"
        return (
            f"| {self.label} | {self.rates[0] / 1e9:.0f} / {self.rates[1] / 1e9:.1f} | {self.flops / 1e9:.1f} "
            f"| {self.bytes / 1e9:.2f} | {1e3 * self.bound_s:.1f} "
            f"({self.bound_by}) | {1e3 * self.measured_s:.1f} | **{ratio:.2f}×** | ≤ {self.target}× {verdict} "
            f"| {100 * mfu:.0f} % | {self.note} |"
        )


def measure_decode(policy: Policy, rows: int, new: int, rates: tuple[float, float], args) -> tuple[Row, str]:
    run = decode_run(policy, rows)
    lengths = run.generate(1 + new)
    early = sum(length < 1 + new for length in lengths)
    short = best_seconds(lambda: run.generate(1), args.repeats)
    long = best_seconds(lambda: run.generate(1 + new), args.repeats)
    step = (long - short) / new
    shape = Shape.of(policy.model.config)
    prompt = statistics.mean(len(r.prompt_token_ids) for r in run.requests)
    context = prompt + 1 + (new + 1) / 2  # the mean over the N timed steps
    flops, moved = decode_flops(shape, rows, context), decode_bytes(shape, rows, context)
    compute, memory = flops / rates[0], moved / rates[1]
    note = f"context {context:.0f}" + (f"; {early} rows stopped early" if early else "")
    row = Row(
        f"decode, {rows} rows",
        flops,
        moved,
        max(compute, memory),
        "FLOPs" if compute >= memory else "bytes",
        step,
        TARGETS.get(rows, 2.0),
        rates,
        note,
    )
    profile = ""
    if args.profile:
        extra = profiled(lambda: run.generate(1 + new)).minus(profiled(lambda: run.generate(1)))
        profile = extra.table(
            f"Decode step, {rows} rows: where the time goes (per step, under the profiler)", new, args.top
        )
    return row, profile


def measure_learner(
    policy: Policy, rows: int, prompt: int, completion: int, rates: tuple[float, float], args, adamw: str
) -> tuple[Row, str]:
    settings = LearnerSettings(LossSection(), OptimizerSection(lr=1e-6), total_steps=1000, temperature=1.0)
    dtype = next(policy.model.parameters()).dtype
    learner = Learner(policy.model, settings, precision=LearnerPrecision(dtype, fused_adamw=adamw == "fused"))
    policy.model.train()
    batch = learner_rows(rows, prompt, completion, policy.model.config.vocab_size)
    seconds = best_seconds(lambda: learner.train_step(batch), args.learner_repeats)
    shape = Shape.of(policy.model.config)
    trained = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    flops, adamw_bytes = learner_flops(shape, rows, prompt, completion), 28 * trained
    bound = flops / rates[0] + adamw_bytes / rates[1]
    label = f"learner step, {rows} rows × ({prompt} + {completion})"
    row = Row(
        label,
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
            "Learner step: where the time goes (under the profiler)", 1, args.top
        )
    policy.model.eval()
    return row, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--rows", type=int, nargs="*", default=[16, 128], help="decode batch sizes (none: skip)")
    parser.add_argument("--new-tokens", type=int, default=48, help="decode steps timed per call")
    parser.add_argument("--learner-rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=45)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--learner-repeats", type=int, default=2)
    parser.add_argument(
        "--adamw",
        nargs="+",
        choices=["fused", "loop"],
        default=["fused"],
        help="AdamW per learner row: fused (what a CPU run uses) and/or loop (one op at a time)",
    )
    parser.add_argument("--profile", action="store_true", help="a torch profiler table for each row")
    parser.add_argument("--top", type=int, default=10, help="operators per profile table")
    parser.add_argument("--smoke", action="store_true", help="a small random Llama and few steps")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.new_tokens, args.learner_rows, args.prompt_tokens = [16], 4, 8, 8
        args.repeats = args.learner_repeats = 1
    torch.set_num_threads(args.threads)
    cpu = cpu_model()
    print(
        f"# {cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads {args.threads}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print("# rates: matmul float32 2048² GFLOP/s / copy 256 MiB GB/s (read + written), measured before each row\n")
    if args.smoke:
        policy = load_policy("tiny", tiny=SMOKE_TINY, device="cpu")
    else:
        policy = load_policy("gguf", "smollm2", device="cpu")
    results = [measure_decode(policy, rows, args.new_tokens, machine_rates(args), args) for rows in args.rows]
    for adamw in args.adamw:
        learner_rates = machine_rates(args)
        shape = (args.learner_rows, args.prompt_tokens, args.new_tokens)
        results.append(measure_learner(policy, *shape, learner_rates, args, adamw))
    print("| step | rates | GFLOP | GB moved | bound ms (by) | measured ms | ratio | target | MFU | note |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row, _ in results:
        print(row.markdown())
    for _, profile in results:
        if profile:
            print(profile)


if __name__ == "__main__":
    main()
