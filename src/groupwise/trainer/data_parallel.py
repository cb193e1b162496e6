"""One learner rank's view of its process group: the wrapped policy, the collectives, and full-state gathering.

Everything here is ``torch.distributed``: the process group (gloo on CPU, NCCL on CUDA), the DDP and FSDP2
wrappers, the state-dict helpers of ``torch.distributed.checkpoint``. Nothing is home-made.

**Why the policy is wrapped in a scoring module.** The learner scores completions through the model's decoder
and reads the LM head's weight itself (the chunked logprobs), so the causal LM's own ``forward`` never runs.
DDP prepares its gradient all-reduce in the wrapper's ``forward``, and FSDP2 gathers the root's parameters (the
embeddings, the head, the final norm) in the root's ``forward``: both must wrap the call that scores, so
:class:`ScoringModule`, whose ``forward`` *is* the scorer, is what DDP and ``fully_shard`` wrap. Its outputs are
a flat tuple of tensors, so FSDP2 finds them to hook the backward pass.

**Gradient averaging.** DDP and FSDP2 average gradients over the ranks. The learner sums its loss over every
micro-batch and divides by the update's normaliser summed over the ranks (``all_sum``), so it multiplies the
summed gradients by ``world_size / normaliser``: the mean over ranks of ``world_size · g_r / N`` is
``Σ_r g_r / N``, one rank's update on all the rows.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import Tensor

from groupwise.model.completion_scorer import CompletionScorer, unwrap_adapter

T = TypeVar("T")


class ScoringModule(torch.nn.Module):
    """``forward(prompt_ids, completion_ids, with_entropy)`` = the learner's scorer on ``model``, as a module."""

    def __init__(self, model: torch.nn.Module, scorer: CompletionScorer | None = None):
        super().__init__()
        self.model = model
        self._scorer = scorer

    @property
    def scorer(self) -> CompletionScorer:
        if self._scorer is None:
            raise RuntimeError("the scoring module scores with the learner's scorer, which was never set")
        return self._scorer

    @scorer.setter
    def scorer(self, scorer: CompletionScorer) -> None:
        self._scorer = scorer

    def forward(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], with_entropy: bool
    ) -> tuple[Tensor, Tensor | None, Tensor, int, int]:
        scored = self.scorer.score(self.model, prompt_ids, completion_ids, with_entropy=with_entropy)
        return scored.logprobs, scored.entropy, scored.mask, scored.padded_tokens, scored.real_tokens


