"""The generator factory is the one seam a generation backend needs.

Invariants pinned:
- a backend of the tests' own (``fakes.generators:toy_backend``), plugged in through ``generation.backend`` alone,
  trains a sync run and an async run: every trained completion is one the toy sampled, the toy gets the learner's
  weights after every step (versions 1, 2, ...), and the runs' fates pass the audit;
- a backend that cannot stream is reported so by the one capability query (``stream_support``), and a run asking for
  continuous batching on it notes that it runs one batch per call;
- a plug-in backend that does not import, is not callable, or cannot be called with the GeneratorSpec alone is a
  config error naming ``generation.backend``, before any model loads; a factory that raises or returns something
  else than a generator is one too (exit 2, the factory's message, no traceback), in sync and async runs, as soon
  as the model it is built for is loaded; the shipped backends are exactly the config's ``GENERATION_BACKENDS``;
- a backend that returns fewer completions than a request asked for is refused with a message naming the
  generator and the counts (not "dynamic sampling needs G >= 2");
- a plug-in backend whose answers break the Generator contract (strings, NaN logprobs, token ids outside the
  vocabulary, a weight version newer than its own, an unknown finish reason) is a config error naming
  ``generation.backend`` and what it returned when its first (probe) answer does, and stops the run naming it
  when a later one does (not an ``AttributeError``, not ``DynamicSamplingExhausted``).
"""

from __future__ import annotations

import json

import pytest
import yaml
from fakes.generators import DIGITS, ToyGenerator

from groupwise.cli.main import main
from groupwise.cli.run_prompts import training_uids
from groupwise.config import ConfigError, config_from_dict
from groupwise.config.generation_schema import GENERATION_BACKENDS
from groupwise.generation.factory import BACKENDS, stream_support
from groupwise.run.audit import audit_run
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session
from groupwise.trainer.preflight import check_inputs

TOY = "fakes.generators:toy_backend"


def toy_config(tmp_path, mode: str, **sections):
    return config_from_dict(toy_dict(tmp_path, mode, **sections))


def toy_dict(tmp_path, mode: str, **sections) -> dict:
    data = {
        "mode": mode,
        "run": {"name": f"toy-{mode}", "output_dir": str(tmp_path / "runs"), "seed": 1, "max_steps": 2},
        "model": {"source": "tiny", "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                             "intermediate_size": 64, "max_position_embeddings": 32}},
        "data": {"task": "addition", "addition": {"min_digits": 1, "max_digits": 1, "num_eval": 8}},
        "generation": {"backend": TOY, "max_new_tokens": 4},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 4, "dynamic_sampling": {"enabled": False}},
        "logging": {"progress": False, "tensorboard": False},
        "eval": {"at_start": False, "at_end": False},
    }  # fmt: skip
    if mode == "async":
        data["async"] = {"sampler": {"name": "in_order", "max_lookahead_versions": 0},
                         "rollout_failure": {"on_dropped_prompt": "shrink"}}  # fmt: skip
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def toy_config_file(tmp_path, mode: str, **sections):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(toy_dict(tmp_path, mode, **sections)), encoding="utf-8")
    return path


