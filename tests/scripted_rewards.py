"""Scripted reward functions for trainer tests (``reward.function: "scripted_rewards:<name>"``).

They are fakes named as such: deterministic functions of the prompt and the completion text that make some
groups zero-variance on purpose, and record every call so a test can recompute the metrics independently.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from groupwise.types import Completion, Prompt

CALLS: list[tuple[str, str, float]] = []


def marker_reward(prompt: Prompt, completion: Completion) -> float:
    """Zero-variance by construction for prompts whose first operand is a multiple of 3 (always 1.0 when the
    second operand is even, else always 0.0); every other prompt is rewarded by the parity of the completion's first
    token id, which a random tiny model varies within a group. Records ``(uid, text, reward)``."""
    a, b = prompt.metadata["a"], prompt.metadata["b"]
    if a % 3 == 0:
        reward = 1.0 if b % 2 == 0 else 0.0
    else:
        reward = float(completion.token_ids[0] % 2)
    CALLS.append((prompt.uid, completion.text, reward))
    return reward


def fails_on_answers_ending_in(prompt: Prompt, completion: Completion, digits: str = "7") -> float:
    """Raises for prompts whose answer ends in one of ``digits`` (a verifier bug tied to the data); otherwise
    ``marker_reward``."""
    if prompt.answer[-1:] in digits:
        raise ValueError(f"verifier cannot parse answers ending in {prompt.answer[-1]} (answer {prompt.answer})")
    return marker_reward(prompt, completion)


def hangs_on_answers_ending_in(prompt: Prompt, completion: Completion, digits: str = "7") -> float:
    """Sleeps 2 s for prompts whose answer ends in one of ``digits`` (a verifier stuck on some data, to be cut by
    ``reward.timeout_s``); otherwise ``marker_reward``."""
    if prompt.answer[-1:] in digits:
        time.sleep(2.0)
    return marker_reward(prompt, completion)


def fails_after_calls(prompt: Prompt, completion: Completion, calls: int = 48) -> float:
    """``marker_reward`` until ``CALLS`` holds ``calls`` entries, then raises: a verifier that breaks mid-run (clear
    ``CALLS`` before the run)."""
    if len(CALLS) >= calls:
        raise ValueError(f"verifier broke after {calls} calls")
    return marker_reward(prompt, completion)


def constant_after_calls(prompt: Prompt, completion: Completion, calls: int = 32) -> float:
    """``marker_reward`` until ``CALLS`` holds ``calls`` entries, then 1.0 for every completion: a policy that has
    mastered its data, every group all right (clear ``CALLS`` before the run). Records ``(uid, text, reward)``."""
    if len(CALLS) < calls:
        return marker_reward(prompt, completion)
    CALLS.append((prompt.uid, completion.text, 1.0))
    return 1.0


def spins_in_torch(prompt: Prompt, completion: Completion) -> float:
    """Never returns, busy in torch kernels (a verifier stuck in native code): the thread cannot be stopped, and
    the process must still exit with the run's code."""
    import torch

    x = torch.randn(64, 64)
    while True:
        x = (x @ x).tanh()


def waits_forever(prompt: Prompt, completion: Completion) -> float:
    """Never returns (a wedged verifier): the stall watchdog must stop the run. Blocks without busy-waiting."""
    threading.Event().wait()
    return 0.0


def kill_once_reward(prompt: Prompt, completion: Completion, kill_flag: str = "") -> float:
    """``marker_reward``, except that the first call to find ``kill_flag`` claims it and kills its
    own process (SIGKILL): a generation worker lost mid-group, while scoring a batch it has generated."""
    if kill_flag:
        try:
            os.rename(kill_flag, kill_flag + ".claimed")
        except FileNotFoundError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    return marker_reward(prompt, completion)


def slow_marker_reward(prompt: Prompt, completion: Completion) -> float:
    """``marker_reward`` after 50 ms: groups are still being scored on the workers (their rows done,
    their calls running) whenever a step ends, so every checkpoint finds attempts to keep."""
    time.sleep(0.05)
    return marker_reward(prompt, completion)
