"""What an environment's latency costs a multi-turn rollout, on the lockstep driver and on the generation stream.

    .venv/bin/python bench/episodes.py [--prompts 16] [--group 8] [--turns 4] [--slots 32] [--latency 0.5]

P prompts x G episodes of ``guess_number`` whose ``step`` sleeps a fixed latency (a stand-in for a slow tool),
up to ``--turns`` turns of at most 12 tokens, on a small random policy and the built-in engine, every group in
flight at once (as the async controller keeps them). Four rollouts of the same seeds, so the same tokens:

* ``lockstep``: :func:`run_episode_groups` on ``Engine.generate`` — each round waits for its slowest step;
* ``stream``: every episode on one generation stream with ``--slots`` rows (continuous batching): a turn joins
  the running batch, a step runs on its own thread, and the stream decodes other episodes' turns meanwhile.

Each at latency 0 and at ``--latency``, alternating, ``--repeats`` times (the best of each is shown). Columns: the
wall time, model tokens sampled per second, and that throughput against the same driver with an instant tool.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from groupwise.environments.guess_number import GuessNumberEnvironment
from groupwise.episodes.episode import Episode, EpisodeLimits
from groupwise.episodes.group import EpisodeError, EpisodeSettings
from groupwise.episodes.lockstep import run_episode_groups
from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer
from groupwise.generation import Engine
from groupwise.model import load_policy
from groupwise.runtime.streamed_episodes import GroupTurns, run_streamed_group
from groupwise.types import Prompt, SamplingParams

SAMPLING = SamplingParams(max_new_tokens=12, temperature=1.0)
Groups = list[list[Episode] | EpisodeError]


@dataclass
class SlowGuess(GuessNumberEnvironment):
    """guess_number whose every step takes ``latency`` seconds (a slow tool)."""

    latency: float = 0.0

    def __post_init__(self) -> None:
        super().__init__(max_guesses=50)

    def step(self, assistant_message):
        time.sleep(self.latency)
        return super().step(assistant_message)


def lockstep(engine: Engine, settings: EpisodeSettings, prompts: list[Prompt], args: argparse.Namespace) -> Groups:
    return run_episode_groups(engine, SAMPLING, settings, prompts, list(range(len(prompts))), args.group)


def streamed(engine: Engine, settings: EpisodeSettings, prompts: list[Prompt], args: argparse.Namespace) -> Groups:
    stream = engine.open_stream(SAMPLING, max_rows=args.slots)
    stream.start("bench-stream")

    async def every_group() -> Groups:
        runs = (
            run_streamed_group(stream, settings, p, seed, args.group, GroupTurns()) for seed, p in enumerate(prompts)
        )
        return list(await asyncio.gather(*runs))

    try:
        return asyncio.run(every_group())
    finally:
        stream.close(30.0)


Driver = Callable[[Engine, EpisodeSettings, list[Prompt], argparse.Namespace], Groups]


def measure(engine: Engine, tokenizer, args: argparse.Namespace, driver: Driver, latency: float) -> tuple[float, int]:
    """(wall seconds, model tokens sampled) of one rollout."""
    limits = EpisodeLimits(max_turns=args.turns, max_tokens=400, max_observation_tokens=64, max_turn_tokens=12)
    renderer = ChatRenderer(tokenizer, (), PLAIN_CHAT_TEMPLATE)
    settings = EpisodeSettings("slow_guess", lambda: SlowGuess(latency=latency), renderer, limits, 60.0)
    prompts = [Prompt(uid=f"p{i}", answer="77", messages=({"role": "user", "content": "Guess 1 to 99."},))
               for i in range(args.prompts)]  # fmt: skip
    start = time.perf_counter()
    groups = driver(engine, settings, prompts, args)
    wall = time.perf_counter() - start
    episodes = [e for g in groups if isinstance(g, list) for e in g]
    return wall, sum(sum(e.trainable) for e in episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tiny = {"vocab": "full", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024,
            "max_position_embeddings": 512}  # fmt: skip
    policy = load_policy("tiny", tiny=tiny, seed=0, device="cpu")
    engine = Engine(policy.model, policy.tokenizer, eos_token_ids=(policy.tokenizer.eos_token_id,))
    drivers: dict[str, Driver] = {"lockstep": lockstep, "stream": streamed}
    cases = [(name, latency) for name in drivers for latency in (0.0, args.latency)]
    for name in drivers:  # warm-up
        measure(engine, policy.tokenizer, args, drivers[name], 0.0)
    best: dict[tuple[str, float], tuple[float, int]] = {}
    for _ in range(args.repeats):
        for name, latency in cases:
            wall, tokens = measure(engine, policy.tokenizer, args, drivers[name], latency)
            if (name, latency) not in best or wall < best[name, latency][0]:
                best[name, latency] = (wall, tokens)
    print(f"{args.prompts} prompts x {args.group} episodes in flight, up to {args.turns} turns, {args.slots} slots\n")
    print("| driver | step latency | wall s | model tokens | tokens/s | vs instant tool |")
    print("|---|---|---|---|---|---|")
    for name, latency in cases:
        wall, tokens = best[name, latency]
        base_wall, base_tokens = best[name, 0.0]
        ratio = (tokens / wall) / (base_tokens / base_wall)
        print(f"| {name} | {latency:g} s | {wall:.2f} | {tokens} | {tokens / wall:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
