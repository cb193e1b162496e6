"""What every module of the vLLM tier shares: its marks, the shipped tiny model, the prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from groupwise.optional_packages import vllm_unavailable

TINY_MODEL = Path(__file__).resolve().parents[2] / "models" / "addition-tiny"
VLLM_MISSING = vllm_unavailable()
PROMPTS = ("12+34=", "7+5=", "61+28=", "3+90=")


def vllm_marks() -> list[pytest.MarkDecorator]:
    """The marks of every module here: the tier's marker, and a skip (with the reason) without vLLM."""
    return [pytest.mark.vllm, pytest.mark.skipif(VLLM_MISSING is not None, reason=VLLM_MISSING or "")]
