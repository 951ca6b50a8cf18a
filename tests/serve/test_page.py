"""The web page at GET / in a real browser: Debian's chromium driven by Playwright (no browser
download: ``executable_path``), at phone width, against a real server.

It loads the page, translates a sentence (the answer is the offline translation), finds the
cross-attention heatmap of the viewer in its frame, streams a generation (its text is
generate_text's), checks that nothing was fetched from elsewhere and nothing logged an error
(a Content-Security-Policy violation would), and takes a screenshot that must not be blank.
Without chromium the test fails with how to install it; it does not skip.
"""

import shutil

import pytest
from playwright.sync_api import sync_playwright

from attnkit.decoding import Translator, model_decoding
from attnkit.generation import GenerationConfig, generate_text
from attnkit.serve import LoadedModels, ServeSettings, create_app
from tests.helpers.serve import DEADLINE, ThreadedServer
from tests.helpers.viz import assert_image

SENTENCE = "Zwei Hunde spielen im Schnee."
PROMPT = "the cat"
PHONE = {"width": 390, "height": 844}
WAIT_MS = DEADLINE * 1000


@pytest.fixture(scope="module")
def browser():
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "chromium not found: the web page test drives Debian's chromium; install it with "
            "`apt-get install -y chromium` (scripts/setup.sh does)"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=path, args=["--no-sandbox", "--disable-gpu", "--disable-quic"]
        )
        yield browser
        browser.close()


def test_page_translates_draws_the_heatmap_and_streams(browser, models, tmp_path):
    served = LoadedModels(models.translation, None, models.gpt, models.folders)
    app = create_app(ServeSettings(), models=served)
    translation = Translator(models.translation.model, models.translation.tokenizer,
                             model_decoding(models.translation.path)).translate([SENTENCE]).translations[0]  # fmt: skip
    (generated,) = generate_text(models.gpt, None, [PROMPT], GenerationConfig(max_new_tokens=30))

    with ThreadedServer(app) as server:
        page = browser.new_page(viewport=PHONE, device_scale_factor=1)
        requests, problems = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(server.url + "/")
        # (selectors, not wait_for_function: the page's CSP forbids the eval that needs)
        page.wait_for_selector("#status:text-matches('^Ready')", timeout=WAIT_MS)

        # Translate, then find the heatmap of the translation in the viewer's frame.
        page.fill("#source", SENTENCE)
        page.click("#translate-button")
        page.wait_for_selector("body[data-translate=done]", timeout=WAIT_MS)
        assert page.text_content("#translation") == translation
        frame = page.frame_locator("#viewer-frame")
        viewer = frame.locator("#viewer")
        viewer.wait_for(timeout=WAIT_MS)
        frame.locator("#heatmap .cell").first.wait_for(timeout=WAIT_MS)
        assert viewer.get_attribute("data-kind") == "cross"
        assert viewer.get_attribute("data-head") == "mean"
        rows, cols = int(viewer.get_attribute("data-rows")), int(viewer.get_attribute("data-cols"))
        assert frame.locator("#heatmap .cell").count() == rows * cols > 0
        assert int(viewer.get_attribute("data-nonblank")) > 0
        assert translation in frame.locator("#subtitle").text_content()

        # Stream a generation.
        page.fill("#prompt", PROMPT)
        page.fill("#max-new-tokens", "30")
        page.fill("#temperature", "0")
        page.click("#generate-button")
        page.wait_for_selector("body[data-generate=done]", timeout=WAIT_MS)
        text = page.evaluate("document.getElementById('generated-text').textContent")
        assert text == generated.text
        assert int(page.evaluate("document.body.dataset.pieces")) > 1  # it came in pieces

        # Phone width: nothing wider than the screen; nothing fetched elsewhere; no errors.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a phone"
        foreign = [u for u in requests if not u.startswith((server.url, "about:", "data:"))]
        assert not foreign, foreign
        assert not problems, problems
        shot = tmp_path / "page.png"
        page.screenshot(path=str(shot), full_page=True)

        # The OpenAPI page renders every endpoint offline too.
        page.goto(server.url + "/docs")
        page.locator(".opblock").first.wait_for(timeout=WAIT_MS)
        shown = " ".join(page.locator(".opblock-summary-path").all_text_contents())
        for path in ("/v1/translate", "/v1/embed", "/v1/attention", "/v1/generate"):
            assert path in shown, shown
        foreign = [u for u in requests if not u.startswith((server.url, "about:", "data:"))]
        assert not foreign, foreign
        page.close()
    assert_image(shot)
