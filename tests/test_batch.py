"""RowBatch and the JSONL writer keep rows aligned (invariants 1 and 2 in docs/design.md).

Pins: every column always has num_rows rows (construction and writes of another length raise, naming the
column and both lengths); a column read from a batch cannot change it (sequences are tuples, tensors are read
as copies and copied when written); select/slice/concat apply one row index to every column;
slicing out of range raises instead of truncating; concat needs identical column sets and right-pads 2-D
tensors with per-column pad values; select_groups keeps whole groups in the requested order; partial
groups are detected; from_groups, build_rows and train_data name each shared concept the same (raw_reward);
the JSONL writer refuses misaligned columns and writes one object per row.
"""

import json

import pytest
import torch

from groupwise.batch import RowBatch
from groupwise.run.jsonl import write_rows_jsonl
from groupwise.types import Completion, Group, Prompt


def marked_batch() -> RowBatch:
    """3 groups of G=2; reward = prompt×10 + gen identifies each row."""
    return RowBatch(
        {
            "group_id": [0, 0, 1, 1, 2, 2],
            "reward": torch.tensor([0.0, 1.0, 10.0, 11.0, 20.0, 21.0]),
            "tokens": torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]),
            "text": ["p0g0", "p0g1", "p1g0", "p1g1", "p2g0", "p2g1"],
        }
    )


def test_construction_rejects_columns_of_different_lengths_naming_them():
    with pytest.raises(ValueError, match=r"'reward' has 5"):
        RowBatch({"group_id": [0, 0, 1, 1, 2, 2], "reward": torch.zeros(5)})


def test_group_id_column_is_required():
    with pytest.raises(ValueError, match="group_id"):
        RowBatch({"reward": [1.0]})


def test_misaligned_write_raises_naming_column_and_both_lengths():
    batch = marked_batch()
    with pytest.raises(ValueError, match=r"'unfiltered_reward' with 8 rows into a RowBatch of 6 rows"):
        batch["unfiltered_reward"] = [0.0] * 8
    assert "unfiltered_reward" not in batch


def test_copy_of_a_same_rows_column_is_allowed_and_stays_aligned_through_filtering():
    batch = marked_batch()
    batch["filtered_reward"] = batch["reward"]
    kept = batch.select_groups([0, 2])
    assert kept["filtered_reward"].tolist() == kept["reward"].tolist() == [0.0, 1.0, 20.0, 21.0]


def test_columns_view_is_read_only():
    with pytest.raises(TypeError):
        marked_batch().columns["reward"] = [0.0]  # type: ignore[index]


def test_select_applies_one_index_to_every_column():
    picked = marked_batch().select([4, 1])
    assert picked["text"] == ("p2g0", "p0g1")
    assert picked["reward"].tolist() == [20.0, 1.0]
    assert picked["tokens"].tolist() == [[9, 10], [3, 4]]
    assert picked["group_id"] == (2, 0)


def test_select_rejects_out_of_range_and_negative_indices():
    with pytest.raises(IndexError, match="outside 0..5"):
        marked_batch().select([6])
    with pytest.raises(IndexError):
        marked_batch().select([-1])


def test_select_refuses_a_boolean_mask():
    with pytest.raises(TypeError, match="boolean mask"):
        marked_batch().select(torch.tensor([True, False, True, False, True, False]))


def test_a_column_read_from_a_batch_cannot_change_it():
    """The misalignment repro: an in-place edit of a column read from the batch used to skip the row-count check
    and survive into select (rewards of rows that do not exist)."""
    batch = RowBatch({"group_id": [0, 0, 2, 2], "reward": [10.0, 11.0, 30.0, 31.0]})
    with pytest.raises(TypeError):
        batch["reward"][:] = [10.0, 11.0, 20.0, 21.0, 30.0, 31.0]
    with pytest.raises(TypeError):
        batch.columns["reward"][0] = 0.0
    assert batch.select([0, 1, 2, 3])["reward"] == (10.0, 11.0, 30.0, 31.0)
    assert batch.num_rows == 4


