"""The ``dataset`` task: local files read through Hugging Face ``datasets``, mapped by column.

Invariants pinned (on tiny files each test writes in ``tmp_path``):
- each format is read into the same prompts: parquet, an arrow file (IPC file and stream formats), JSON Lines, a
  JSON array, CSV (an integer answer stored as its string form), a ``Dataset.save_to_disk`` folder, and a split of a
  ``DatasetDict.save_to_disk`` folder; several files of one split are read in order;
- uids: the id column's value when ``columns.id`` is mapped (a dotted name reaches into a struct), else
  ``{file stem}/{row}`` (a saved folder: ``{folder}/{split}/{row}``), 0-based; the same in every build;
- the column mapping: other column names, ``metadata: []`` / a list / null (every unmapped column), chat turns from
  ``columns.messages``; the verl preset on a verl-shaped parquet file (``prompt`` as chat turns,
  ``reward_model.ground_truth`` as the answer, ``data_source`` and ``extra_info`` as metadata, other columns
  dropped), a key set in ``columns`` overriding the preset's;
- held-out splits: by file (``eval_path``), by name (``eval_split`` of a DatasetDict), by fraction: ``round(f ×
  rows)`` rows drawn with the seed, the same rows for the same seed, other rows for another, never a row in both,
  file order kept, uids unchanged;
- every bad input raises one DatasetFilesError naming the config key, the file and, where it applies, the column and
  the rows: a missing file (with the directory it was resolved against), a file that is not its format, an unknown
  suffix, an empty file, a folder not written by save_to_disk, a split a file or DatasetDict does not have, a
  missing column or struct field, values of the wrong type (null, a list answer, chat turns mapped as text, text
  mapped as chat, turns with extra fields, an empty prompt, a bool id, duplicate ids, a datetime or NaN in
  metadata), one row to hold out from; a bad column's rows group into one line; every file's problems at once;
- without the ``datasets`` package the task names ``data.task`` and the install command.
"""

from __future__ import annotations

import datetime
import json
import sys

import datasets
import pyarrow as pa
import pytest

from groupwise.data.dataset_task import MAX_ROWS_LISTED, DatasetFilesError, DatasetTask
from groupwise.data.registry import build_task

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1), "level": i % 2} for i in range(6)]


def table(rows=ROWS) -> datasets.Dataset:
    return datasets.Dataset.from_list(rows)


def verl_rows(n: int = 4) -> list[dict]:
    """Rows shaped as verl's data_preprocess scripts write them."""
    return [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"What is {i}+1? Put the answer after ####."}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"split": "train", "index": i, "answer": f"{i}+1 = {i + 1} #### {i + 1}"}}
            for i in range(n)]  # fmt: skip


def problems_of(**settings) -> list[tuple[str, str]]:
    with pytest.raises(DatasetFilesError) as caught:
        DatasetTask(**settings)
    return [(problem.key, problem.rule) for problem in caught.value.problems]


def only_problem(**settings) -> str:
    problems = problems_of(**settings)
    assert len(problems) == 1, problems
    return problems[0][1]


def summary(task: DatasetTask, split: str = "train") -> list[tuple]:
    prompts = task.train_prompts() if split == "train" else task.eval_prompts()
    return [(p.uid, p.text, p.answer, p.metadata) for p in prompts]


EXPECTED = [(f"data/{i}", f"{i}+1=", str(i + 1), {"level": i % 2}) for i in range(6)]


def write_arrow(path, rows, stream: bool):
    data = pa.Table.from_pylist(rows)
    writer = pa.ipc.new_stream if stream else pa.ipc.new_file
    with writer(str(path), data.schema) as sink:
        sink.write_table(data)


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "json_array", "csv", "arrow_file", "arrow_stream"])
def test_each_file_format_reads_the_same_prompts(tmp_path, kind):
    suffix = {"jsonl": "jsonl", "json_array": "json", "arrow_file": "arrow", "arrow_stream": "arrow"}.get(kind, kind)
    path = tmp_path / f"data.{suffix}"
    if kind == "parquet":
        table().to_parquet(str(path))
    elif kind == "jsonl":
        table().to_json(str(path))
    elif kind == "json_array":
        path.write_text(json.dumps(ROWS), encoding="utf-8")
    elif kind == "csv":
        table([{**row, "answer": int(row["answer"])} for row in ROWS]).to_csv(str(path), index=False)
    else:
        write_arrow(path, ROWS, stream=kind == "arrow_stream")
    assert summary(DatasetTask(str(path))) == EXPECTED