def trained_texts(run_dir) -> list[str]:
    lines = []
    for path in sorted((run_dir / "train_data").glob("step_*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return [line["completion_text"] for line in lines]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_toy_backend_plugged_in_through_the_factory_trains_both_modes(tmp_path, mode):
    session = build_session(toy_config(tmp_path, mode))
    toy = session.engine
    assert isinstance(toy, ToyGenerator)
    (run_sync if mode == "sync" else run_async)(session)
    assert session.state.step == 2
    assert toy.calls > 0 and toy.loads[-2:] == [1, 2]  # the learner's weights after each step
    texts = trained_texts(session.run_dir.path)
    assert len(texts) == 2 * 2 * 4  # 2 steps x P 2 x G 4
    eos = session.policy.tokenizer.eos_token
    assert all(text.endswith(eos) and set(text.removesuffix(eos)) <= set(DIGITS) and text != eos for text in texts)
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()


def test_a_backend_that_cannot_stream_says_so_and_batching_falls_back(tmp_path):
    cfg = toy_config(tmp_path, "sync", generation={"continuous_batching": True})
    session = build_session(cfg)
    support = stream_support(session.engine)
    assert not support.available and "ToyGenerator" in support.reason
    assert not session.streaming.available
    events = session.run_dir.events_path.read_text()
    assert "generation runs one batch per engine call" in events


@pytest.mark.parametrize(
    "backend, words",
    [("no_such_backend_module:make", "cannot import module"), ("fakes.generators:DIGITS", "not callable"),
     ("fakes.generators:two_argument_backend", "cannot be called with one argument, the GeneratorSpec")],
)
def test_a_plugin_backend_that_cannot_be_built_is_a_config_error(tmp_path, backend, words):
    cfg = toy_config(tmp_path, "sync", generation={"backend": backend})
    with pytest.raises(ConfigError) as info:
        check_inputs(cfg, training=True)
    (issue,) = [i for i in info.value.errors if i.path == "generation.backend"]
    assert issue.value == backend and words in issue.rule


def test_an_unknown_backend_name_is_refused_by_the_schema(tmp_path):
    with pytest.raises(ConfigError, match="generation.backend"):
        toy_config(tmp_path, "sync", generation={"backend": "fastest"})


def test_the_shipped_backends_are_the_config_values():
    assert tuple(BACKENDS) == GENERATION_BACKENDS


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "backend, words",
    [("fakes.generators:raising_backend", "the factory raised RuntimeError: the sampling server at :9000 is down"),
     ("fakes.generators:not_a_generator_backend", "returned a dict, which is not a Generator")],
)
def test_a_backend_factory_that_raises_or_returns_no_generator_exits_2_naming_the_key(tmp_path, capsys, mode,
                                                                                     backend, words):
    config = toy_config_file(tmp_path, mode, generation={"backend": backend})
    assert main(["config", "check", str(config)]) == 0  # what the factory does needs the model: known at the call
    capsys.readouterr()
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "generation.backend" in err and backend in err and words in err
    assert "Traceback" not in err


def test_a_backend_returning_fewer_completions_than_asked_is_named_with_what_it_returned(tmp_path, capsys):
    config = toy_config_file(tmp_path, "sync", generation={"backend": "fakes.generators:short_backend"},
                             grpo={"dynamic_sampling": {"enabled": True}})
    assert main(["train", str(config)]) == 2  # found on the probe request, before training
    err = capsys.readouterr().err
    assert "the generator ShortToyGenerator returned 1 completion(s) for request 0, which asked for 2" in err
    assert "G >= 2" not in err and "Traceback" not in err


@pytest.mark.parametrize("how, words", [
    ("string", "returned a str, not a Completion (groupwise.types.Completion) (request 0, completion 0)"),
    ("nan", "returned the logprob nan; every sampled token's logprob must be a finite Python float"),
    ("vocab", "returned the token id 1000000, which is not a token of the model (the model has "),
    ("version", "returned the weight version 5 while the generator holds version 0"),
    ("finish", "returned the finish reason 'done', not one of stop, length"),
])  # fmt: skip
def test_a_backend_breaking_the_generator_contract_is_a_config_error_naming_what_it_returned(tmp_path, capsys, how,
                                                                                            words):
    backend = f"fakes.generators:{how}_backend"
    config = toy_config_file(tmp_path, "sync", generation={"backend": backend})
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "generation.backend" in err and f"generation backend {backend!r} does not keep the Generator contract: " \
        "the generation.backend generator BrokenToyGenerator " in err and words in err, err
    assert "Traceback" not in err and "AttributeError" not in err


def test_a_backend_breaking_the_contract_later_stops_the_run_naming_it(tmp_path, capsys):
    config = toy_config_file(tmp_path, "sync", generation={"backend": "fakes.generators:late_nan_backend"},
                             grpo={"dynamic_sampling": {"enabled": True}})
    assert main(["train", str(config)]) == 1
    err = capsys.readouterr().err
    assert "the generation.backend generator BrokenToyGenerator returned the logprob nan" in err, err
    assert "DynamicSamplingExhausted" not in err and "Traceback" not in err
