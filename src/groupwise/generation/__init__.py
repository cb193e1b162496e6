"""Generation: the ``Generator`` interface and the built-in KV-cache sampling engine."""

from groupwise.generation.base import Generator
from groupwise.generation.engine import Engine

__all__ = ["Engine", "Generator"]
