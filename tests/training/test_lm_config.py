"""The training config of a language model: ``task = "lm"``, a GPTConfig [model], an
LMDataConfig [data], the cosine schedule's keys, and what a resume may change."""

from __future__ import annotations

import pytest

from attnkit.models import GPTConfig
from attnkit.training.config import OptimConfig, TrainConfig, check_resume
from attnkit.training.lm_config import LMDataConfig
from tests.helpers.lm import TINY_LM, tiny_lm_config
from tests.helpers.training import CONFIGS


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_task_lm_reads_a_gpt_model_and_lm_data(tmp_path):
    c = TrainConfig.from_toml(
        write(
            tmp_path, 'task = "lm"\n[model]\nd_model = 64\nnum_heads = 4\n[data]\nbatch_size = 8\n'
        )
    )
    assert c.task == "lm" and isinstance(c.model, GPTConfig) and isinstance(c.data, LMDataConfig)
    assert c.model.d_model == 64 and c.data.batch_size == 8 and c.data.corpus == "shakespeare"
    assert c.context_length == c.model.context_length  # data.context_length 0 = the model's


def test_translation_stays_the_default_task(tmp_path):
    c = TrainConfig.from_toml(write(tmp_path, "[model]\nd_model = 64\n"))
    assert c.task == "translation" and c.to_dict()["task"] == "translation"


def test_round_trips_through_toml_and_dict(tmp_path):
    c = tiny_lm_config("optim.max_steps=5", "data.tokenizer=bpe", "data.vocab_size=300")
    assert TrainConfig.from_toml(write(tmp_path, c.to_toml())) == c
    assert TrainConfig.from_dict(c.to_dict(), allow_tokenizer_keys=True) == c
    assert c.to_toml().startswith('task = "lm"\n')