def test_tensor_columns_are_copies_on_write_and_on_read():
    given = torch.tensor([1.0, 2.0, 3.0, 4.0])
    batch = RowBatch({"group_id": [0, 0, 1, 1], "t": given})
    given[0] = 99.0  # the caller's tensor is not the batch's
    read = batch["t"]
    read[1] = 99.0  # nor is what a read returns
    read.resize_(8)
    batch.columns["t"][2] = 99.0
    for derived in (batch, batch.select([0, 1, 2, 3]), batch.slice(0, 4), RowBatch.concat([batch])):
        assert derived["t"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_slice_keeps_rows_in_order():
    sliced = marked_batch().slice(2, 5)
    assert sliced["text"] == ("p1g0", "p1g1", "p2g0")
    assert sliced["reward"].tolist() == [10.0, 11.0, 20.0]


@pytest.mark.parametrize("start, stop", [(0, 7), (-1, 3), (4, 2)])
def test_slice_out_of_range_raises_instead_of_truncating(start, stop):
    with pytest.raises(IndexError, match="out of range"):
        marked_batch().slice(start, stop)


def test_iter_slices_covers_every_row_once_with_remainder_last():
    pieces = list(marked_batch().iter_slices(4))
    assert [len(p) for p in pieces] == [4, 2]
    assert tuple(t for p in pieces for t in p["text"]) == marked_batch()["text"]


def test_iter_slices_rejects_non_positive_size():
    with pytest.raises(ValueError, match="rows_per_slice"):
        list(marked_batch().iter_slices(0))


def test_concat_keeps_rows_aligned_and_pads_2d_tensors_per_column():
    a = RowBatch({"group_id": [0], "ids": torch.tensor([[5, 6, 7]]), "mask": torch.tensor([[1, 1, 1]])})
    b = RowBatch({"group_id": [1], "ids": torch.tensor([[8]]), "mask": torch.tensor([[1]])})
    merged = RowBatch.concat([a, b], pad_values={"ids": -100})
    assert merged["group_id"] == (0, 1)
    assert merged["ids"].tolist() == [[5, 6, 7], [8, -100, -100]]
    assert merged["mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_concat_rejects_different_column_sets_naming_them():
    a = RowBatch({"group_id": [0], "reward": [1.0]})
    b = RowBatch({"group_id": [1], "advantage": [0.5]})
    with pytest.raises(ValueError, match=r"missing \['reward'\], extra \['advantage'\]"):
        RowBatch.concat([a, b])


def test_concat_rejects_list_mixed_with_tensor():
    a = RowBatch({"group_id": [0], "reward": [1.0]})
    b = RowBatch({"group_id": [1], "reward": torch.tensor([1.0])})
    with pytest.raises(TypeError, match="reward"):
        RowBatch.concat([a, b])


def test_select_groups_keeps_whole_groups_in_requested_order():
    picked = marked_batch().select_groups([2, 0])
    assert picked["text"] == ("p2g0", "p2g1", "p0g0", "p0g1")
    picked.assert_whole_groups(2)


def test_select_groups_rejects_unknown_ids():
    with pytest.raises(KeyError, match=r"\[7\]"):
        marked_batch().select_groups([0, 7])


def test_group_ids_are_unique_in_row_order():
    batch = RowBatch({"group_id": torch.tensor([5, 5, 3, 3, 9, 9])})
    assert batch.group_ids() == [5, 3, 9]


def test_assert_whole_groups_detects_a_partial_group():
    partial = marked_batch().select([0, 1, 2])
    with pytest.raises(ValueError, match="group 1 has 1 of 2 rows"):
        partial.assert_whole_groups(2)
    with pytest.raises(ValueError, match="group 1 has 1 of 3 rows"):
        partial.assert_whole_groups({0: 2, 1: 3})


def _group(group_id: int, raw: list[float], shaped: list[float]) -> Group:
    completions = [Completion((1,) * (i + 1), (-0.5,) * (i + 1), f"c{i}", "stop", 3) for i in range(len(raw))]
    prompt = Prompt(uid=f"t/train/{group_id}", answer="x", text="q")
    return Group(group_id, prompt, (1, 2), completions, raw, shaped, start_version=2, end_version=3)


def test_from_groups_builds_one_row_per_completion_in_group_order():
    batch = RowBatch.from_groups([_group(7, [1.0, 0.0], [0.9, 0.0]), _group(3, [0.5, 0.25], [0.5, 0.2])])
    assert batch["group_id"] == (7, 7, 3, 3)
    assert batch["raw_reward"] == (1.0, 0.0, 0.5, 0.25)
    assert batch["reward"] == (0.9, 0.0, 0.5, 0.2)
    assert batch["num_tokens"] == (1, 2, 1, 2)
    assert batch["completion_index"] == (0, 1, 0, 1)
    assert batch["prompt_uid"] == ("t/train/7", "t/train/7", "t/train/3", "t/train/3")


def test_from_groups_build_rows_and_train_data_use_one_name_per_concept():
    from groupwise.rows import build_rows
    from groupwise.trainer.session import TRAIN_DATA_COLUMNS

    groups = [_group(7, [1.0, 0.0], [0.9, 0.0])]
    summary, rows = RowBatch.from_groups(groups), build_rows(groups, [[0.5, -0.5]])
    shared = {"group_id", "prompt_uid", "completion_index", "raw_reward", "reward", "finish_reason", "start_version"}
    assert shared <= set(summary.columns) and shared <= set(rows.columns) and shared <= set(TRAIN_DATA_COLUMNS)
    for name in shared:
        assert summary[name] == rows[name], name
    assert rows["raw_reward"] == (1.0, 0.0) and rows["reward"] == (0.9, 0.0)


def test_jsonl_writes_one_object_per_row(tmp_path):
    batch = marked_batch()
    path = tmp_path / "train_data" / "step_1.jsonl"
    assert write_rows_jsonl(path, batch.columns) == 6
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert tuple(r["text"] for r in rows) == batch["text"]
    assert [r["reward"] for r in rows] == batch["reward"].tolist()
    assert rows[3]["tokens"] == [7, 8]


def test_jsonl_refuses_misaligned_columns_naming_lengths(tmp_path):
    with pytest.raises(ValueError, match=r"'content': 4, 'rewards': 6"):
        write_rows_jsonl(tmp_path / "x.jsonl", {"content": ["a"] * 4, "rewards": torch.zeros(6)})
    assert not (tmp_path / "x.jsonl").exists()


def test_jsonl_writes_non_finite_floats_as_null(tmp_path):
    path = tmp_path / "x.jsonl"
    write_rows_jsonl(path, {"v": [float("nan"), 1.5]})
    assert [json.loads(line)["v"] for line in path.read_text().splitlines()] == [None, 1.5]
