"""A character-level tokenizer for tiny from-scratch policies: one character is one token.

Built on ``tokenizers`` so it behaves like any Hugging Face fast tokenizer (``save_pretrained`` /
``AutoTokenizer.from_pretrained`` round-trip offline, ``decode`` with or without special tokens).
"""

from __future__ import annotations

import string
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

CharVocab = Literal["task", "full"]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

# "task" is just what arithmetic prompts and answers need; a small vocabulary makes the random-init
# policy's chance of a correct answer much higher (18 tokens instead of 64: a from-scratch addition run starts
# learning about 1.5x sooner).
_TASK_CHARS = string.digits + "+-*/=() "
_FULL_CHARS = string.digits + string.ascii_lowercase + string.ascii_uppercase + " \n" + "+-*/=()[],.:?!'\"%<>_;#&"
_VOCAB_CHARS: dict[str, str] = {"task": _TASK_CHARS, "full": _FULL_CHARS}


def char_vocabulary(vocab: CharVocab) -> list[str]:
    """The ordered token list: the four specials (ids 0–3: pad, bos, eos, unk), then one token per character."""
    if vocab not in _VOCAB_CHARS:
        raise ValueError(f"unknown char vocabulary {vocab!r}; use one of {sorted(_VOCAB_CHARS)}")
    chars = list(dict.fromkeys(_VOCAB_CHARS[vocab]))  # dedupe, keep order
    return [*SPECIAL_TOKENS, *chars]


def build_char_tokenizer(vocab: CharVocab = "full") -> PreTrainedTokenizerFast:
    """A left-padding, one-char-per-token tokenizer that prepends ``<bos>`` to every encoded text.

    Characters outside the vocabulary become ``<unk>``. ``decode`` fuses characters without
    inserting spaces. The special tokens are matched whole, so the text ``"<eos>"`` encodes to the
    EOS id.
    """
    tokens = char_vocabulary(vocab)
    token_to_id = {token: index for index, token in enumerate(tokens)}
    backend = Tokenizer(models.WordLevel(vocab=token_to_id, unk_token=UNK))
    # Oniguruma rejects "(?s)."; "[\s\S]" matches any single character including newlines.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, token_to_id[BOS])],
    )
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )
