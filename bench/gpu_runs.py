"""The measurements of ``bench/gpu.py``: model shapes, GPU checks, generation, learner step, profile (the learning
check is in ``gpu_learning``).

Each function returns result rows (plain dicts: what the table prints and the JSON keeps) and never raises for
a failed measurement: a CUDA out-of-memory or any other error becomes a row whose note says what failed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from generation import Measurement, Setting, count_generated, run_engine, timed
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from groupwise.generation import Engine
from groupwise.types import GenerationRequest, SamplingParams

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Shape:
    """A model shape (random weights): a Llama (SmolLM2-135M) or a Qwen2 (Qwen2.5-0.5B, q/k/v biases)."""

    name: str
    family: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float

    def build(self, device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
        config_class, model_class = (Qwen2Config, Qwen2ForCausalLM) if self.family == "qwen2" else (
            LlamaConfig, LlamaForCausalLM)  # fmt: skip
        config = config_class(
            vocab_size=self.vocab, hidden_size=self.hidden, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, intermediate_size=self.intermediate,
            tie_word_embeddings=True, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
        )  # fmt: skip
        config._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        with torch.device(device):  # initialise on the device: a 0.5B model takes ~35 s to initialise on a CPU
            model = model_class(config)
        return model.to(dtype).eval()

    def matmul_parameters(self) -> int:
        """N of the FLOP formula: every weight a token is multiplied by, the (tied) LM head once, no lookup."""
        qkv = self.hidden * self.head_dim * (self.heads + 2 * self.kv_heads)
        attention = qkv + self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp) + self.vocab * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    "smollm2-135m": Shape("smollm2-135m", "llama", 49152, 576, 30, 9, 3, 1536, 1e5),
    "qwen2.5-0.5b": Shape("qwen2.5-0.5b", "qwen2", 151936, 896, 24, 14, 2, 4864, 1e6),
}
SMOKE_SHAPES = {
    "smollm2-135m": Shape("smollm2-135m (smoke)", "llama", 512, 64, 2, 4, 2, 128, 1e5),
    "qwen2.5-0.5b": Shape("qwen2.5-0.5b (smoke)", "qwen2", 512, 64, 2, 4, 2, 128, 1e6),
}


class IdTokenizer:
    """Decodes ids as space-separated numbers: random-weight models have no tokenizer, and the engine must
    still turn every completion into text (about the per-token cost of a real detokenizer's Python side)."""

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        return [" ".join(map(str, row)) for row in rows]


def random_prompts(vocab: int, count: int, seed: int, shortest: int = 16, longest: int = 48) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (count,), generator=generator).tolist()
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def run_hf(model, prompts: list[list[int]], new_tokens: int, eos: list[int], pad_id: int) -> tuple[int, int]:
    """Hugging Face ``generate`` on the left-padded batch (temperature 1, no filter), as bench/generation.py."""
    width = max(map(len, prompts))
    device = next(model.parameters()).device
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        output = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=pad_id,
        )  # fmt: skip
    generated = output[:, width:].tolist()
    return count_generated(generated, set(eos)), len(generated[0])


def failure_row(section: str, model: str, shape: str, method: str, error: BaseException) -> dict[str, Any]:
    if isinstance(error, torch.cuda.OutOfMemoryError):
        note = "CUDA out of memory"
    else:
        note = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    return {"section": section, "model": model, "shape": shape, "method": method, "note": note}


def _release() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- checks: graph replay equals the same step run eagerly --------------------------------------------------------


