"""Runtimes for the async controller: embedded (in-process, the default) and Ray (``ray_*.py`` only)."""
