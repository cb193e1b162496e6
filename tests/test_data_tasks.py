"""Synthetic tasks and the task registry.

Invariants pinned:
- addition enumerates exactly the operand pairs with the requested digit counts; prompt, answer, uid
  and metadata agree with each other; uids are unique.
- train and held-out splits are disjoint (addition by pair, countdown by (sorted numbers, target)),
  identical for the same seed, different for another seed; the held-out split does not depend on
  num_train; num_train / num_eval are honoured as counts.
- every countdown item over all items of a seed is solved by its demonstration (checked by the
  countdown verifier), its numbers lie in 1..max_number and its target in 1..max_target.
- impossible settings (eval split eating the whole space, too few countdown items) fail with a
  message naming the setting.
- build_task builds each task from a config section and rejects unknown settings;
- a plug-in task (``data.task: module:Class``) is built from ``data.kwargs`` with the run seed, and a config whose
  plug-in task does not import, does not take its kwargs, raises or lacks the Task members is refused before any
  model loads, naming the key; ``data.kwargs`` with a built-in task is refused;
- a plug-in task whose ``train_prompts()``/``eval_prompts()`` raise, return dicts, a generator, a prompt with a
  non-string answer or with neither text nor messages, or one uid twice in a split is a config error naming
  ``data.task`` (exit 2 at ``config check`` and ``train``, no traceback, no run directory); eval prompts that ask
  what training prompts ask (a plug-in task's, or a JSONL eval file equal to the train file) are a warning only.
"""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from groupwise.data.addition import MAX_EVAL_FRACTION, AdditionTask, operands_with_digits
from groupwise.data.countdown import CountdownTask
from groupwise.data.registry import build_task
from groupwise.data.rewards import countdown, exact_numeric
from groupwise.types import Completion


def finished(text: str) -> Completion:
    return Completion(token_ids=(), logprobs=(), text=text, finish_reason="stop", weight_version=0)


def pair(prompt) -> tuple[int, int]:
    return prompt.metadata["a"], prompt.metadata["b"]


def countdown_key(prompt) -> tuple[tuple[int, ...], int]:
    return tuple(sorted(prompt.metadata["numbers"])), int(prompt.answer)


# ---------------------------------------------------------------- addition


def test_operand_ranges_count_zero_as_one_digit():
    assert list(operands_with_digits(1, 1)) == list(range(10))
    assert list(operands_with_digits(2, 2)) == list(range(10, 100))
    assert list(operands_with_digits(1, 2)) == list(range(100))


def test_addition_covers_every_pair_once_across_splits():
    task = AdditionTask(min_digits=1, max_digits=1, num_eval=15, seed=3)
    train, held_out = task.train_prompts(), task.eval_prompts()
    assert len(held_out) == 15
    assert len(train) == 85
    all_pairs = [pair(p) for p in train + held_out]
    assert sorted(all_pairs) == [(a, b) for a in range(10) for b in range(10)]
    assert not {pair(p) for p in train} & {pair(p) for p in held_out}


def test_addition_prompt_answer_uid_agree():
    task = AdditionTask(min_digits=2, max_digits=2, num_train=200, num_eval=50, seed=1)
    for split, prompts in (("train", task.train_prompts()), ("eval", task.eval_prompts())):
        for p in prompts:
            a, b = pair(p)
            assert 10 <= a <= 99 and 10 <= b <= 99
            assert p.text == f"{a}+{b}="
            assert p.answer == str(a + b)
            assert p.uid == f"addition/{split}/{a}+{b}"
            assert p.messages is None
            assert task.demonstration(p) == p.answer
            assert exact_numeric(p, finished(task.demonstration(p))) == 1.0
    uids = [p.uid for p in task.train_prompts() + task.eval_prompts()]
    assert len(set(uids)) == len(uids) == 250


