"""The dequantised copy of a GGUF file is made once, cached, and reads back as the same policy.

Invariants pinned:
- a policy read from the cache has bit-identical weights (float32 and bfloat16: one entry per dtype), config,
  generation config and logits to one dequantised from the file, and a tokenizer that encodes, decodes and
  renders chat exactly the same, with the same special tokens and EOS ids; the first load says it dequantised
  and cached, the second that it read the cache (and dequantises nothing: the GGUF reader is never called);
- an entry is keyed by the file's content: rewriting the file makes a new entry, never a stale read; touching it,
  or the same file at another path (installed in a second environment), reads the same entry;
- an entry appears whole or not at all: a store that fails leaves no entry and no staging directory, and the run
  goes on dequantised; an entry that cannot be read is removed and made again;
- the cache root: ``model.gguf_cache`` (a directory, ``off``, or ``auto`` = ``$GROUPWISE_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/groupwise``, else ``~/.cache/groupwise``); YAML's bare ``off`` means off; the key is refused
  for a model that is not GGUF;
- (slow) the shipped SmolLM2 file: the cached copy is the same policy, and the second load is faster.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from test_model_loading import _write_tiny_gguf

from groupwise.config import ConfigError, config_from_dict
from groupwise.model import build_char_tokenizer, build_tiny_model, eos_token_ids, gguf_loading, load_policy
from groupwise.model.gguf_files import SOURCE_FILE, cache_entry, cache_root, default_cache_root, smollm2_gguf_path

pytestmark = pytest.mark.numerics

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
TEXTS = ["12+3=", "7 - 5 = 2", "=+ 40\n1"]
CHAT = [{"role": "user", "content": "1+2="}]


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    tokenizer = build_char_tokenizer("task")
    model = build_tiny_model(2, 32, 2, 64, 64, vocab_size=len(tokenizer), seed=11)
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, model, tokenizer, chat_template=TEMPLATE)
    return path


def assert_same_policy(cached, fresh) -> None:
    cached_state, fresh_state = cached.model.state_dict(), fresh.model.state_dict()
    assert cached_state.keys() == fresh_state.keys()
    for name, tensor in fresh_state.items():
        assert cached_state[name].dtype == tensor.dtype and torch.equal(cached_state[name], tensor), name
    assert type(cached.model) is type(fresh.model)
    ignore = {"_name_or_path", "transformers_version"}
    assert ({k: v for k, v in cached.model.config.to_dict().items() if k not in ignore}
            == {k: v for k, v in fresh.model.config.to_dict().items() if k not in ignore})  # fmt: skip
    assert cached.model.generation_config.to_diff_dict() == fresh.model.generation_config.to_diff_dict()
    a, b = cached.tokenizer, fresh.tokenizer
    assert a.get_vocab() == b.get_vocab() and a.all_special_tokens == b.all_special_tokens
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id)
    for text in TEXTS:
        assert a(text)["input_ids"] == b(text)["input_ids"]
        assert a.decode(b(text)["input_ids"]) == b.decode(b(text)["input_ids"])
    assert a.chat_template == b.chat_template
    assert (a.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
            == b.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))  # fmt: skip
    assert eos_token_ids(a, cached.model) == eos_token_ids(b, fresh.model)
    ids = torch.tensor([b(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        assert torch.equal(cached.model(ids).logits, fresh.model(ids).logits)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cached_copy_is_the_policy_a_fresh_dequantisation_gives(gguf_file, tmp_path, dtype, monkeypatch) -> None:
    root = tmp_path / "cache"
    fresh = load_policy("gguf", gguf_file, device="cpu", dtype=dtype)
    notes: list[str] = []
    first = load_policy("gguf", gguf_file, device="cpu", dtype=dtype, gguf_cache=root, note=notes.append)
    entry = cache_entry(gguf_file, root, dtype)
    assert notes == [f"dequantising tiny.gguf once; the float copy is cached in {entry}"]
    assert (entry / SOURCE_FILE).is_file() and (entry / "config.json").is_file()
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no staging directory left beside it

    def refuse(*args, **kwargs):
        raise AssertionError("a cached GGUF must not be dequantised again")

    monkeypatch.setattr(gguf_loading, "dequantise_gguf", refuse)
    notes.clear()
    second = load_policy("gguf", gguf_file, device="cpu", dtype=dtype, gguf_cache=root, note=notes.append)
    assert notes == [f"read the dequantised tiny.gguf from the cache {entry}"]
    assert_same_policy(first, fresh)
    assert_same_policy(second, fresh)
    assert second.model.dtype == getattr(torch, dtype)


def test_a_changed_file_gets_a_new_entry_and_the_same_file_elsewhere_shares_one(gguf_file, tmp_path) -> None:
    root = tmp_path / "cache"
    before = cache_entry(gguf_file, root)
    load_policy("gguf", gguf_file, device="cpu", gguf_cache=root)
    stat = gguf_file.stat()
    os.utime(gguf_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert cache_entry(gguf_file, root) == before  # touched, same content: the same entry
    elsewhere = tmp_path / "other-env" / gguf_file.name
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(gguf_file.read_bytes())
    notes: list[str] = []
    load_policy("gguf", elsewhere, device="cpu", gguf_cache=root, note=notes.append)
    assert notes == [f"read the dequantised tiny.gguf from the cache {before}"]
    data = bytearray(gguf_file.read_bytes())
    data[-1] ^= 0xFF  # a rewritten file (one byte of its last tensor changed)
    gguf_file.write_bytes(bytes(data))
    after = cache_entry(gguf_file, root)
    assert after != before and not after.exists()
    notes.clear()
    load_policy("gguf", gguf_file, device="cpu", gguf_cache=root, note=notes.append)
    assert notes[0].startswith("dequantising tiny.gguf once") and after.is_dir()


def test_a_failed_store_leaves_nothing_and_an_unreadable_entry_is_rebuilt(gguf_file, tmp_path, monkeypatch) -> None:
    root = tmp_path / "cache"
    fresh = load_policy("gguf", gguf_file, device="cpu")
    entry = cache_entry(gguf_file, root)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(gguf_loading.os, "rename", full_disk)
        notes: list[str] = []
        policy = load_policy("gguf", gguf_file, device="cpu", gguf_cache=root, note=notes.append)
    assert notes[1].startswith(f"could not cache the dequantised copy in {entry}")
    assert list(entry.parent.iterdir()) == []  # neither the entry nor its staging directory
    assert_same_policy(policy, fresh)

    load_policy("gguf", gguf_file, device="cpu", gguf_cache=root)
    (entry / "model.safetensors").unlink()  # a cache cleaner that took half an entry
    notes = []
    policy = load_policy("gguf", gguf_file, device="cpu", gguf_cache=root, note=notes.append)
    assert notes[0].startswith(f"the cached copy {entry} could not be read")
    assert notes[1].startswith("dequantising tiny.gguf once")
    assert (entry / "model.safetensors").is_file()
    assert_same_policy(policy, fresh)


def test_where_the_cache_lives(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GROUPWISE_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root("auto") == tmp_path / "explicit"
    monkeypatch.delenv("GROUPWISE_CACHE_DIR")
    assert cache_root("auto") == tmp_path / "xdg" / "groupwise"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_root() == tmp_path / "home" / ".cache" / "groupwise"
    assert cache_root("off") is None
    assert cache_root(str(tmp_path / "mine")) == tmp_path / "mine"


def test_the_config_key() -> None:
    gguf = {"model": {"source": "gguf", "path": "smollm2"}}
    assert config_from_dict(gguf).model.gguf_cache == "auto"
    assert config_from_dict(gguf, ["model.gguf_cache=off"]).model.gguf_cache == "off"  # YAML: off is false
    assert config_from_dict(gguf, ["model.gguf_cache=/tmp/c"]).model.gguf_cache == "/tmp/c"
    with pytest.raises(ConfigError, match="model.gguf_cache has no effect with model.source 'tiny'"):
        config_from_dict({"model": {"source": "tiny"}}, ["model.gguf_cache=off"])


@pytest.mark.slow
def test_the_shipped_smollm2_file_is_cached_once(tmp_path) -> None:
    root = tmp_path / "cache"
    started = time.monotonic()
    first = load_policy("gguf", "smollm2", device="cpu", gguf_cache=root)
    dequantising = time.monotonic() - started
    started = time.monotonic()
    second = load_policy("gguf", "smollm2", device="cpu", gguf_cache=root)
    reading = time.monotonic() - started
    assert cache_entry(smollm2_gguf_path(), root).is_dir()
    assert_same_policy(second, first)
    assert second.tokenizer.apply_chat_template(CHAT, tokenize=False) == first.tokenizer.apply_chat_template(
        CHAT, tokenize=False)
    assert reading < dequantising, (reading, dequantising)
