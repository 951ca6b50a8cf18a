"""Bounded decoding: config validation, length limits that cannot overflow, searches refused
before they allocate what cannot fit (the estimate itself: test_memory_bound.py), and special
ids taken from the tokenizer."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from attnkit.decoding import (
    MAX_BEAM_SIZE,
    MAX_LENPEN,
    DecodingConfig,
    Translator,
    decoding_memory,
    generate,
    max_lengths,
)
from attnkit.models import Transformer
from tests.helpers.decoding import EOS, PAD, pad_batch, tiny_config

# The modules, not the functions of the same name that attnkit.decoding exports. The searches
# in generate_module look up available_memory there, so that is where a test replaces it.
generate_module = importlib.import_module("attnkit.decoding.generate")
translate_module = importlib.import_module("attnkit.decoding.translate")

# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(beam_size=MAX_BEAM_SIZE + 1),
            r"beam_size: expected at most MAX_BEAM_SIZE=1024, got 1025",
        ),
        (dict(beam_size=100_000), r"beam_size: expected at most MAX_BEAM_SIZE=1024"),
        (dict(beam_size=2.0), r"beam_size: expected an integer >= 1, got 2.0"),
        (dict(beam_size=True), r"beam_size: expected an integer >= 1, got True"),
        (dict(beam_size=-3), r"beam_size: expected an integer >= 1, got -3"),
        (
            dict(max_len_a=math.inf),
            r"max_len_a, max_len_b: expected >= 0 and finite, got max_len_a=inf",
        ),
        (dict(max_len_a=math.nan), r"got max_len_a=nan"),
        (dict(max_len_a=-math.inf), r"got max_len_a=-inf"),
        (dict(max_len_a="1.2"), r"got max_len_a='1.2'"),
        (dict(max_len_b=-1), r"got max_len_b=-1"),
        (dict(max_len_b=math.inf), r"got max_len_b=inf"),
        (dict(max_len_b=2.5), r"max_len_b: expected an integer >= 0, got 2.5"),
        (dict(min_len=-1), r"min_len: expected an integer >= 0, got -1"),
        (dict(min_len=1.5), r"min_len: expected an integer >= 0, got 1.5"),
        (
            dict(max_len_a=0, max_len_b=0),
            r"max_len_b: 0 with max_len_a=0 is every output's longest length, below min_len=1; "
            r"expected max_len_b >= min_len",
        ),
        (
            dict(lenpen=math.nan),
            r"lenpen: expected a number from -10 to 10 \(usual: 0 to 2\), got nan",
        ),
        (
            dict(lenpen=math.inf),
            r"lenpen: expected a number from -10 to 10 \(usual: 0 to 2\), got inf",
        ),
        # len ** 1000 overflows a float, len ** -1000 is 0 (a score divided by it): refused
        (dict(lenpen=1000.0), r"lenpen: expected a number from -10 to 10"),
        (dict(lenpen=-500), r"lenpen: expected a number from -10 to 10"),
        (dict(n_best=0), r"n_best: expected 1 <= n_best <= beam_size=5, got 0"),
        (dict(bos_id=-1), r"bos_id: expected None or an id >= 0, got -1"),
        (dict(eos_id=2.0), r"eos_id: expected None or an id >= 0, got 2.0"),
        # truthy or falsy non-bools used to pass as the opposite of what they say
        (dict(use_cache="no"), r"use_cache: expected True or False, got 'no'"),
        (dict(use_cache=0), r"use_cache: expected True or False, got 0"),
        (dict(use_cache=None), r"use_cache: expected True or False, got None"),
    ],
)
def test_config_refuses_values_outside_bounds(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodingConfig(**kwargs)


def test_config_accepts_the_bounds():
    assert DecodingConfig(beam_size=MAX_BEAM_SIZE).beam_size == 1024
    assert (
        DecodingConfig(max_len_a=1e30, max_len_b=10**12, min_len=0, lenpen=-0.5).max_len_a == 1e30
    )
    for lenpen in (-MAX_LENPEN, MAX_LENPEN):
        penalty = DecodingConfig(lenpen=lenpen).length_penalty
        assert math.isfinite(penalty.normalize(-1.0, 1024)) and penalty.normalize(-1.0, 1024) != 0


@pytest.mark.parametrize("a, b", [(1e30, 10), (1e300, 0), (0.0, 10**15), (1.7e308, 10**18)])
def test_huge_length_limits_give_the_model_limit(a, b):
    """Before: floor(a * len + b) overflowed int64 to a negative number, clamped to min_len
    (1-token outputs). The limit is the model's: max_len - 1 = 39 (hand-computed)."""
    src = pad_batch([[5, 6, 7], [8]])
    limits = max_lengths(src, DecodingConfig(max_len_a=a, max_len_b=b), 40, PAD)
    assert limits.tolist() == [39, 39]


