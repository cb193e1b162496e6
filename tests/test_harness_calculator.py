"""The shipped calculator harnesses (a plain OpenAI-SDK agent loop, and a LangGraph ReAct agent) train exactly the
tokens the built-in calculator environment would, with SmolLM2's own tokenizer and chat template.

Invariants pinned:
- given the same sampled turns, every session of ``examples/calculator_harness.py`` and of
  ``examples/calculator_langgraph.py`` (when ``groupwise[agents]`` is installed) records the same token sequence and
  the same trainable mask as the ``calculator`` environment's episode: the same opening (system prompt, tool
  descriptions, question), the sampled ids as sampled — even where their text would re-encode to other ids —, the
  tool's answer rendered by the template, and no retokenized token;
- through the endpoint, the model's ``<tool_call>`` reply came back to the SDK as OpenAI ``tool_calls`` and the
  harness's ``tool`` message was rendered as context, never trained;
- the session's reward (``None`` from the harness) is ``final_number`` on its last reply;
- streamed, a tool call arrives as OpenAI ``tool_calls`` chunks with ``finish_reason: tool_calls``, its markup not
  in the content.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from groupwise.data.loader import LoadedPrompt
from groupwise.data.rewards import final_number
from groupwise.environments.calculator import CalculatorEnvironment, add, multiply
from groupwise.episodes.episode import EpisodeLimits
from groupwise.episodes.group import EpisodeSettings
from groupwise.episodes.lockstep import run_episode_groups
from groupwise.episodes.template import ChatRenderer
from groupwise.episodes.tool_formats import TOOL_FORMATS
from groupwise.episodes.tools import tool_schema
from groupwise.harness.endpoint import EndpointSettings
from groupwise.harness.launch import HarnessSpec
from groupwise.harness.live import SessionLimits
from groupwise.harness.render import RequestRenderer
from groupwise.harness.runner import HarnessRunner, HarnessSettings
from groupwise.model import smollm2_gguf_path
from groupwise.plugins import import_plugin
from groupwise.trainer.rollout import RolloutWorker
from groupwise.types import Completion, GenerationRequest, Prompt, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}</tool_call>'
SAMPLING = SamplingParams(max_new_tokens=48, temperature=0.7)


@pytest.fixture(scope="module")
def tokenizer():
    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)


class CalculatorTurns:
    """A fake generator (test only): a ``multiply`` call while no tool has answered, then the product; the call's
    ids split one word into pieces, so its text re-encodes to other ids."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.version = tokenizer, 0
        end = [tokenizer.eos_token_id]
        head, tail = CALL.split("multiply")
        self.call = self._ids(head) + self._ids("multi") + self._ids("ply") + self._ids(tail) + end
        self.answer = self._ids("The product is 56088.") + end
        assert tokenizer(CALL, add_special_tokens=False)["input_ids"] + end != self.call

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        out = []
        for request in requests:
            answered = "<|im_start|>tool" in self.tokenizer.decode(list(request.prompt_token_ids))
            ids = (self.answer if answered else self.call)[: request.max_new_tokens or sampling.max_new_tokens]
            text = self.tokenizer.decode(ids[:-1])
            out.append(
                [
                    Completion(tuple(ids), tuple(-0.1 for _ in ids), text, "stop", self.version)
                    for _ in range(request.num_samples)
                ]
            )
        return out

    def load_weights(self, state, version) -> None:  # the Generator interface; never called here
        raise AssertionError


@pytest.mark.parametrize("example", ["calculator_harness", "calculator_langgraph"])
def test_the_harness_examples_record_what_the_calculator_environment_would(tokenizer, example):
    if example == "calculator_langgraph":
        pytest.importorskip("langgraph", reason="the LangGraph example needs groupwise[agents]")
    prompt = Prompt(
        "mul/123x456",
        "56088",
        messages=(
            {"role": "user", "content": "What is 123 * 456? Use the multiply tool, then reply with only the number."},
        ),
    )
    renderer = ChatRenderer(tokenizer, [tool_schema(multiply), tool_schema(add)], None)
    episodes_settings = EpisodeSettings(
        "calculator", CalculatorEnvironment, renderer, EpisodeLimits(3, 400, 32, 48, 8192), 30.0
    )
    [episodes] = run_episode_groups(CalculatorTurns(tokenizer), SAMPLING, episodes_settings, [prompt], [5], 2)

    harness = HarnessRunner(
        HarnessSettings(
            HarnessSpec(example, function=import_plugin(f"{ROOT}/examples/{example}.py:run", "episode.harness")),
            RequestRenderer(tokenizer, None, TOOL_FORMATS["hermes"]),
            SessionLimits(3, 400, 48, 32, 8192),
            60.0,
            EndpointSettings(),
        )
    )
    worker = RolloutWorker(CalculatorTurns(tokenizer), tokenizer, final_number, SAMPLING, 2, 0, harness=harness)
    try:
        [group] = worker.generate_groups([LoadedPrompt(prompt, 0, 0)], [0])
    finally:
        worker.close()
    assert not isinstance(episodes, Exception)
    for episode, completion in zip(episodes, group.completions, strict=True):
        harness_tokens = list(group.prompt_token_ids) + list(completion.token_ids)
        assert harness_tokens == list(episode.prompt_ids) + episode.token_ids
        assert (
            list(completion.trainable)
            == [False] * (len(episode.prompt_ids) - len(group.prompt_token_ids)) + episode.trainable
        )
        record = completion.episode
        assert record is not None and record.harness is not None and not completion.branches
        assert record.harness["retokenized_tokens"] == 0 and record.harness["tool_calls"] == 1
        assert record.harness["requests"] == 2 and record.turns == 2
    assert group.raw_rewards == [1.0, 1.0]  # final_number on "The product is 56088."


def test_a_streamed_tool_call_arrives_as_openai_tool_call_chunks(tokenizer):
    import openai

    from groupwise.harness.endpoint import Endpoint
    from groupwise.harness.live import LiveSession

    class CallOnce:  # a fake turn sampler (test only): the multiply call, with its ids
        sampling, version = SAMPLING, 0

        async def sample(self, request: GenerationRequest) -> list[Completion]:
            ids = CalculatorTurns(tokenizer).call
            return [Completion(tuple(ids), (-0.1,) * len(ids), tokenizer.decode(ids[:-1]), "stop", 0)]

    endpoint = Endpoint(EndpointSettings(), TOOL_FORMATS["hermes"])
    endpoint.start()
    try:
        renderer = RequestRenderer(tokenizer, None, TOOL_FORMATS["hermes"])
        endpoint.registry.add(LiveSession("key", 0, 0, renderer, SessionLimits(3, 400, 48, 32, 8192)), CallOnce())
        client = openai.OpenAI(base_url=endpoint.base_url, api_key="key", max_retries=0)
        schemas = import_plugin(f"{ROOT}/examples/calculator_harness.py:SCHEMAS", "tools")
        chunks = list(
            client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "What is 123 * 456?"}], tools=schemas, stream=True
            )
        )
    finally:
        endpoint.close()
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("multiply", '{"a": 123, "b": 456}')]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # the markup is not content
