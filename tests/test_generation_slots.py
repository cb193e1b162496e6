"""The engine's static-slot decode path — the code CUDA graphs capture — run on CPU with every replay a plain call.

- buckets: ``row_bucket`` is the smallest of 1, 2, 4, 8, 12, 16, 24, 32, 48, … that holds the rows;
- equivalence: the slot path (``cuda_graphs='eager'``: static buffers, per-bucket steps bound to the weights
  at capture, rows leaving by bucketing down) samples the same tokens as the compacting path and records
  logprobs within 1e-5 (float32), for multi-head and grouped-query attention, ragged prompts, G samples per
  prompt, rows finishing at many different steps (several buckets used), top-k/top-p, greedy, stop strings,
  and a Qwen2 model with biases;
- weights: changed in place (an optimizer step on a shared model, ``load_weights``) they are used by the next
  call with the captured steps kept (nothing captured again) — also after a fused AdamW step, which bumps no
  version counter, once the session's ``load_weights`` ran; rebound to new storage
  (``load_state_dict(assign=True)``) the steps are captured again and the new weights used — never stale;
- buffers: a longer chunk than the slots hold reallocates them and captures again, with the same results;
- on a CUDA machine only (skipped elsewhere): captured CUDA graphs replay exactly what the eager slot step
  computes, also after an in-place weight change (no recapture);
- a failed capture (here: CUDA graphs asked of a CPU-only torch) falls back to eager replays, says why in
  ``decode_path``, and samples the same tokens;
- ``cuda_graphs`` modes: unknown values, 'on' without CUDA and graph modes without the fast step are refused
  with the fix; ``decode_path`` names the path for 'auto', 'off' and 'eager' on CPU; the config key
  ``generation.cuda_graphs`` reaches the built engine, YAML's bare on/off (booleans) mean 'on'/'off', and its
  cross-field rules name the key and the fix.
"""

from __future__ import annotations

import pytest
import torch
from fakes.decoder_models import assert_same_completions, char_tokenizer, peaked_model, text_requests

from groupwise.config import ConfigError, config_from_dict, load_config
from groupwise.generation import Engine
from groupwise.generation.slots import row_bucket
from groupwise.generation.step_graphs import StepGraphs
from groupwise.trainer.builder import build_components
from groupwise.types import GenerationRequest, SamplingParams

EOS = 2
# Many stop tokens, so rows finish at many different steps and the slot path buckets down several times.
STOPS = (EOS, *range(10, 40))
SLOTS = "fast Llama decode step in static slots, replayed eagerly (row buckets 1..256, each captured on first use;"


TEXTS = ["1+2=", "a much longer prompt: 81*7=", "9", "12+30=", "77-5=", "hello"]


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def _requests(tokenizer, samples: int = 5) -> list[GenerationRequest]:
    return text_requests(tokenizer, TEXTS, samples)


def _tokens(completions) -> list[list[tuple[int, ...]]]:
    return [[c.token_ids for c in per] for per in completions]


def _slot_and_plain(model, tokenizer, stops=STOPS) -> tuple[Engine, Engine]:
    return Engine(model, tokenizer, stops, cuda_graphs="eager"), Engine(model, tokenizer, stops, cuda_graphs="off")


def test_row_buckets_are_the_smallest_holding_the_rows() -> None:
    buckets = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    for rows in range(1, 1025):
        assert row_bucket(rows) == min(b for b in buckets if b >= rows)
    with pytest.raises(ValueError, match="rows=0 must be >= 1"):
        row_bucket(0)


@pytest.mark.parametrize(
    ("kv_heads", "seed", "sampling", "min_captures"),
    [
        (6, 0, SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9), 3),
        (2, 3, SamplingParams(max_new_tokens=24, temperature=0.7, top_k=20), 3),
        (1, 0, SamplingParams(max_new_tokens=24, temperature=0.0), 1),  # greedy: a prompt's samples finish together
    ],
)
def test_slot_path_samples_what_the_compacting_path_samples(tokenizer, kv_heads, seed, sampling, min_captures) -> None:
    model = peaked_model(len(tokenizer), seed=seed, num_key_value_heads=kv_heads)
    slot, plain = _slot_and_plain(model, tokenizer)
    got, expected = slot.generate(_requests(tokenizer), sampling), plain.generate(_requests(tokenizer), sampling)
    assert slot.decode_path.startswith(SLOTS)
    assert len({c.num_tokens for per in got for c in per}) > 1, "rows should finish at different steps"
    assert slot.decode_graphs.captures >= min_captures, "rows finishing at different steps should use several buckets"
    assert_same_completions(got, expected)


