"""Dense against oneDNN projections in the fast decode step, by the model's hidden size: the rule behind ``auto``.

    taskset -c 1 .venv/bin/python bench/projections.py            # ~3 min on one core
    taskset -c 1 .venv/bin/python bench/projections.py --smoke    # one small model, one shape: seconds
    taskset -c 1 .venv/bin/python bench/projections.py --rates    # the layouts on SmolLM2's shapes: ~1 min

For random Llama models of hidden size 128, 256 and 384 (the first the tiny default model's shape), the engine's
``generate`` with a weight change before every call — what a sync loop does: the optimizer step changes the
shared model, so the decode step refreshes its copies of the weights (a oneDNN refresh reorders them anew) — at
16 and 128 rows, 6 and 48 new tokens. Each kind gets its own engine on the same model; their calls alternate, and
each figure is the best of ``--repeats`` calls after two warm-up calls. Every row runs to the end (the end token
is one the rows never draw), so both kinds decode the same number of steps.

``--rates``: instead, how fast each layout streams SmolLM2-135M's projection weights (30 layers × q|k|v, o,
gate|up, down: random weights of its shapes, 425 MB, more than any cache) at 1, 16 and 128 rows — oneDNN's packed
weight, ``torch.mm`` on ``[in, out]``, ``F.linear`` on ``[out, in]``, and ``W @ xᵀ`` — in ms per sweep and GB of
weights read per second: where a decode step's projections sit between the copy rate and the kernels' reach.

``auto`` (``groupwise.generation.projections.projection_kind``) takes oneDNN from ``ONEDNN_MIN_HIDDEN`` on: the
last column says what it picks. Each engine's ``projection_kind`` is checked to be the kind it was given.
"""

from __future__ import annotations

import argparse
import time

import torch
from roofline_parts import cpu_model

from groupwise.generation.engine import Engine
from groupwise.generation.projections import onednn_available, projection_kind
from groupwise.model.loading import load_policy
from groupwise.types import GenerationRequest, SamplingParams

SHAPES = {  # hidden size: the tiny model's other dimensions scaled with it
    128: {"num_layers": 4, "num_heads": 4, "intermediate_size": 512},
    256: {"num_layers": 8, "num_heads": 8, "intermediate_size": 1024},
    384: {"num_layers": 8, "num_heads": 6, "intermediate_size": 1536},
}
CALLS = ((128, 6), (16, 48), (128, 48))  # (rows, new tokens)
KINDS = ("dense", "onednn")


def seconds_per_call(engines: dict[str, Engine], rows: int, new_tokens: int, repeats: int) -> dict[str, float]:
    """Best seconds of one ``generate`` per kind, a weight change before each call, the kinds' calls alternating."""
    model = next(iter(engines.values())).model
    requests = [
        GenerationRequest(prompt_token_ids=tuple(range(3, 13 + i % 3)), num_samples=8, seed=i) for i in range(rows // 8)
    ]
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    best = dict.fromkeys(engines, float("inf"))
    for call in range(repeats + 2):
        for kind, engine in engines.items():
            with torch.no_grad():  # an optimizer step's in-place change: the decode step must refresh its copies
                for parameter in model.parameters():
                    parameter.mul_(1.0)
            start = time.perf_counter()
            engine.generate(requests, sampling)
            if call >= 2:
                best[kind] = min(best[kind], time.perf_counter() - start)
    return best


SMOLLM2_PROJECTIONS = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (out, in): q|k|v, o, gate|up, down
SMOLLM2_LAYERS = 30


def projection_rates(repeats: int) -> None:
    """The ``--rates`` table (module docstring): best of ``repeats`` sweeps over every layer's projections."""
    weights = [[torch.randn(out, inp) for out, inp in SMOLLM2_PROJECTIONS] for _ in range(SMOLLM2_LAYERS)]
    transposed = [[w.t().contiguous() for w in layer] for layer in weights]
    packed = [[torch.ops.mkldnn._reorder_linear_weight(w, 128) for w in layer] for layer in weights]
    weight_bytes = sum(w.numel() * w.element_size() for layer in weights for w in layer)
    layouts = {
        "oneDNN packed": lambda layer, j, x: torch.ops.mkldnn._linear_pointwise(x, packed[layer][j], None, "none",
                                                                                  [], ""),
        "mm on [in, out]": lambda layer, j, x: torch.mm(x, transposed[layer][j]),
        "F.linear on [out, in]": lambda layer, j, x: torch.nn.functional.linear(x, weights[layer][j]),
        "W @ xᵀ": lambda layer, j, x: torch.mm(weights[layer][j], x.t()),
    }  # fmt: skip
    print(f"# SmolLM2-135M's projections: {weight_bytes / 1e6:.0f} MB of float32 weights per sweep")
    print("| rows | " + " | ".join(f"{name} ms (GB/s)" for name in layouts) + " |")
    print("|---|" + "---|" * len(layouts))
    for rows in (1, 16, 128):
        inputs = {inp: torch.randn(rows, inp) for _, inp in SMOLLM2_PROJECTIONS}
        cells = []
        for multiply in layouts.values():

            def sweep(multiply=multiply, inputs=inputs) -> None:
                for layer in range(SMOLLM2_LAYERS):
                    for j, (_, inp) in enumerate(SMOLLM2_PROJECTIONS):
                        multiply(layer, j, inputs[inp])

            sweep()
            seconds = min(timed(sweep) for _ in range(repeats))
            cells.append(f"{seconds * 1000:.1f} ({weight_bytes / seconds / 1e9:.1f})")
        print(f"| {rows} | " + " | ".join(cells) + " |")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="hidden size 128 at 16 rows, 6 new tokens")
    parser.add_argument("--rates", action="store_true", help="the layouts' rates on SmolLM2's projection shapes")
    args = parser.parse_args()
    if not onednn_available():
        raise SystemExit("this torch build has no oneDNN: every float32 CPU run takes dense projections")
    torch.set_num_threads(args.threads)
    if args.rates:
        print(f"# {cpu_model()}, {args.threads} thread(s), torch {torch.__version__}; best of {args.repeats} sweeps")
        projection_rates(args.repeats)
        return
    shapes = {128: SHAPES[128]} if args.smoke else SHAPES
    calls = ((16, 6),) if args.smoke else CALLS
    print(f"# {cpu_model()}, {args.threads} thread(s), torch {torch.__version__}; best of {args.repeats} calls")
    print("| hidden | rows | new tokens | dense ms | oneDNN ms | oneDNN / dense | auto takes |")
    print("|---|---|---|---|---|---|---|")
    for hidden, shape in shapes.items():
        tiny = {"vocab": "full", "hidden_size": hidden, **shape}
        policy = load_policy("tiny", tiny=tiny, seed=0, device="cpu")
        never_drawn = policy.model.config.vocab_size + 1  # an end token no row draws: every row runs to the end
        engines = {kind: Engine(policy.model, policy.tokenizer, [never_drawn], projections=kind) for kind in KINDS}
        auto = projection_kind(torch.device("cpu"), torch.float32, hidden)
        for rows, new_tokens in calls:
            best = seconds_per_call(engines, rows, new_tokens, args.repeats)
            assert all(engine.projection_kind == kind for kind, engine in engines.items())
            dense, onednn = best["dense"] * 1000, best["onednn"] * 1000
            print(f"| {hidden} | {rows} | {new_tokens} | {dense:.1f} | {onednn:.1f} | {onednn / dense:.2f} | {auto} |")


if __name__ == "__main__":
    main()
