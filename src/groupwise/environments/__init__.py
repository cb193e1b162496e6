"""Environments shipped with groupwise (``episode.environment`` names them): a calculator tool for arithmetic
and a guess-the-number game. docs/environments.md describes both and how to write another."""

from groupwise.config.episode_schema import BUILTIN_ENVIRONMENTS as ENVIRONMENTS

__all__ = ["ENVIRONMENTS"]