@pytest.mark.parametrize(
    "text,message",
    [
        ('task = "mt"\n', r"c.toml'?: task: expected one of \['translation', 'lm'\], got 'mt'"),
        (
            'task = "lm"\n[model]\nnum_encoder_layers = 2\n',
            r"unknown key\(s\) \['model.num_encoder",
        ),
        ('task = "lm"\n[data]\nsrc_lang = "de"\n', r"unknown key\(s\) \['data.src_lang'\]"),
        ('task = "lm"\n[model]\nd_model = -4\n', r"c.toml'?: d_model: expected an integer from 1"),
        ('task = "lm"\n[model]\nnum_heads = 5\n', r"d_model must be a multiple of num_heads"),
        ('task = "lm"\n[model]\ndropout = 1.5\n', r"c.toml'?: dropout: expected a number in"),
        ('task = "lm"\n[model]\nvocab_size = 65\n', r"model.vocab_size: set from the tokenizer"),
        ('task = "lm"\n[model]\nbos_token_id = 3\n', r"model.bos_token_id: set from the token"),
        ('task = "lm"\n[model]\npositional = "sinusoidal"\n', r"a GPT-2 folder holds learned"),
        ('task = "lm"\n[data]\ntokenizer = "word"\n', r"data.tokenizer: expected one of"),
        ('task = "lm"\n[data]\nbatch_size = 0\n', r"data.batch_size: expected an integer from 1"),
        ('task = "lm"\n[data]\nvocab_size = 100\n', r"data.vocab_size: expected an integer from"),
        ('task = "lm"\n[data]\ncorpus = ""\n', r"train_file must name a text file"),
        (
            'task = "lm"\n[data]\ncorpus = "multi30k"\n',
            r"data.corpus: expected one of \['shakespeare', ''\] \('' = your own text, "
            r"train_file and val_file\), got 'multi30k'",
        ),
        (
            'task = "lm"\n[model]\ncontext_length = 64\n[data]\ncontext_length = 65\n',
            r"data.context_length=65 exceeds model.context_length=64",
        ),
        ('task = "lm"\n[optim]\nval_bleu = true\n', r"BLEU is for translation"),
        ('task = "lm"\n[optim]\nschedule = "linear"\n', r"optim.schedule: expected one of"),
        ('task = "lm"\n[optim]\nmin_lr = 0.1\npeak_lr = 0.01\n', r"optim.min_lr: expected a"),
    ],
)
def test_bad_lm_values_name_the_file_and_the_field(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_toml(write(tmp_path, text))


def test_overrides_know_the_lm_sections():
    c = tiny_lm_config("data.tokenizer=bpe", "model.d_model=64", "optim.peak_lr=0.01")
    assert (c.data.tokenizer, c.model.d_model, c.optim.peak_lr) == ("bpe", 64, 0.01)
    with pytest.raises(ValueError, match=r"unknown key data.max_tokens"):
        tiny_lm_config("data.max_tokens=10")


def test_bpe_vocabulary_is_checked_with_the_model_before_training(tmp_path):
    model = "[model]\nd_model = 8192\nnum_heads = 8\nd_ff = 8192\nnum_layers = 1\n"
    ok = TrainConfig.from_toml(write(tmp_path, f'task = "lm"\n{model}'))
    assert ok.model.vocab_size == 50257
    data = '[data]\ntokenizer = "bpe"\nvocab_size = 1048576\n'
    with pytest.raises(ValueError, match=r"data.vocab_size=1048576: .*parameters"):
        TrainConfig.from_toml(write(tmp_path, f'task = "lm"\n{model}{data}'))


def test_sections_must_match_the_task():
    with pytest.raises(TypeError, match=r"task 'lm' needs a GPTConfig"):
        TrainConfig(task="lm")
    with pytest.raises(ValueError, match=r"schedule: expected one of"):
        OptimConfig(schedule="step")


@pytest.mark.parametrize(
    "item,allowed",
    [
        ("model.dropout=0.3", True),
        ("model.embed_dropout=0.3", True),
        ("optim.peak_lr=0.01", True),
        ("data.batch_size=16", True),
        ("data.seed=9", True),
        ("model.d_model=64", False),
        ("model.context_length=32", False),
        ("data.tokenizer=bpe", False),
        ("data.max_train_chars=99", False),
        ("data.corpus=", False),
    ],
)
def test_resume_may_change_what_keeps_weights_and_tokenizer(item, allowed):
    saved = tiny_lm_config()
    # The saved config has the tokenizer's keys filled in; a new one does not: no conflict.
    saved.model.vocab_size, saved.model.bos_token_id = 70, 0
    try:
        # a train_file beside a named corpus is refused (it was ignored): only with corpus ""
        new = tiny_lm_config(item, *(["data.train_file=x.txt"] if "corpus" in item else []))
    except ValueError:
        pytest.fail(item)
    new.data.train_file = saved.data.train_file if "corpus" not in item else "x.txt"
    if allowed:
        check_resume(saved, new, "runs/x/last/config.json")
    else:
        key = item.partition("=")[0]
        with pytest.raises(ValueError, match=rf"cannot change {key} = .* runs/x/last/config"):
            check_resume(saved, new, "runs/x/last/config.json")


def test_resume_may_not_change_the_task():
    translation = TrainConfig.from_toml(CONFIGS / "tiny_copy.toml")
    with pytest.raises(ValueError, match=r"cannot change task = 'translation' \(the run has 'lm'"):
        check_resume(tiny_lm_config(), translation, "c.json")


def test_tiny_lm_helper_is_a_valid_dict():
    assert TrainConfig.from_dict(TINY_LM).task == "lm"


@pytest.mark.parametrize("name,tokenizer", [("char", "char"), ("bpe", "bpe")])
def test_shipped_shakespeare_configs_read(name, tokenizer):
    c = TrainConfig.from_toml(CONFIGS / f"shakespeare_{name}_gpt.toml")
    assert c.task == "lm" and c.data.tokenizer == tokenizer and c.data.corpus == "shakespeare"
    assert c.optim.schedule == "cosine" and c.optim.max_minutes == 60
