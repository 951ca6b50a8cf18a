"""Tests for attnkit.data.tokenizer: exact round trip, special ids, persistence."""

import json
import logging
import time

import pytest
import torch

from attnkit.data.batching import TokenBatchSampler
from attnkit.data.corpus import load_named_corpus
from attnkit.data.dataset import encode_pairs
from attnkit.data.tokenizer import SubwordTokenizer

logger = logging.getLogger(__name__)

TRICKY = [
    "",
    " ",
    "   ",
    "a  b   c",
    "  leading spaces",
    "trailing spaces  ",
    " both ",
    "\ttab\tinside\t",
    "line\nbreak and\r\nwindows",
    "Ärger über Öl, Straße, café, naïve, año",
    "e\u0301 (decomposed) vs \u00e9 (composed)",  # must not be NFC-normalised
    "non\u00a0breaking\u2009thin space",
    "unseen: 漢字 カタカナ 🙂 👩‍👩‍👧 Ω ∑ \u0000 \x7f",
    "▁ sentencepiece marker ▁▁",
    "<s> </s> <pad> <unk> <0x41> look like special tokens",
    "„Zitat“ – “quote” ‘x’ …",
]


def roundtrip_failures(tokenizer, lines):
    decoded = tokenizer.decode_batch(tokenizer.encode_batch(lines))
    return [(line, out) for line, out in zip(lines, decoded, strict=True) if line != out]


