"""Config YAML that could hang, crash or be misread is refused with the key and the line (files and overrides).

Invariants pinned here:
- bounds: an alias bomb in ``reward.kwargs`` (``config show`` and ``train`` both dump it into config.yaml) is
  refused within seconds; a 20,000-deep flow sequence is refused, not a RecursionError; a 4,301-digit integer is
  refused, not a ValueError; more than 1 MiB of YAML is refused; aliases that stay small still load;
- duplicate keys (two ``run:`` blocks, or one key twice in any mapping, at any depth) are refused naming both lines;
  YAML's merge key ``<<`` still lets a mapping override merged keys;
- YAML 1.1 numbers: ``1:30`` (base 60, read as 90) and ``010`` (octal, read as 8) are refused with the value YAML
  would have used; quoted, they are strings; ``007`` and plain numbers are untouched;
- overrides go through the same reader (issues carry the override's key), and one key given twice is refused;
- every problem of a file comes at once, and an override's own problems are reported beside the file's;
- through the CLI: exit 2, no traceback.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict, load_config, parse_yaml
from groupwise.config.yaml_input import MAX_YAML_BYTES, YamlInputError

TINY = "model: {source: tiny}\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def issues_of(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> list:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), overrides)
    return info.value.errors


def alias_bomb(levels: int = 7) -> str:
    """Ten references per level: 10^levels values once expanded, a few hundred bytes as text."""
    lines = ["  kwargs:", '    l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * 10)
        lines.append(f"    l{level}: &l{level} [{refs}]")
    return TINY + "reward:\n  function: 'm:f'\n" + "\n".join(lines) + "\n"


# --- bounds ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["show", "check"])
def test_an_alias_bomb_is_refused_within_seconds(tmp_path, capsys, command):
    path = write(tmp_path, alias_bomb())
    start = time.monotonic()
    assert main(["config", command, str(path)]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert "100,000 values once aliases are expanded" in err and "Traceback" not in err


def test_a_deep_flow_sequence_is_refused_not_a_recursion_error(tmp_path):
    text = TINY + "reward:\n  kwargs:\n    x: " + "[" * 20_000 + "]" * 20_000 + "\n"
    (issue,) = issues_of(tmp_path, text)
    assert "at most 32 levels deep" in issue.rule and "line 4" in str(issue.value)


def test_a_4301_digit_integer_is_refused_not_a_value_error(tmp_path):
    (issue,) = issues_of(tmp_path, TINY + "run:\n  seed: " + "9" * 4301 + "\n")
    assert issue.path == "run.seed" and "limited to 100 digits" in issue.rule and "4301 digits" in issue.value


def test_more_than_a_mebibyte_is_refused(tmp_path):
    text = TINY + "data:\n  system_prompt: '" + "a" * MAX_YAML_BYTES + "'\n"
    (issue,) = issues_of(tmp_path, text)
    assert "limited to 1,048,576 bytes" in issue.rule


def test_small_aliases_still_load():
    data = parse_yaml("a: &x {k: 1}\nb: *x\nc: {<<: *x, k: 2}\n")
    assert data == {"a": {"k": 1}, "b": {"k": 1}, "c": {"k": 2}}


# --- duplicate keys ----------------------------------------------------------------------------------------------


def test_two_run_blocks_are_refused_naming_both_lines(tmp_path):
    text = TINY + "run:\n  max_steps: 5\ngrpo: {}\nrun:\n  seed: 3\n"
    (issue,) = issues_of(tmp_path, text)
    assert issue.path == "run" and issue.value == "2 entries (lines 2 and 5)"
    assert "silently keep the last one" in issue.rule


def test_a_nested_duplicate_is_refused_with_its_dotted_key(tmp_path):
    text = TINY + "grpo:\n  dynamic_sampling:\n    max_gen_rounds: 2\n    max_gen_rounds: 3\n"
    (issue,) = issues_of(tmp_path, text)
    assert issue.path == "grpo.dynamic_sampling.max_gen_rounds"


def test_every_problem_of_a_file_comes_at_once_with_the_overrides_own(tmp_path):
    text = TINY + "run: {max_steps: 1:30}\nrun: {seed: 010}\n"
    errors = issues_of(tmp_path, text, ("run.name=a", "run.name=b"))
    assert [e.path for e in errors] == ["run.max_steps", "run", "run.seed", "run.name"]


# --- YAML 1.1 numbers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "read_as"), [("1:30", 90), ("-1:30", -90), ("1:30.5", 90.5), ("010", 8)])
def test_yaml_11_numbers_are_refused_with_what_yaml_would_read(tmp_path, text, read_as):
    (issue,) = issues_of(tmp_path, TINY + f"run:\n  max_steps: {text}\n")
    assert issue.path == "run.max_steps" and issue.value == text
    assert f"number {read_as}" in issue.rule and "line 3" in issue.rule


def test_quoted_and_plain_numbers_are_untouched():
    assert parse_yaml("a: '1:30'\nb: 007\nc: 10\nd: 0x1f\ne: 1e-4\n") == {"a": "1:30", "b": 7, "c": 10, "d": 31,
                                                                           "e": 1e-4}


# --- overrides ---------------------------------------------------------------------------------------------------


def test_overrides_are_read_the_same_way():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"model": {"source": "tiny"}}, ["run.max_steps=1:30", "reward.kwargs={a: 1, a: 2}"])
    assert [e.path for e in info.value.errors] == ["run.max_steps", "reward.kwargs.a"]


def test_parse_yaml_names_the_prefix():
    with pytest.raises(YamlInputError) as info:
        parse_yaml("{k: 1, k: 2}", prefix="reward.kwargs")
    assert [issue.path for issue in info.value.issues] == ["reward.kwargs.k"]


def test_the_cli_exits_2_without_a_traceback(tmp_path, capsys):
    path = write(tmp_path, TINY + "run:\n  max_steps: 5\nrun:\n  max_steps: 1:30\n")
    assert main(["config", "check", str(path), "run.seed=010"]) == 2
    err = capsys.readouterr().err
    assert "3 errors" in err and "Traceback" not in err
