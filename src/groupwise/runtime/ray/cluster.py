"""Joining a Ray cluster and making sure the run's actors can be placed on it.

The ``ray`` module is imported here first, so a missing install fails with the install command
(:class:`RayNotInstalledError`) instead of a bare ``ModuleNotFoundError``; the other modules of
:mod:`groupwise.runtime.ray` take ``ray`` from this one.

Placement is checked before anything waits on it, because Ray never fails a request it cannot place: the
actor just stays pending and the run hangs silently (on 2 CPUs, two ``num_cpus=1`` actors reserve every CPU
and any further default request waits forever, with no error). So:

* a request larger than every node (:func:`unschedulable_reasons`, *infeasible*) or larger than what the
  cluster has free right now (*busy*) is refused at once with the key to change;
* starting actors waits at most ``timeout_s`` (:func:`wait_until_started`) and then names the actors that
  never came up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from groupwise.controller.failures import register_infra_error_type
from groupwise.runtime.ray.errors import INSTALL_COMMAND, RayNotInstalledError, RaySetupError, UnschedulableError

if TYPE_CHECKING:
    from groupwise.config import RaySection

try:
    import ray
    import ray.exceptions
except ModuleNotFoundError as _missing:  # only a missing Ray itself; a broken install shows its own error
    if _missing.name != "ray":
        raise
    raise RayNotInstalledError(
        f"runtime.backend: ray needs the Ray package, which is not installed; install it with: {INSTALL_COMMAND} "
        "(or set runtime.backend: embedded to train in this process)",
        name="ray",
    ) from _missing

# A lost worker, node or object is the machinery failing, not the data: the controller retries it under the
# infra budget. RayTaskError (user code raising inside an actor) is deliberately absent: it keeps its cause's
# class, so a reward function's error stays a data error.
RAY_INFRA_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.RayActorError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.LocalRayletDiedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.ObjectFetchTimedOutError,
    ray.exceptions.OutOfMemoryError,
    ray.exceptions.RaySystemError,
)
for _error_type in RAY_INFRA_ERRORS:
    register_infra_error_type(_error_type)

# A Ray actor handle. Its remote methods are looked up dynamically (``handle.train_chunk.remote(rows)``), which
# Ray's own ``ActorHandle`` types as ``Never``; so a handle is typed as unknown, and each call site says what it gets.
ActorHandle = Any

_EPSILON = 1e-9


@dataclass(frozen=True)
class ActorResources:
    """What one actor reserves, and the config keys that set it (named in errors)."""

    role: str
    cpus: float
    gpus: float
    cpu_key: str
    gpu_key: str

    def options(self) -> dict[str, float]:
        return {"num_cpus": self.cpus, "num_gpus": self.gpus}


def generation_worker_resources(ray_cfg: RaySection, index: int) -> ActorResources:
    return ActorResources(
        f"generation worker {index}",
        ray_cfg.cpus_per_generation_worker,
        ray_cfg.gpus_per_generation_worker,
        "runtime.ray.cpus_per_generation_worker",
        "runtime.ray.gpus_per_generation_worker",
    )


def learner_resources(ray_cfg: RaySection, rank: int | None = None) -> ActorResources:
    """The learner actor, or with several learner ranks rank ``rank``'s (each reserves the learner's share)."""
    role = "learner" if rank is None else f"learner rank {rank}"
    return ActorResources(
        role, ray_cfg.learner_cpus, ray_cfg.learner_gpus, "runtime.ray.learner_cpus", "runtime.ray.learner_gpus"
    )


def run_resources(ray_cfg: RaySection, learner_ranks: int = 1) -> list[ActorResources]:
    """The learner (or each of its ``learner_ranks`` ranks) and every generation worker, as ``runtime.ray``
    sizes them."""
    workers = [generation_worker_resources(ray_cfg, i) for i in range(ray_cfg.num_generation_workers)]
    if learner_ranks == 1:
        return [learner_resources(ray_cfg), *workers]
    return [*(learner_resources(ray_cfg, rank) for rank in range(learner_ranks)), *workers]


def unschedulable_reasons(
    requests: Sequence[ActorResources],
    node_totals: Sequence[Mapping[str, float]],
    available: Mapping[str, float],
) -> list[str]:
    """Why ``requests`` cannot all be placed: empty when they can.

    *Infeasible*: a request needs more CPUs or GPUs than any single alive node has in total (an actor lives on
    one node). Otherwise *busy*: the requests together need more than the cluster has free now (``available``).
    """
    reasons = [reason for r in requests if (reason := _infeasible(r, node_totals))]
    if reasons:
        return reasons
    for resource, attribute, key in (("CPU", "cpus", "cpu_key"), ("GPU", "gpus", "gpu_key")):
        need = sum(getattr(r, attribute) for r in requests)
        free = available.get(resource, 0.0)
        total = sum(n.get(resource, 0.0) for n in node_totals)
        if need > free + _EPSILON:
            settings = sorted({getattr(r, key) for r in requests if getattr(r, attribute) > 0})
            held = "; other actors or jobs hold the rest" if free < total - _EPSILON else ""
            reasons.append(
                f"the run reserves {need:g} {resource} in all but the cluster has {free:g} free ({total:g} in total"
                f"{held}); lower {', '.join(settings)} or runtime.ray.num_generation_workers"
            )
    return reasons


def _infeasible(r: ActorResources, node_totals: Sequence[Mapping[str, float]]) -> str | None:
    def fits(need: float, node: Mapping[str, float], resource: str) -> bool:
        return need <= node.get(resource, 0.0) + _EPSILON

    if any(fits(r.cpus, n, "CPU") and fits(r.gpus, n, "GPU") for n in node_totals):
        return None
    cpu_short = not any(fits(r.cpus, n, "CPU") for n in node_totals)
    gpu_short = not any(fits(r.gpus, n, "GPU") for n in node_totals)
    # Neither alone too large: no single node has both at once.
    keys = [key for key, short in ((r.cpu_key, cpu_short), (r.gpu_key, gpu_short)) if short] or [r.cpu_key, r.gpu_key]
    largest = ", ".join(f"{max((n.get(x, 0.0) for n in node_totals), default=0.0):g} {x}" for x in ("CPU", "GPU"))
    return (
        f"{r.role} asks for {r.cpus:g} CPU and {r.gpus:g} GPU, but no node has that much (the largest have "
        f"{largest}); lower {' / '.join(keys)} or add a bigger node"
    )


def check_schedulable(requests: Sequence[ActorResources]) -> None:
    """Raise :class:`UnschedulableError` now, instead of letting Ray leave the actors pending for ever."""
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    reasons = unschedulable_reasons(requests, nodes, ray.available_resources())
    if reasons:
        raise UnschedulableError("Ray cannot place this run's actors:\n- " + "\n- ".join(reasons))


def wait_until_started(ready_refs: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """Wait for each actor's ``ready`` call (role → ObjectRef); return role → what ``ready`` returned.

    An actor whose constructor raised fails with its error; actors not up after ``timeout_s`` seconds raise
    :class:`UnschedulableError` naming them (Ray could not place them, or they hang while loading).
    """
    refs = list(ready_refs.values())
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = [role for role, ref in ready_refs.items() if ref in pending]
        raise UnschedulableError(
            f"{', '.join(late)} did not start within {timeout_s:g} s: Ray could not place them on the cluster "
            "(see `ray status` for pending demands) or they hang while loading the model"
        )
    started = {}
    for role, ref in ready_refs.items():
        try:
            started[role] = ray.get(ref)
        except ray.exceptions.RayError as err:
            raise RaySetupError(f"{role} failed to start: {err}") from err
    return started


@dataclass
class RayCluster:
    """This process's connection to a Ray cluster; ``shutdown`` ends only what :func:`connect_cluster` began."""

    owns_connection: bool
    address: str

    def shutdown(self) -> None:
        if self.owns_connection and ray.is_initialized():
            ray.shutdown()
        self.owns_connection = False


def connect_cluster(address: str) -> RayCluster:
    """Join the cluster ``runtime.ray.address`` names: ``""`` starts a local one, ``auto`` finds the running one,
    ``host:port`` joins that one. A process already connected (``ray.init`` done by the caller) keeps its
    connection, and shutting the run down leaves it open."""
    if ray.is_initialized():
        return RayCluster(owns_connection=False, address="(already connected)")
    kwargs: dict[str, Any] = {"include_dashboard": False} if not address else {"address": address}
    try:
        ray.init(**kwargs, log_to_driver=True)
    except (ConnectionError, ValueError) as err:
        hint = (
            "start one with `ray start --head` on this machine"
            if address == "auto"
            else "check the address (`ray status` on the head node prints it)"
        )
        raise RaySetupError(
            f"runtime.ray.address={address!r}: no Ray cluster to join ({err}); {hint}, "
            "or leave runtime.ray.address empty to start a local cluster"
        ) from err
    return RayCluster(owns_connection=True, address=address or f"local ({os.cpu_count()} CPUs)")
