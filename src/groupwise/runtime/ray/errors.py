"""Errors of the Ray runtime that the CLI reports without a traceback. This module does not import Ray, so
callers can catch these errors on machines where Ray is not installed."""

from __future__ import annotations

INSTALL_COMMAND = "pip install 'groupwise[ray]'"


class RayNotInstalledError(ModuleNotFoundError):
    """``runtime.backend: ray`` was chosen but the ``ray`` package is not installed."""


class RaySetupError(RuntimeError):
    """The Ray runtime could not start the run: no cluster to join, or actors that cannot be placed or started."""


class UnschedulableError(RaySetupError):
    """The cluster cannot place (or did not start) an actor the run needs."""
