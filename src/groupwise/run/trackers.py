"""Experiment trackers: the scalars of ``metrics.jsonl`` also sent to TensorBoard, Weights & Biases, trackio or
MLflow (``logging.backends``), each through its own library.

Every tracker gets exactly what a ``metrics.jsonl`` line holds, at the same step: each finite value of every
:meth:`~groupwise.run.metrics.MetricsWriter.log` call (non-finite values, written to the file as ``null``, are left
out; integers are sent as floats). A tracker opens on the first value it is sent, so a run that fails before its
first metric leaves nothing behind in it. Where each one writes, when nothing else is configured:

- ``tensorboard``: event files in ``runs/<name>/tensorboard/`` (``tensorboard --logdir runs``); a resumed run
  purges the steps after its checkpoint, as ``metrics.jsonl`` does.
- ``wandb``: ``runs/<name>/wandb/``; offline (nothing is sent; ``wandb sync runs/<name>/wandb/offline-run-*``
  uploads later) unless an API key is set (``WANDB_API_KEY`` or ``wandb login``), or ``WANDB_MODE`` says otherwise.
- ``trackio``: trackio's local store (``$TRACKIO_DIR``, by default ``~/.cache/huggingface/trackio``; ``trackio
  show``).
- ``mlflow``: an SQLite store in ``runs/<name>/mlflow.db`` (MLflow 3 keeps its plain-directory store in
  maintenance mode); ``mlflow ui --backend-store-uri sqlite:///runs/<name>/mlflow.db``. ``MLFLOW_TRACKING_URI``
  overrides it (a shared store or a server).

W&B, trackio and MLflow name the run after its directory, under ``logging.project`` (W&B and trackio project,
MLflow experiment), with the resolved config as its parameters. Each session of a resumed run is a run of its own
there, with the same name (their steps after the checkpoint are logged again; ``metrics.jsonl`` is the record).

A tracker that fails while the run goes on is closed and dropped, and the run's ``events.log`` says so: the
metrics file stays the record, and a tracker's outage does not end training.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import netrc
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args
from urllib.parse import urlparse

from groupwise.config.sections import TrackingBackend

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from groupwise.config import RunConfig

BACKENDS: tuple[str, ...] = get_args(TrackingBackend)
# Modules each backend imports, and the extra that installs them.
REQUIRED_MODULES = {
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
}

# The command that installs a backend's modules (TensorBoard is a dependency of groupwise itself).
INSTALL = {
    "tensorboard": "pip install tensorboard",
    "wandb": "pip install 'groupwise[wandb]'",
    "trackio": "pip install 'groupwise[trackio]'",
    "mlflow": "pip install 'groupwise[mlflow]'",
}


class Tracker(Protocol):
    """One tracking backend of a run."""

    name: str

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record ``scalars`` at ``step`` (called once per :meth:`MetricsWriter.log`, steps never going back)."""

    def purge_after(self, step: int) -> None:
        """A resumed run continues from ``step``: values logged for later steps by an earlier session are void."""

    def close(self) -> None:
        """Flush and close (it may be opened again by a later :meth:`log`)."""


def missing_modules(backend: str) -> list[str]:
    """The modules ``backend`` needs that cannot be imported here (found without importing them)."""
    return [module for module in REQUIRED_MODULES[backend] if importlib.util.find_spec(module) is None]


def trackers_for(backends: Sequence[str], run_dir: Path, run_name: str, project: str,
                 params: Mapping[str, Any]) -> list[Tracker]:  # fmt: skip
    """The trackers of ``backends`` for the run in ``run_dir`` (``params``: its resolved config, nested)."""
    made: dict[str, Tracker] = {
        "tensorboard": TensorBoardTracker(run_dir / "tensorboard"),
        "wandb": WandbTracker(run_dir, run_name, project, params),
        "trackio": TrackioTracker(run_name, project, params),
        "mlflow": MlflowTracker(run_dir, run_name, project, params),
    }
    unknown = [name for name in backends if name not in made]
    if unknown:
        raise ValueError(f"unknown tracking backends {unknown}; choose from {list(BACKENDS)}")
    return [made[name] for name in backends]


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (the flat parameters MLflow takes)."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


