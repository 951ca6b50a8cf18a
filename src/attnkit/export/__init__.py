"""Exporting attnkit models to other inference engines (importing this package loads neither
torch nor ctranslate2; exporting does).

    from attnkit.export import export_ctranslate2

    export_ctranslate2(None, "multi30k_ct2", quantization="int8")   # None: the shipped model

:mod:`~attnkit.export.ctranslate2` fills CTranslate2's own ``TransformerSpec`` from a
translation model folder (the ``export`` extra installs ctranslate2);
:mod:`~attnkit.export.folder` decides which folder an export may replace and writes it whole
or not at all.
"""

from attnkit.export.ctranslate2 import (
    QUANTIZATIONS,
    build_spec,
    export_ctranslate2,
    strip_end_token,
    translate_options,
)

__all__ = [
    "QUANTIZATIONS",
    "build_spec",
    "export_ctranslate2",
    "strip_end_token",
    "translate_options",
]
