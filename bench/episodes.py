"""What an environment's latency costs a multi-turn rollout, on the lockstep driver and on the generation stream.

    .venv/bin/python bench/episodes.py [--prompts 16] [--group 8] [--turns 4] [--slots 32] [--latency 0.5]
        [--drivers lockstep,stream,stream-no-reuse]

P prompts x G episodes of ``guess_number`` whose ``step`` sleeps a fixed latency (a stand-in for a slow tool),
up to ``--turns`` turns of at most 12 tokens, on a small random policy and the built-in engine, every group in
flight at once (as the async controller keeps them). Four rollouts of the same seeds, so the same tokens:

* ``lockstep``: :func:`run_episode_groups` on ``Engine.generate`` — each round waits for its slowest step;
* ``stream``: every episode on one generation stream with ``--slots`` rows (continuous batching): a turn joins
  the running batch, a step runs on its own thread, and the stream decodes other episodes' turns meanwhile; a
  turn's prompt extends the previous turn's, whose keys/values the stream kept, so only the new tokens prefill;
* ``stream-no-reuse``: the same stream with prefix reuse off (``prefix_tokens=0``): every turn prefills its whole
  prompt. The same seeds sample the same tokens (checked: tokens equal, logprobs within 1e-5).

Each at latency 0 and at ``--latency``, alternating, ``--repeats`` times (the best of each is shown). Columns: the
wall time, model tokens sampled per second, that throughput against the same driver with an instant tool, the
stream's prompt tokens reused and prefilled, and the speedup of reuse (wall without reuse / wall with it).
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


def streamed(engine: Engine, settings: EpisodeSettings, prompts: list[Prompt], args: argparse.Namespace,
             prefix_tokens: int | None = None) -> Groups:  # fmt: skip
    stream = engine.open_stream(SAMPLING, max_rows=args.slots, prefix_tokens=prefix_tokens)
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
        PREFIXES[prefix_tokens != 0] = (stream.prefixes.reused_tokens, stream.prefixes.prefilled_tokens)


PREFIXES: dict[bool, tuple[int, int]] = {}  # the last stream's (reused, prefilled) prompt tokens, by reuse on/off


def streamed_without_reuse(
    engine: Engine, settings: EpisodeSettings, prompts: list[Prompt], args: argparse.Namespace
) -> Groups:
    return streamed(engine, settings, prompts, args, prefix_tokens=0)


Driver = Callable[[Engine, EpisodeSettings, list[Prompt], argparse.Namespace], Groups]


@dataclass
class Rollout:
    wall: float
    tokens: int  # model tokens sampled
    episodes: list[Episode]
    prefixes: tuple[int, int] | None  # a stream's (reused, prefilled) prompt tokens


def measure(engine: Engine, tokenizer, args: argparse.Namespace, driver: Driver, latency: float) -> Rollout:
    """One rollout, timed."""
    limits = EpisodeLimits(max_turns=args.turns, max_tokens=400, max_observation_tokens=64, max_turn_tokens=12)
    renderer = ChatRenderer(tokenizer, (), PLAIN_CHAT_TEMPLATE)
    settings = EpisodeSettings("slow_guess", lambda: SlowGuess(latency=latency), renderer, limits, 60.0)
    prompts = [Prompt(uid=f"p{i}", answer="77", messages=({"role": "user", "content": "Guess 1 to 99."},))
               for i in range(args.prompts)]  # fmt: skip
    start = time.perf_counter()
    groups = driver(engine, settings, prompts, args)
    wall = time.perf_counter() - start
    episodes = [e for g in groups if isinstance(g, list) for e in g]
    prefixes = PREFIXES.get(driver is streamed) if driver in (streamed, streamed_without_reuse) else None
    return Rollout(wall, sum(sum(e.trainable) for e in episodes), episodes, prefixes)


def same_samples(a: list[Episode], b: list[Episode]) -> tuple[bool, float]:
    """Whether two rollouts sampled the same tokens, and the largest logprob difference between them."""
    same = [e.token_ids for e in a] == [e.token_ids for e in b]
    gaps = [abs(x - y) for ea, eb in zip(a, b, strict=True) for x, y in zip(ea.logprobs, eb.logprobs, strict=True)]
    return same, max(gaps, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drivers", default="lockstep,stream,stream-no-reuse")
    args = parser.parse_args()
    tiny = {"vocab": "full", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024,
            "max_position_embeddings": 512}  # fmt: skip
    policy = load_policy("tiny", tiny=tiny, seed=0, device="cpu")
    engine = Engine(policy.model, policy.tokenizer, eos_token_ids=(policy.tokenizer.eos_token_id,))
    known: dict[str, Driver] = {"lockstep": lockstep, "stream": streamed, "stream-no-reuse": streamed_without_reuse}
    drivers = {name: known[name] for name in args.drivers.split(",")}
    cases = [(name, latency) for name in drivers for latency in (0.0, args.latency)]
    for name in drivers:  # warm-up
        measure(engine, policy.tokenizer, args, drivers[name], 0.0)
    best: dict[tuple[str, float], Rollout] = {}
    for _ in range(args.repeats):
        for name, latency in cases:
            rollout = measure(engine, policy.tokenizer, args, drivers[name], latency)
            if (name, latency) not in best or rollout.wall < best[name, latency].wall:
                best[name, latency] = rollout
    print(f"{args.prompts} prompts x {args.group} episodes in flight, up to {args.turns} turns, {args.slots} slots\n")
    print("| driver | step latency | wall s | model tokens | tokens/s | vs instant tool | prompt reused/prefilled |")
    print("|---|---|---|---|---|---|---|")
    for name, latency in cases:
        rollout, base = best[name, latency], best[name, 0.0]
        ratio = (rollout.tokens / rollout.wall) / (base.tokens / base.wall)
        reuse = "—" if rollout.prefixes is None else f"{rollout.prefixes[0]} / {rollout.prefixes[1]}"
        print(f"| {name} | {latency:g} s | {rollout.wall:.2f} | {rollout.tokens} | {rollout.tokens / rollout.wall:.0f} "
              f"| {ratio:.2f} | {reuse} |")
    if {"stream", "stream-no-reuse"} <= set(drivers):
        print()
        for latency in (0.0, args.latency):
            on, off = best["stream", latency], best["stream-no-reuse", latency]
            same, gap = same_samples(on.episodes, off.episodes)
            print(f"prefix reuse at step latency {latency:g} s: {off.wall / on.wall:.2f}x faster "
                  f"({off.wall:.2f} s -> {on.wall:.2f} s); same tokens: {same}; max |logprob diff| {gap:.1e}")


if __name__ == "__main__":
    main()