def test_a_saved_dataset_and_a_saved_dataset_dict_split(tmp_path):
    table().save_to_disk(str(tmp_path / "flat"))
    datasets.DatasetDict({"train": table(ROWS[:4]), "test": table(ROWS[4:])}).save_to_disk(str(tmp_path / "dd"))
    assert summary(DatasetTask(str(tmp_path / "flat"))) == [(f"flat/{i}", *rest) for i, (_, *rest) in
                                                             enumerate(EXPECTED)]  # fmt: skip
    task = DatasetTask(str(tmp_path / "dd"), eval_split="test")  # by name: the train split is "train"
    assert [p.uid for p in task.train_prompts()] == ["dd/train/0", "dd/train/1", "dd/train/2", "dd/train/3"]
    assert [(p.uid, p.answer) for p in task.eval_prompts()] == [("dd/test/0", "5"), ("dd/test/1", "6")]
    swapped = DatasetTask(str(tmp_path / "dd"), train_split="test")
    assert [p.uid for p in swapped.train_prompts()] == ["dd/test/0", "dd/test/1"] and swapped.eval_prompts() == []


def test_shards_are_read_in_order_and_the_eval_file_is_its_own_split(tmp_path):
    table(ROWS[:3]).to_parquet(str(tmp_path / "part-0.parquet"))
    table(ROWS[3:5]).to_parquet(str(tmp_path / "part-1.parquet"))
    table(ROWS[5:]).to_json(str(tmp_path / "held.jsonl"))
    task = DatasetTask([str(tmp_path / "part-0.parquet"), str(tmp_path / "part-1.parquet")],
                       eval_path=str(tmp_path / "held.jsonl"))  # fmt: skip
    assert [p.uid for p in task.train_prompts()] == ["part-0/0", "part-0/1", "part-0/2", "part-1/0", "part-1/1"]
    assert [(p.uid, p.text) for p in task.eval_prompts()] == [("held/0", "5+1=")]


def test_the_column_mapping_names_other_columns_and_metadata(tmp_path):
    rows = [{"question": f"{i}*2=", "solution": i * 2, "qid": f"q-{i}", "topic": "mul", "hard": i > 1}
            for i in range(3)]  # fmt: skip
    path = tmp_path / "mul.parquet"
    table(rows).to_parquet(str(path))
    task = DatasetTask(str(path), columns={"prompt": "question", "answer": "solution", "id": "qid"})
    assert summary(task) == [(f"q-{i}", f"{i}*2=", str(i * 2), {"topic": "mul", "hard": i > 1}) for i in range(3)]
    kept = DatasetTask(str(path), columns={"prompt": "question", "answer": "solution", "metadata": ["hard"]})
    assert [p.metadata for p in kept.train_prompts()] == [{"hard": False}, {"hard": False}, {"hard": True}]
    bare = DatasetTask(str(path), columns={"prompt": "question", "answer": "solution", "metadata": []})
    assert [(p.uid, p.metadata) for p in bare.train_prompts()] == [("mul/0", {}), ("mul/1", {}), ("mul/2", {})]


def test_chat_turns_from_a_messages_column(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{i}+{i}?"}],
             "answer": 2 * i} for i in range(2)]  # fmt: skip
    table(rows).to_parquet(str(tmp_path / "chat.parquet"))
    task = DatasetTask(str(tmp_path / "chat.parquet"), columns={"messages": "messages"})
    prompt = task.train_prompts()[1]
    assert prompt.text is None and prompt.answer == "2"
    assert prompt.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"})


def test_the_verl_preset_reads_a_verl_parquet_file(tmp_path):
    path = tmp_path / "gsm8k_train.parquet"
    table(verl_rows()).to_parquet(str(path))
    task = build_task("dataset", {"train_path": str(path), "preset": "verl"}, seed=0)
    first = task.train_prompts()[0]
    assert first.uid == "gsm8k_train/0" and first.answer == "1" and first.text is None
    assert first.messages == ({"role": "user", "content": "What is 0+1? Put the answer after ####."},)
    assert first.metadata == {"data_source": "openai/gsm8k",
                              "extra_info": {"split": "train", "index": 0, "answer": "0+1 = 1 #### 1"}}
    by_index = DatasetTask(str(path), preset="verl", columns={"id": "extra_info.index", "metadata": ["ability"]})
    assert [(p.uid, p.metadata) for p in by_index.train_prompts()] == [(str(i), {"ability": "math"}) for i in range(4)]


def test_held_out_by_fraction_is_seeded_disjoint_and_keeps_uids_and_order(tmp_path):
    rows = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(40)]
    table(rows).to_parquet(str(tmp_path / "sums.parquet"))

    def split(seed: int) -> tuple[list[str], list[str]]:
        task = DatasetTask(str(tmp_path / "sums.parquet"), eval_fraction=0.25, seed=seed)
        return [p.uid for p in task.train_prompts()], [p.uid for p in task.eval_prompts()]

    train, held = split(7)
    assert len(held) == 10 and len(train) == 30
    assert set(train).isdisjoint(held) and sorted(train + held) == sorted(f"sums/{i}" for i in range(40))
    assert train == sorted(train, key=lambda uid: int(uid.split("/")[1]))  # file order within each split
    assert held == sorted(held, key=lambda uid: int(uid.split("/")[1]))
    assert split(7) == (train, held)
    assert split(8)[1] != held


