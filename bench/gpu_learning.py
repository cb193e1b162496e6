"""The end-to-end learning check of ``bench/gpu.py``: the SFT recipe makes a small model on the device, then
GRPO with dynamic sampling trains it, time-boxed; the row reports held-out accuracy at the start and the end.

Like the measurements in ``gpu_runs``, it returns result rows and never raises: a failure becomes a row saying
what failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_runs import REPO, failure_row


def learning_check(device: str, workdir: Path, seconds_left: Callable[[], float], smoke: bool) -> list[dict[str, Any]]:
    """``recipes/warm_start_addition.yaml`` on the device, then ``examples/addition.yaml`` from its result,
    time-boxed: held-out greedy accuracy at the start of GRPO and at its end."""
    from groupwise.config import load_config
    from groupwise.runtime.sync_run import train_steps
    from groupwise.trainer.builder import build_session
    from groupwise.trainer.sft import run_sft

    common = [f"model.device={device}", f"run.output_dir={workdir}", "logging.tensorboard=false"]
    small = ["data.addition.num_eval=16", "data.addition.num_train=200"] if smoke else []
    try:
        start = time.perf_counter()
        sft_overrides = [*common, *small, "run.name=gpu-sft"]
        if smoke:
            sft_overrides += ["sft.steps=4", "sft.eval_every=2", "sft.stop_at_accuracy=null", "sft.batch_size=8"]
        final = run_sft(load_config(REPO / "recipes/warm_start_addition.yaml", sft_overrides))
        sft_seconds = time.perf_counter() - start
        # Smoke: a 4-step SFT model gives every group the same reward (dynamic sampling would find none to
        # train), so GRPO starts from the shipped warm start made by the same recipe.
        start_from = REPO / "models/addition-tiny" if smoke else final
        rl_overrides = [*common, *small, "run.name=gpu-grpo", f"model.path={start_from}", "logging.progress=false",
                        "logging.train_data=false", "checkpoint.every=0"]  # fmt: skip
        if smoke:
            rl_overrides += ["run.max_steps=2", "grpo.num_prompts_per_step=4", "eval.every=0"]
        session = build_session(load_config(REPO / "examples/addition.yaml", rl_overrides))
        start = time.perf_counter()
        curve = [(0, session.evaluate(step=0)["eval/accuracy"])]
        reserve = 5.0 if smoke else 15.0  # the final evaluation and checkpoint
        while session.state.step < session.cfg.run.max_steps and seconds_left() > reserve:
            if train_steps(session, session.state.step + 1) == "exhausted":  # one step at a time: time-boxed
                break
            if "eval/accuracy" in session.last_metrics and session.last_metrics["step"] == session.state.step:
                curve.append((session.state.step, session.last_metrics["eval/accuracy"]))
        session.finish()
        if curve[-1][0] != session.state.step:
            curve.append((session.state.step, session.last_metrics["eval/accuracy"]))
        rl_seconds = time.perf_counter() - start
    except Exception as error:
        return [failure_row("learning", "addition-tiny (SFT on device)", "", "sft + grpo", error)]
    gain = curve[-1][1] - curve[0][1]
    steps = session.state.step
    return [{
        "section": "learning", "model": "addition-tiny (SFT on device)", "shape": f"{steps} GRPO steps",
        "method": "sft -> grpo + dynamic sampling", "time": f"{sft_seconds:.0f} s sft + {rl_seconds:.0f} s grpo",
        "ratio": f"accuracy {curve[0][1]:.3f} -> {curve[-1][1]:.3f} ({100 * gain:+.1f} points)",
        "note": "curve " + ", ".join(f"{s}:{a:.2f}" for s, a in curve) + f"; decode: {session.engine.decode_path}",
        "accuracy_start": curve[0][1], "accuracy_end": curve[-1][1], "gain_points": 100 * gain, "curve": curve,
        "sft_seconds": sft_seconds, "grpo_seconds": rl_seconds, "grpo_steps": steps,
    }]  # fmt: skip
