"""The ``vllm`` section of ``bench/gpu.py``: the vLLM backend against the built-in engine, same shapes and settings.

Per model shape (random weights, written as a Hugging Face folder without a tokenizer: vLLM is started with
``skip_tokenizer_init``, the backend writes the text itself): the engine start (``vllm.LLM`` in this process,
compiled with CUDA graphs on a GPU, eager on CPU), then per generation setting tokens/s and ms/step of the vLLM
backend and of the built-in engine, interleaved, best of ``repeats`` after a warm-up each (the ratio column is
vLLM ÷ engine), and the time of one weight sync (``load_weights`` of the whole state dict: vLLM's in-place
``reload_weights``). Where vllm is not installed the section is one skipped row.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from generation import Setting, run_engine, timed
from gpu_runs import IdTokenizer, Shape, _release, failure_row, random_prompts

from groupwise.generation import Engine

GPU_MEMORY_SHARE = 0.3  # vLLM's share of the GPU; the built-in engine and the model it samples from hold theirs


def vllm_rows(
    shape: Shape, settings: list[Setting], device: str, repeats: int, allows: Callable[[float], bool], smoke: bool
) -> list[dict[str, Any]]:
    """The section's rows for one shape (module docstring); failures become rows, never exceptions."""
    if importlib.util.find_spec("vllm") is None:
        return [{"section": "vllm", "model": shape.name, "shape": "", "method": "-",
                 "note": "skipped: vllm is not installed (pip install 'groupwise[vllm]')"}]  # fmt: skip
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if smoke:  # vLLM's CPU attention takes head sizes from 32 up: the smoke shapes' 16 is widened
        shape = replace(shape, hidden=max(shape.hidden, 32 * shape.heads))
    try:
        model = shape.build(device, dtype)
        started = time.perf_counter()
        generator = _vllm_generator(model, device, dtype, max(s.rows for s in settings))
        start_s = time.perf_counter() - started
    except Exception as error:
        return [failure_row("vllm", shape.name, "", "start", error)]
    rows: list[dict[str, Any]] = [{"section": "vllm", "model": shape.name, "shape": "", "method": "vLLM start",
                                   "time": f"{start_s:.1f} s", "seconds": start_s}]  # fmt: skip
    try:
        engine = Engine(model, IdTokenizer(), [0], max_batch_rows=max(s.rows for s in settings),
                        cuda_graphs="eager" if device == "cpu" else "on")  # fmt: skip
        for setting in settings:
            if not allows(5.0 if smoke else 30.0):
                rows.append({"section": "vllm", "model": shape.name, "shape": str(setting), "method": "-",
                             "note": "skipped: time box"})  # fmt: skip
                continue
            rows += _setting_rows(shape, setting, engine, generator, device, repeats)
        rows.append(_weight_sync_row(shape, generator, model))
    except Exception as error:
        rows.append(failure_row("vllm", shape.name, "", "run", error))
    finally:
        generator.shutdown()  # one in-process vLLM engine at a time
        del model
        _release()
    return rows


def _vllm_generator(model: torch.nn.Module, device: str, dtype: torch.dtype, max_rows: int) -> Any:
    from groupwise.generation.vllm.engine import VllmGenerator
    from groupwise.generation.vllm.setup import VllmSettings

    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as folder:
        model.save_pretrained(folder)
        settings = VllmSettings(
            model_dir=folder, dtype=str(dtype).removeprefix("torch."), device=device, enforce_eager=device == "cpu",
            max_num_seqs=max_rows, kv_cache_gib=1, gpu_memory_utilization=GPU_MEMORY_SHARE,
            extra={"skip_tokenizer_init": True},
        )  # fmt: skip
        return VllmGenerator(settings, IdTokenizer(), [0], list(model.state_dict()))


def _setting_rows(
    shape: Shape, setting: Setting, engine: Engine, generator: Any, device: str, repeats: int
) -> list[dict[str, Any]]:
    distinct = random_prompts(shape.vocab, setting.rows // setting.group_size, seed=setting.rows)
    prompts = [p for p in distinct for _ in range(setting.group_size)]
    methods = {
        "groupwise engine": partial(run_engine, engine, prompts, setting.new_tokens, setting.group_size),
        "vLLM": partial(run_engine, generator, prompts, setting.new_tokens, setting.group_size),
    }
    for fn in methods.values():
        fn()  # warm-up: the engine captures its graphs, vLLM compiles its logprob kernel
    best: dict[str, Any] = {}
    for _ in range(repeats):
        for method, fn in methods.items():  # interleaved: a load spike hits both
            current = timed(fn, torch.device(device))
            if method not in best or current.tokens / current.seconds > best[method].tokens / best[method].seconds:
                best[method] = current
    engine_rate = best["groupwise engine"].tokens / best["groupwise engine"].seconds
    rows = []
    for method, m in best.items():
        rate = m.tokens / m.seconds
        rows.append({
            "section": "vllm", "model": shape.name, "shape": str(setting), "method": method,
            "time": f"{1000 * m.seconds / m.steps:.2f} ms/step", "rate": f"{rate:,.0f} tok/s",
            "peak_mib": round(m.peak_mib), "ratio": f"{rate / engine_rate:.2f}x engine", "tokens": m.tokens,
            "steps": m.steps, "seconds": m.seconds, "tokens_per_s": rate, "vs_engine": rate / engine_rate,
        })  # fmt: skip
    return rows


def _weight_sync_row(shape: Shape, generator: Any, model: torch.nn.Module) -> dict[str, Any]:
    state = model.state_dict()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    generator.load_weights(state, generator.version + 1)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    size_mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    return {"section": "vllm", "model": shape.name, "shape": f"{size_mib:,.0f} MiB", "method": "weight sync",
            "time": f"{seconds:.3f} s", "rate": f"{size_mib / 1024 / seconds:.1f} GiB/s", "seconds": seconds}
