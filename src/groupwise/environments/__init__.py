"""Environments shipped with groupwise (``episode.environment`` names them): a calculator tool for arithmetic,
a guess-the-number game, a walk along the number line and a sandbox that runs the model's Python programs.
docs/environments.md describes each and how to write another."""

from groupwise.config.episode_schema import BUILTIN_ENVIRONMENTS as ENVIRONMENTS

__all__ = ["ENVIRONMENTS"]