def test_huge_length_limits_decode_to_the_model_limit(random_model):
    config = DecodingConfig(beam_size=2, max_len_a=1e30, min_len=39)
    (hyps,) = generate(random_model, pad_batch([[5, 6, 7]]), config)
    assert len(hyps[0].tokens) == 39


def test_ids_outside_the_vocabulary_are_refused(random_model):
    with pytest.raises(
        ValueError, match=r"eos_id: 24 is not in the model's target vocabulary of 24 ids"
    ):
        generate(random_model, pad_batch([[5]]), DecodingConfig(beam_size=1, eos_id=24))
    with pytest.raises(ValueError, match=r"bos_id: 99 is not in the model's target vocabulary"):
        generate(random_model, pad_batch([[5]]), DecodingConfig(beam_size=2, bos_id=99))


@pytest.mark.parametrize("beam", [1, 2])
@pytest.mark.parametrize("bad", [24, 5000, -1])
def test_source_ids_outside_the_vocabulary_are_refused(random_model, beam, bad):
    with pytest.raises(
        ValueError, match=rf"src: token id {bad} is outside the vocabulary \[0, 24\)"
    ):
        generate(random_model, torch.tensor([[5, 6, EOS], [bad, EOS, PAD]]),
                 DecodingConfig(beam_size=beam))  # fmt: skip


@pytest.mark.parametrize("beam", [1, 2])
def test_eos_that_is_the_pad_id_is_refused(random_model, beam):
    """The search never produces pad, so an eos equal to it could never end a sentence."""
    with pytest.raises(ValueError, match=r"eos_id: 0 is the model's pad_id=0"):
        generate(random_model, pad_batch([[5]]), DecodingConfig(beam_size=beam, eos_id=PAD))


def test_config_must_be_a_decoding_config(random_model):
    message = (
        r"config: expected a DecodingConfig or None, got dict \(DecodingConfig\(\*\*settings\)"
    )
    for search in (generate, generate_module.greedy_search, generate_module.beam_search):
        with pytest.raises(TypeError, match=message):
            search(random_model, pad_batch([[5]]), {"beam_size": 2})
    with pytest.raises(TypeError, match=message):
        Translator(random_model, _Tokenizer(), {"beam_size": 2})


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize("use_cache", [True, False])
def test_search_that_cannot_fit_is_refused_before_allocating(random_model, monkeypatch, use_cache):
    monkeypatch.setattr(generate_module, "available_memory", lambda device: 10_000_000)
    config = DecodingConfig(beam_size=1000, use_cache=use_cache)
    with pytest.raises(ValueError) as err:
        generate(random_model, pad_batch([[5, 6, 7]] * 8), config)
    message = str(err.value)
    assert message.startswith("beam_size: decoding 8 sentence(s) with beam_size=1000")
    assert "more than the 0.01 GiB of memory available on cpu" in message
    assert "use a beam of at most" in message
    # The beam the message proposes fits.
    fits = int(message.split("use a beam of at most ")[1].split()[0])
    assert 1 <= fits < 1000
    generate(
        random_model,
        pad_batch([[5, 6, 7]] * 8),
        DecodingConfig(beam_size=fits, use_cache=use_cache),
    )