def test_special_token_ids(small_tokenizer):
    tok = small_tokenizer
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert [tok.id_to_token(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tok.id_to_token(4) == "<0x00>" and tok.id_to_token(259) == "<0xFF>"


def test_vocab_size_and_contiguous_ids(small_tokenizer):
    assert small_tokenizer.vocab_size == 1000
    vocab = json.loads(small_tokenizer.to_json())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(1000))


@pytest.mark.parametrize("split", ["val", "test2016"])
def test_roundtrip_exact_on_all_val_and_test_lines(small_tokenizer, split):
    corpus = load_named_corpus("multi30k", split=split)
    for lines in (corpus.src, corpus.tgt):
        assert roundtrip_failures(small_tokenizer, lines) == []


def test_roundtrip_exact_on_train_sample(small_tokenizer, multi30k_train):
    # Every 7th line, plus the known lines with a trailing space (5908) and a tab (7365).
    sample = multi30k_train.src[::7] + multi30k_train.tgt[::7]
    sample += [multi30k_train.src[5908], multi30k_train.src[7365]]
    assert roundtrip_failures(small_tokenizer, sample) == []


@pytest.mark.parametrize("text", TRICKY)
def test_roundtrip_exact_on_tricky_strings(small_tokenizer, text):
    ids = small_tokenizer.encode(text)
    assert small_tokenizer.decode(ids) == text
    assert all(i > small_tokenizer.unk_id for i in ids), "encode must never emit special ids"


def test_unseen_characters_use_byte_fallback_not_unk(small_tokenizer):
    ids = small_tokenizer.encode("漢")
    tokens = [small_tokenizer.id_to_token(i) for i in ids]
    # Independent reference: the UTF-8 bytes of U+6F22 are E6 BC A2.
    assert tokens[-3:] == ["<0xE6>", "<0xBC>", "<0xA2>"]
    assert small_tokenizer.unk_id not in ids


def test_subwords_are_shared_between_languages(small_tokenizer):
    # A joint vocabulary: frequent words of both languages are single tokens.
    assert small_tokenizer.tokens("Ein Mann") == [" Ein", " Mann"]
    assert small_tokenizer.tokens("A man") == [" A", " man"]


def test_decode_stops_at_eos_and_skips_specials(small_tokenizer):
    tok = small_tokenizer
    ids = tok.encode("Ein Hund.")
    row = [tok.bos_id, *ids, tok.eos_id, *tok.encode("garbage"), tok.pad_id]
    assert tok.decode(row) == "Ein Hund."
    assert tok.decode([tok.bos_id, ids[0], tok.unk_id, *ids[1:], tok.pad_id]) == "Ein Hund."
    assert tok.decode(torch.tensor(row)) == "Ein Hund."
    batch = torch.tensor([row, [tok.bos_id, tok.eos_id] + [tok.pad_id] * (len(row) - 2)])
    assert tok.decode_batch(batch) == ["Ein Hund.", ""]


def test_encode_batch_matches_encode(small_tokenizer):
    lines = ["Ein Hund.", "  Zwei ", "漢字"]
    assert small_tokenizer.encode_batch(lines) == [small_tokenizer.encode(s) for s in lines]


def test_save_load_equal(small_tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    small_tokenizer.save(path)
    loaded = SubwordTokenizer.load(path)
    assert loaded.to_json() == small_tokenizer.to_json()
    assert loaded.vocab_size == small_tokenizer.vocab_size
    lines = load_named_corpus("multi30k", split="val").tgt + TRICKY
    assert loaded.encode_batch(lines) == small_tokenizer.encode_batch(lines)
    assert roundtrip_failures(loaded, TRICKY) == []


def test_training_is_deterministic():
    texts = load_named_corpus("multi30k", split="val").src * 2
    first = SubwordTokenizer.train(texts, vocab_size=600)
    second = SubwordTokenizer.train(iter(texts), vocab_size=600)
    assert first.to_json() == second.to_json()


def test_small_corpus_gives_smaller_vocab_and_warns(caplog):
    with caplog.at_level(logging.WARNING):
        tok = SubwordTokenizer.train(["ab ab ab", "abc"], vocab_size=5000)
    assert tok.vocab_size < 5000
    assert "vocab_size=5000" in caplog.text
    assert tok.decode(tok.encode("abc xyz")) == "abc xyz"


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size=260 must be greater than 260"):
        SubwordTokenizer.train(["a b"], vocab_size=260)
    with pytest.raises(ValueError, match="min_frequency=0"):
        SubwordTokenizer.train(["a b"], vocab_size=300, min_frequency=0)
    with pytest.raises(ValueError, match="path='/nonexistent/tokenizer.json'"):
        SubwordTokenizer.load("/nonexistent/tokenizer.json")


def test_full_size_vocab_8000_on_multi30k_train(multi30k_train):
    start = time.perf_counter()
    tok = SubwordTokenizer.train(multi30k_train.src + multi30k_train.tgt, vocab_size=8000)
    logger.info("trained vocab 8000 in %.2f s", time.perf_counter() - start)
    assert tok.vocab_size == 8000
    sample = multi30k_train.src[::29] + multi30k_train.tgt[::29]
    assert roundtrip_failures(tok, sample) == []
    pairs = encode_pairs(list(multi30k_train)[::29], tok)
    mean_src = sum(len(s) for s, _ in pairs) / len(pairs)
    # German train averages 11.1 words a sentence (wc -w); subwords are a little more.
    assert 10 < mean_src < 20
    assert TokenBatchSampler(pairs, max_tokens=4096, max_len=128).num_skipped == 0


def test_bpe_dropout_segments_afresh_and_decodes_exactly(small_tokenizer):
    """BPE-dropout (tokenizers' own): the same lines get varying segmentations, each of which
    decodes to the line exactly (the tricky lines too); the original tokenizer is untouched."""
    lines = ["Ein Mann mit einem orangefarbenen Hut starrt auf etwas.", *TRICKY]
    plain = small_tokenizer.encode_batch(lines)
    drop = small_tokenizer.with_bpe_dropout(0.3)
    draws = [drop.encode_batch(lines) for _ in range(10)]
    assert len({tuple(map(tuple, d)) for d in draws}) > 1
    assert all(not roundtrip_failures(drop, lines) for _ in range(5))
    assert all(drop.decode_batch(d) == lines for d in draws)
    assert small_tokenizer.encode_batch(lines) == plain  # deterministic as before
    assert small_tokenizer.with_bpe_dropout(0.0) is small_tokenizer
    for bad in (1.0, -0.1, float("nan"), "0.1"):
        with pytest.raises(ValueError, match=r"bpe_dropout: expected a probability in \[0, 1\)"):
            small_tokenizer.with_bpe_dropout(bad)


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b'{"model": 5}'])
def test_load_of_a_damaged_file_names_it(small_tokenizer, tmp_path, content):
    path = tmp_path / "tokenizer.json"
    small_tokenizer.save(path)
    path.write_bytes(content if content else path.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a readable tokenizer \("):
        SubwordTokenizer.load(path)


def test_load_of_another_tokenizer_names_the_file_and_the_special_id(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    path = tmp_path / "tokenizer.json"
    Tokenizer(WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(str(path))
    with pytest.raises(ValueError, match=r"tokenizer\.json: tokenizer has '<pad>' at id None"):
        SubwordTokenizer.load(path)


@pytest.mark.parametrize(
    "ids, message",
    [
        ([10**6], r"ids\[0\]: id 1000000 is outside the vocabulary \[0, "),  # was dropped
        ([5, -1], r"ids\[1\]: id -1 is outside the vocabulary \[0, "),  # was dropped
        ([300.7, 301.2], r"ids\[0\]: expected an integer id, got 300.7"),  # was rounded
        ([True], r"ids\[0\]: expected an integer id, got True"),
        ("abc", r"ids: expected a sequence of integer ids, got str"),
        (torch.tensor([1.0, 2.0]), r"ids: expected a 1-D tensor of integer ids, got shape \(2,\) "),
        (torch.tensor([[300, 301]]), r"ids: expected a 1-D tensor of integer ids, got shape \(1, 2\)"),
    ],
)  # fmt: skip
def test_decode_refuses_ids_that_are_not_of_the_vocabulary(small_tokenizer, ids, message):
    with pytest.raises(ValueError, match=message):
        small_tokenizer.decode(ids)
    with pytest.raises(ValueError, match=message):
        small_tokenizer.decode_batch([[300], ids])


def test_decode_takes_numpy_and_tensor_integers(small_tokenizer):
    import numpy as np

    ids = small_tokenizer.encode("Ein Hund.")
    text = small_tokenizer.decode(ids)
    assert small_tokenizer.decode(np.array(ids)) == text
    assert small_tokenizer.decode(torch.tensor(ids, dtype=torch.int32)) == text
