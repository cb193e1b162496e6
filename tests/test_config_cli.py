"""The ``groupwise config`` command line.

Invariants pinned here:
- ``config check`` exits 0 and prints ``ok: FILE`` for a valid config, exits 2 and prints every error
  (with overrides applied) otherwise; a missing file or a YAML syntax error also exits 2; never a traceback;
- ``config show`` prints the resolved config as YAML that loads back to an equal config;
- usage errors exit 2 and ``--help`` exits 0 (``main`` returns the code instead of raising SystemExit);
- G = 1 with only an entropy term is a warning (the reward never reaches the gradient), without it an error;
- a hazard (async weight_fifo, with replace or shrink) is a warning: ``config check`` exits 0 and says so,
  ``config show`` keeps stdout loadable, the warning goes to stderr and ``simulate`` writes it to events.log.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from groupwise.cli.main import build_parser, main
from groupwise.config import config_from_dict, load_config

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_check_valid_config(tmp_path, capsys):
    path = write(tmp_path, "model:\n  source: tiny\n")
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path}"


def test_check_reports_every_error_and_no_traceback(tmp_path, capsys):
    path = write(tmp_path, "model:\n  source: tiny\n  path: models/x\ngrpo:\n  num_prompt_per_step: 4\n")
    code = main(["config", "check", str(path), "loss.kl_coef=0.5", "run.max_steps=0"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    for expected in ("4 errors", "model.path", "did you mean `grpo.num_prompts_per_step`?", "loss.kl_coef",
                     "run.max_steps", str(path)):
        assert expected in err
    assert "Traceback" not in err


def test_overrides_can_fix_a_config(tmp_path, capsys):
    path = write(tmp_path, "model:\n  source: tiny\ngrpo:\n  num_generations_per_prompt: 1\n")
    assert main(["config", "check", str(path)]) == 2
    assert main(["config", "check", str(path), "grpo.num_generations_per_prompt=4"]) == 0


def test_missing_file_and_bad_yaml_exit_2_with_a_message(tmp_path, capsys):
    assert main(["config", "check", str(tmp_path / "absent.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    path = write(tmp_path, "grpo: {num_prompts_per_step: 8\n")
    assert main(["config", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "Traceback" not in err


def test_show_prints_yaml_that_reloads_equal(capsys):
    example = ROOT / "examples" / "addition_async.yaml"
    assert main(["config", "show", str(example), "grpo.num_prompts_per_step=8", "async.max_buffered_rollouts=32"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    expected = load_config(example, ["grpo.num_prompts_per_step=8", "async.max_buffered_rollouts=32"])
    assert config_from_dict(shown) == expected
    assert shown["grpo"]["num_prompts_per_step"] == 8 and shown["async"]["max_buffered_rollouts"] == 32


def test_usage_errors_and_help_return_codes(capsys):
    assert main([]) == 2
    assert main(["config"]) == 2
    assert main(["config", "show"]) == 2
    assert main(["nonsense"]) == 2
    assert main(["--help"]) == 0
    assert "config" in capsys.readouterr().out


def test_parser_has_one_subcommand_per_registered_command():
    parser = build_parser()
    args = parser.parse_args(["config", "check", "f.yaml", "a.b=1", "c=2"])
    assert args.command == "config" and args.file == "f.yaml" and args.overrides == ["a.b=1", "c=2"]
    assert callable(args.handler)


WEIGHT_FIFO = "mode: async\nmodel:\n  source: tiny\ngrpo:\n  dynamic_sampling:\n    enabled: false\n" \
              "loss:\n  importance_sampling: true\nasync:\n  sampler:\n    name: weight_fifo\n"


def test_a_hazard_is_a_warning_on_stderr_and_the_config_stays_valid(tmp_path, capsys):
    path = write(tmp_path, WEIGHT_FIFO)
    for on_dropped in ("replace", "shrink"):
        override = f"async.rollout_failure.on_dropped_prompt={on_dropped}"
        assert main(["config", "check", str(path), override]) == 0
        out, err = capsys.readouterr()
        assert out.strip() == f"ok: {path} (1 warning(s) above)"
        assert err.startswith("warning: async.sampler.name: weight_fifo\n")
        assert f"on_dropped_prompt {on_dropped}" in err and "ControllerStalled" in err and "ready_first" in err
    # config show keeps stdout loadable YAML and warns on stderr.
    assert main(["config", "show", str(path)]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["async"]["sampler"]["name"] == "weight_fifo" and err.startswith("warning:")
    # Another sampler: no warning.
    assert main(["config", "check", str(path), "async.sampler.name=ready_first"]) == 0
    assert capsys.readouterr() == (f"ok: {path}\n", "")


def test_one_generation_per_prompt_with_only_an_entropy_term_is_a_warning(tmp_path, capsys):
    path = write(tmp_path, "model:\n  source: tiny\ngrpo:\n  num_generations_per_prompt: 1\n  dynamic_sampling:\n"
                 "    enabled: false\nloss:\n  entropy_coef: 0.01\n")
    assert main(["config", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"ok: {path} (1 warning(s) above)"
    assert err.startswith("warning: grpo.num_generations_per_prompt: 1\n") and "only loss.entropy_coef moves" in err
    assert main(["config", "check", str(path), "loss.entropy_coef=0"]) == 2
    assert "every advantage is exactly 0" in capsys.readouterr().err


def test_simulate_writes_the_warning_to_events_log(tmp_path, capsys):
    path = write(tmp_path, WEIGHT_FIFO)
    code = main(["simulate", str(path), f"run.output_dir={tmp_path}", "run.name=wf", "run.max_steps=2",
                 "logging.tensorboard=false", "sim.num_prompts=64"])  # fmt: skip
    assert code == 0 and "warning: async.sampler.name" in capsys.readouterr().err
    events = (tmp_path / "wf" / "events.log").read_text()
    assert "config warning: async.sampler.name: weight_fifo trains each step only from groups" in events
