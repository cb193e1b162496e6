"""The built-in engine's generation stream keeps the request-stream contract (``tests/stream_contract.py``).

Invariants pinned (the contract, on ``GenerationStream`` started on its own thread, both partial-rollout modes):
- each request is answered exactly once, one completion per sample, within its token limit (the stream's, or
  the request's own ``max_new_tokens``), with its cost in tokens; progress, while present, is a prefix of it;
- a cancel reports the request's cost exactly once, for a request running or already answered; a forgotten
  request leaves nothing in ``progress``;
- a weight post runs its load and calls ``done`` once; the step, weight-load and busy-time counters advance.
"""

from __future__ import annotations

import pytest
from fakes.decoder_models import char_tokenizer, peaked_model
from stream_contract import check_request_stream_contract

from groupwise.generation import Engine
from groupwise.types import SamplingParams

MAX_NEW = 12


@pytest.mark.parametrize("partial", ["off", "continue"])
def test_the_builtin_stream_keeps_the_request_stream_contract(partial):
    tokenizer = char_tokenizer()
    engine = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, (2,))
    stream = engine.open_stream(SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0), max_rows=8, partial=partial)
    stream.start("test-contract")
    try:
        prompts = [tuple(tokenizer(text)["input_ids"]) for text in ("1+2=", "a longer prompt 81*7=", "9")]
        check_request_stream_contract(stream, prompts, MAX_NEW)
    finally:
        stream.close(10.0)
