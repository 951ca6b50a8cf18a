"""Language-model tokenizers: characters and byte-level BPE, both exact round trips, both a
tokenizer.json that Hugging Face `tokenizers` and attnkit's GPT tokenizer read."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from attnkit.data.corpus import load_named_text
from attnkit.data.lm_tokenizer import (
    BYTE_TOKENS,
    byte_bpe_tokenizer,
    char_tokenizer,
    newline_id,
    train_lm_tokenizer,
)
from attnkit.models.gpt_tokenizer import GPTTokenizer

TRAIN = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
HARD = [
    "",
    "a",
    "\n",
    "  two  spaces  \n\n\n",
    "Über naïve façade: 日本語, emoji 🙂, tab\there, CR\r\nLF",
    "<0x41> looks like a byte token",
    "\x00\x7f",
]


@pytest.fixture(scope="module", params=["char", "bpe"])
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    """Each kind, saved and read back with tokenizers.Tokenizer.from_file."""
    tok = train_lm_tokenizer(request.param, TRAIN * 20, vocab_size=300, min_frequency=2)
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    tok.save(str(path))
    return Tokenizer.from_file(str(path))


@pytest.mark.parametrize("text", HARD + [TRAIN])
def test_round_trip_is_exact(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text


def test_gpt_tokenizer_reads_the_file_and_decodes_one_id_at_a_time(tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    gpt = GPTTokenizer.from_file(path)
    ids = gpt.encode(TRAIN)
    assert gpt.decode(ids) == TRAIN
    assert "".join(gpt.decode([i]) for i in ids) == TRAIN  # ASCII: every id whole characters


def test_char_vocabulary_is_the_sorted_characters_then_the_bytes():
    tok = char_tokenizer("banana")
    vocab = tok.get_vocab()
    assert [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])] == [
        "\n", "a", "b", "n", *BYTE_TOKENS
    ]  # fmt: skip
    assert tok.encode("nab\n", add_special_tokens=False).ids == [3, 1, 2, 0]
    # A character never seen is its UTF-8 bytes, never an unknown token.
    ids = tok.encode("é", add_special_tokens=False).ids
    assert ids == [4 + 0xC3, 4 + 0xA9] and tok.decode(ids) == "é"
    assert newline_id(tok) == 0


def test_char_tokens_are_one_a_character_on_shakespeare():
    text = load_named_text("shakespeare", "val")[:20000]
    tok = char_tokenizer(text)
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) == len(text)
    assert tok.get_vocab_size() == len(set(text)) + 256


def test_bpe_has_the_asked_vocabulary_and_compresses():
    text = load_named_text("shakespeare", "val")[:50000]
    tok = byte_bpe_tokenizer(text, 600)
    assert tok.get_vocab_size() == 600
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) < len(text) / 2
    assert tok.id_to_token(newline_id(tok)) == "Ċ"  # GPT-2's byte symbol for "\n"


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"text: expected the training text"):
        char_tokenizer("")
    with pytest.raises(ValueError, match=r"vocab_size: expected an integer >= 257"):
        byte_bpe_tokenizer("abc", 256)
    with pytest.raises(ValueError, match=r"kind: expected one of \['char', 'bpe'\]"):
        train_lm_tokenizer("word", "abc")
