"""The learner as N data-parallel processes (``learner.num_ranks`` > 1) on the embedded runtime.

**What runs where.** The run's own process (the driver) keeps everything it keeps with one learner — the
controller or sync loop, the engine, the rewards, the run directory — and spawns every rank as a child
(``torch.multiprocessing``, spawn). Rank 0 is a child too, not the driver: a rank waits in collectives, and a
driver blocked in one could not notice that a peer died, stop the others or write what it knows; the driver
only waits on pipes, which it can watch. The cost is one copy of the weights from rank 0 to the driver per
version, which the engine needs anyway.

**The protocol.** The driver sends each command to every rank over its pipe (a step's rows go whole to every
rank; each keeps its share: groupwise.trainer.rank_learner) and waits for every reply; rank 0's reply is the
result. The ranks rendezvous on ``127.0.0.1`` at a free port with ``learner.collective_timeout_s`` as the
process-group timeout.

**A rank that dies.** While waiting, the driver watches every rank's process: one that exits ends the wait
at once with :class:`LearnerRankDied` naming the rank, its exit code, what the learner was doing and the
newest complete checkpoint (what is kept); the other ranks are stopped. A rank that raises ends it the same
way with the rank's own error. A rank stuck in a collective because a peer died fails after the process-group
timeout, so no wait is unbounded.

**A driver that dies.** Every rank watches its parent (:mod:`groupwise.runtime.parent_watch`): when the driver is
gone — SIGKILLed, say — the rank ends within moments, whatever it was doing, rather than living on as an orphan.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import os
import pickle
import socket
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp

from groupwise.batch import RowBatch
from groupwise.runtime.parent_watch import exit_with_parent

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.trainer.rank_learner import RankLearner

_POLL_S = 0.5  # how often a waiting driver looks at the ranks' processes
_STOP_GRACE_S = 5.0  # seconds a stopped rank gets to exit before it is killed


def send(conn: Connection, message: object) -> None:
    """Pickle ``message`` by value. ``Connection.send`` would use torch's reducers, which move every tensor
    into shared memory and send a handle: the driver's copy of the weights would then *be* rank 0's live
    parameters and change with every update."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:  # Any: whatever the other end pickled
    return pickle.loads(conn.recv_bytes())


class LearnerRankDied(RuntimeError):
    """A learner rank's process ended while the run needed it: the step cannot complete, the run stops."""


class LearnerRankFailed(RuntimeError):
    """A learner rank raised (its error and traceback are in the message); the run stops."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LearnerRanks:
    """The driver's handle on N rank processes (module docstring). ``kept()`` says what is on disk, for errors."""

    def __init__(self, cfg: RunConfig, kept: Callable[[], str] = lambda: "nothing yet"):
        self.num_ranks = cfg.learner.num_ranks
        self.kept = kept
        self.closed = False
        context = mp.get_context("spawn")
        port = free_port()
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        for rank in range(self.num_ranks):
            parent, child = context.Pipe(duplex=True)
            proc = context.Process(target=rank_main, args=(rank, self.num_ranks, port, cfg, child),
                                   name=f"groupwise-learner-rank-{rank}", daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self.started: dict[str, Any] = {}  # rank 0's ready reply, once every rank started

    @property
    def processes(self) -> list[BaseProcess]:
        return list(self._procs)

    def wait_started(self) -> dict[str, Any]:
        """Rank 0's ``ready`` reply once every rank has built its learner (``version``, ``logprob_path``)."""
        self.started = self._gather("starting (loading the model, joining the process group)")
        return self.started

    def call(self, what: str, command: str, *args: Any) -> Any:  # Any: the arguments and reply of any command
        """Run ``command(*args)`` on every rank; rank 0's result. ``what`` names it in errors."""
        if self.closed:
            raise LearnerRankDied(f"the learner ranks were stopped before {what}")
        for rank, conn in enumerate(self._conns):
            try:
                send(conn, (command, args))
            except (BrokenPipeError, ConnectionResetError, EOFError):
                self._died(rank, what)
        return self._gather(what)

    def _gather(self, what: str) -> Any:  # Any: rank 0's reply to any command
        replies: dict[int, Any] = {}
        while len(replies) < self.num_ranks:
            waiting = {r: (self._conns[r], self._procs[r].sentinel) for r in range(self.num_ranks) if r not in replies}
            ready = multiprocessing.connection.wait([h for pair in waiting.values() for h in pair], timeout=_POLL_S)
            for rank, (conn, sentinel) in waiting.items():
                if conn in ready or conn.poll():
                    try:
                        status, value = receive(conn)
                    except (EOFError, ConnectionResetError):
                        self._died(rank, what)
                    if status == "error":
                        self._failed(rank, what, value)
                    replies[rank] = value
                elif sentinel in ready:
                    self._died(rank, what)
        return replies[0]

    def _died(self, rank: int, what: str) -> None:
        proc = self._procs[rank]
        proc.join(1.0)
        code = proc.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        self.close()
        raise LearnerRankDied(
            f"learner rank {rank} of {self.num_ranks} (pid {proc.pid}) {how} while {what}; the other ranks were "
            f"stopped and the run stops here. Kept: {self.kept()}; continue with `groupwise train ... --resume`"
        )

    def _failed(self, rank: int, what: str, error: tuple[BaseException | None, str]) -> None:
        exc, text = error
        self.close()
        if exc is not None and not isinstance(exc, (RuntimeError, OSError)):
            raise exc  # a typed error the run handles (a non-finite step, a bad checkpoint): keep its type
        raise LearnerRankFailed(
            f"learner rank {rank} of {self.num_ranks} failed while {what}; the other ranks were stopped. "
            f"Kept: {self.kept()}.\n{text}"
        ) from exc

    def close(self) -> None:
        """Stop every rank (a polite ``close``, then terminate, then kill); safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for conn in self._conns:
            with contextlib.suppress(OSError, EOFError):
                send(conn, ("close", ()))
        for proc in self._procs:
            proc.join(_STOP_GRACE_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(_STOP_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()


# --- the rank process -----------------------------------------------------------------------------------------
def rank_main(rank: int, world_size: int, port: int, cfg: RunConfig, conn: Connection) -> None:
    """A rank's process: build the learner in the group, then serve the driver's commands until ``close``. It ends
    with its driver, whatever it is doing then (:mod:`groupwise.runtime.parent_watch`)."""
    import torch.distributed as dist

    exit_with_parent()

    try:
        learner = build_rank_learner(cfg, rank, world_size, "127.0.0.1", port, cuda_index=rank, share_cpus=True)
        _reply(conn, rank, {"version": learner.version, "logprob_path": learner.warm_up()})
    except BaseException as err:  # noqa: BLE001 — the driver reports it, naming this rank
        send(conn, ("error", _portable(err)))
        return
    commands = RankCommands(learner)
    while True:
        try:
            command, args = receive(conn)
        except (EOFError, OSError):  # the driver is gone: nothing to serve
            break
        if command == "close":
            break
        try:
            _reply(conn, rank, getattr(commands, command)(*args))
        except BaseException as err:  # noqa: BLE001
            send(conn, ("error", _portable(err)))
            break
    if dist.is_initialized():
        dist.destroy_process_group()


def _reply(conn: Connection, rank: int, value: object) -> None:
    send(conn, ("ok", value if rank == 0 else None))  # rank 0's copy is the one the driver keeps


def _portable(err: BaseException) -> tuple[BaseException | None, str]:
    """The error itself when it pickles (to keep its type), and its traceback as text."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:  # noqa: BLE001
        return None, text
    return err, text


def build_rank_learner(
    cfg: RunConfig, rank: int, world_size: int, host: str, port: int, cuda_index: int, share_cpus: bool
) -> RankLearner:
    """Rank ``rank``'s learner in the group that meets at ``host:port``, on GPU ``cuda_index`` with CUDA;
    ``share_cpus``: split this machine's cores among the ranks (Ray sets each actor's threads itself)."""
    from groupwise.model.loading import resolve_device
    from groupwise.trainer.builder import learner_parts, load_policy_from_config
    from groupwise.trainer.data_parallel import DataParallel, init_process_group
    from groupwise.trainer.rank_learner import RankLearner

    device = resolve_device(cfg.model.device)
    if device.type == "cuda":
        device = torch.device("cuda", cuda_index)  # one GPU per rank
        torch.cuda.set_device(device)
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"device": str(device)})})
    elif share_cpus:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    init_process_group(rank, world_size, host, port, device, cfg.learner.collective_timeout_s)
    torch.manual_seed(cfg.run.seed)
    policy = load_policy_from_config(cfg)
    parallel = DataParallel(rank, world_size, cfg.learner.sharding, device)
    parts = learner_parts(cfg, policy.model)
    return RankLearner(parts.model, parts.settings, parallel, reference=parts.reference, precision=parts.precision)


@dataclass
class RankCommands:
    """What the driver can ask of a rank; every rank runs each one (most are collectives)."""

    learner: RankLearner

    def train_chunk(self, rows: RowBatch) -> None:
        self.learner.train_chunk(rows)

    def finish_step(self) -> tuple[dict[str, float], int]:
        return self.learner.finish_step(), self.learner.version

    def state_dict(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> int:
        self.learner.load_state_dict(state)
        return self.learner.version

    def model_state(self) -> dict[str, torch.Tensor]:
        return self.learner.model_state()

    def load_model_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.learner.load_model_state(state)

    def generator_state(self) -> dict[str, torch.Tensor]:
        return self.learner.generator_state()


class RankedLearner:
    """The session's ``learner`` (a ``StepLearner``): every call goes to all ranks; ``version`` mirrors rank 0."""

    def __init__(self, ranks: LearnerRanks):
        self.ranks = ranks
        self.version = int(ranks.started["version"]) if ranks.started else 0

    @property
    def logprob_path(self) -> str:
        return str(self.ranks.started["logprob_path"])

    def train_chunk(self, rows: RowBatch) -> None:
        self.ranks.call("training a chunk", "train_chunk", rows)

    def finish_step(self) -> dict[str, float]:
        metrics, self.version = self.ranks.call("finishing a step", "finish_step")
        return metrics

    def train_step(self, rows: RowBatch) -> dict[str, float]:
        self.train_chunk(rows)
        return self.finish_step()

    def state_dict(self) -> dict[str, Any]:
        return self.ranks.call("gathering the optimizer state", "state_dict")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.version = self.ranks.call("loading the optimizer state", "load_state_dict", dict(state))

    def generator_state(self) -> dict[str, torch.Tensor]:
        return self.ranks.call("gathering the weights for the generator", "generator_state")


@dataclass
class RankedModel:
    """The policy's ``model`` as the session sees it: its state lives in the ranks (rank 0 gathers it)."""

    ranks: LearnerRanks

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.ranks.call("gathering the model state", "model_state")

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.ranks.call("loading the model state", "load_model_state", dict(state))
