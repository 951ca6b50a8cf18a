"""Text in, text out: stop strings cut the text, streaming gives the same text in whole
characters, empty prompts start from bos."""

import pytest

from attnkit.generation import GenerationConfig, generate, generate_text, stream_text
from tests.helpers.generation import VOCAB, load_pair

PROMPTS = ["hello world", "你好 😀", "the cat", "café"]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory, byte_bpe):
    assert byte_bpe.get_vocab_size() == VOCAB
    _, model = load_pair(tmp_path_factory.mktemp("gpt2_text"), byte_bpe)
    assert model.tokenizer is not None
    return model


def test_text_is_the_decoded_tokens(gpt):
    config = GenerationConfig(max_new_tokens=25, eos_ids=(), logprobs=True)
    results = generate_text(gpt, None, PROMPTS, config)
    ids = [gpt.tokenizer.encode(p) for p in PROMPTS]
    tokens = generate(gpt, ids, config).tokens
    for result, expected in zip(results, tokens, strict=True):
        assert result.tokens == expected
        assert result.text == gpt.tokenizer.decode(expected)
        assert result.finish_reason == "length" and len(result.logprobs) == 25
    plain = generate_text(gpt, None, PROMPTS[:1], GenerationConfig(max_new_tokens=3, eos_ids=()))
    assert plain[0].logprobs is None and len(plain[0].tokens) == 3


def test_stop_string_cuts_the_text(gpt):
    free = generate_text(gpt, None, PROMPTS, GenerationConfig(max_new_tokens=40, eos_ids=()))
    text = free[0].text
    # two characters from the middle of row 0's text (the random model also writes invalid
    # UTF-8, shown as U+FFFD, which makes no stop string)
    stop = next(text[i : i + 2] for i in range(8, len(text)) if "\ufffd" not in text[i : i + 2])
    cut = text.index(stop)
    out = generate_text(
        gpt,
        None,
        PROMPTS,
        GenerationConfig(max_new_tokens=40, eos_ids=(), stop_strings=(stop, "\x00never")),
    )
    assert out[0].text == text[:cut] and out[0].finish_reason == "stop"
    n = len(out[0].tokens)  # the ids up to the one that completed the stop string
    assert out[0].tokens == free[0].tokens[:n]
    assert stop in gpt.tokenizer.decode(out[0].tokens) and stop not in gpt.tokenizer.decode(
        out[0].tokens[:-1]
    )
    for row in range(1, len(PROMPTS)):  # the others: cut at their own first occurrence, if any
        full = free[row].text
        assert out[row].text == (full[: full.index(stop)] if stop in full else full)


def test_eos_is_not_text(gpt):
    free = generate_text(gpt, None, PROMPTS, GenerationConfig(max_new_tokens=20, eos_ids=()))
    eos = free[2].tokens[6]
    cut = free[2].tokens.index(eos)  # its first occurrence
    out = generate_text(gpt, None, PROMPTS, GenerationConfig(max_new_tokens=20, eos_ids=(eos,)))
    assert out[2].finish_reason == "eos" and out[2].tokens == free[2].tokens[: cut + 1]
    assert out[2].text == gpt.tokenizer.decode(free[2].tokens[:cut])


@pytest.mark.parametrize(
    "settings",
    [dict(), dict(temperature=1.0, seed=5), dict(stop_strings=("e",), temperature=1.0, seed=1)],
)
def test_stream_equals_generate_text(gpt, settings):
    config = GenerationConfig(max_new_tokens=30, eos_ids=(), **settings)
    for prompt in PROMPTS:
        pieces = list(stream_text(gpt, None, prompt, config))
        whole = generate_text(gpt, None, [prompt], config)[0].text
        # A piece split inside a character would add a U+FFFD the whole text does not have.
        assert "".join(pieces) == whole
        assert all(pieces)


