"""What the harness endpoint costs: the same multi-turn rollout in process and through the OpenAI-compatible endpoint.

    .venv/bin/python bench/harness.py [--model tiny|smollm2] [--prompts 4] [--group 8] [--turns 3] [--slots 32]
        [--latency 0.5] [--repeats 2] [--sessions 32]

P prompts x G sessions of a calculator-shaped conversation — the model's turn, a tool's answer, the model again,
up to ``--turns`` model turns of at most 24 tokens — on a small random policy (``tiny``, where a decode step is
mostly Python) or SmolLM2-135M-Instruct (``smollm2``, the calculator job's model, its chat template) and the
built-in engine's generation stream (async + continuous batching), every group in flight at once:

* ``environment``: an in-process environment (:func:`run_streamed_group`): each turn is a request on the stream,
  the tool's answer rendered by the template;
* ``endpoint``: the same conversation written as a harness, a plain ``openai`` SDK loop sending the whole history
  each time, through the endpoint (render, match the served reply to its ids, sample on the same stream, answer
  over HTTP).

Each at an instant tool and at ``--latency`` seconds per tool answer, alternating, ``--repeats`` times (the best of
each is shown): wall time, model tokens sampled, tokens/s, the endpoint's throughput against the environment's, and
each driver's throughput with the slow tool against its own with an instant one (how well the latency is hidden).

Then the endpoint's own cost per request, with the sampling taken out: ``--sessions`` concurrent sessions, each a
``--turns``-request conversation, against a sampler that answers at once; the time from the client's send to its
answer, per request (render + match + HTTP + JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from dataclasses import dataclass

import openai

from groupwise.episodes.environment import StepResult
from groupwise.episodes.episode import EpisodeLimits
from groupwise.episodes.group import EpisodeSettings
from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer
from groupwise.episodes.tool_formats import TOOL_FORMATS
from groupwise.generation import Engine
from groupwise.harness.endpoint import Endpoint, EndpointSettings
from groupwise.harness.launch import HarnessSpec
from groupwise.harness.live import LiveSession, SessionLimits
from groupwise.harness.render import RequestRenderer
from groupwise.harness.runner import HarnessRunner, HarnessSettings
from groupwise.harness.session import HarnessSession
from groupwise.model import eos_token_ids, load_policy
from groupwise.model.gguf_files import default_cache_root
from groupwise.runtime.streamed_episodes import GroupTurns, run_streamed_group
from groupwise.runtime.streamed_harness import StreamTurns
from groupwise.types import Completion, GenerationRequest, Prompt, SamplingParams

SAMPLING = SamplingParams(max_new_tokens=24, temperature=1.0)
TOOL_ANSWER = "56088"


@dataclass
class ToolTurns:
    """The environment (bench only): every model turn is answered by a tool message after ``latency`` seconds,
    until ``turns`` model turns."""

    turns: int
    latency: float
    taken: int = 0

    def reset(self, prompt: Prompt, sample_index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": prompt.text or ""}]

    def step(self, assistant_message: dict[str, str]) -> StepResult:
        self.taken += 1
        time.sleep(self.latency)
        if self.taken >= self.turns:
            return StepResult(reward=float(len(assistant_message["content"]) % 2), done=True)
        return StepResult(messages=[{"role": "tool", "content": TOOL_ANSWER}])


def harness(turns: int, latency: float):
    """The same conversation as a harness: an ``openai`` SDK loop."""

    def run(session: HarnessSession) -> float:
        client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        messages: list[dict] = [{"role": "user", "content": session.prompt.text or ""}]
        for turn in range(turns):
            reply = client.chat.completions.create(model=session.model, messages=messages).choices[0].message
            time.sleep(latency)
            if turn + 1 < turns:
                messages += [
                    {"role": "assistant", "content": reply.content or ""},
                    {"role": "tool", "content": TOOL_ANSWER},
                ]
        return float(len(reply.content or "") % 2)

    return run


@dataclass
class Rollout:
    wall: float
    tokens: int


def prompts(args: argparse.Namespace) -> list[Prompt]:
    return [Prompt(f"mul/{i}", "0", text=f"What is {100 + i} * {456 + i}?") for i in range(args.prompts)]


def template(args: argparse.Namespace) -> str | None:
    """The chat template: the model's own (SmolLM2's), or the plain one for the tiny model that has none."""
    return None if args.model == "smollm2" else PLAIN_CHAT_TEMPLATE


def environment_rollout(engine: Engine, tokenizer, args: argparse.Namespace, latency: float) -> Rollout:
    limits = EpisodeLimits(args.turns, 600, 64, SAMPLING.max_new_tokens)
    settings = EpisodeSettings(
        "tool_turns", lambda: ToolTurns(args.turns, latency), ChatRenderer(tokenizer, (), template(args)), limits, 60.0
    )
    stream = engine.open_stream(SAMPLING, max_rows=args.slots)
    stream.start("bench-environment")

    async def every_group() -> list:
        return list(
            await asyncio.gather(
                *(
                    run_streamed_group(stream, settings, p, seed, args.group, GroupTurns())
                    for seed, p in enumerate(prompts(args))
                )
            )
        )

    start = time.perf_counter()
    try:
        groups = asyncio.run(every_group())
    finally:
        stream.close(30.0)
    wall = time.perf_counter() - start
    return Rollout(wall, sum(sum(e.trainable) for g in groups for e in g))


def endpoint_rollout(engine: Engine, tokenizer, args: argparse.Namespace, latency: float) -> Rollout:
    renderer = RequestRenderer(tokenizer, template(args), TOOL_FORMATS["hermes"])
    runner = HarnessRunner(
        HarnessSettings(
            HarnessSpec("bench", function=harness(args.turns, latency)),
            renderer,
            SessionLimits(args.turns, 600, SAMPLING.max_new_tokens, 64),
            120.0,
            EndpointSettings(),
        )
    )
    stream = engine.open_stream(SAMPLING, max_rows=args.slots)
    stream.start("bench-endpoint")

    async def every_group() -> list:
        runs = [
            runner.run_group(StreamTurns(stream, SAMPLING, lambda: 0), p, seed, args.group)
            for seed, p in enumerate(prompts(args))
        ]
        return list(await asyncio.gather(*runs))

    start = time.perf_counter()
    try:
        groups = asyncio.run(every_group())
    finally:
        stream.close(30.0)
        runner.close()
    wall = time.perf_counter() - start
    return Rollout(wall, sum(r.session.counts.served_tokens for g in groups if isinstance(g, list) for r in g))


class InstantTurns:
    """A sampler that answers every request at once with a fixed reply (bench only): the endpoint's own cost."""

    def __init__(self, tokenizer) -> None:
        self.sampling, self.version = SAMPLING, 0
        self.ids = tuple(tokenizer("The answer is 56088.", add_special_tokens=False)["input_ids"])

    async def sample(self, request: GenerationRequest) -> list[Completion]:
        return [Completion(self.ids, (-0.5,) * len(self.ids), "The answer is 56088.", "length", 0)]


