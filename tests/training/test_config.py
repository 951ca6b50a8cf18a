"""TOML configs into dataclasses: defaults, overrides, errors, the shipped files."""

from __future__ import annotations

import re

import pytest

from attnkit.models import TransformerConfig
from attnkit.training.config import DataConfig, OptimConfig, TrainConfig, apply_overrides
from tests.helpers.training import CONFIGS


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_are_the_paper_recipe():
    c = TrainConfig()
    assert c.optim.betas == (0.9, 0.98) and c.optim.eps == 1e-9
    assert c.optim.label_smoothing == 0.1 and c.optim.warmup_steps == 4000
    assert c.optim.lr_scale == 1.0 and c.optim.clip_norm > 0
    assert c.model.share_embeddings and c.model.tie_output and c.model.dropout == 0.1


def test_shipped_configs_load():
    m = TrainConfig.from_toml(CONFIGS / "multi30k_de_en.toml")
    assert (m.model.d_model, m.model.num_heads, m.model.d_ff) == (256, 8, 1024)
    assert (m.model.num_encoder_layers, m.model.num_decoder_layers) == (3, 3)
    assert m.data.vocab_size == 6000 and m.data.corpus == "multi30k"
    assert m.optim.autocast == "auto" and m.optim.label_smoothing == 0.1
    assert m.optim.betas == (0.9, 0.98)
    t = TrainConfig.from_toml(CONFIGS / "tiny_copy.toml")
    assert t.data.corpus == "copy" and t.model.d_model == 64


def test_partial_file_and_types(tmp_path):
    path = write(tmp_path, "[model]\nd_model = 128\n[optim]\nbetas = [0.8, 0.9]\nlr_scale = 2\n")
    c = TrainConfig.from_toml(path)
    assert c.model.d_model == 128 and c.model.num_heads == TransformerConfig().num_heads
    assert c.optim.betas == (0.8, 0.9) and c.optim.lr_scale == 2.0
    assert isinstance(c.optim.lr_scale, float)
    assert c.data == DataConfig()


def test_overrides_parse_toml_values(tmp_path):
    path = write(tmp_path, "[model]\ndropout = 0.1\n")
    c = TrainConfig.from_toml(
        path,
        [
            "model.dropout=0.3",
            "optim.betas=[0.9, 0.99]",
            "data.corpus=copy",
            'data.src_lang="en"',
            "model.norm_first=false",
            "optim.max_steps = 7",
        ],
    )
    assert c.model.dropout == 0.3 and c.optim.betas == (0.9, 0.99)
    assert c.data.corpus == "copy" and c.data.src_lang == "en"
    assert c.model.norm_first is False and c.optim.max_steps == 7


def test_unknown_section_and_keys_list_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config section\(s\) \['trainer'\]; known"):
        TrainConfig.from_toml(write(tmp_path, "[trainer]\nx = 1\n"))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['model.heads'\].*'num_heads'"):
        TrainConfig.from_toml(write(tmp_path, "[model]\nheads = 4\n"))
    with pytest.raises(ValueError, match=r"unknown key optim.lr;.*'lr_scale'"):
        apply_overrides({}, ["optim.lr=0.1"])
    with pytest.raises(ValueError, match=r"unknown section 'train'"):
        apply_overrides({}, ["train.lr=0.1"])