def test_slot_path_with_stop_strings_and_qwen2_biases(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=7, family="qwen2")
    slot, plain = _slot_and_plain(model, tokenizer, stops=(EOS,))
    sampling = SamplingParams(max_new_tokens=20, temperature=1.0, stop=("a", "7"))
    got, expected = slot.generate(_requests(tokenizer), sampling), plain.generate(_requests(tokenizer), sampling)
    assert slot.decode_path.startswith(SLOTS)
    assert {c.finish_reason for per in got for c in per} == {"stop", "length"}
    assert_same_completions(got, expected)


def test_weights_changed_in_place_are_used_without_capturing_again(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=3)
    slot, plain = _slot_and_plain(model, tokenizer)
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
    before = slot.generate(_requests(tokenizer), sampling)
    with torch.no_grad():  # what an optimizer step does to the shared model in sync mode
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    after = slot.generate(_requests(tokenizer), sampling)
    assert _tokens(after) != _tokens(before)
    assert_same_completions(after, plain.generate(_requests(tokenizer), sampling))
    # load_weights (the async engine's weight sync) copies in place too.
    state = {name: tensor * 0.9 for name, tensor in peaked_model(len(tokenizer), seed=4).state_dict().items()}
    slot.load_weights(state, version=1)
    synced = slot.generate(_requests(tokenizer), sampling)
    assert _tokens(synced) != _tokens(after)
    assert_same_completions(synced, plain.generate(_requests(tokenizer), sampling))
    assert slot.decode_graphs.resets == 0, "in-place weight changes must keep the captured steps"


def test_a_fused_optimizer_step_is_seen_after_load_weights(tokenizer) -> None:
    # Fused AdamW writes the parameters without bumping their version counters; the sync session calls
    # load_weights(model.state_dict()) after every optimizer step, and that copy in place is what shows the change.
    model = peaked_model(len(tokenizer), seed=10)
    slot = Engine(model, tokenizer, STOPS, cuda_graphs="eager")
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
    before = slot.generate(_requests(tokenizer), sampling)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    sum(p.square().sum() for p in model.parameters()).backward()
    optimizer.step()
    slot.load_weights(model.state_dict(), version=1)
    after = slot.generate(_requests(tokenizer), sampling)
    assert _tokens(after) != _tokens(before)
    fresh = Engine(model, tokenizer, STOPS, cuda_graphs="off")
    assert_same_completions(after, fresh.generate(_requests(tokenizer), sampling))
    assert slot.decode_graphs.resets == 0


def test_weights_rebound_to_new_storage_are_captured_again(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=5)
    slot, plain = _slot_and_plain(model, tokenizer)
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
    before = slot.generate(_requests(tokenizer), sampling)
    assert slot.decode_graphs.resets == 0
    new_state = {name: t.clone() for name, t in peaked_model(len(tokenizer), seed=6).state_dict().items()}
    model.load_state_dict(new_state, assign=True)  # parameters now live in new tensors
    after = slot.generate(_requests(tokenizer), sampling)
    assert _tokens(after) != _tokens(before)
    assert_same_completions(after, plain.generate(_requests(tokenizer), sampling))
    assert slot.decode_graphs.resets == 1


def test_larger_chunks_reallocate_the_slots(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=8)
    slot, plain = _slot_and_plain(model, tokenizer)
    small, large = SamplingParams(max_new_tokens=8, temperature=1.0), SamplingParams(max_new_tokens=80, temperature=1.0)
    first = _requests(tokenizer, samples=1)[:2]
    assert_same_completions(slot.generate(first, small), plain.generate(first, small))
    assert slot.decode_graphs.resets == 0
    # More rows (more slots) and more new tokens (more cache columns) than the first call allocated.
    assert_same_completions(slot.generate(_requests(tokenizer), large), plain.generate(_requests(tokenizer), large))
    assert slot.decode_graphs.resets == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_equal_the_eager_slot_step(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=0).cuda()
    graphs = Engine(model, tokenizer, STOPS, cuda_graphs="on")
    eager = Engine(model, tokenizer, STOPS, cuda_graphs="eager")
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9)
    for _ in range(2):
        got, expected = graphs.generate(_requests(tokenizer), sampling), eager.generate(_requests(tokenizer), sampling)
        assert_same_completions(got, expected, tolerance=0.0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.1)
    assert graphs.decode_path.startswith("fast Llama decode step under cuda graphs")
    assert graphs.decode_graphs.captures >= 2 and graphs.decode_graphs.resets == 0


