"""attnkit.viz.html: one self-contained page, checked as text and in headless Chromium.

The browser tests need Debian's ``chromium`` (scripts/setup.sh installs it); without it they
fail, they do not skip. Chromium's --dump-dom prints the page after its script has run; the
viewer writes a summary of what it drew into ``#viewer``'s data attributes, and the URL hash
selects the view (``#kind=encoder&layer=0&head=1&row=2``).
"""

import dataclasses
import html
import json
import re
import shutil
import subprocess

import pytest
import torch

from attnkit.viz import render_html, write_html
from tests.helpers.viz import assert_image

DATA = re.compile(r'<script id="attnkit-data" type="application/json">(.*?)</script>', re.S)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
]


def _data(page: str) -> dict:
    return json.loads(DATA.search(page).group(1))


# --------------------------------------------------------------------------- the file


def test_self_contained(translation_maps):
    page = render_html(translation_maps)
    lowered = page.lower()
    for needle in ("http:", "https:", "//cdn", "src=", "<link", "@import", "url(", "xmlns"):
        assert needle not in lowered, needle
    assert "default-src 'none'" in page  # the browser may not fetch anything either
    assert lowered.count("<script") == 2 and lowered.count("</script>") == 2


def test_data_round_trip(translation_maps):
    m = translation_maps
    data = _data(render_html(m, kind="decoder", layer=0, head="mean"))
    assert data["initial"] == {"kind": "decoder", "layer": 0, "head": "mean"}
    assert [k["id"] for k in data["kinds"]] == ["encoder", "decoder", "cross"]
    for entry in data["kinds"]:
        rows, cols = m.axes(entry["id"])
        assert entry["rows"] == rows and entry["cols"] == cols
        got = torch.tensor(entry["layers"], dtype=torch.float64)  # (L, H, T_q, T_k)
        expected = torch.stack(m.layers(entry["id"]))
        torch.testing.assert_close(got, expected.double(), atol=5e-5, rtol=0)
    assert data["subtitle"] == f"{m.source} \u2192 {m.target}"


def test_defaults_and_bert(bert_maps):
    data = _data(render_html(bert_maps))
    assert data["initial"] == {"kind": "encoder", "layer": 5, "head": 0}  # the last layer
    assert data["title"] == "BERT attention" and data["kinds"][0]["label"] == "BERT self-attention"


def test_text_cannot_break_out_of_the_page(translation_maps):
    evil = "</script><script>alert(1)</script><!--"
    maps = dataclasses.replace(
        translation_maps, src_tokens=[evil, *translation_maps.src_tokens[1:]]
    )
    page = render_html(maps, title="<b>x</b> & __ATTNKIT_SCRIPT__")
    assert "alert(1)</script>" not in page and "<!--" not in page
    assert page.lower().count("</script>") == 2
    assert "<title>&lt;b&gt;x&lt;/b&gt; &amp; __ATTNKIT_SCRIPT__</title>" in page
    data = _data(page)
    assert data["kinds"][0]["rows"][0] == evil and data["title"].endswith("__ATTNKIT_SCRIPT__")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "cross"}, "kind: expected one of ['encoder']"),
        ({"layer": 6}, "0 <= layer <= 5"),
        ({"head": 12}, "0 <= head <= 11"),
    ],
)
def test_bad_first_view(bert_maps, kwargs, message):
    with pytest.raises(ValueError) as err:
        render_html(bert_maps, **kwargs)
    assert message in str(err.value)


# --------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "chromium not found: the HTML viewer tests open the page in Debian's headless "
            "chromium; install it with `apt-get install -y chromium` (scripts/setup.sh does)"
        )
    profile = tmp_path_factory.mktemp("chromium-profile")

    def run(url: str, *extra: str) -> str:
        result = subprocess.run(
            [path, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    return run


def _summary(dom: str) -> dict:
    tag = re.search(r'<div id="viewer"([^>]*)>', dom)
    assert tag, "no #viewer in the dumped page"
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', tag.group(1)))


def test_viewer_renders_and_follows_the_head(chromium, tmp_path, translation_maps):
    m = translation_maps
    page = write_html(m, tmp_path / "attn.html")
    url = page.resolve().as_uri()
    first = _summary(chromium(url + "#kind=encoder&layer=0&head=0", "--dump-dom"))
    dom = chromium(url + "#kind=encoder&layer=0&head=1&row=2", "--dump-dom")
    second = _summary(dom)
    s = len(m.src_tokens)
    for summary, head in ((first, "0"), (second, "1")):
        assert (summary["kind"], summary["layer"], summary["head"]) == ("encoder", "0", head)
        assert int(summary["cells"]) == s * s
        assert int(summary["nonblank"]) > s * s // 2  # softmax weights: coloured cells
        assert float(summary["sum"]) == pytest.approx(s, abs=1e-2)  # every row sums to 1
    assert first["checksum"] != second["checksum"]  # another head, another picture

    # Hovering row 2 lists what that token attends to, most first.
    assert second["hover"] == "row:2"
    weights = m.select("encoder", 0, 1)[2]
    listed = re.search(r'<table id="top">(.*?)</table>', dom, re.S).group(1)
    first_token = re.search(r"<td>(.*?)</td>", listed).group(1)
    assert html.unescape(first_token) == m.src_tokens[int(weights.argmax())]


def test_viewer_screenshot_is_not_blank(chromium, tmp_path, translation_maps):
    page = write_html(translation_maps, tmp_path / "attn.html")
    shot = tmp_path / "shot.png"
    url = page.resolve().as_uri() + "#kind=cross&layer=1&head=mean&row=1"
    chromium(url, f"--screenshot={shot}", "--window-size=900,600")
    assert_image(shot)


def test_what_is_not_a_capture_is_named():
    """Before: AttributeError: 'dict' object has no attribute 'kinds'."""
    from attnkit.viz import render_html

    with pytest.raises(TypeError, match=r"^maps: expected an AttentionMaps .*, got dict$"):
        render_html({})


def test_write_html_refuses_an_image_name(translation_maps, tmp_path):
    """It wrote the HTML page into x.png, which no image viewer opens."""
    with pytest.raises(
        ValueError, match=r"^out: expected a file ending in .html or .htm, got '.*x.png'"
    ):
        write_html(translation_maps, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
    assert write_html(translation_maps, tmp_path / "x.HTML").is_file()