def test_addition_is_deterministic_per_seed_and_differs_across_seeds():
    first = AdditionTask(1, 2, num_train=100, num_eval=40, seed=7)
    again = AdditionTask(1, 2, num_train=100, num_eval=40, seed=7)
    other = AdditionTask(1, 2, num_train=100, num_eval=40, seed=8)
    assert first.train_prompts() == again.train_prompts()
    assert first.eval_prompts() == again.eval_prompts()
    assert [p.uid for p in first.eval_prompts()] != [p.uid for p in other.eval_prompts()]
    assert [p.uid for p in first.train_prompts()] != [p.uid for p in other.train_prompts()]


def test_addition_held_out_split_does_not_depend_on_num_train():
    small = AdditionTask(1, 2, num_train=10, num_eval=25, seed=0)
    large = AdditionTask(1, 2, num_train=None, num_eval=25, seed=0)
    assert small.eval_prompts() == large.eval_prompts()
    assert small.train_prompts() == large.train_prompts()[:10]
    assert len(large.train_prompts()) == 100 * 100 - 25


def test_addition_held_out_split_is_capped_to_a_fifth_of_a_tiny_space():
    task = AdditionTask(1, 1, num_eval=100, seed=0)  # 1-digit operands: only 100 pairs
    assert len(task.eval_prompts()) == int(100 * MAX_EVAL_FRACTION) == 20
    assert len(task.train_prompts()) == 80
    assert not {pair(p) for p in task.train_prompts()} & {pair(p) for p in task.eval_prompts()}
    # a request below the cap is honoured exactly
    assert len(AdditionTask(1, 1, num_eval=7).eval_prompts()) == 7
    assert len(AdditionTask(1, 1, num_eval=0).eval_prompts()) == 0


def test_addition_rejects_bad_digit_ranges():
    with pytest.raises(ValueError, match="min_digits=3, max_digits=2"):
        AdditionTask(3, 2)
    with pytest.raises(ValueError, match="max_digits=4.*at most 3"):
        AdditionTask(1, 4)


# ---------------------------------------------------------------- countdown


@pytest.fixture(scope="module")
def countdown_task() -> CountdownTask:
    return CountdownTask(num_numbers=3, max_number=20, max_target=100, num_train=600, num_eval=80, seed=11)


def test_every_countdown_item_is_solved_by_its_demonstration(countdown_task):
    prompts = countdown_task.train_prompts() + countdown_task.eval_prompts()
    assert len(prompts) == 680
    for p in prompts:
        assert countdown(p, finished(countdown_task.demonstration(p))) == 1.0, p
        assert len(p.metadata["numbers"]) == 3
        assert all(1 <= n <= 20 for n in p.metadata["numbers"])
        assert 1 <= p.metadata["target"] <= 100
        assert p.answer == str(p.metadata["target"])


def test_countdown_prompt_is_one_user_message_naming_numbers_and_target(countdown_task):
    p = countdown_task.train_prompts()[0]
    assert p.text is None
    assert len(p.messages) == 1 and p.messages[0]["role"] == "user"
    numbers, target = p.metadata["numbers"], p.answer
    expected_start = f"Using the numbers [{', '.join(map(str, numbers))}], write an expression that equals {target}."
    assert p.messages[0]["content"].startswith(expected_start)
    assert "Answer with the expression only." in p.messages[0]["content"]
    json.dumps(p.metadata)  # metadata must be loggable


def test_countdown_splits_disjoint_and_items_unique(countdown_task):
    train_keys = [countdown_key(p) for p in countdown_task.train_prompts()]
    eval_keys = [countdown_key(p) for p in countdown_task.eval_prompts()]
    assert len(set(train_keys)) == len(train_keys) == 600
    assert len(set(eval_keys)) == len(eval_keys) == 80
    assert not set(train_keys) & set(eval_keys)
    uids = [p.uid for p in countdown_task.train_prompts() + countdown_task.eval_prompts()]
    assert len(set(uids)) == len(uids)


