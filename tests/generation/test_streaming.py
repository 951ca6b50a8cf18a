"""Incremental detokenization never splits a UTF-8 character and loses no text."""

from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.generation import IncrementalDetokenizer

TEXTS = ["你好,世界", "emoji 😀👍🏽 and 👨‍👩‍👧", "café naïve", "plain ascii", "日本語のテキスト🎌"]


def _stream(decode, ids, context=()):
    detok = IncrementalDetokenizer(decode, context)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


def test_byte_bpe_splits_characters_and_the_stream_does_not(byte_bpe):
    for text in TEXTS:
        ids = byte_bpe.encode(text).ids
        partial = [byte_bpe.decode(ids[:n]) for n in range(1, len(ids))]
        if not text.isascii():  # the hard case: some prefix ends inside a character
            assert any(p.endswith("\ufffd") for p in partial)
        pieces, rest = _stream(byte_bpe.decode, ids)
        assert all("\ufffd" not in p for p in pieces), pieces
        assert "".join(pieces) + rest == text
        assert rest == ""


def test_every_piece_is_whole_characters_byte_tokenizer(byte_tokenizer):
    for text in TEXTS:
        pieces, rest = _stream(byte_tokenizer.decode, byte_tokenizer.encode(text))
        assert "".join(pieces) == text and rest == ""
        # each piece's bytes are a run of whole characters of the text
        for p in pieces:
            assert p.encode("utf-8").decode("utf-8") == p and "\ufffd" not in p


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=30))
def test_any_text_round_trips(text):
    decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731
    pieces, rest = _stream(decode, list(text.encode("utf-8")))
    assert "".join(pieces) + rest == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces)


def test_context_is_not_returned(byte_bpe):
    prompt = byte_bpe.encode("hello 世").ids
    ids = byte_bpe.encode("界 world").ids
    pieces, rest = _stream(byte_bpe.decode, ids, context=prompt)
    assert "".join(pieces) + rest == "界 world"


def test_invalid_bytes_come_out_as_replacement(byte_tokenizer):
    ids = [104, 0xFF, 105]  # "h", a byte that starts no character, "i"
    pieces, rest = _stream(byte_tokenizer.decode, ids)
    assert "".join(pieces) + rest == "h\ufffdi"
    pieces, rest = _stream(byte_tokenizer.decode, [104, 0xE4, 0xBD])  # ends mid-character
    assert "".join(pieces) == "h" and rest == "\ufffd"