def gpu_checks(shape: Shape, device: str, smoke: bool) -> list[dict[str, Any]]:
    """Graph replays vs the same slot step replayed eagerly (bf16, bit-identical expected), again after an
    in-place weight update (no recapture), and the graph path vs the compacting path in float32 (peaked model)."""
    rows: list[dict[str, Any]] = []
    small = Shape(shape.name + " x4 layers", shape.family, shape.vocab, shape.hidden, min(4, shape.layers),
                  shape.heads, shape.kv_heads, shape.intermediate, shape.rope_theta)  # fmt: skip
    stops = tuple(range(100, 100 + shape.vocab // 20))  # 5% of the vocabulary: rows finish, buckets drop
    requests = [GenerationRequest(tuple(p), 4, seed=i) for i, p in enumerate(random_prompts(shape.vocab, 12, 1))]
    sampling = SamplingParams(max_new_tokens=12 if smoke else 48, temperature=1.0)
    graph_mode = "eager" if device == "cpu" else "on"
    try:
        model = small.build(device, torch.bfloat16)
        graphs = Engine(model, IdTokenizer(), stops, cuda_graphs=graph_mode)
        eager = Engine(model, IdTokenizer(), stops, cuda_graphs="eager")
        for phase in ("initial weights", "after an in-place update"):
            if phase != "initial weights":
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.mul_(1.25)
            got, expected = graphs.generate(requests, sampling), eager.generate(requests, sampling)
            captured = graphs.decode_graphs
            row = _compare("graph replay vs eager slots (bf16)", small.name, phase, got, expected, 0.0,
                           f"{captured.captures} captures, {captured.resets} resets")  # fmt: skip
            if captured.resets:  # an in-place update must keep the captured graphs
                row.update(passed=False, note=row["note"].replace("pass", "FAIL (graphs were captured again)"))
            rows.append(row)
        rows[-1]["decode_path"] = graphs.decode_path
        del model, graphs, eager
        model = small.build(device, torch.float32)
        with torch.no_grad():
            model.model.norm.weight.fill_(8.0)  # peaked distributions: a float32 rounding rarely flips a draw
        graphs = Engine(model, IdTokenizer(), stops, cuda_graphs=graph_mode)
        plain = Engine(model, IdTokenizer(), stops, cuda_graphs="off")
        got, expected = graphs.generate(requests, sampling), plain.generate(requests, sampling)
        rows.append(_compare("graph path vs compacting path (fp32)", small.name, "peaked", got, expected, 1e-4, ""))
    except Exception as error:  # a failed check is a row, not a crash
        rows.append(failure_row("check", small.name, "", "graphs", error))
    _release()
    return rows


def _compare(what: str, model: str, phase: str, got, expected, tolerance: float, note: str) -> dict[str, Any]:
    pairs = [(a, b) for per_a, per_b in zip(got, expected, strict=True) for a, b in zip(per_a, per_b, strict=True)]
    same = [(a, b) for a, b in pairs if a.token_ids == b.token_ids]
    worst = max((abs(x - y) for a, b in same for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0)
    passed = len(same) == len(pairs) and worst <= tolerance
    return {
        "section": "check", "model": model, "shape": phase, "method": what,
        "ratio": f"{len(same)}/{len(pairs)} rows same tokens", "time": f"max |Δlogprob| {worst:.2g}",
        "note": ("pass" if passed else f"FAIL (tolerance {tolerance:g})") + (f"; {note}" if note else ""),
        "passed": passed, "identical_rows": len(same), "rows": len(pairs), "max_logprob_difference": worst,
    }  # fmt: skip


# --- generation: the engine vs Hugging Face generate ---------------------------------------------------------------


def generation_rows(
    shape: Shape, settings: list[Setting], device: str, repeats: int, allows: Callable[[float], bool], smoke: bool
) -> list[dict[str, Any]]:
    """Per setting: the engine (CUDA graphs; eager slots on CPU), best of ``repeats``, and HF ``generate``."""
    rows: list[dict[str, Any]] = []
    try:
        model = shape.build(device, torch.bfloat16)
    except Exception as error:
        return [failure_row("generation", shape.name, "", "build", error)]
    eos, pad = [0], 1
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(s.rows for s in settings)
    graphs = "eager" if device == "cpu" else "on"
    engine = Engine(model, IdTokenizer(), eos, max_batch_rows=largest, cuda_graphs=graphs)
    torch_device = torch.device(device)
    estimate = 5.0 if smoke else 20.0  # seconds per setting; then what the previous setting took
    for setting in settings:
        if not allows(estimate):
            rows.append({"section": "generation", "model": shape.name, "shape": str(setting), "method": "-",
                         "note": "skipped: time box"})  # fmt: skip
            continue
        started = time.perf_counter()
        distinct = random_prompts(shape.vocab, setting.rows // setting.group_size, seed=setting.rows)
        prompts = [p for p in distinct for _ in range(setting.group_size)]
        results: dict[str, Any] = {}
        # The engine's warm-up is a whole run (it captures the buckets the timed runs use); HF has nothing to
        # capture, so a 4-token run loads its kernels, and one timed run is kept (its step cost is steady).
        methods = {
            "groupwise engine": (partial(run_engine, engine, prompts, setting.new_tokens, setting.group_size),
                                 None, repeats),
            "HF generate": (partial(run_hf, model, prompts, setting.new_tokens, eos, pad),
                            partial(run_hf, model, prompts, 4, eos, pad), 1),
        }  # fmt: skip
        for method, (fn, warm_up, count) in methods.items():
            try:
                (warm_up or fn)()
                runs = [_measure(fn, torch_device, owns_resident=method == "groupwise engine", weights=weights)
                        for _ in range(count)]  # fmt: skip
                results[method] = max(runs, key=lambda m: m.tokens / m.seconds)
            except Exception as error:
                rows.append(failure_row("generation", shape.name, str(setting), method, error))
                _release()
        hf = results.get("HF generate")
        for method, m in results.items():
            rate = m.tokens / m.seconds
            speedup = rate / (hf.tokens / hf.seconds) if hf else None
            rows.append({
                "section": "generation", "model": shape.name, "shape": str(setting), "method": method,
                "time": f"{1000 * m.seconds / m.steps:.2f} ms/step", "rate": f"{rate:,.0f} tok/s",
                "peak_mib": round(m.peak_mib), "ratio": "" if speedup is None else f"{speedup:.2f}x HF",
                "tokens": m.tokens, "steps": m.steps, "seconds": m.seconds, "tokens_per_s": rate, "speedup": speedup,
            })  # fmt: skip
        estimate = time.perf_counter() - started
    rows.append({"section": "generation", "model": shape.name, "shape": "", "method": "decode path",
                 "note": engine.decode_path})  # fmt: skip
    del engine, model
    _release()
    return rows


def _measure(fn: Callable[[], tuple[int, int]], device: torch.device, owns_resident: bool, weights: int) -> Measurement:
    """A timed run; on CUDA its peak is the memory it needs beyond the weights: for the engine everything above
    them (its static slots and graph pools are allocated before the run but are its own), for HF what it
    allocates during the run (what is resident before it is the weights and the engine's idle buffers)."""
    if device.type != "cuda":
        return timed(fn, device)  # the process RSS above the start, sampled (bench/generation.py)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = weights if owns_resident else torch.cuda.memory_allocated()
    start = time.perf_counter()
    tokens, steps = fn()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return Measurement(tokens, steps, seconds, (torch.cuda.max_memory_allocated() - base) / 2**20)


# --- learner: one optimizer step on rows x 1,024 tokens ------------------------------------------------------------


def learner_rows(
    shape: Shape, shapes: list[tuple[int, int]], device: str, micro_rows: int, dtype: str, peak_tflops: float,
    allows: Callable[[float], bool], smoke: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """Step time (median of 3 after a warm-up), tokens/s, peak memory and MFU of ``Learner.train_step``."""
    from groupwise.config import config_from_dict
    from groupwise.trainer.builder import build_learner

    rows: list[dict[str, Any]] = []
    for num_rows, tokens in shapes:
        label = f"{num_rows} x {tokens:,}"
        if not allows(3.0 if smoke else 4.0 * num_rows / 16):
            rows.append({"section": "learner", "model": shape.name, "shape": label, "note": "skipped: time box"})
            continue
        try:
            cfg = config_from_dict({"model": {"source": "tiny", "device": device, "dtype": dtype},
                                    "optimizer": {"micro_batch_rows": micro_rows, "warmup_steps": 0}})  # fmt: skip
            model = shape.build(device, getattr(torch, dtype))
            learner = build_learner(cfg, model)  # the CUDA plan: float32 masters, bf16 autocast, fused AdamW
            prompt = 64 if tokens > 64 else tokens // 4
            batch = _learner_batch(num_rows, prompt, tokens - prompt, shape.vocab)
            times = _timed_steps(learner, batch, device, 3)
            peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
            flops = 6 * shape.matmul_parameters() * num_rows * tokens
            flops += 6 * shape.layers * shape.heads * shape.head_dim * num_rows * tokens**2  # causal attention
            step = statistics.median(times)
            mfu = flops / step / (peak_tflops * 1e12)
            rows.append({
                "section": "learner", "model": shape.name, "shape": label, "method": f"train_step ({dtype})",
                "time": f"{step:.3f} s/step", "rate": f"{num_rows * tokens / step:,.0f} tok/s",
                "peak_mib": None if peak is None else round(peak), "ratio": f"MFU {100 * mfu:.1f}%",
                "seconds": step, "tokens_per_s": num_rows * tokens / step, "mfu": mfu, "model_flops": flops,
                "note": f"micro_batch_rows {micro_rows}",
            })  # fmt: skip
            del learner, model
        except Exception as error:
            rows.append(failure_row("learner", shape.name, label, "train_step", error))
        _release()
    return rows


def _learner_batch(num_rows: int, prompt: int, completion: int, vocab: int):
    from groupwise.batch import RowBatch

    generator = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=generator).tolist()  # noqa: E731
    return RowBatch({
        "group_id": [i // 8 for i in range(num_rows)],
        "prompt_ids": [ids(prompt) for _ in range(num_rows)],
        "completion_ids": [ids(completion) for _ in range(num_rows)],
        "generation_logprobs": [[-math.log(vocab)] * completion for _ in range(num_rows)],
        "version_spans": [((0, completion),)] * num_rows,
        "advantage": torch.tensor([1.0 if i % 2 else -1.0 for i in range(num_rows)]),
    })  # fmt: skip


def _timed_steps(learner, batch, device: str, repeats: int) -> list[float]:
    learner.train_step(batch)  # warm-up: allocator, cuBLAS handles, optimizer state
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        learner.train_step(batch)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


# --- profile: where a decode step's time goes, engine vs HF --------------------------------------------------------


def profile_rows(shape: Shape, device: str, out_text: Path, smoke: bool) -> list[dict[str, Any]]:
    """torch.profiler over a short engine call and a short HF generate call (256 rows): the top kernels go to
    ``out_text``; the table gets each one's device-busy fraction (kernel time / wall time)."""
    from torch.profiler import ProfilerActivity, profile

    rows: list[dict[str, Any]] = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    num_rows, new_tokens = (8, 4) if smoke else (256, 32)
    try:
        model = shape.build(device, torch.bfloat16)
        engine = Engine(model, IdTokenizer(), [0], cuda_graphs="eager" if device == "cpu" else "on")
        prompts = random_prompts(shape.vocab, num_rows, seed=7)
        calls = {"groupwise engine": partial(run_engine, engine, prompts, new_tokens, 1),
                 "HF generate": partial(run_hf, model, prompts, new_tokens, [0], 1)}  # fmt: skip
        sections = []
        for method, fn in calls.items():
            fn()  # warm-up (captures the engine's graphs)
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                fn()
                if device == "cuda":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - start
            events = prof.key_averages()
            kernel_us = sum(e.self_device_time_total for e in events) if device == "cuda" else 0.0
            busy = kernel_us / 1e6 / wall
            sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
            sections.append(f"## {method}: {num_rows} rows x {new_tokens} tokens, wall {wall * 1000:.1f} ms, "
                            f"device busy {100 * busy:.0f}%\n\n{events.table(sort_by=sort, row_limit=20)}")  # fmt: skip
            rows.append({
                "section": "profile", "model": shape.name, "shape": f"{num_rows} x {new_tokens}", "method": method,
                "time": f"{wall * 1000:.0f} ms wall", "ratio": f"device busy {100 * busy:.0f}%",
                "note": f"top kernels in {out_text.name}", "device_busy": busy, "wall_seconds": wall,
            })  # fmt: skip
        out_text.write_text("\n\n".join(sections))
        del engine, model
    except Exception as error:
        rows.append(failure_row("profile", shape.name, "", "profiler", error))
    _release()
    return rows


__all__ = ["REPO", "SHAPES", "SMOKE_SHAPES", "Setting", "failure_row", "gpu_checks", "generation_rows",
           "learner_rows", "profile_rows"]  # fmt: skip
