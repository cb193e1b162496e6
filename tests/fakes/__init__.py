"""Scripted fakes for driving the real controller in tests (never used outside ``tests/``)."""

from fakes.rollouts import Outcome, ScriptedRollouts
from fakes.trainer import RecordingTrainer
from fakes.virtual import make_loader, make_prompts, run_virtual

__all__ = ["Outcome", "RecordingTrainer", "ScriptedRollouts", "make_loader", "make_prompts", "run_virtual"]