def test_stream_splits_no_character(gpt, byte_tokenizer):
    """With one id per byte every multi-byte character spans ids; no piece has half of one.

    The model's ids are read as bytes (ids >= 256 are dropped): the random model writes
    invalid UTF-8 too, which must come out exactly as the whole decode shows it."""
    decode = byte_tokenizer.decode

    class Bytes:
        encode = staticmethod(byte_tokenizer.encode)

        @staticmethod
        def decode(ids):
            return decode([i for i in ids if i < 256])

    config = GenerationConfig(max_new_tokens=40, eos_ids=(), temperature=1.0, seed=2)
    for prompt in ("你好", "😀👍🏽", "ab"):
        pieces = list(stream_text(gpt, Bytes, prompt, config))
        whole = generate_text(gpt, Bytes, [prompt], config)[0]
        assert "".join(pieces) == whole.text == Bytes.decode(whole.tokens)


def test_empty_prompt_starts_from_bos(gpt):
    config = GenerationConfig(max_new_tokens=5, eos_ids=())
    out = generate_text(gpt, None, [""], config)[0]
    assert out.tokens == generate(gpt, [[gpt.config.bos_token_id]], config).tokens[0]


def test_prompts_must_be_strings(gpt):
    with pytest.raises(TypeError, match="prompts"):
        generate_text(gpt, None, "one string", GenerationConfig())
    with pytest.raises(TypeError, match="prompt"):
        next(stream_text(gpt, None, ["a list"], GenerationConfig()))


@pytest.mark.parametrize("name", ["gpt2", "models/gpt2"])
def test_a_tokenizer_name_is_refused_with_what_to_pass(gpt, name):
    """A name where the tokenizer object goes reached str.encode, which read the prompt as an
    encoding name: "LookupError: unknown encoding: hello"."""
    message = (
        rf"^tokenizer: expected a tokenizer object \(with encode and decode\), got the str "
        rf"'{name}'; attnkit downloads nothing: pass None for the model's own tokenizer, or one "
        r"read from a file \(GPTTokenizer.from_file\('FOLDER/tokenizer.json'\)\)$"
    )
    with pytest.raises(TypeError, match=message):
        generate_text(gpt, name, ["hello"], GenerationConfig(max_new_tokens=2))
    with pytest.raises(TypeError, match=message):
        next(stream_text(gpt, name, "hello", GenerationConfig(max_new_tokens=2)))


def test_no_prompts_give_no_results(gpt):
    # As Translator.translate([]) and BertModel.encode([]): an empty batch is not an error.
    assert generate_text(gpt, None, [], GenerationConfig()) == []


def test_the_config_must_be_a_generation_config(gpt):
    with pytest.raises(TypeError, match="config: expected a GenerationConfig .* got dict"):
        generate_text(gpt, None, ["hello"], {"max_new_tokens": 3})
    with pytest.raises(TypeError, match="config: expected a GenerationConfig .* got dict"):
        next(stream_text(gpt, None, "hello", {"max_new_tokens": 3}))


def test_a_stream_runs_in_eval_mode_until_it_ends_or_is_closed(gpt):
    # The model has GPT-2's dropout (0.1): in training mode its text would change run to run.
    config = GenerationConfig(max_new_tokens=30, eos_ids=())
    want = generate_text(gpt, None, [PROMPTS[0]], config)[0].text
    gpt.train()
    try:
        pieces = stream_text(gpt, None, PROMPTS[0], config)
        next(pieces)
        assert not gpt.training
        pieces.close()  # a client that goes away
        assert gpt.training
        assert "".join(stream_text(gpt, None, PROMPTS[0], config)) == want
        assert gpt.training
        assert generate_text(gpt, None, [PROMPTS[0]], config)[0].text == want
        assert gpt.training
    finally:
        gpt.eval()


def test_a_prompt_with_a_lone_surrogate_is_named(gpt):
    """Before: tokenizers' "TextInputSequence must be str", naming no prompt."""
    with pytest.raises(ValueError, match=r"^prompts\[1\]: not valid UTF-8 text \(a lone"):
        generate_text(gpt, None, ["ok", "a \udc80"], GenerationConfig(max_new_tokens=2))
