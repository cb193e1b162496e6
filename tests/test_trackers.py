"""Experiment trackers (``logging.backends``) hold the scalars of ``metrics.jsonl``, read back offline through each
library's own files and APIs.

Invariants pinned:
- one real run with every installed backend: TensorBoard's event files (float32, as TensorBoard stores scalars),
  the W&B offline run file (its own protobuf records), trackio's local store and MLflow's SQLite store each hold
  exactly the (step, key, value) triples of metrics.jsonl — every key at every step, nothing more, the evaluation
  merged into the last step included; a backend whose package is missing is skipped with the reason;
- a non-finite value (``null`` in metrics.jsonl) reaches no tracker; a tracker that fails is dropped, named in
  events.log, and the run's metrics.jsonl goes on;
- a backend whose package is not installed is a config error (exit 2, before any model loads) naming the extra to
  install; a repeated backend is refused; ``logging.tensorboard`` keeps working beside ``backends``;
- W&B runs offline without an API key (``WANDB_API_KEY`` or a netrc entry for its host), online with one, and
  leaves ``WANDB_MODE`` to W&B when it is set.
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_sync_trainer import tiny_config

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.run.metrics import MetricsWriter, read_metrics
from groupwise.run.rundir import RunDir
from groupwise.run.trackers import BACKENDS, missing_modules, wandb_mode

PROJECT = "groupwise-tests"
Triples = set[tuple[int, str, float]]


def installed(backend: str) -> bool:
    return not missing_modules(backend)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    """A 3-step sync run (an evaluation at every step and at the end) logged to every installed backend."""
    tmp_path = tmp_path_factory.mktemp("tracked")
    backends = [name for name in BACKENDS if installed(name)]
    cfg = tiny_config(tmp_path, run={"name": "tracked", "max_steps": 3}, eval={"every": 1, "num_prompts": 4},
                      logging={"backends": backends, "project": PROJECT, "train_data": False})  # fmt: skip
    path = tmp_path / "tracked.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(by_alias=True)))
    assert main(["train", str(path)]) == 0
    return tmp_path / "runs" / "tracked"


def jsonl_triples(run_dir: Path) -> Triples:
    triples = {(r["step"], k, float(v)) for r in read_metrics(run_dir / "metrics.jsonl")
               for k, v in r.items() if k != "step" and v is not None}  # fmt: skip
    assert {key for _, key, _ in triples} >= {"loss/total", "eval/accuracy", "reward/trained_mean"}
    return triples


def skip_unless(backend: str) -> None:
    if not installed(backend):
        pytest.skip(f"the {backend} backend's packages {missing_modules(backend)} are not installed "
                    f"(pip install 'groupwise[{backend}]')")  # fmt: skip


def test_tensorboard_holds_the_scalars_of_metrics_jsonl(tracked_run) -> None:
    skip_unless("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tracked_run / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    logged = {(e.step, key, e.value) for key in accumulator.Tags()["scalars"] for e in accumulator.Scalars(key)}
    assert logged == {(step, key, float(np.float32(value))) for step, key, value in jsonl_triples(tracked_run)}


def wandb_history(run_file: Path) -> Triples:
    """The history rows of a W&B run file (``run-<id>.wandb``): a LevelDB-style log (32 KiB blocks of records with
    a 7-byte header: CRC, length, kind full/first/middle/last) after W&B's 7-byte file header, each record a
    ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, pending, records = 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk, position = data[position + 7 : position + 7 + length], position + 7 + length
        if kind == 0:
            position += block - position % block if position % block else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    triples: Triples = set()
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
        step = row.pop("_step")
        triples |= {(step, key, float(value)) for key, value in row.items() if not key.startswith("_")}
    return triples


def test_wandb_offline_run_holds_the_scalars_of_metrics_jsonl(tracked_run) -> None:
    skip_unless("wandb")
    [run_file] = (tracked_run / "wandb").glob("offline-run-*/run-*.wandb")
    assert wandb_history(run_file) == jsonl_triples(tracked_run)