def init_process_group(
    rank: int, world_size: int, host: str, port: int, device: torch.device, timeout_s: float
) -> None:
    """Join the run's group meeting at ``host:port`` (rank 0's address): NCCL on CUDA, gloo on CPU; every
    collective gives up after ``timeout_s`` (a dead peer is an error, not a hang)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )  # fmt: skip


@dataclass(frozen=True)
class WrappedScoring:
    """The learner's scoring module as this rank trains it: ``module`` is what runs the passes and holds the
    parameters (the DDP wrapper, or the FSDP2-sharded module itself); ``scoring`` the scoring module inside it."""

    module: torch.nn.Module
    scoring: ScoringModule

    def __call__(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], with_entropy: bool
    ) -> tuple[Tensor, Tensor | None, Tensor, int, int]:
        return cast("tuple[Tensor, Tensor | None, Tensor, int, int]",
                    self.module(prompt_ids, completion_ids, with_entropy))  # the scoring module's forward


@dataclass
class DataParallel:
    """This rank in a process group of ``world_size`` ranks that trains with ``sharding`` (``ddp`` or ``fsdp``)."""

    rank: int
    world_size: int
    sharding: str
    device: torch.device

    def wrap(self, model: torch.nn.Module) -> WrappedScoring:
        """The scoring module around ``model``, under DDP, or sharded in place by FSDP2 (every decoder layer,
        then the root); its scorer is set once the learner has one. Call before the optimizer is made: FSDP2 turns
        the parameters into sharded DTensors."""
        scoring = ScoringModule(model)
        if self.sharding == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device] if self.device.type == "cuda" else None
            return WrappedScoring(DistributedDataParallel(scoring, device_ids=device_ids), scoring)
        if self.sharding != "fsdp":
            raise ValueError(f"sharding must be 'ddp' or 'fsdp', got {self.sharding!r}")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(scoring, mesh=mesh)
        return WrappedScoring(scoring, scoring)

    @contextlib.contextmanager
    def gradient_sync(self, wrapped: WrappedScoring, enabled: bool) -> Iterator[None]:
        """Inside: forward/backward passes that all-reduce (DDP) or reduce-scatter (FSDP) their gradients only when
        ``enabled``; off, gradients accumulate locally until the update's last micro-batch."""
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        module = wrapped.module
        if isinstance(module, DistributedDataParallel):
            with contextlib.nullcontext() if enabled else module.no_sync():
                yield
            return
        assert isinstance(module, FSDPModule), "a rank trains under DDP or FSDP2"
        module.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    def reshard(self, wrapped: WrappedScoring) -> None:
        """FSDP: put every parameter back to its shard (nothing to do under DDP)."""
        from torch.distributed.fsdp import FSDPModule

        if isinstance(wrapped.module, FSDPModule):
            wrapped.module.reshard()

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the ranks (float64)."""
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def all_max(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64, device=self._collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def gather(self, obj: T) -> list[T]:
        """``obj`` of every rank, in rank order, on every rank."""
        out: list[T] = [obj] * self.world_size  # placeholders: all_gather_object overwrites every slot
        dist.all_gather_object(out, obj)
        return out

    def _collective_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's layers (``model.<base_model_prefix>.layers``, through a peft wrapper): FSDP's units."""
    base = unwrap_adapter(model)
    decoder = getattr(base, getattr(base, "base_model_prefix", ""), None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"{type(base).__name__} has no decoder layer list (<decoder>.layers) to shard with FSDP; "
                         "use learner.sharding: ddp")
    return list(layers)


def full_tensors(state: Mapping[str, Any]) -> dict[str, Tensor]:
    """Every tensor of ``state`` whole and on the CPU. A sharded DTensor is gathered (``full_tensor``, a
    collective): every rank must call this with the same state, in the same order."""
    from torch.distributed.tensor import DTensor

    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()
        for name, value in state.items()
    }


def full_optimizer_state(wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """FSDP: the whole optimizer state in the plain optimizer's layout (parameters numbered in order), so a
    one-process learner loads it as its own; complete on rank 0 (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    # torch types the state as a union of every value kind; its layout is the optimizer's own ("state" by name,
    # "param_groups" with parameter names), which is what is read here.
    by_name: dict[str, Any] = dict(get_optimizer_state_dict(
        wrapped, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    ))  # fmt: skip
    if not by_name:
        return {}
    order = {name: index for index, name in enumerate(_trained_names(wrapped))}
    groups = [{**group, "params": [order[name] for name in group["params"]]} for group in by_name["param_groups"]]
    return {"state": {order[name]: value for name, value in by_name["state"].items()}, "param_groups": groups}


def load_full_optimizer_state(wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Mapping) -> None:
    """Inverse of :func:`full_optimizer_state`; every rank passes the whole state and keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trained_names(wrapped)
    groups = [{**group, "params": [names[index] for index in group["params"]]} for group in state["param_groups"]]
    by_name: dict[str, Any] = {
        "state": {names[index]: value for index, value in state["state"].items()}, "param_groups": groups
    }
    set_optimizer_state_dict(wrapped, optimizer, optim_state_dict=by_name,  # the optimizer's own layout, by name
                             options=StateDictOptions(full_state_dict=True))


def load_full_model_state(model: torch.nn.Module, state: Mapping[str, Tensor]) -> None:
    """FSDP: load whole tensors into the sharded parameters (each rank keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True))


def _trained_names(wrapped: torch.nn.Module) -> list[str]:
    """Fully qualified names of the trained parameters, in the optimizer's order (``model.parameters()``)."""
    return [name for name, p in wrapped.named_parameters() if p.requires_grad]