def test_a_tiny_fraction_holds_out_one_row_and_leaves_one(tmp_path):
    table(ROWS[:2]).to_parquet(str(tmp_path / "two.parquet"))
    task = DatasetTask(str(tmp_path / "two.parquet"), eval_fraction=0.01)
    assert len(task.train_prompts()) == 1 and len(task.eval_prompts()) == 1
    table(ROWS[:1]).to_parquet(str(tmp_path / "one.parquet"))
    key, rule = problems_of(train_path=str(tmp_path / "one.parquet"), eval_fraction=0.5)[0]
    assert key == "data.dataset.eval_fraction" and "holds 1 row(s)" in rule


# --- bad inputs -------------------------------------------------------------------------------------------------


def test_bad_files_are_named_with_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake.parquet").write_text("not parquet", encoding="utf-8")
    (tmp_path / "empty.csv").write_bytes(b"")
    (tmp_path / "data.txt").write_text("prompt,answer\n", encoding="utf-8")
    (tmp_path / "folder").mkdir()
    table().to_parquet(str(tmp_path / "real.parquet"))
    cases = {
        "data/missing.parquet": f"working directory, here {tmp_path}, giving {tmp_path / 'data/missing.parquet'}",
        "fake.parquet": "fake.parquet: cannot be read as parquet (ArrowInvalid: Parquet magic bytes not found",
        "empty.csv": "empty.csv: the file is empty",
        "data.txt": "cannot tell the format from the suffix '.txt'",
        "folder": "folder: a folder, but not one written by save_to_disk",
    }
    problems = problems_of(train_path=list(cases))
    assert [key for key, _ in problems] == ["data.dataset.train_path"] * len(cases)
    for (_, rule), expected in zip(problems, cases.values(), strict=True):
        assert expected in rule
    assert "cannot be read as json" in only_problem(train_path=str(tmp_path / "real.parquet"), format="json")


def test_splits_a_table_does_not_have_are_named(tmp_path):
    table().to_parquet(str(tmp_path / "flat.parquet"))
    datasets.DatasetDict({"train": table(), "validation": table()}).save_to_disk(str(tmp_path / "dd"))
    assert "a file has no splits, so data.dataset.train_split ('dev')" in only_problem(
        train_path=str(tmp_path / "flat.parquet"), train_split="dev")
    rule = only_problem(train_path=str(tmp_path / "dd"), eval_split="test")
    assert "without a split 'test' (data.dataset.eval_split); its splits: ['train', 'validation']" in rule
    problems = problems_of(train_path=str(tmp_path / "flat.parquet"), eval_path=str(tmp_path / "dd"))
    assert problems == [("data.dataset.eval_path", f"{tmp_path / 'dd'}: a saved DatasetDict with the splits "
                         "['train', 'validation']; set data.dataset.eval_split to one")]  # fmt: skip


def test_missing_columns_and_struct_fields_are_named_with_the_columns_there(tmp_path):
    table().to_parquet(str(tmp_path / "plain.parquet"))
    rule = only_problem(train_path=str(tmp_path / "plain.parquet"), columns={"answer": "solution"})
    assert rule == (f"{tmp_path / 'plain.parquet'}: no column 'solution' (columns.answer); its columns: "
                    "['prompt', 'answer', 'level']")
    rows = [{**row, "reward_model": {"style": "rule", "truth": "1"}} for row in verl_rows(2)]
    table(rows).to_parquet(str(tmp_path / "verl.parquet"))
    rule = only_problem(train_path=str(tmp_path / "verl.parquet"), preset="verl")
    assert ("column 'reward_model.ground_truth' (columns.answer), rows 0, 1: struct column 'reward_model' has no "
            "field 'ground_truth' (its fields: ['style', 'truth'])") in rule


