"""The harness endpoint over HTTP, driven by the ``openai`` SDK as users' agents drive it.

Invariants pinned:
- chat completions, plain and streamed (sync and async clients): the content served is the sampled turn's text,
  and a follow-up request echoing the reply extends the same recorded sequence, whose trainable tokens are
  exactly the ids served (tool calls through the endpoint: tests/test_harness_calculator.py);
- ``/v1/completions`` takes token ids and answers the ids it sampled (token in, token out); ``/v1/models`` lists
  the run's model name;
- the run's sampling wins over the request's and the response says which values it overrode; a ``stop`` string
  cuts the served text before it and the recorded ids after the token that completed it;
- limits: a session past its request count is answered with no content and ``finish_reason: length``; a context
  past the model's positions gets a 400 ``context_length_exceeded``;
- malformed requests (bad JSON, unknown role, an image part, ``n`` out of range, a body over the size limit) get
  OpenAI-style 4xx errors; a missing or unknown key gets 401 and never reaches a session; the server answers
  the next request as before.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import openai
import pytest
from test_episodes import EOS, TOKENIZER, chars

from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE
from groupwise.episodes.tool_formats import TOOL_FORMATS
from groupwise.harness.endpoint import Endpoint, EndpointSettings
from groupwise.harness.live import LiveSession, SessionLimits
from groupwise.harness.render import RequestRenderer
from groupwise.types import Completion, GenerationRequest, SamplingParams

Reply = Callable[[tuple[int, ...], int], list[int]]


class ScriptedTurns:
    """A fake turn sampler (test only): each request's choices are ``reply(context, sample)``; every request is
    kept."""

    def __init__(self, reply: Reply, sampling: SamplingParams = SamplingParams(max_new_tokens=16)) -> None:
        self.reply, self.sampling, self.version = reply, sampling, 0
        self.requests: list[GenerationRequest] = []

    async def sample(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        out = []
        for sample in range(request.num_samples):
            ids = self.reply(request.prompt_token_ids, sample)[: request.max_new_tokens]
            text = TOKENIZER.decode([i for i in ids if i != EOS], skip_special_tokens=False)
            out.append(
                Completion(
                    tuple(ids), tuple(-0.25 for _ in ids), text, "stop" if ids and ids[-1] == EOS else "length", 0
                )
            )
        return out


LIMITS = SessionLimits(max_requests=4, max_tokens=600, max_request_tokens=80, max_new_tokens=200, max_context=900)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint(EndpointSettings(max_body_bytes=20_000, model_name="tiny-policy"), TOOL_FORMATS["hermes"])
    served.start()
    yield served
    served.close()


def session(
    endpoint: Endpoint, reply: Reply, key: str, limits: SessionLimits = LIMITS
) -> tuple[LiveSession, ScriptedTurns]:
    live = LiveSession(key, 0, 7, RequestRenderer(TOKENIZER, PLAIN_CHAT_TEMPLATE, TOOL_FORMATS["hermes"]), limits)
    turns = ScriptedTurns(reply)
    endpoint.registry.add(live, turns)
    return live, turns


def client(endpoint: Endpoint, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint.base_url, api_key=key, max_retries=0)


def sampled(row) -> list[int]:
    return [t for t, keep in zip(row.token_ids, row.trainable, strict=True) if keep]


def test_streamed_answers_carry_the_same_content_for_sync_and_async_clients(endpoint):
    live, _ = session(endpoint, lambda context, sample: chars("hello") + [EOS], "key-stream")
    chunks = list(
        client(endpoint, "key-stream").chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(chars("hello")) + 1

    async def streamed() -> str:
        answer = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="key-stream", max_retries=0)
        stream = await answer.chat.completions.create(
            model="any",
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "again"},
            ],
            stream=True,
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert asyncio.run(streamed()) == "hello"
    (row,) = live.tree.rows()  # the echoed streamed reply was recognised: one sequence
    assert sampled(row) == (chars("hello") + [EOS]) * 2


def test_token_in_token_out_completions_and_the_model_list(endpoint):
    live, scripted = session(endpoint, lambda context, sample: chars("42") + [EOS], "key-tokens")
    answer = client(endpoint, "key-tokens").completions.create(model="any", prompt=chars("6*7="), max_tokens=4)
    assert answer.choices[0].text == "42" and answer.model_extra["groupwise"]["token_ids"] == [chars("42") + [EOS]]
    assert scripted.requests[0].prompt_token_ids == tuple(chars("6*7=")) and scripted.requests[0].max_new_tokens == 4
    assert [m.id for m in client(endpoint, "key-tokens").models.list()] == ["tiny-policy"]
    (row,) = live.tree.rows()
    assert row.token_ids == chars("6*7=42") + [EOS] and sampled(row) == chars("42") + [EOS]


def test_the_runs_sampling_wins_and_a_stop_string_cuts_the_served_ids(endpoint):
    live, _ = session(endpoint, lambda context, sample: chars("abc. def") + [EOS], "key-stop")
    answer = client(endpoint, "key-stop").chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "go"}],
        temperature=0.2,
        stop=[". "],
        presence_penalty=1,
    )
    assert answer.choices[0].message.content == "abc" and answer.choices[0].finish_reason == "stop"
    extension = answer.model_extra["groupwise"]
    assert extension["temperature"] == 1.0 and extension["overridden"] == {"temperature": 0.2}
    assert extension["ignored"] == ["presence_penalty"]
    (row,) = live.tree.rows()
    assert sampled(row) == chars("abc. ")  # through the token that completed the stop string, nothing after


def test_limits_answer_the_way_openai_does(endpoint):
    limits = SessionLimits(max_requests=1, max_tokens=600, max_request_tokens=16, max_new_tokens=200, max_context=40)
    live, _ = session(endpoint, lambda context, sample: chars("ok") + [EOS], "key-limits", limits)
    openai_client = client(endpoint, "key-limits")
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(model="any", messages=[{"role": "user", "content": "x" * 60}])
    assert refused.value.code == "context_length_exceeded" and live.counts.refused_requests == 1
    live.counts.requests = 1  # the request budget is spent: the next is answered with no room
    answer = openai_client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].finish_reason == "length" and not answer.choices[0].message.content
    assert live.counts.limited_requests == 1 and live.tree.rows() == []


def _post(endpoint: Endpoint, body: bytes, key: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"{endpoint.base_url}/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("body", "key", "status", "says"),
    [
        (b"{not json", "key-bad", 400, "not valid JSON"),
        (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), "key-bad", 400, "the roles are"),
        (
            json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}).encode(),
            "key-bad",
            400,
            "text parts only",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 17}).encode(), "key-bad", 400, "n must be"),
        (json.dumps({"messages": [{"role": "user", "content": "x" * 30_000}]}).encode(), "key-bad", 413, "over 20,000"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), None, 401, "not a live session"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "key-guessed", 401, "not a live"),
    ],
)
def test_malformed_requests_get_openai_errors_and_the_server_goes_on(endpoint, body, key, status, says):
    live, _ = session(endpoint, lambda context, sample: chars("ok") + [EOS], "key-bad")
    code, answer = _post(endpoint, body, key)
    assert code == status and says in answer["error"]["message"] and answer["error"]["type"]
    assert live.tree.rows() == []
    code, answer = _post(endpoint, json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "key-bad")
    assert code == 200 and answer["choices"][0]["message"]["content"] == "ok"