@pytest.mark.parametrize(
    "item,message",
    [
        ("model.dropout", r"expected section.key=value"),
        ("dropout=0.3", r"expected section.key=value"),
        ("optim.max_steps=abc", r"'abc' is not a TOML value"),
        # a documented key, but not one --set can change: said so (it was "section.key=value")
        ("task=lm", r"the task is set at the top of the config file"),
        ('task="lm"', r"the task is set at the top of the config file"),
    ],
)
def test_bad_override_syntax(item, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides({}, [item])


@pytest.mark.parametrize(
    "text,message",
    [
        ("[optim]\nmax_steps = 1.5\n", r"optim.max_steps: expected int, got 1.5"),
        ('[optim]\nautocast = "bf32"\n', r"optim.autocast: expected one of"),
        ("[optim]\nbetas = [0.9]\n", r"optim.betas: expected a list of 2 numbers, got \[0.9\]"),
        ('[model]\ndropout = "high"\n', r"model.dropout: expected float"),
        ("[model]\nsrc_vocab_size = 10\n", r"model.src_vocab_size: set from the tokenizer"),
        (
            "[data]\nmax_tokens = 0\n",
            r"c.toml': data.max_tokens: expected an integer from 1 to 16,777,216, got 0",
        ),
        (
            '[model]\npositional = "rope"\n',
            r"positional: expected one of \['sinusoidal', 'learned'\]",
        ),
        ("[model\n", r"is not valid TOML"),
    ],
)
def test_bad_values(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_toml(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.toml' does not exist"):
        TrainConfig.from_toml(tmp_path / "nope.toml")


@pytest.mark.parametrize("text", ["", "\n", "# a comment only\n"])
def test_a_config_without_settings_is_refused(tmp_path, text):
    with pytest.raises(ValueError, match=r"c.toml' holds no settings \(it is empty, or only"):
        TrainConfig.from_toml(write(tmp_path, text), ["optim.max_steps=5"])


def test_a_directory_is_no_config_file(tmp_path):
    with pytest.raises(
        ValueError, match=rf"^config file '{re.escape(str(tmp_path))}' is a directory, not a TOML"
    ):
        TrainConfig.from_toml(tmp_path)


def test_a_file_that_is_not_utf8_is_named_with_the_byte_offset(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"[optim]\nmax_steps = 3\n# caf\xe9\n")
    with pytest.raises(ValueError) as info:
        TrainConfig.from_toml(path)
    message = str(info.value)
    assert message.startswith(f"config file {str(path)!r}: line 3 is not valid UTF-8"), message
    assert "byte 0xe9 at byte 6 of line 3, byte offset 27 of the file" in message


def test_a_list_of_the_right_length_is_the_tuple():
    c = TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", ["optim.betas=[0.8,0.9]"])
    assert c.optim.betas == (0.8, 0.9) and isinstance(c.optim.betas, tuple)
    assert TrainConfig.from_dict({"optim": {"betas": [0, 0.5]}}).optim.betas == (0.0, 0.5)


def test_toml_and_dict_round_trip(tmp_path):
    c = TrainConfig.from_toml(CONFIGS / "multi30k_de_en.toml", ["optim.betas=[0.8, 0.9]"])
    again = TrainConfig.from_toml(write(tmp_path, c.to_toml()))
    assert again == c
    assert TrainConfig.from_dict(c.to_dict(), allow_tokenizer_keys=True) == c


def test_with_overrides_keeps_vocab_sizes():
    c = TrainConfig()
    c.model.src_vocab_size = c.model.tgt_vocab_size = 300
    d = c.with_overrides(["optim.max_steps=3"])
    assert d.optim.max_steps == 3 and d.model.src_vocab_size == 300


def test_optim_and_data_validation():
    with pytest.raises(
        ValueError, match=r"optim.label_smoothing: expected a number in \[0.0, 1.0\)"
    ):
        OptimConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"train_src and train_tgt must name files"):
        DataConfig(corpus="")
    with pytest.raises(ValueError, match=r"give both or neither"):
        DataConfig(corpus="", train_src="a", train_tgt="b", val_src="a.txt")


def test_a_new_run_refuses_what_would_end_it_unsaved_or_be_ignored(tmp_path):
    """best_metric 'val_bleu' without BLEU was accepted, and the run died at its first
    evaluation, unsaved; files beside a named corpus were accepted and ignored. Both are
    refused by a run about to start, before its folder is made; a saved config that has them
    still reads back (runs saved before the checks resume and average), and a resumed run is
    not held to the files rule (it keeps the data it was saved with)."""
    from attnkit.training.trainer import Trainer
    from tests.helpers.lm import tiny_lm_config
    from tests.helpers.training import fast_config

    cases = [
        (fast_config('optim.best_metric="val_bleu"', "optim.val_bleu=false"),
         r"optim.best_metric='val_bleu': it needs optim.val_bleu=true"),
        (tiny_lm_config('optim.best_metric="val_bleu"', "optim.max_steps=2"),
         r"optim.best_metric='val_bleu': BLEU is for translation, not task = 'lm'"),
        (fast_config('data.corpus="multi30k"', 'data.val_src="x.de"', 'data.val_tgt="x.en"'),
         r"data.val_src='x.de': your own files are read only with corpus = \"\" \(here corpus = 'multi30k'\)"),
        (tiny_lm_config('data.corpus="shakespeare"', 'data.train_file="mine.txt"', "optim.max_steps=2"),
         r"data.train_file='mine.txt': your own files are read only with corpus"),
    ]  # fmt: skip
    for config, message in cases:  # each config read without complaint, refused at the start
        with pytest.raises(ValueError, match=message):
            Trainer(config, tmp_path / "run")
        assert not (tmp_path / "run").exists()
        TrainConfig.from_dict(config.to_dict(), allow_tokenizer_keys=True)  # as a saved one is read
    files = cases[2][0]
    files.check_new_run(resumed=True)  # resumed: the data was fixed when the run was saved
    ok = fast_config('optim.best_metric="val_bleu"', "optim.val_bleu=true")
    ok.check_new_run()


@pytest.mark.parametrize("corpus", ["foo", "Multi30k", "copy ", "shakespeare"])
def test_an_unknown_corpus_lists_every_valid_value(corpus):
    with pytest.raises(ValueError) as info:
        TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", [f"data.corpus={corpus!r}"])
    message = str(info.value)
    assert f'--set "data.corpus={corpus!r}"' in message, message
    assert "data.corpus: expected one of ['multi30k', 'copy', ''] " in message, message
    assert f"got {corpus!r}" in message
    for valid in ["multi30k", "copy", ""]:  # and the files of "" need train_src/train_tgt
        extra = ["data.train_src=a.txt", "data.train_tgt=b.txt"] if not valid else []
        items = [f"data.corpus={valid!r}", *extra]
        assert TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", items).data.corpus == valid


@pytest.mark.parametrize(
    "items,message",
    [
        (["data.src_lang=fr"], r"data.src_lang: expected one of \['de', 'en'\] for corpus "),
        (["data.tgt_lang=EN"], r"data.tgt_lang: expected one of \['de', 'en'\]"),
        (["data.src_lang=en"], r"data.src_lang and data.tgt_lang: both 'en'"),
        (["data.train_split=test"], r"data.train_split: expected one of \['train', 'val', "),
        (["data.val_split=dev"], r"data.val_split: expected one of \[.*'test2016', ''\]"),
    ],
)
def test_a_named_corpus_checks_its_languages_and_splits(items, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_toml(CONFIGS / "multi30k_de_en.toml", items)
    # The copy task has no languages or splits: the keys are not its to check.
    TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", items)


def test_optional_ffn_dropout_defaults_to_dropout_and_round_trips(tmp_path):
    c = TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", ["model.dropout=0.2"])
    assert c.model.ffn_dropout is None
    text = c.to_toml()
    assert "# ffn_dropout = (default)" in text
    assert TrainConfig.from_toml(write(tmp_path, text)) == c
    d = c.with_overrides(["model.ffn_dropout=0"])
    assert d.model.ffn_dropout == 0.0 and isinstance(d.model.ffn_dropout, float)
    with pytest.raises(ValueError, match="ffn_dropout"):
        c.with_overrides(['model.ffn_dropout="x"'])


BAD_SETS = [
    # negative, zero, boolean, string, fractional and huge sizes
    ("model.d_model=-1", r"d_model: expected an integer from 1 to"),
    ("model.d_model=0", r"d_model: expected an integer from 1 to"),
    ("model.d_model=true", r"model.d_model: expected int, got True \(bool\)"),
    ('model.d_model="64"', r"model.d_model: expected int, got '64' \(str\)"),
    ("model.d_model=64.0", r"model.d_model: expected int, got 64.0"),
    ("model.d_model=99999999999", r"d_model: expected an integer from 1 to"),
    ("model.num_heads=0", r"num_heads: expected an integer from 1 to"),
    ("model.num_heads=3", r"d_model must be a multiple of num_heads"),
    ("model.d_ff=-5", r"d_ff: expected an integer from 1 to"),
    ("model.num_encoder_layers=0", r"num_encoder_layers: expected an integer from 1 to"),
    ("model.max_len=1000000000", r"max_len: expected an integer from 1 to"),
    ("model.d_model=65536", r"parameters"),  # each size allowed, the whole model too large
    ("model.dropout=1.5", r"dropout: expected a number in \[0.0, 1.0\)"),
    ("model.dropout=nan", r"dropout: expected a number in \[0.0, 1.0\), got nan"),
    ("data.max_tokens=0", r"data.max_tokens: expected an integer from 1 to 16,777,216, got 0"),
    ("data.max_tokens=-4096", r"data.max_tokens: expected an integer from 1"),
    ("data.max_tokens=true", r"data.max_tokens: expected int, got True"),
    ("data.max_tokens=99999999999", r"data.max_tokens: expected an integer from 1 to 16,777,216"),
    ("data.max_tokens=16", r"data.max_tokens=16 must be >= the longest pair"),
    ("data.vocab_size=10", r"data.vocab_size: expected an integer from 261 to"),
    ("data.vocab_size=10000000", r"data.vocab_size: expected an integer from 261 to 1,048,576"),
    ("data.max_len=999", r"data.max_len=999 exceeds model.max_len=32"),
    ("data.seed=-1", r"data.seed: expected an integer from 0 to 4,294,967,295, got -1"),
    ("data.copy_max_len=2", r"data.copy_max_len=2 must be >= data.copy_min_len=3"),
    ("optim.max_steps=-1", r"optim.max_steps: expected an integer from 0 to"),
    ("optim.max_steps=false", r"optim.max_steps: expected int, got False"),
    ("optim.accumulation=0", r"optim.accumulation: expected an integer from 1 to 4,096"),
    ("optim.warmup_steps=0", r"optim.warmup_steps: expected an integer from 1"),
    ("optim.threads=100000", r"optim.threads: expected an integer from 0 to 4,096"),
    ("optim.lr_scale=0", r"optim.lr_scale: expected a number in \(0.0, 1000.0\]"),
    ("optim.lr_scale=inf", r"optim.lr_scale: expected a number in \(0.0, 1000.0\], got inf"),
    ("optim.max_minutes=-1", r"optim.max_minutes: expected a number in \[0.0, 10000000.0\]"),
    ("optim.max_minutes=nan", r"optim.max_minutes: expected a number in .*, got nan"),
    ("optim.betas=[0.9, 1.0]", r"optim.betas: expected a number in \[0.0, 1.0\), got 1.0"),
    ("optim.betas=[0.9]", r"optim.betas: expected a list of 2 numbers, got \[0.9\] \(1 number\)"),
    ("optim.betas=[0.9,0.98,0.5]", r"a list of 2 numbers, got \[0.9, 0.98, 0.5\] \(3 numbers\)"),
    ('optim.betas=[0.9,"x"]', r"optim.betas: expected a list of 2 numbers, got \[0.9, 'x'\]"),
    ("optim.betas=0.9", r"optim.betas: expected a list of 2 numbers, got 0.9 \(float\)"),
    ('optim.log_every="often"', r"optim.log_every: expected int, got 'often' \(str\)"),
    ("optim.val_bleu=1", r"optim.val_bleu: expected bool, got 1 \(int\)"),
    ("optim.autocast=fp8", r"optim.autocast: expected one of"),
]


@pytest.mark.parametrize("item,message", BAD_SETS, ids=[item for item, _ in BAD_SETS])
def test_bad_set_values_name_the_set_item_and_the_field(item, message):
    """Every bad ``--set`` value fails at once, naming the item it came from and the field."""
    with pytest.raises(ValueError, match=message) as info:
        TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", [item])
    assert f"--set {item!r}" in str(info.value)


@pytest.mark.parametrize(
    "item,message",
    [
        ("model.d_modl=64", r"unknown key model.d_modl; known \[model\] keys: .*'d_model'"),
        ("optim.learning_rate=0.1", r"unknown key optim.learning_rate;.*'lr_scale'"),
        ("trainer.max_steps=1", r"unknown section 'trainer'; known: \['model', 'data', 'optim'\]"),
        ("model.src_vocab_size=10", r"model.src_vocab_size: set from the tokenizer"),
        ("max_steps=1", r"expected section.key=value"),
    ],
)
def test_unknown_keys_and_sections_in_set(item, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", [item])


@pytest.mark.parametrize(
    "text,message",
    [
        ("[model]\nd_model = -8\n", r"d_model: expected an integer from 1"),
        ("[optim]\nmax_steps = -3\n", r"optim.max_steps: expected an integer from 0"),
        ("[data]\nvocab_size = true\n", r"data.vocab_size: expected int, got True"),
        ('[optim]\nthreads = "2"\n', r"optim.threads: expected int, got '2'"),
        ("[optim]\nmax_minutes = inf\n", r"optim.max_minutes: expected a number in .*, got inf"),
    ],
)
def test_bad_file_values_name_the_file_and_the_field(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as info:
        TrainConfig.from_toml(path)
    assert str(info.value).startswith(f"config file {str(path)!r}")


def test_resumed_config_errors_name_the_set_item_or_the_saved_config():
    with pytest.raises(ValueError, match=r"^--set 'optim.eps=0': optim.eps: expected a number"):
        TrainConfig().with_overrides(["optim.eps=0"], source="run/last/config.json")
    saved = TrainConfig(data=DataConfig(copy_min_len=2))
    with pytest.raises(
        ValueError, match=r"^run/last/config.json with --set 'data.copy_max_len=1': data.copy_max"
    ):
        saved.with_overrides(["data.copy_max_len=1"], source="run/last/config.json")


def test_values_at_the_bounds_are_accepted():
    c = TrainConfig.from_toml(
        CONFIGS / "tiny_copy.toml",
        ["optim.max_steps=0", "optim.patience=1", "data.vocab_size=261", "optim.threads=4096"],
    )
    assert c.optim.max_steps == 0 and c.data.vocab_size == 261
