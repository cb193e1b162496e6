"""The GPUs the job model knows, from their makers' public spec sheets (per GPU, dense BF16, no sparsity).

A spec sheet quotes tensor-core throughput "with sparsity" for Hopper and Blackwell parts; the dense figure the
cost model needs is half of it. Memory is the HBM capacity and bandwidth of the SXM (or superchip) part; NVLink is
the GPU's total NVLink bandwidth (both directions), used for a colocated weight reshard.

| GPU | BF16 dense | HBM | HBM bandwidth | NVLink | spec sheet |
|---|---|---|---|---|---|
| A100 | 312 TFLOP/s | 80 GB | 2.039 TB/s | 600 GB/s | NVIDIA A100 80GB SXM datasheet |
| H100 | 989 TFLOP/s | 80 GB | 3.35 TB/s | 900 GB/s | NVIDIA H100 SXM5 datasheet (1,979 sparse) |
| H200 | 989 TFLOP/s | 141 GB | 4.8 TB/s | 900 GB/s | NVIDIA H200 SXM datasheet (1,979 sparse) |
| H20 | 148 TFLOP/s | 96 GB | 4.0 TB/s | 900 GB/s | NVIDIA H20 (HGX H20) product brief |
| B200 | 2,250 TFLOP/s | 180 GB | 7.7 TB/s | 1.8 TB/s | NVIDIA HGX B200 datasheet (4.5 sparse; 62 TB/s per 8) |
| GB200 | 2,500 TFLOP/s | 186 GB | 8.0 TB/s | 1.8 TB/s | NVIDIA GB200 NVL72 datasheet (360 P sparse per 72) |

Any other GPU is ``cluster.gpu: custom`` with its figures in ``cluster.gpu_spec``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from groupwise.config.job_schema import JobClusterSection

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's public figures: dense BF16 FLOP/s, HBM bytes, HBM bytes/s, NVLink bytes/s."""

    name: str
    bf16_flops: float
    memory_bytes: float
    memory_bandwidth: float
    nvlink_bandwidth: float


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("A100", 312 * TERA, 80 * GIGA, 2039 * GIGA, 600 * GIGA),
        GpuSpec("H100", 989 * TERA, 80 * GIGA, 3350 * GIGA, 900 * GIGA),
        GpuSpec("H200", 989 * TERA, 141 * GIGA, 4800 * GIGA, 900 * GIGA),
        GpuSpec("H20", 148 * TERA, 96 * GIGA, 4000 * GIGA, 900 * GIGA),
        GpuSpec("B200", 2250 * TERA, 180 * GIGA, 7700 * GIGA, 1800 * GIGA),
        GpuSpec("GB200", 2500 * TERA, 186 * GIGA, 8000 * GIGA, 1800 * GIGA),
    )
}
GPU_NAMES = tuple(GPUS)


def gpu_spec(name: str) -> GpuSpec:
    """The spec of GPU ``name`` (one of :data:`GPU_NAMES`)."""
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; the table has {', '.join(GPU_NAMES)}") from None


def cluster_gpu(cluster: JobClusterSection) -> GpuSpec:
    """The cluster's GPU: the table's row, or the user's ``gpu_spec`` for ``gpu: custom`` (checked by
    :func:`~groupwise.sim.job_checks.check_cluster` to be given exactly then)."""
    spec = cluster.gpu_spec
    if cluster.gpu != "custom" or spec is None:
        return gpu_spec(cluster.gpu)
    return GpuSpec("custom", spec.bf16_tflops * TERA, spec.memory_gb * GIGA, spec.memory_tbytes_per_s * TERA,
                   spec.nvlink_gbytes_per_s * GIGA)  # fmt: skip
