"""JSONL datasets.

Invariants pinned:
- a good file yields one Prompt per non-blank line with the text or chat turns, the answer as a
  string (numbers converted), the given id or the line-number uid "{stem}/{split}/{lineno}", and
  every other field in metadata.
- every kind of bad line fails with DatasetError naming the file and the line number and what is
  wrong; all bad lines are reported in one error (capped at 20 with a count of the rest).
- missing and empty files fail with DatasetError naming the path.
- hostile lines are bad lines like any other, never a crash: nesting deeper than the parser's limit (100,000
  levels: ``RecursionError`` before), a lone surrogate escape (``"\\ud800"``, which no tokenizer can encode) in
  the prompt, a chat turn, the answer, the id or metadata, and an integer of more digits than Python converts.
- JsonlTask loads both splits eagerly and its demonstration is the answer.
"""

from __future__ import annotations

import json
import re

import pytest

from groupwise.data.jsonl_dataset import MAX_REPORTED_ERRORS, DatasetError, JsonlTask, load_jsonl_prompts


def write_lines(path, lines: list[str]):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_good_file_yields_prompts_with_uids_answers_and_metadata(tmp_path):
    path = write_lines(
        tmp_path / "math.jsonl",
        [
            json.dumps({"prompt": "2+3=", "answer": "5"}),
            "",
            json.dumps({"messages": [{"role": "user", "content": "2*3?"}], "answer": 6, "id": "q-7", "level": 2}),
            json.dumps({"prompt": "half of 3", "answer": 1.5, "numbers": [1, 2], "id": 41}),
        ],
    )
    prompts = load_jsonl_prompts(path, "train")
    assert [p.uid for p in prompts] == ["math/train/1", "q-7", "41"]
    assert [p.answer for p in prompts] == ["5", "6", "1.5"]
    assert prompts[0].text == "2+3=" and prompts[0].messages is None
    assert prompts[1].text is None and prompts[1].messages == ({"role": "user", "content": "2*3?"},)
    assert prompts[1].metadata == {"level": 2}
    assert prompts[2].metadata == {"numbers": [1, 2]}
    assert prompts[0].metadata == {}


BAD_LINES = {
    "{not json": r"invalid JSON",
    '["a list"]': r"expected a JSON object, got list",
    '{"answer": "1"}': r"neither is present",
    '{"prompt": "a", "messages": [{"role": "user", "content": "a"}], "answer": "1"}': r"both are present",
    '{"prompt": "a"}': r"missing 'answer'",
    '{"prompt": 3, "answer": "1"}': r"'prompt' must be a string",
    '{"prompt": "a", "answer": null}': r"'answer' must be a string or a finite number",
    '{"prompt": "a", "answer": true}': r"'answer' must be a string or a finite number",
    '{"messages": [], "answer": "1"}': r"non-empty list",
    '{"messages": [{"role": "user"}], "answer": "1"}': r"messages\[0\].*'role' and 'content'",
    '{"messages": [{"role": "user", "content": 5}], "answer": "1"}': r"messages\[0\].*must be strings",
    '{"prompt": "a", "answer": "1", "id": 1.5}': r"'id' must be",
    '{"prompt": "1+1=\\ud800", "answer": "2"}': r"lone surrogate.*\\ud800.*'prompt'",
    '{"messages": [{"role": "user", "content": "\\udfff"}], "answer": "2"}': r"lone surrogate.*'messages'",
    '{"prompt": "a", "answer": "\\ud83d"}': r"lone surrogate.*'answer'",
    '{"prompt": "a", "answer": "1", "id": "x\\udc80"}': r"lone surrogate.*'id'",
    '{"prompt": "a", "answer": "1", "tags": [{"t": "\\ud800"}]}': r"lone surrogate.*'tags'",
    '{"prompt": "a", "answer": ' + "7" * 5000 + "}": r"invalid JSON.*digits",
    "[" * 100_000 + "]" * 100_000: r"nested deeper than 64 levels",
    '{"prompt": "a", "answer": "1", "meta": ' + "[" * 65 + "]" * 65 + "}": r"nested deeper than 64 levels",
}


@pytest.mark.parametrize(("line", "problem"), list(BAD_LINES.items()), ids=lambda v: v[:40])
def test_each_bad_line_kind_is_named_with_file_and_line(tmp_path, line, problem):
    path = write_lines(tmp_path / "data.jsonl", [json.dumps({"prompt": "ok", "answer": "1"}), line])
    with pytest.raises(DatasetError) as info:
        load_jsonl_prompts(path, "train")
    message = str(info.value)
    assert str(path) in message
    assert re.search(r"line 2: .*" + problem, message), message
    assert "line 1" not in message


def test_duplicate_id_names_both_lines(tmp_path):
    path = write_lines(
        tmp_path / "d.jsonl",
        [json.dumps({"prompt": "a", "answer": 1, "id": "x"}), json.dumps({"prompt": "b", "answer": 2, "id": "x"})],
    )
    with pytest.raises(DatasetError, match=r"line 2: duplicate id 'x' \(first used on line 1\)"):
        load_jsonl_prompts(path, "train")


def test_all_bad_lines_are_reported_at_once(tmp_path):
    good = json.dumps({"prompt": "a", "answer": 1})
    lines = [good, "{oops", good, '{"prompt": "a"}', good, '{"answer": 2}']
    path = write_lines(tmp_path / "d.jsonl", lines)
    with pytest.raises(DatasetError) as info:
        load_jsonl_prompts(path, "eval")
    message = str(info.value)
    assert "3 bad line(s)" in message
    assert re.findall(r"line (\d+):", message) == ["2", "4", "6"]


def test_many_bad_lines_are_capped_with_a_count(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", ["{oops"] * (MAX_REPORTED_ERRORS + 7))
    with pytest.raises(DatasetError) as info:
        load_jsonl_prompts(path, "train")
    message = str(info.value)
    assert len(re.findall(r"line \d+:", message)) == MAX_REPORTED_ERRORS
    assert f"{MAX_REPORTED_ERRORS + 7} bad line(s)" in message
    assert "and 7 more bad lines" in message


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.jsonl: no such file"):
        load_jsonl_prompts(tmp_path / "nope.jsonl", "train")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DatasetError, match=r"empty\.jsonl: no prompts"):
        load_jsonl_prompts(empty, "train")


def test_jsonl_task_splits_and_demonstration(tmp_path):
    train = write_lines(tmp_path / "tr.jsonl", [json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) for i in range(3)])
    held_out = write_lines(tmp_path / "ev.jsonl", [json.dumps({"prompt": "9+1=", "answer": 10})])
    task = JsonlTask(train, held_out)
    assert [p.uid for p in task.train_prompts()] == ["tr/train/1", "tr/train/2", "tr/train/3"]
    assert [p.uid for p in task.eval_prompts()] == ["ev/eval/1"]
    assert task.demonstration(task.eval_prompts()[0]) == "10"
    assert task.default_reward == "exact_numeric"
    assert JsonlTask(train).eval_prompts() == []
    with pytest.raises(DatasetError, match="data.jsonl.train_path"):
        JsonlTask(None)
