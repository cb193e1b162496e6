"""Dense against oneDNN projections in the fast decode step, by the model's hidden size: the rule behind ``auto``.

    taskset -c 1 .venv/bin/python bench/projections.py            # ~3 min on one core
    taskset -c 1 .venv/bin/python bench/projections.py --smoke    # one small model, one shape: seconds

For random Llama models of hidden size 128, 256 and 384 (the first the tiny default model's shape), the engine's
``generate`` with a weight change before every call — what a sync loop does: the optimizer step changes the
shared model, so the decode step refreshes its copies of the weights (a oneDNN refresh reorders them anew) — at
16 and 128 rows, 6 and 48 new tokens. Each kind gets its own engine on the same model; their calls alternate, and
each figure is the best of ``--repeats`` calls after two warm-up calls. Every row runs to the end (the end token
is one the rows never draw), so both kinds decode the same number of steps.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="hidden size 128 at 16 rows, 6 new tokens")
    args = parser.parse_args()
    if not onednn_available():
        raise SystemExit("this torch build has no oneDNN: every float32 CPU run takes dense projections")
    torch.set_num_threads(args.threads)
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