def test_countdown_is_deterministic_per_seed_and_differs_across_seeds():
    a = CountdownTask(num_train=50, num_eval=20, seed=5)
    b = CountdownTask(num_train=50, num_eval=20, seed=5)
    c = CountdownTask(num_train=50, num_eval=20, seed=6)
    assert a.train_prompts() == b.train_prompts() and a.eval_prompts() == b.eval_prompts()
    assert [p.uid for p in a.train_prompts()] != [p.uid for p in c.train_prompts()]
    assert [p.uid for p in a.eval_prompts()] != [p.uid for p in c.eval_prompts()]
    # the held-out split does not depend on how many training items are asked for
    assert CountdownTask(num_train=5, num_eval=20, seed=5).eval_prompts() == a.eval_prompts()


def test_countdown_too_small_space_fails_with_a_fix():
    with pytest.raises(ValueError, match=r"found only \d+ distinct items.*lower num_train"):
        CountdownTask(num_numbers=2, max_number=2, max_target=4, num_train=50, num_eval=0)
    with pytest.raises(ValueError, match="num_numbers=1"):
        CountdownTask(num_numbers=1)


# ---------------------------------------------------------------- registry


def test_build_task_passes_section_and_run_seed(tmp_path):
    addition = build_task("addition", {"min_digits": 1, "max_digits": 1, "num_train": 40, "num_eval": 10}, seed=2)
    assert addition.train_prompts() == AdditionTask(1, 1, num_train=40, num_eval=10, seed=2).train_prompts()
    assert addition.default_reward == "exact_numeric"
    game = build_task("countdown", {"num_train": 30, "num_eval": 5}, seed=4)
    assert game.eval_prompts() == CountdownTask(num_train=30, num_eval=5, seed=4).eval_prompts()
    assert game.default_reward == "countdown"
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "1+1=", "answer": 2}\n')
    jsonl = build_task("jsonl", {"train_path": str(train), "eval_path": None}, seed=0)
    assert [p.answer for p in jsonl.train_prompts()] == ["2"]
    assert jsonl.eval_prompts() == []


def test_build_task_accepts_the_whole_data_section():
    class AdditionSection(BaseModel):
        min_digits: int = 1
        max_digits: int = 2
        num_train: int = 30
        num_eval: int = 10

    class DataSection(BaseModel):
        task: str = "addition"
        addition: AdditionSection = AdditionSection()
        shuffle: bool = True

    from_section = build_task("addition", DataSection(), seed=9)
    from_dict = build_task("addition", {"task": "addition", "addition": AdditionSection().model_dump()}, seed=9)
    expected = AdditionTask(1, 2, num_train=30, num_eval=10, seed=9)
    assert from_section.train_prompts() == from_dict.train_prompts() == expected.train_prompts()
    assert from_section.eval_prompts() == expected.eval_prompts()


def test_build_task_rejects_unknown_task_and_settings():
    with pytest.raises(ValueError, match="unknown task 'sudoku'"):
        build_task("sudoku", {}, seed=0)
    with pytest.raises(ValueError, match=r"unexpected settings \['max_numbers'\].*num_numbers"):
        build_task("countdown", {"max_numbers": 3}, seed=0)
    with pytest.raises(ValueError, match="seed"):
        build_task("addition", {"seed": 3}, seed=0)


# ---------------------------------------------------------------- plug-in tasks


def plugin_config(task: str, **kwargs):
    from groupwise.config import config_from_dict

    return config_from_dict({"model": {"source": "tiny"}, "data": {"task": task, "kwargs": kwargs},
                             "grpo": {"num_prompts_per_step": 2}, "run": {"seed": 7}})  # fmt: skip


def test_a_plugin_task_is_built_from_its_kwargs_and_the_run_seed():
    from plugin_tasks import DoublingTask

    from groupwise.trainer.preflight import check_inputs

    inputs = check_inputs(plugin_config("plugin_tasks:DoublingTask", count=12), training=True)
    expected = DoublingTask(count=12, seed=7)
    assert inputs.task.train_prompts() == expected.train_prompts() and len(inputs.task.train_prompts()) == 8
    assert inputs.task.eval_prompts() == expected.eval_prompts()


@pytest.mark.parametrize(
    "task, kwargs, key, words",
    [
        ("no_such_task_module:Task", {}, "data.task", "cannot import module"),
        ("plugin_tasks:DoublingTask", {"size": 3}, "data.kwargs", "unexpected settings ['size']"),
        ("plugin_tasks:RaisingTask", {}, "data.kwargs", "RuntimeError: the task's data server is down"),
        ("plugin_tasks:NotATask", {}, "data.kwargs", "does not satisfy the Task protocol"),
        ("plugin_tasks:SplitsRaiseTask", {}, "data.task",
         "train_prompts() raised ConnectionError: the prompt server refused the connection"),
        ("plugin_tasks:DictsTask", {}, "data.task",
         "train_prompts() returned 16 unusable item(s) of 16: item 0: a dict, not a groupwise.types.Prompt"),
        ("plugin_tasks:GeneratorTask", {}, "data.task", "train_prompts() returned a generator; it must return a list"),
        ("plugin_tasks:IntAnswerTask", {}, "data.task", "answer is int, not str"),
        ("plugin_tasks:NoTextTask", {}, "data.task",
         "eval_prompts() returned 4 unusable item(s) of 4: item 0: prompt 'doubling/"),
        ("plugin_tasks:DuplicateUidTask", {}, "data.task", "1 uid(s) appear more than once in the train split: 'same'"),
    ],
)
def test_a_plugin_task_that_cannot_be_built_is_a_config_error(task, kwargs, key, words):
    from groupwise.config import ConfigError
    from groupwise.trainer.preflight import check_inputs

    with pytest.raises(ConfigError) as info:
        check_inputs(plugin_config(task, **kwargs), training=True)
    (issue,) = [i for i in info.value.errors if i.path == key]
    assert words in issue.rule


def test_kwargs_with_a_builtin_task_are_refused():
    from groupwise.config import ConfigError

    with pytest.raises(ConfigError, match="data.kwargs"):
        plugin_config("addition", count=3)


def test_a_plugin_task_with_unusable_splits_exits_2_at_check_and_train(tmp_path, capsys):
    from groupwise.cli.main import main

    config = tmp_path / "config.yaml"
    config.write_text(f"model: {{source: tiny}}\ndata: {{task: 'plugin_tasks:GeneratorTask'}}\n"
                      f"run: {{output_dir: {tmp_path / 'runs'}}}\ngrpo: {{num_prompts_per_step: 2}}\n")
    for command in ("config", "train"):
        args = ["config", "check", str(config)] if command == "config" else ["train", str(config)]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "data.task" in err and "returned a generator" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_an_eval_split_overlapping_training_is_a_warning_not_an_error(tmp_path, capsys):
    from groupwise.cli.main import main
    from groupwise.trainer.preflight import check_inputs

    inputs = check_inputs(plugin_config("plugin_tasks:EvalIsTrainTask"), training=True)
    (warning,) = inputs.warnings
    assert warning.path == "data.task"
    assert "4 of 4 eval prompts ask what a training prompt asks" in warning.rule
    assert check_inputs(plugin_config("plugin_tasks:DoublingTask"), training=True).warnings == []
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {{source: tiny}}\ndata: {{task: 'plugin_tasks:EvalIsTrainTask'}}\n"
                      f"run: {{output_dir: {tmp_path / 'runs'}}}\ngrpo: {{num_prompts_per_step: 2}}\n")
    assert main(["config", "check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "warning: data.task" in err and "(1 warning(s) above)" in out


def test_a_jsonl_eval_file_equal_to_the_train_file_is_warned(tmp_path):
    from groupwise.config import config_from_dict
    from groupwise.trainer.preflight import check_inputs

    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(6)))
    cfg = config_from_dict({"model": {"source": "tiny"}, "grpo": {"num_prompts_per_step": 2},
                            "data": {"task": "jsonl", "jsonl": {"train_path": str(path), "eval_path": str(path)}}})
    (warning,) = check_inputs(cfg, training=False).warnings
    assert warning.path == "data.jsonl.eval_path" and warning.value == str(path)
    assert "6 of 6 eval prompts" in warning.rule