class TensorBoardTracker:
    """TensorBoard event files through ``torch.utils.tensorboard``."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._writer: SummaryWriter | None = None
        self._purge_step: int | None = None

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # lazy: this import costs ~2 s

            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=self._purge_step)
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def purge_after(self, step: int) -> None:
        """Readers discard earlier sessions' events from ``step + 1`` on (``purge_step``); an open writer cannot
        purge, so it is closed and the marker lands in the next event file."""
        self._purge_step = step + 1
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbTracker:
    """A Weights & Biases run in ``<run dir>/wandb``, offline unless an API key is set."""

    name = "wandb"

    def __init__(self, run_dir: Path, run_name: str, project: str, params: Mapping[str, Any]) -> None:
        self.run_dir, self.run_name, self.project, self.params = run_dir, run_name, project, dict(params)
        self._run: Any = None  # Any: the optional package's run object (not installed by default)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._run is None:
            import wandb

            settings = wandb.Settings(console="off", x_disable_stats=True, quiet=True, silent=True)
            self._run = wandb.init(
                project=self.project, name=self.run_name, dir=str(self.run_dir), config=self.params,
                mode=wandb_mode(), reinit="create_new", settings=settings,
            )  # fmt: skip
        self._run.log(dict(scalars), step=step)

    def purge_after(self, step: int) -> None:
        """Nothing to purge: each session is a run of its own (module docstring)."""

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def wandb_mode() -> Literal["online", "offline"] | None:
    """None (W&B reads ``$WANDB_MODE`` itself) when that is set; else ``online`` with an API key (``WANDB_API_KEY``,
    or a netrc entry for the W&B host as ``wandb login`` writes), ``offline`` without one (W&B would otherwise ask
    for a key, or fail without a terminal)."""
    if os.environ.get("WANDB_MODE"):
        return None
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return "online" if netrc.netrc(os.environ.get("NETRC")).authenticators(host) else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


class TrackioTracker:
    """A trackio run in trackio's local store."""

    name = "trackio"

    def __init__(self, run_name: str, project: str, params: Mapping[str, Any]) -> None:
        self.run_name, self.project, self.params = run_name, project, dict(params)
        self._run: Any = None  # Any: the optional package's run object (not installed by default)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._run is None:
            import trackio

            with contextlib.redirect_stdout(sys.stderr):  # where it logs and how to view it: beside our phase lines
                self._run = trackio.init(project=self.project, name=self.run_name, config=self.params,
                                         auto_log_gpu=False, auto_log_cpu=False)  # fmt: skip
        self._run.log(dict(scalars), step=step)

    def purge_after(self, step: int) -> None:
        """Nothing to purge: each session is a run of its own (module docstring)."""

    def close(self) -> None:
        if self._run is not None:
            import trackio
            from trackio import context_vars

            with contextlib.redirect_stdout(sys.stderr):
                if context_vars.current_run.get() is self._run:
                    trackio.finish()  # also forgets it as trackio's current run, which its atexit hook would finish
                else:
                    self._run.finish()
            self._run = None


class MlflowTracker:
    """An MLflow run, through ``MlflowClient`` (no process-global active run), in ``<run dir>/mlflow.db``."""

    name = "mlflow"

    def __init__(self, run_dir: Path, run_name: str, project: str, params: Mapping[str, Any]) -> None:
        self.run_dir, self.run_name, self.project, self.params = run_dir, run_name, project, dict(params)
        self._client: Any = None  # Any: mlflow's MlflowClient (an optional package)
        self._run_id: str | None = None

    @property
    def tracking_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(self.run_dir / 'mlflow.db').resolve()}"

    def _open(self) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        for name in ("mlflow", "alembic"):  # their INFO lines (creating tables, migrations) are not ours to show;
            logging.getLogger(name).setLevel(logging.WARNING)  # after the import, which sets mlflow's level

        client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = client.get_experiment_by_name(self.project)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            own_store = "MLFLOW_TRACKING_URI" not in os.environ  # keep artifacts beside our store, not in the cwd
            location = (self.run_dir / "mlflow_artifacts").resolve().as_uri() if own_store else None
            experiment_id = client.create_experiment(self.project, artifact_location=location)
        run = client.create_run(experiment_id, run_name=self.run_name)
        params = [Param(key, str(value)) for key, value in flatten(self.params).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            client.log_batch(run.info.run_id, params=params[start : start + 100])
        self._client, self._run_id = client, run.info.run_id

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._client is None:
            self._open()
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(key, value, stamp, step) for key, value in scalars.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def purge_after(self, step: int) -> None:
        """Nothing to purge: each session is a run of its own (module docstring)."""

    def close(self) -> None:
        if self._client is not None:
            self._client.set_terminated(self._run_id)
            self._client, self._run_id = None, None


def config_trackers(cfg: RunConfig, run_dir: Path) -> list[Tracker]:
    """The trackers a run config's ``logging`` section asks for (``cfg``: a ``RunConfig``)."""
    params = cfg.model_dump(mode="json", by_alias=True)
    return trackers_for(cfg.logging.enabled_backends(), run_dir, run_dir.name, cfg.logging.project, params)