def request_overhead(tokenizer, args: argparse.Namespace) -> list[float]:
    """Milliseconds from send to answer of every request of ``--sessions`` concurrent sessions."""
    endpoint = Endpoint(EndpointSettings(), TOOL_FORMATS["hermes"])
    endpoint.start()
    renderer = RequestRenderer(tokenizer, template(args), TOOL_FORMATS["hermes"])
    limits = SessionLimits(args.turns, 10_000, SAMPLING.max_new_tokens, 256)
    timings: list[float] = []
    lock = threading.Lock()

    def converse(index: int) -> None:
        key = f"bench-{index}"
        endpoint.registry.add(LiveSession(key, index, index, renderer, limits), InstantTurns(tokenizer))
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=key, max_retries=0)
        messages: list[dict] = [{"role": "user", "content": f"What is {100 + index} * 456?"}]
        for _ in range(args.turns):
            start = time.perf_counter()
            reply = client.chat.completions.create(model="bench", messages=messages).choices[0].message
            with lock:
                timings.append(1000 * (time.perf_counter() - start))
            messages += [{"role": "assistant", "content": reply.content or ""}, {"role": "tool", "content": "7"}]

    threads = [threading.Thread(target=converse, args=(i,)) for i in range(args.sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    endpoint.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=32)
    args = parser.parse_args()
    if args.model == "smollm2":
        policy = load_policy("gguf", path="smollm2", device="cpu", gguf_cache=default_cache_root())
    else:
        tiny = {
            "vocab": "full",
            "num_layers": 4,
            "hidden_size": 256,
            "num_heads": 4,
            "intermediate_size": 1024,
            "max_position_embeddings": 512,
        }
        policy = load_policy("tiny", tiny=tiny, seed=0, device="cpu")
    engine = Engine(policy.model, policy.tokenizer, eos_token_ids=eos_token_ids(policy.tokenizer, policy.model))
    drivers = {"environment": environment_rollout, "endpoint": endpoint_rollout}
    cases = [(name, latency) for latency in (0.0, args.latency) for name in drivers]
    for name in drivers:  # warm-up
        drivers[name](engine, policy.tokenizer, args, 0.0)
    best: dict[tuple[str, float], Rollout] = {}
    for _ in range(args.repeats):
        for name, latency in cases:
            rollout = drivers[name](engine, policy.tokenizer, args, latency)
            if (name, latency) not in best or rollout.tokens / rollout.wall > best[name, latency].tokens / best[
                name, latency
            ].wall:
                best[name, latency] = rollout
    print(
        f"{args.model}: {args.prompts} prompts x {args.group} sessions in flight, {args.turns} model turns, "
        f"{args.slots} slots\n"
    )
    print("| driver | tool latency | wall s | model tokens | tokens/s | vs environment | vs instant tool |")
    print("|---|---|---|---|---|---|---|")
    for name, latency in cases:
        rollout, env, instant = best[name, latency], best["environment", latency], best[name, 0.0]
        rate = rollout.tokens / rollout.wall
        print(
            f"| {name} | {latency:g} s | {rollout.wall:.2f} | {rollout.tokens} | {rate:.0f} | "
            f"{rate / (env.tokens / env.wall):.2f} | {rate / (instant.tokens / instant.wall):.2f} |"
        )
    timings = sorted(request_overhead(policy.tokenizer, args))
    print(
        f"\nendpoint overhead, {args.sessions} concurrent sessions x {args.turns} requests, sampling excluded: "
        f"median {statistics.median(timings):.1f} ms, p90 {timings[int(0.9 * len(timings))]:.1f} ms per request"
    )


if __name__ == "__main__":
    main()
