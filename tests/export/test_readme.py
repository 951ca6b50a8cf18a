"""The README's lines that serve a CTranslate2 export run as written and translate as attnkit
does (float32 for both, so that the comparison is exact on every processor; the README showed
int8 once, whose output lost the final period of its own example)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from attnkit.decoding import Translator, load_translation_model, model_decoding
from attnkit.export import export_ctranslate2

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet() -> str:
    section = README.read_text(encoding="utf-8").split("### Export to CTranslate2", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_readme_lines_translate_as_attnkit(tmp_path):
    code = readme_snippet()
    assert 'compute_type="float32"' in code and "multi30k_ct2" in code
    out = export_ctranslate2(None, tmp_path / "multi30k_ct2")
    code = code.replace('"multi30k_ct2', f'"{out}')
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {})
    model, tokenizer, _ = load_translation_model(None)
    sentence = re.search(r'for line in \["(.*?)"\]', code).group(1)
    expected = Translator(model, tokenizer, model_decoding(None)).translate([sentence])
    assert printed.getvalue() == f"{expected.translations!r}\n"
    assert re.search(r"# (\[.*\])$", code.strip()).group(1) == repr(expected.translations)