def test_trackio_local_store_holds_the_scalars_of_metrics_jsonl(tracked_run) -> None:
    skip_unless("trackio")
    from trackio.sqlite_storage import SQLiteStorage

    rows = SQLiteStorage.get_logs(PROJECT, "tracked")
    logged = {(row["step"], key, float(value)) for row in rows for key, value in row.items()
              if key not in ("step", "timestamp")}  # fmt: skip
    assert logged == jsonl_triples(tracked_run)


def test_mlflow_store_holds_the_scalars_of_metrics_jsonl(tracked_run) -> None:
    skip_unless("mlflow")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tracked_run / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.params["grpo.num_generations_per_prompt"] == "4"
    logged = {(m.step, key, m.value) for key in run.data.metrics for m in client.get_metric_history(run.info.run_id,
                                                                                                     key)}
    assert logged == jsonl_triples(tracked_run)


class RecordingTracker:
    name = "recording"

    def __init__(self, fail_at: int | None = None) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.fail_at = fail_at
        self.closed = False

    def log(self, step: int, scalars) -> None:
        if step == self.fail_at:
            raise ConnectionError("the tracking server went away")
        self.logged.append((step, dict(scalars)))

    def purge_after(self, step: int) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_non_finite_values_reach_no_tracker_and_a_failing_tracker_is_dropped(tmp_path) -> None:
    run = RunDir.create(tmp_path, "exp", "a: 1\n", resume=False)
    good, bad = RecordingTracker(), RecordingTracker(fail_at=2)
    writer = MetricsWriter(run, trackers=[bad, good])
    writer.log(1, {"loss/total": math.nan, "ds/gen_rounds": 2})
    writer.log(2, {"loss/total": 0.5})
    writer.log(2, {"eval/accuracy": 0.25})  # merged into step 2's line; the trackers get the new key at step 2
    assert good.logged == [(1, {"ds/gen_rounds": 2.0}), (2, {"loss/total": 0.5}), (2, {"eval/accuracy": 0.25})]
    assert bad.logged == [(1, {"ds/gen_rounds": 2.0})] and bad.closed and writer.trackers == [good]
    assert "tracker recording failed at step 2 (ConnectionError: the tracking server went away)" in (
        run.events_path.read_text())
    assert read_metrics(run.metrics_path)[-1] == {"step": 2, "loss/total": 0.5, "eval/accuracy": 0.25}


def test_a_missing_backend_package_is_a_config_error_naming_the_extra(tmp_path, monkeypatch, capsys) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real_find_spec(name, *a))  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path).model_dump(by_alias=True)))
    assert main(["config", "check", str(path), "logging.backends=[tensorboard, mlflow]"]) == 2
    err = capsys.readouterr().err
    assert "logging.backends" in err and "the mlflow backend needs the package(s) mlflow" in err
    assert "pip install 'groupwise[mlflow]', or remove mlflow from logging.backends" in err
    assert main(["train", str(path), "logging.backends=[mlflow]"]) == 2
    assert "pip install 'groupwise[mlflow]'" in capsys.readouterr().err
    assert main(["simulate", str(path), "logging.backends=[mlflow]"]) == 2
    assert "pip install 'groupwise[mlflow]'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before anything was made


def test_backend_choices() -> None:
    def enabled(*overrides: str) -> list[str]:
        cfg = config_from_dict({"model": {"source": "tiny"}}, [f"logging.{o}" for o in overrides])
        return cfg.logging.enabled_backends()

    assert enabled() == ["tensorboard"]
    assert enabled("tensorboard=false") == []
    assert enabled("backends=[wandb, mlflow]") == ["wandb", "mlflow"]
    assert enabled("backends=[wandb]", "tensorboard=true") == ["tensorboard", "wandb"]
    assert enabled("backends=[tensorboard, trackio]", "tensorboard=false") == ["trackio"]
    with pytest.raises(ConfigError, match="more than once"):
        enabled("backends=[wandb, wandb]")


def test_wandb_runs_offline_without_a_key(tmp_path, monkeypatch) -> None:
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine example.com login u password p\n")
    monkeypatch.setenv("NETRC", str(netrc_file))
    assert wandb_mode() == "offline"
    netrc_file.write_text("machine api.wandb.ai login user password secret\n")
    assert wandb_mode() == "online"
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() is None  # W&B reads it itself