def test_a_failed_capture_falls_back_to_eager_replays(tokenizer, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError("no capture stream (refused by the test)")

    monkeypatch.setattr(torch.cuda, "Stream", refuse)  # every capture fails, on a CUDA machine too
    graphs = StepGraphs(use_graphs=True)
    calls = []
    graphs.run("key", lambda: lambda: calls.append(1))
    graphs.run("key", lambda: pytest.fail("a captured step is not built again"))
    assert (len(calls), graphs.use_graphs, graphs.captures) == (2, False, 1)
    assert graphs.fallback_reason.startswith("cuda graph capture failed:")
    model = peaked_model(len(tokenizer), seed=9)
    slot, plain = _slot_and_plain(model, tokenizer)
    slot.generate(_requests(tokenizer)[:1], SamplingParams(max_new_tokens=2))  # decide the path
    slot.decode_graphs.use_graphs = True  # as on CUDA: the next capture is a real one, and fails here
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    got, expected = slot.generate(_requests(tokenizer), sampling), plain.generate(_requests(tokenizer), sampling)
    assert_same_completions(got, expected)
    assert "replayed eagerly" in slot.decode_path and "cuda graph capture failed" in slot.decode_path


def test_cuda_graph_modes_are_checked_and_named(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=1)
    with pytest.raises(ValueError, match="cuda_graphs='maybe' must be one of auto, on, off, eager"):
        Engine(model, tokenizer, (EOS,), cuda_graphs="maybe")
    with pytest.raises(ValueError, match="cuda_graphs='on' needs a model on a CUDA device, not cpu; use 'auto'"):
        Engine(model, tokenizer, (EOS,), cuda_graphs="on")
    with pytest.raises(ValueError, match="fast_decode=False turns off"):
        Engine(model, tokenizer, (EOS,), cuda_graphs="eager", fast_decode=False)
    paths = {}
    for mode in ("auto", "off", "eager"):
        engine = Engine(model, tokenizer, (EOS,), cuda_graphs=mode)
        engine.generate(_requests(tokenizer)[:1], SamplingParams(max_new_tokens=3))
        paths[mode] = engine.decode_path
    assert paths == {
        "auto": "fast Llama decode step (no cuda graphs: the model is on cpu)",
        "off": "fast Llama decode step (cuda graphs off)",
        "eager": SLOTS + " cuda_graphs='eager')",
    }


def _config(**generation):
    tiny = {"num_layers": 1, "hidden_size": 32, "num_heads": 2}
    model = {"source": "tiny", "tiny": tiny, "device": "cpu"}
    return {"model": model, "generation": {"max_new_tokens": 4, **generation}}


@pytest.mark.parametrize(("mode", "path"), [("auto", "no cuda graphs: the model is on cpu")])
def test_the_config_key_reaches_the_built_engine(mode, path) -> None:
    engine = build_components(config_from_dict(_config(cuda_graphs=mode))).engine
    engine.generate([GenerationRequest((5, 6, 7), 2, seed=0)], SamplingParams(max_new_tokens=4))
    assert (engine.cuda_graphs, engine.decode_path) == (mode, f"fast Llama decode step ({path})")


def test_yaml_on_and_off_mean_the_modes(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: {source: tiny, device: cuda}\ngeneration: {cuda_graphs: off}\n")  # YAML: off is false
    assert load_config(path).generation.cuda_graphs == "off"
    assert load_config(path, ["generation.cuda_graphs=on"]).generation.cuda_graphs == "on"


def test_config_rules_for_cuda_graphs() -> None:
    with pytest.raises(ConfigError) as error:
        config_from_dict(_config(cuda_graphs="on"))
    assert "generation.cuda_graphs" in str(error.value) and "model.device 'cpu'" in str(error.value)
    with pytest.raises(ConfigError) as error:
        config_from_dict(_config(cuda_graphs="off"))
    assert "has no effect" in str(error.value)
    on_cuda = {"source": "tiny", "device": "cuda"}
    with pytest.raises(ConfigError) as error:
        config_from_dict({**_config(cuda_graphs="on", fast_decode=False), "model": on_cuda})
    assert "generation.fast_decode: false turns off" in str(error.value)
    cuda = config_from_dict({**_config(cuda_graphs="off"), "model": on_cuda})
    assert cuda.generation.cuda_graphs == "off"
