"""A GPT's causal self-attention: captured weights equal Hugging Face's, labels come from the
tokenizer, and `attnkit attention --model GPT_DIR` draws them in the viewer."""

import json
import re

import pytest
import torch
import transformers

from attnkit.cli import main
from attnkit.viz import capture_gpt  # exported beside capture_bert and capture_translation
from tests.helpers.generation import byte_bpe, load_pair

TEXT = "the quick brown fox, 你好"
DATA = re.compile(r'<script id="attnkit-data" type="application/json">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2_attn")
    hf, gpt = load_pair(folder, byte_bpe())
    return hf, gpt, folder


def test_weights_equal_hugging_face(pair):
    _, gpt, folder = pair
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    maps = capture_gpt(gpt, None, TEXT)
    ids = gpt.tokenizer.encode(TEXT)
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids]), output_attentions=True).attentions
    assert maps.model_type == "gpt" and maps.kinds == ["encoder"]
    assert len(maps.encoder) == len(theirs) == 2
    for ours, ref in zip(maps.encoder, theirs, strict=True):
        assert ours.shape == (4, len(ids), len(ids))
        torch.testing.assert_close(ours, ref[0].float(), rtol=1e-4, atol=1e-5)
        assert torch.equal(ours.triu(1), torch.zeros_like(ours))  # causal: no future column


def test_labels_are_the_tokens(pair):
    _, gpt, _ = pair
    text = "the quick brown fox"
    maps = capture_gpt(gpt, None, text)
    ids = gpt.tokenizer.encode(text)
    assert len(maps.src_tokens) == len(ids) > 4  # the tiny BPE splits some words
    # a word start is shown without its space, a piece inside a word with "##"
    assert not maps.src_tokens[0].startswith("##")
    assert (
        "".join(t[2:] if t.startswith("##") else " " + t for t in maps.src_tokens).strip() == text
    )
    assert maps.axes("encoder") == (maps.src_tokens, maps.src_tokens)
    assert maps.kind_label("encoder") == "GPT causal self-attention"


def test_the_viewer_page_of_a_gpt_is_titled_so(pair):
    """render_html titled a GPT's page "Translation attention"."""
    from attnkit.viz import render_html

    page = render_html(capture_gpt(pair[1], None, "the quick brown fox"))
    assert "<title>GPT attention</title>" in page
    assert json.loads(DATA.search(page).group(1))["title"] == "GPT attention"


def test_select_names_a_bad_layer_or_head_as_the_api_takes_it(pair):
    maps = capture_gpt(pair[1], None, "the quick brown fox")
    with pytest.raises(ValueError, match=r"^layer: expected 0 <= layer <= 1 .*got True$"):
        maps.select("encoder", True)  # a bool is no layer number (it was layer 1)
    with pytest.raises(ValueError, match=r"'mean', or None for all heads, got 4$"):
        maps.select("encoder", 0, 4)


def test_bad_text(pair):
    with pytest.raises(ValueError, match="text"):
        capture_gpt(pair[1], None, "  ")
    with pytest.raises(TypeError, match=r"^text: expected a str, got bytes$"):
        capture_gpt(pair[1], None, b"the cat")
    with pytest.raises(TypeError, match=r"tokenizer: expected a tokenizer object.*'gpt2'"):
        capture_gpt(pair[1], "gpt2", "the cat")


def test_attention_command_on_a_gpt_folder(pair, tmp_path, capsys):
    _, gpt, folder = pair
    out = tmp_path / "gpt.html"
    assert main(["attention", "--model", str(folder), TEXT, "--out", str(out)]) == 0
    data = json.loads(DATA.search(out.read_text(encoding="utf-8")).group(1))
    assert [k["id"] for k in data["kinds"]] == ["encoder"]
    assert data["initial"]["layer"] == 1
    assert "GPT" in out.read_text(encoding="utf-8")
    assert "wrote" in capsys.readouterr().err
    png = tmp_path / "gpt.png"
    assert (
        main(["attention", "--model", str(folder), TEXT, "--head", "mean", "--out", str(png)]) == 0
    )
    assert png.stat().st_size > 0
    capsys.readouterr()
    for flags in (["--beam", "3"], ["--target", "x"]):  # before: --beam silently ignored
        assert main(["attention", "--model", str(folder), TEXT, *flags, "--out", str(png)]) == 2
        assert capsys.readouterr().err == (
            f"attnkit attention: error: {flags[0]}: only for translation models; this is a GPT "
            "model\n"
        )


def test_attention_command_on_a_gpt_folder_without_a_tokenizer(pair, tmp_path, capsys):
    """The CLI names the folder and the missing file (the library's "pass one" advice is for
    Python callers, who can pass a tokenizer; a command-line user cannot)."""
    import shutil

    folder = tmp_path / "no_tokenizer"
    shutil.copytree(pair[2], folder)
    (folder / "tokenizer.json").unlink()
    out = tmp_path / "x.html"
    assert main(["attention", "--model", str(folder), TEXT, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--model {str(folder)!r}: no tokenizer.json" in err and "pass one" not in err
    assert not out.exists()


def test_attention_command_on_a_llama_folder(tmp_path):
    """A Llama folder (grouped-query attention: 4 query heads share 2 key/value heads; rotary
    positions): the viewer shows every query head, the weights Hugging Face eager returns."""
    from attnkit.pretrained_loading import load_pretrained
    from tests.helpers.generation import tiny_llama_config
    from tests.helpers.gpt import write_hf_llama_folder

    folder = tmp_path / "llama"
    hf = write_hf_llama_folder(folder, tiny_llama_config(), byte_bpe())
    loaded = load_pretrained(folder)
    maps = capture_gpt(loaded.model, None, TEXT)
    ids = loaded.tokenizer.encode(TEXT)
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids]), output_attentions=True).attentions
    assert len(maps.encoder) == len(theirs) == 2
    for ours, ref in zip(maps.encoder, theirs, strict=True):
        assert ours.shape == (4, len(ids), len(ids))
        torch.testing.assert_close(ours, ref[0].float(), rtol=1e-4, atol=1e-5)
    out = tmp_path / "llama.html"
    assert main(["attention", "--model", str(folder), TEXT, "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    data = json.loads(DATA.search(page).group(1))
    assert [k["id"] for k in data["kinds"]] == ["encoder"] and "Llama attention" in page