BAD_VALUES = [  # (the value both rows get, the column mapping, what the problem says)
    ({"prompt": None}, {}, "column 'prompt' (columns.prompt), rows 0, 1: must be a string, got null"),
    ({"prompt": "   "}, {}, "column 'prompt' (columns.prompt), rows 0, 1: is empty"),
    ({"prompt": [{"role": "user", "content": "hi"}]}, {},
     "rows 0, 1: holds chat turns, not a string: map it as columns.messages (preset verl does)"),
    ({"answer": None}, {}, "column 'answer' (columns.answer), rows 0, 1: must be a string or a finite number, "
                          "got null"),
    ({"answer": float("nan")}, {}, "rows 0, 1: must be a string or a finite number, got a non-finite float"),
    ({"answer": [2]}, {}, "rows 0, 1: must be a string or a finite number, got list"),
    ({"qid": True}, {"id": "qid"}, "column 'qid' (columns.id), rows 0, 1: must be a non-empty string or an integer, "
                                   "got bool"),
    ({"level": float("nan")}, {}, "column 'level' (columns.metadata), rows 0, 1: holds a NaN or infinite float, which "
                                  "metadata cannot keep"),
    ({"level": datetime.datetime(2024, 1, 1)}, {}, "rows 0, 1: holds a datetime, which metadata cannot keep"),
]


@pytest.mark.parametrize(("change", "columns", "expected"), BAD_VALUES, ids=[str(b[0])[:30] for b in BAD_VALUES])
def test_each_mistyped_value_is_named_with_its_column_and_rows(tmp_path, change, columns, expected):
    rows = [{"prompt": "1+1=", "answer": "2", "qid": "a", "level": 1.0, **change} for _ in range(2)]
    path = tmp_path / "rows.parquet"
    table(rows).to_parquet(str(path))
    rule = only_problem(train_path=str(path), columns=columns)
    assert rule.startswith(f"{path}: 2 bad row(s) of 2 (rows counted from 0):")
    assert expected in rule, rule


def test_chat_turns_that_cannot_be_a_prompt_are_named(tmp_path):
    rows = [
        {"m": [{"role": "user", "content": "ok"}], "answer": "1"},
        {"m": [{"role": "user", "content": "  "}], "answer": "1"},
        {"m": [], "answer": "1"},
        {"m": [{"role": "user", "content": "hi", "name": "bob"}], "answer": "1"},
        {"m": "What is 1+1?", "answer": "2"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    rule = only_problem(train_path=str(path), columns={"messages": "m"})
    assert "4 bad row(s) of 5 (rows counted from 0)" in rule
    assert "column 'm' (columns.messages), row 1: every turn has empty content" in rule
    assert "row 2: must be a non-empty list of {role, content} turns, got an empty list" in rule
    assert "row 3: turn 0 has fields besides role and content that are not null: ['name']" in rule
    assert "row 4: holds a string, not chat turns: map it as columns.prompt" in rule


def test_duplicate_ids_name_both_rows(tmp_path):
    rows = [{"prompt": "a", "answer": "1", "id": "q"}, {"prompt": "b", "answer": "2", "id": "r"},
            {"prompt": "c", "answer": "3", "id": "q"}]  # fmt: skip
    table(rows).to_parquet(str(tmp_path / "ids.parquet"))
    rule = only_problem(train_path=str(tmp_path / "ids.parquet"), columns={"id": "id"})
    assert f"row 2: uid 'q' again (first: row 0 of {tmp_path / 'ids.parquet'}); uids must be unique" in rule


def test_a_bad_column_is_one_line_with_its_rows_and_a_count(tmp_path):
    rows = [{"prompt": f"{i}=", "answer": [i]} for i in range(1000)]
    table(rows).to_parquet(str(tmp_path / "lists.parquet"))
    rule = only_problem(train_path=str(tmp_path / "lists.parquet"))
    assert rule.splitlines() == [
        f"{tmp_path / 'lists.parquet'}: 1000 bad row(s) of 1000 (rows counted from 0):",
        f"  column 'answer' (columns.answer), rows 0, 1, 2, 3, 4 and {1000 - MAX_ROWS_LISTED} more: must be a string "
        "or a finite number, got list",
    ]


def test_every_file_and_split_is_reported_at_once(tmp_path):
    table().to_parquet(str(tmp_path / "good.parquet"))
    table([{"prompt": "x", "answer": None}]).to_json(str(tmp_path / "bad.jsonl"))
    problems = problems_of(train_path=[str(tmp_path / "good.parquet"), str(tmp_path / "gone.csv")],
                           eval_path=str(tmp_path / "bad.jsonl"))  # fmt: skip
    assert [key for key, _ in problems] == ["data.dataset.train_path", "data.dataset.eval_path"]
    assert "gone.csv: no such file" in problems[0][1]
    assert "column 'answer' (columns.answer), row 0: must be a string or a finite number, got null" in problems[1][1]


def test_without_the_datasets_package_the_task_says_how_to_install_it(tmp_path, monkeypatch):
    table().to_parquet(str(tmp_path / "data.parquet"))
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now raises ImportError
    with pytest.raises(DatasetFilesError) as caught:
        DatasetTask(str(tmp_path / "data.parquet"))
    (problem,) = caught.value.problems
    assert (problem.key, problem.fix) == ("data.task", "pip install 'groupwise[datasets]'")
    assert "not installed" in problem.rule
