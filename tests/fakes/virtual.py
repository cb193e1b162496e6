"""Virtual-time runner (looptime) and a real prompt loader over synthetic prompts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import looptime

from groupwise.data.loader import PromptLoader
from groupwise.types import Prompt

T = TypeVar("T")


def make_prompts(n: int, prefix: str = "p") -> list[Prompt]:
    return [Prompt(uid=f"{prefix}{i}", answer="", text=f"{prefix}{i}") for i in range(n)]


def make_loader(n: int, prefix: str = "p") -> PromptLoader:
    """One epoch of ``n`` prompts ``p0..p{n-1}`` in order."""
    return PromptLoader(make_prompts(n, prefix), seed=0, shuffle=False, max_epochs=1)


def run_virtual(main: Callable[[], Awaitable[T]], timeout: float = 10_000.0) -> T:
    """Run ``main()`` on a looptime loop (virtual time); a run longer than ``timeout`` virtual seconds —
    a hang — raises TimeoutError."""
    loop = looptime.new_event_loop(start=0)
    try:
        return loop.run_until_complete(asyncio.wait_for(main(), timeout))
    finally:
        loop.close()