def test_nothing_fits(random_model, monkeypatch):
    monkeypatch.setattr(generate_module, "available_memory", lambda device: 1000)
    with pytest.raises(ValueError, match=r"decode fewer sentences per batch or shorter outputs"):
        generate(random_model, pad_batch([[5, 6, 7]]), DecodingConfig(beam_size=1))


class _Tokenizer:
    """A tokenizer whose special ids are not attnkit's 1 and 2 (ids are the letters' codes)."""

    pad_id, bos_id, eos_id = 0, 22, 23

    def encode_batch(self, lines):
        return [[4 + (ord(c) - ord("a")) % 18 for c in line.replace(" ", "")] for line in lines]

    def decode_batch(self, batch):
        return [" ".join(str(i) for i in ids) for ids in batch]


def test_translator_takes_the_ids_from_its_tokenizer(random_model):
    tokenizer = _Tokenizer()
    translator = Translator(random_model, tokenizer, DecodingConfig(beam_size=2))
    assert (translator.config.bos_id, translator.config.eos_id) == (22, 23)
    lines = ["abc", "hello world", "x"]
    out = translator.translate(lines).translations
    # Reference: the ids given by hand to the search.
    explicit = DecodingConfig(beam_size=2, bos_id=22, eos_id=23)
    for line, text in zip(lines, out, strict=True):
        src = torch.tensor([[*tokenizer.encode_batch([line])[0], 23]])
        (hyps,) = generate(random_model, src, explicit)
        assert text == " ".join(str(i) for i in hyps[0].tokens)
        assert not {"22", "23"} & set(text.split())
    with pytest.raises(ValueError, match=r"eos_id: the config says 2 but the tokenizer's is 23"):
        Translator(random_model, tokenizer, DecodingConfig(eos_id=2))
    tokenizer.pad_id = 5
    with pytest.raises(ValueError, match=r"tokenizer: its pad id 5 is not the model's pad_id=0"):
        Translator(random_model, tokenizer)


def test_translator_checks_its_tokenizer_against_the_model(random_model):
    """Mismatches show when the Translator is made, not at the first translation."""
    tokenizer = _Tokenizer()
    tokenizer.vocab_size = 280  # 24 ids in the model
    with pytest.raises(
        ValueError,
        match=r"tokenizer: its vocabulary of 280 ids does not fit the model's src_vocab_size=24",
    ):
        Translator(random_model, tokenizer)
    tokenizer.vocab_size = 24
    Translator(random_model, tokenizer)  # as large as the model's: fits
    tokenizer.eos_id = 0
    with pytest.raises(ValueError, match=r"eos_id: 0 is the model's pad_id=0"):
        Translator(random_model, tokenizer)


@pytest.mark.parametrize(
    "sources, error, message",
    [
        ([[5000, EOS]], ValueError, r"sources\[0\]: token id 5000 is outside the vocabulary \[0, 24\)"),
        ([[5, EOS], [-1, EOS]], ValueError, r"sources\[1\]: token id -1 is outside the vocabulary"),
        ([[24, EOS]], ValueError, r"sources\[0\]: token id 24 is outside the vocabulary"),
        ([[5.5, 2.0]], TypeError, r"sources\[0\]\[0\]: expected an int token id, got float 5.5"),
        ([[5, True]], TypeError, r"sources\[0\]\[1\]: expected an int token id, got bool True"),
        (["ab"], TypeError, r"sources\[0\]: expected a list of int token ids, got str"),
        ([None], TypeError, r"sources\[0\]: expected a list of int token ids, got NoneType"),
        ("ab", TypeError, r"sources: expected a sequence of token id lists, got str"),
    ],
)  # fmt: skip
def test_translate_ids_checks_the_ids(random_model, sources, error, message):
    translator = Translator(random_model, _Tokenizer(), DecodingConfig(beam_size=2))
    with pytest.raises(error, match=message):
        translator.translate_ids(sources)


