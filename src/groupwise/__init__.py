"""groupwise: GRPO with DAPO dynamic sampling, in a sync loop and an async single controller."""

__version__ = "0.1.0"
