"""The decode step compiled by torch's compiler (``generation.compile``), against the same step run eagerly.

- exactness (slow tier: compiling takes minutes here), with dense and with oneDNN projections: on a tiny random
  model the compiled slot step samples the same tokens as the eager slot step (``cuda_graphs='eager'``) and
  records logprobs within 1e-4 (float32) —
  sampled at temperature 1 with rows finishing at different steps (several row buckets), after the weights
  changed in place (an optimizer step on the shared model: the compiled step reads the new weights), and greedy;
  ``decode_path`` names the compiled step and ``compile_seconds`` counts the compile's cost;
- a compile that fails falls back to the eager step, says why, and samples the same tokens;
- the rule: ``on`` compiles, ``off`` does not, ``auto`` only for a run planning at least ``AUTO_MIN_DECODE_STEPS``
  decode steps (``run.max_steps × generation.max_new_tokens``); an unknown mode is refused;
- the config key ``generation.compile`` reaches the built engine, YAML's bare on/off mean 'on'/'off', and an
  unknown value names the key.
"""

from __future__ import annotations

import pytest
import torch
from fakes.decoder_models import assert_same_completions, char_tokenizer, peaked_model, text_requests

from groupwise.config import ConfigError, config_from_dict, load_config
from groupwise.generation import Engine, compiled_step, step_graphs
from groupwise.generation.compiled_step import AUTO_MIN_DECODE_STEPS, compile_wanted
from groupwise.generation.projections import onednn_available
from groupwise.trainer.builder import build_components
from groupwise.types import SamplingParams

EOS = 2
STOPS = (EOS, *range(10, 40))  # many stop tokens: rows finish at many steps, so several buckets run
TEXTS = ["1+2=", "a much longer prompt: 81*7=", "9", "12+30=", "77-5=", "hello"]
COMPILED = "fast Llama decode step in static slots, compiled by torch.compile"
# Recorded logprobs, compiled vs eager (float32): fused loops round differently; measured up to 1.3e-5.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def _tokens(completions) -> list[list[tuple[int, ...]]]:
    return [[c.token_ids for c in per] for per in completions]


def _compiled_and_eager(model, tokenizer, projections: str = "auto") -> tuple[Engine, Engine]:
    compiled = Engine(model, tokenizer, STOPS, compile_step=True, projections=projections)
    return compiled, Engine(model, tokenizer, STOPS, cuda_graphs="eager", projections=projections)


@pytest.mark.slow  # its compiles: ~4 min on a loaded 2-core CPU, ~15 s once inductor's disk cache holds them
@pytest.mark.parametrize("projections", ["dense", "onednn"])
def test_the_compiled_step_samples_what_the_eager_step_samples(tokenizer, projections) -> None:
    if projections == "onednn" and not onednn_available():
        pytest.skip("this torch build has no oneDNN")
    model = peaked_model(len(tokenizer), seed=3)
    compiled, eager = _compiled_and_eager(model, tokenizer, projections)
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
    requests = text_requests(tokenizer, TEXTS, 2)
    before = compiled.generate(requests, sampling)
    assert compiled.decode_path.startswith(COMPILED) and compiled.projection_kind == projections
    assert len({c.num_tokens for per in before for c in per}) > 1, "rows should finish at different steps"
    assert compiled.decode_graphs.captures >= 2, "rows finishing at different steps should use several buckets"
    assert compiled.decode_graphs.compile_seconds > 0
    assert_same_completions(before, eager.generate(requests, sampling), TOLERANCE)
    with torch.no_grad():  # what an optimizer step does to the shared model in sync mode
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    after = compiled.generate(requests, sampling)
    assert _tokens(after) != _tokens(before)
    assert_same_completions(after, eager.generate(requests, sampling), TOLERANCE)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    assert_same_completions(compiled.generate(requests, greedy), eager.generate(requests, greedy), TOLERANCE)


def test_a_failed_compile_falls_back_to_the_eager_step(tokenizer, monkeypatch) -> None:
    def refuse(step):
        def fails() -> None:
            raise RuntimeError("no compiler here")

        return fails

    monkeypatch.setattr(step_graphs, "compiled", refuse)
    model = peaked_model(len(tokenizer), seed=1)
    compiled, eager = _compiled_and_eager(model, tokenizer)
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0)
    requests = text_requests(tokenizer, TEXTS[:3], 2)
    assert_same_completions(compiled.generate(requests, sampling), eager.generate(requests, sampling))
    assert compiled.decode_path.startswith("fast Llama decode step in static slots, replayed eagerly")
    assert compiled.decode_graphs.fallback_reason == "torch.compile failed: RuntimeError: no compiler here"
    assert not compiled.decode_graphs.compile_steps


@pytest.mark.parametrize(
    ("mode", "planned", "wanted"),
    [
        ("on", None, True),
        ("off", 10**9, False),
        ("auto", None, False),
        ("auto", AUTO_MIN_DECODE_STEPS - 1, False),
        ("auto", AUTO_MIN_DECODE_STEPS, True),
    ],
)
def test_the_compile_rule(mode, planned, wanted) -> None:
    assert compile_wanted(mode, planned) is wanted


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="compile='yes' must be one of auto, on, off"):
        compiled_step.compile_wanted("yes", 1)


def _config(**generation):
    tiny = {"num_layers": 1, "hidden_size": 32, "num_heads": 2}
    model = {"source": "tiny", "tiny": tiny, "device": "cpu"}
    return {"model": model, "generation": {"max_new_tokens": 4, **generation}}


@pytest.mark.parametrize(("mode", "compiles"), [("on", True), ("auto", False), ("off", False)])
def test_the_config_key_reaches_the_built_engine(mode, compiles) -> None:
    assert build_components(config_from_dict(_config(compile=mode))).engine.compile_step is compiles
    long_run = {**_config(compile="auto"), "run": {"max_steps": AUTO_MIN_DECODE_STEPS // 4}}
    assert build_components(config_from_dict(long_run)).engine.compile_step  # 25,000 steps × 4 tokens


def test_yaml_on_and_off_and_unknown_values(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: {source: tiny}\ngeneration: {compile: off}\n")  # YAML: off is false
    assert load_config(path).generation.compile == "off"
    assert load_config(path, ["generation.compile=on"]).generation.compile == "on"
    with pytest.raises(ConfigError) as error:
        config_from_dict(_config(compile="sometimes"))
    assert "generation.compile" in str(error.value)