def test_translate_ids_takes_numpy_ints_and_tuples(random_model):
    np = pytest.importorskip("numpy")
    translator = Translator(random_model, _Tokenizer(), DecodingConfig(beam_size=2))
    expected = translator.translate_ids([[5, 6, EOS]])
    assert translator.translate_ids([(np.int64(5), np.int32(6), EOS)]) == expected


def test_translator_splits_batches_to_fit_memory(random_model, monkeypatch):
    """With little memory, batches are split (same output) instead of failing."""
    tokenizer = _Tokenizer()
    lines = ["abcdefgh"[: 1 + i % 8] for i in range(20)]
    config = DecodingConfig(beam_size=3, max_len_a=0.5, max_len_b=3)
    roomy = Translator(random_model, tokenizer, config).translate(lines).translations
    calls = []
    real_generate = translate_module.generate

    def counting(model, src, cfg):
        calls.append(src.shape[0])
        return real_generate(model, src, cfg)

    one = decoding_memory(random_model, sentences=1, beam_size=3, num_positions=8, src_len=9,
                          use_cache=True)  # fmt: skip
    monkeypatch.setattr(translate_module, "available_memory", lambda device: 2 * 3 * one)
    monkeypatch.setattr(translate_module, "generate", counting)
    tight = Translator(random_model, tokenizer, config, batch_tokens=10_000).translate(lines)
    assert tight.translations == roomy
    assert sum(calls) == 20 and max(calls) <= 3 and len(calls) >= 7


def test_translator_checks_batch_tokens(random_model):
    for bad in (0, -1, 2.5, True, "4000"):
        with pytest.raises(ValueError, match=r"batch_tokens: expected an integer >= 1"):
            Translator(random_model, _Tokenizer(), batch_tokens=bad)


def test_generate_default_ids_are_the_subword_tokenizers():
    from attnkit.data import SubwordTokenizer

    config = DecodingConfig()
    assert config.bos_id is None and config.eos_id is None
    assert (config.bos, config.eos) == (SubwordTokenizer.bos_id, SubwordTokenizer.eos_id)
    assert EOS == SubwordTokenizer.eos_id


def test_beam_larger_than_the_vocabulary_still_works():
    """6 ids, 3 usable tokens: a beam of 50 pads its candidates (the exhaustive-search test
    relies on it), so the vocabulary does not bound the beam; memory does."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(6)).eval()
    (hyps,) = generate(model, pad_batch([[4, 5]]), DecodingConfig(beam_size=50, n_best=50,
                                                                  max_len_a=0, max_len_b=2))  # fmt: skip
    assert len(hyps) == 3 + 9  # every sequence of 1 or 2 tokens from {3, 4, 5}


def test_worker_processes_share_the_free_memory(random_model, monkeypatch):
    """A worker process (one of ``_siblings`` decoding at once) splits its batches for its
    share of the free memory, as threads do for theirs."""
    tokenizer = _Tokenizer()
    config = DecodingConfig(beam_size=3, max_len_a=0.5, max_len_b=3)
    translator = Translator(random_model, tokenizer, config)
    sources, _ = translator.encode(["abcdefgh"] * 6)
    src = translator._pad(list(range(6)), sources)  # (6, 9)
    one = decoding_memory(random_model, sentences=1, beam_size=3, num_positions=8, src_len=9,
                          use_cache=True)  # fmt: skip
    monkeypatch.setattr(translate_module, "available_memory", lambda device: 2 * 6 * one)
    alone = translator._memory_batches(src, 1)
    translator._siblings = 2
    shared = translator._memory_batches(src, 1)
    assert [s.stop - s.start for s in alone] == [6]
    assert [s.stop - s.start for s in shared] == [3, 3]
    assert [s.stop - s.start for s in translator._memory_batches(src, 2)] == [1] * 6  # 2 x 2
