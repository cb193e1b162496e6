"""What the roofline scripts share: the model's sizes, this machine's two rates, a timer, a profile, a table row.

* matmul rate: ``C = A B`` with float32 ``2048 × 2048`` operands, ``2·n³`` FLOPs per call → FLOP/s;
* copy rate: a 256 MiB float32 tensor copied into another, bytes read + bytes written per call → bytes/s.

Both are the best of 3 × ``--repeats`` calls, measured again just before each row (a shared or throttled
machine's rates drift), with torch's threads as the calling script set them.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shape:
    """The sizes the FLOP and byte counts read from a Llama-family config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config) -> Shape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            config.intermediate_size,
            config.vocab_size,
        )

    @property
    def layer_params(self) -> int:
        """Every layer's q, k, v, o and gate, up, down weights: ``L·(h·(H + 2·KV)·D + H·D·h + 3·h·I)``."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        attention = qkv + self.heads * self.head_dim * self.hidden
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocations, oneDNN primitive caches, the decoder's probe
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_rate(repeats: int, n: int = 2048) -> float:
    """FLOP/s of a float32 ``n × n`` matmul."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return 2 * n**3 / best_seconds(lambda: torch.mm(a, b, out=out), repeats)


def copy_rate(repeats: int, mib: int = 256) -> float:
    """Bytes per second read + written by a float32 copy of ``mib`` MiB."""
    source = torch.randn(mib * 2**20 // 4)
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / best_seconds(lambda: target.copy_(source), repeats)


def cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    return names[0] if names else platform.processor()


def machine_rates(args) -> tuple[float, float]:
    """The matmul and copy rates now: measured again before every row, since a shared or throttled machine's
    rates drift (133–183 GFLOP/s within one hour on the 2-core VM of bench/RESULTS.md)."""
    return matmul_rate(args.repeats * 3), copy_rate(args.repeats * 3)


@dataclass(frozen=True)
class Profile:
    """Per operator (calls, self CPU seconds) of what ran under the torch profiler, and its wall seconds."""

    ops: dict[str, tuple[int, float]]
    wall_s: float

    def minus(self, other: Profile) -> Profile:
        """What this profile has beyond ``other`` (the extra decode steps of a longer call)."""
        ops = {
            key: (calls - other.ops.get(key, (0, 0.0))[0], seconds - other.ops.get(key, (0, 0.0))[1])
            for key, (calls, seconds) in self.ops.items()
        }
        return Profile(ops, self.wall_s - other.wall_s)

    def share(self, seconds: float) -> str:
        return f"{100 * seconds / self.wall_s:.1f} %"

    def table(self, title: str, per: int, top: int) -> str:
        """The ``top`` operators by self time, per step (``per`` steps profiled), with their share of the profiled
        wall time; the last line is the rest (other operators and the Python between them)."""
        lines = [f"\n{title}\n", "| operator | calls/step | self ms/step | share |", "|---|---|---|---|"]
        ranked = sorted(self.ops.items(), key=lambda item: -item[1][1])[:top]
        for name, (calls, seconds) in ranked:
            lines.append(f"| {name} | {calls / per:.0f} | {1e3 * seconds / per:.2f} | {self.share(seconds)} |")
        rest = self.wall_s - sum(seconds for _, (_, seconds) in ranked)
        lines.append(f"| (the rest: other operators, Python) | | {1e3 * rest / per:.2f} | {self.share(rest)} |")
        return "\n".join(lines)


def profiled(fn: Callable[[], object]) -> Profile:
    """One call of ``fn`` under the torch profiler (CPU activities)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    return Profile({e.key: (e.count, e.self_cpu_time_total / 1e6) for e in prof.key_averages()}, wall)


@dataclass(frozen=True)
class Row:
    label: str
    flops: float
    bytes: float
    bound_s: float
    bound_by: str
    measured_s: float
    target: float
    rates: tuple[float, float]  # the matmul FLOP/s and copy bytes/s measured just before this row
    note: str = ""

    def markdown(self) -> str:
        ratio = self.measured_s / self.bound_s
        mfu = self.flops / self.measured_s / self.rates[0]
        verdict = "met" if ratio <= self.target else "missed"
        return (
            f"| {self.label} | {self.rates[0] / 1e9:.0f} / {self.rates[1] / 1e9:.1f} | {self.flops / 1e9:.1f} "
            f"| {self.bytes / 1e9:.2f} | {1e3 * self.bound_s:.1f} "
            f"({self.bound_by}) | {1e3 * self.measured_s:.1f} | **{ratio:.2f}×** | ≤ {self.target}× {verdict} "
            f"| {100 * mfu:.0f} % | {self.note} |"
        )
