"""The char tokenizer: one character is one token, specials have fixed ids, BOS is prepended,
padding is on the left, decode is lossless for in-vocabulary text, and the tokenizer survives
``save_pretrained`` + plain ``AutoTokenizer.from_pretrained`` unchanged (offline)."""

from __future__ import annotations

import string

import pytest
from transformers import AutoTokenizer

from groupwise.model import build_char_tokenizer, char_vocabulary


@pytest.mark.parametrize("vocab", ["task", "full"])
def test_one_token_per_character_after_bos(vocab: str) -> None:
    tokenizer = build_char_tokenizer(vocab)
    text = "12+(3*4)= 7"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert len(ids) == len(text) + 1
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == list(text)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(ids) == "<bos>" + text


def test_special_ids_are_fixed_and_vocabularies_hold_what_the_brief_lists() -> None:
    task, full = char_vocabulary("task"), char_vocabulary("full")
    assert task[:4] == full[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert set(task[4:]) == set(string.digits + "+-*/=() ")
    assert set(string.digits + string.ascii_letters + " +-*/=()[],.:?\n") <= set(full[4:])
    assert len(full) == len(set(full))
    tokenizer = build_char_tokenizer("full")
    ids = (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id)
    assert ids == (0, 1, 2, 3)
    assert len(tokenizer) == len(full)


def test_out_of_vocabulary_characters_become_unk_and_specials_match_whole() -> None:
    tokenizer = build_char_tokenizer("task")
    ids = tokenizer("1a<eos>", add_special_tokens=False)["input_ids"]
    assert ids == [tokenizer.convert_tokens_to_ids("1"), tokenizer.unk_token_id, tokenizer.eos_token_id]


def test_batches_are_left_padded() -> None:
    tokenizer = build_char_tokenizer("task")
    batch = tokenizer(["1+1=", "12+13="], padding=True)
    assert batch["input_ids"][0][:2] == [tokenizer.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1, 1, 1]
    assert batch["attention_mask"][1] == [1] * 7


def test_save_and_plain_autotokenizer_round_trip(tmp_path) -> None:
    tokenizer = build_char_tokenizer("full")
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "What is 3+4?\nAnswer: 7."
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded.padding_side == "left"
    assert reloaded.decode(reloaded(text)["input_ids"], skip_special_tokens=True) == text
    assert (reloaded.pad_token, reloaded.bos_token, reloaded.eos_token) == ("<pad>", "<bos>", "<eos>")


def test_unknown_vocabulary_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown char vocabulary 'digits'"):
        build_char_tokenizer("digits")  # type: ignore[arg-type]
