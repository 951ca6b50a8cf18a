"""Optional dependencies: imported where a feature needs them, with the pip extra to install.

The core (attention, models, training, decoding, BLEU, the HTML viewer) needs none of them;
drawing images needs matplotlib, the ``plot`` extra (``pip install 'attnkit[plot]'``).
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Imports ``module`` for ``feature``, or raises an ImportError naming the extra to install.

    Args:
        module: Dotted module name, e.g. ``"matplotlib.figure"``.
        extra: The attnkit extra that installs it, e.g. ``"plot"``.
        feature: What needs it, for the message, e.g. ``"attnkit.viz.plots"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package = module.split(".")[0]
        raise ImportError(
            f"{feature} needs {package}, which is not installed: "
            f"pip install 'attnkit[{extra}]' (or pip install {package})"
        ) from err
