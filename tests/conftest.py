"""Test-session settings shared by every module.

Intra-op threads: one by default. The models in the suite are tiny, one thread is as fast as two for them,
and it keeps OpenMP teams from competing for a busy core. ``GROUPWISE_TEST_THREADS=N`` runs the session
with N threads instead: ``make test-cpu-variants`` uses it to show which comparisons depend on the thread
count. The count is also exported as ``OMP_NUM_THREADS``, so a ``groupwise`` command called in-process
treats it as the user's explicit choice and leaves it alone. A test that changes the count gets it back
afterwards, so one test cannot change the kernels of the tests after it.

``OMP_WAIT_POLICY=PASSIVE`` (unless set already) is exported before torch loads libgomp, which reads it only
then: waiting OpenMP threads sleep instead of spinning against other work on the machine.

Nothing a test runs writes to the user's caches or trackers: the GGUF cache (``GROUPWISE_CACHE_DIR``) and trackio's
store (``TRACKIO_DIR``, read when trackio is imported) point into a scratch directory removed at exit, W&B runs
offline whatever keys the machine holds, and ``MLFLOW_TRACKING_URI`` is unset (each run keeps its own SQLite store).
"""

import atexit
import os
import shutil
import tempfile

import pytest

THREADS_VARIABLE = "GROUPWISE_TEST_THREADS"


def _test_threads() -> int:
    text = os.environ.get(THREADS_VARIABLE, "1")
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(f"{THREADS_VARIABLE}={text!r}: must be a whole number of threads >= 1 (e.g. 2)")
    return int(text)


TEST_THREADS = _test_threads()
SCRATCH = tempfile.mkdtemp(prefix="groupwise-tests-")
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
os.environ["GROUPWISE_CACHE_DIR"] = os.path.join(SCRATCH, "cache")
os.environ["TRACKIO_DIR"] = os.path.join(SCRATCH, "trackio")
os.environ["WANDB_MODE"] = "offline"
for _wandb_dir in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
    os.environ[_wandb_dir] = os.path.join(SCRATCH, "wandb", _wandb_dir.lower())
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ["OMP_NUM_THREADS"] = str(TEST_THREADS)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP variables: libgomp reads them when torch loads it)

torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def _restore_intra_op_threads():
    yield
    if torch.get_num_threads() != TEST_THREADS:
        torch.set_num_threads(TEST_THREADS)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster with 2 CPUs, one per test session, for every module that runs on Ray; actors reserve
    fractions, so nothing can starve. Workers import the test reward functions from this directory."""
    ray = pytest.importorskip("ray")
    auth_mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a throwaway local cluster: no token to generate
    path = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()
    if auth_mode is None:
        del os.environ["RAY_AUTH_MODE"]
    else:
        os.environ["RAY_AUTH_MODE"] = auth_mode
