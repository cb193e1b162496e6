"""What an environment's latency costs a multi-turn rollout, and what the lock-step runner adds to generation.

    .venv/bin/python bench/episodes.py [--prompts 4] [--group 8] [--turns 3] [--latencies 0,0.05,0.2]

Runs ``run_episode_groups`` with a tiny random policy on the built-in engine against ``guess_number`` whose
``step`` sleeps a fixed latency (a stand-in for a tool call), P prompts × G episodes of up to ``--turns`` turns.
Columns: the wall time of the whole rollout; what the latency added to it (against the same rollout at latency
0: the same seeds, so the same tokens); the lock-step bound, rounds × latency (a round waits for its slowest
call); and the environment seconds summed over every call (what running the calls one after another would add).
Environment calls run on their own threads, so the added time follows the bound, not the sum.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from groupwise.environments.guess_number import GuessNumberEnvironment
from groupwise.episodes.episode import EpisodeLimits
from groupwise.episodes.lockstep import EpisodeSettings, run_episode_groups
from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer
from groupwise.generation import Engine
from groupwise.model import load_policy
from groupwise.types import Prompt, SamplingParams


@dataclass
class SlowGuess(GuessNumberEnvironment):
    """guess_number whose every step takes ``latency`` seconds (a slow tool)."""

    latency: float = 0.0

    def __post_init__(self) -> None:
        super().__init__(max_guesses=50)

    def step(self, assistant_message):
        time.sleep(self.latency)
        return super().step(assistant_message)


def measure(engine: Engine, tokenizer, args: argparse.Namespace, latency: float) -> tuple[float, float, int, int]:
    limits = EpisodeLimits(max_turns=args.turns, max_tokens=400, max_observation_tokens=64, max_turn_tokens=8)
    renderer = ChatRenderer(tokenizer, (), PLAIN_CHAT_TEMPLATE)
    settings = EpisodeSettings("slow_guess", lambda: SlowGuess(latency=latency), renderer, limits, 60.0)
    prompts = [Prompt(uid=f"p{i}", answer="77", messages=({"role": "user", "content": "Guess 1 to 99."},))
               for i in range(args.prompts)]  # fmt: skip
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    start = time.perf_counter()
    groups = run_episode_groups(engine, sampling, settings, prompts, list(range(args.prompts)), args.group)
    wall = time.perf_counter() - start
    episodes = [e for g in groups if isinstance(g, list) for e in g]
    rounds = max(e.turns for e in episodes)
    return wall, sum(e.env_seconds for e in episodes), sum(e.turns for e in episodes), rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--latencies", default="0.5,1")
    args = parser.parse_args()
    policy = load_policy("tiny", tiny={"vocab": "full", "max_position_embeddings": 512}, seed=0, device="cpu")
    engine = Engine(policy.model, policy.tokenizer, eos_token_ids=(policy.tokenizer.eos_token_id,))
    measure(engine, policy.tokenizer, args, 0.0)  # warm-up
    base, _, _, _ = measure(engine, policy.tokenizer, args, 0.0)
    print(f"{args.prompts} prompts x {args.group} episodes, up to {args.turns} turns; at latency 0: {base:.2f} s\n")
    print("| step latency | turns | rounds | wall s | added s | bound: rounds x latency | serial: env s summed |")
    print("|---|---|---|---|---|---|---|")
    for latency in (float(x) for x in args.latencies.split(",")):
        wall, env, turns, rounds = measure(engine, policy.tokenizer, args, latency)
        print(f"| {latency:g} s | {turns} | {rounds} | {wall:.2f} | {wall - base:.2f} | {rounds * latency:.2f} | "
              f"{env:.2f} |")


if __name__ == "__main__":
    main()
