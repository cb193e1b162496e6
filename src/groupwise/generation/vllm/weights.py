"""New weights into a live vLLM engine, in place, without rebuilding it.

* **In this process** (``vllm.LLM`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, CPU or CUDA): the workers'
  ``reload_weights`` with the state dict as its ``weights_iterator`` (:func:`reload_in_process`). It runs the model's
  own checkpoint loader, so repacked CPU parameters are refreshed too; calling ``model.load_weights`` on the
  parameters directly does not work on CPU (they were repacked after loading).
* **In another process** (``AsyncLLM``'s engine core), on CPU: the state dict is written as safetensors into a
  folder of this backend's own and the workers reload from it (``reload_weights(weights_path=...)``,
  :class:`DiskReload`); tensors in a ``collective_rpc`` argument do not survive vLLM's message encoding.
* **In another process, on CUDA** (untested here: written against vLLM's documented weight-transfer API, to be
  checked on a GPU): vLLM's native weight transfer over CUDA IPC (:class:`IpcTransfer`), the engine built with
  ``weight_transfer_config=WeightTransferConfig(backend="ipc")``: the learner and the engine share the GPU, and the
  trainer-side engine sends handles to the learner's tensors (``start_weight_update`` / ``update_weights`` /
  ``finish_weight_update``). Separate GPUs would use the ``nccl`` backend with a rendezvous (not built yet).

Every path checks the names first: a state dict that does not match the served model is a ``ValueError`` naming the
keys, before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor


def check_names(state: Mapping[str, Tensor], expected: set[str]) -> None:
    """Refuse a state dict whose names are not the served model's (``expected``: the policy's own state-dict keys,
    recorded when the engine was built)."""
    missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unknown:
        raise ValueError(
            f"load_weights: the state dict does not match the engine's model (missing {missing[:5]}, unexpected "
            f"{unknown[:5]}); pass the full state dict of the policy the engine was built from (LoRA merged)"
        )


def reload_in_process(llm: Any, state: Mapping[str, Tensor]) -> None:  # Any: a vllm.LLM (vllm: optional, lazy)
    """Reload ``state`` into an in-process ``vllm.LLM``'s workers."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(state.items()))})


class DiskReload:
    """Reloads an engine in another process from safetensors written to ``directory`` (overwritten each time)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def write(self, state: Mapping[str, Tensor]) -> str:
        """``state`` as ``model.safetensors`` in the folder (tied tensors written once each: safetensors refuses
        shared storage); returns the folder."""
        from safetensors.torch import save_file

        tensors: dict[str, Tensor] = {}
        seen: set[int] = set()
        for name, tensor in state.items():
            value = tensor.detach().to("cpu").contiguous()
            pointer = value.untyped_storage().data_ptr()
            tensors[name] = value.clone() if pointer in seen else value
            seen.add(pointer)
        path = self.directory / "model.safetensors"
        partial = path.with_suffix(".partial")
        save_file(tensors, str(partial))
        partial.replace(path)
        return str(self.directory)

    async def push(self, engine: Any, state: Mapping[str, Tensor]) -> None:  # Any: a vLLM AsyncLLM
        """Write ``state`` and have ``engine`` (an ``AsyncLLM``) reload it."""
        folder = self.write(state)
        await engine.collective_rpc("reload_weights", kwargs={"weights_path": folder})


class _StateSource:
    """A vLLM ``WeightSource`` over the state dict of the current push (built lazily: vLLM is imported late)."""

    def __init__(self) -> None:
        self.state: Mapping[str, Tensor] = {}

    def metadata(self) -> list[Any]:  # Any: vLLM's ParamMeta (vllm is optional and imported lazily)
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in self.state.items()]

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        return iter(list(self.state.items()))


class _LoopClient:
    """vLLM's ``VLLMWeightSyncClient`` (four synchronous calls) over an ``AsyncLLM`` on another thread's loop."""

    # Any: a vLLM AsyncLLM, and what its coroutines return (vllm is optional and imported lazily).
    def __init__(self, engine: Any, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self.engine, self.run = engine, run

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self.run(self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info)))

    def start_weight_update(self) -> None:
        self.run(self.engine.start_weight_update())

    def update_weights(self, update_info: Any) -> None:  # Any: vLLM's update info, passed through
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self.run(self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.run(self.engine.finish_weight_update(weight_version=weight_version))


class IpcTransfer:
    """UNTESTED without a GPU. vLLM's native weight transfer over CUDA IPC into an ``AsyncLLM`` on the same GPU.

    ``run`` runs a coroutine on the engine's loop and waits for it (from a thread that is not the loop's): the
    trainer-side engine drives the transfer through synchronous calls.
    """

    # Any: a vLLM AsyncLLM, and what its coroutines return (vllm is optional and imported lazily).
    def __init__(self, engine: Any, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        self._source = _StateSource()
        self._trainer = WeightTransferTrainerFactory.trainer_init(
            IPCTrainerInitInfo(rank=0), client=_LoopClient(engine, run), source=self._source  # type: ignore[arg-type, unused-ignore]
        )

    def push_blocking(self, state: Mapping[str, Tensor]) -> None:
        """Send ``state`` and wait until the workers loaded it. CUDA IPC shares device memory: tensors that are
        not on the GPU (a Ray worker receives the learner's weights on the CPU) are copied there first."""
        self._source.state = {name: t if t.is_cuda else t.to("cuda") for name, t in state.items()}
        try:
            self._trainer.send_weights()
        finally:
            self._source.state = {}
