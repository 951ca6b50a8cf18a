"""Sentence embeddings from token states: the pooling of a sentence-transformers folder.

A sentence-transformers checkpoint is a Hugging Face model folder plus a few small files:
``modules.json`` lists the pipeline (Transformer -> Pooling -> Normalize),
``1_Pooling/config.json`` says which pooling, and ``Normalize`` (a module without files) asks
for unit-length vectors. :meth:`Pooling.from_folder` reads them; a plain model folder without
them gets sentence-transformers' own default, mean pooling without normalisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit import model_folder

MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")  # sentence-transformers' names
# The boolean keys of older 1_Pooling/config.json files, in sentence-transformers' order.
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"


@dataclass(frozen=True)
class Pooling:
    """How token states (B, T, D) become one vector per sentence.

    Args:
        modes: one or more of :data:`MODES`; several are concatenated in this order.
        normalize: scale each sentence vector to unit L2 norm.
    """

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if not self.modes or bad:
            raise ValueError(
                f"pooling modes: expected one or more of {list(MODES)}, got {self.modes}"
            )

    def __call__(self, hidden: Tensor, mask: Tensor, *, normalize: bool | None = None) -> Tensor:
        """Pool ``hidden`` (B, T, D) over the real tokens of ``mask`` (B, T), True = real token.

        Returns:
            (B, D * len(modes)) in float32 (sums over tokens are not done in half precision).
        """
        hidden = hidden.float()
        keep = mask.to(torch.bool).unsqueeze(-1)  # (B, T, 1)
        # The same floor as sentence-transformers, so an empty row gives 0, not NaN.
        count = keep.sum(dim=1).to(hidden.dtype).clamp(min=1e-9)  # (B, 1)
        parts = []
        for mode in self.modes:
            if mode == "cls":
                parts.append(hidden[:, 0])  # (B, D)
            elif mode == "max":
                filled = hidden.masked_fill(~keep, torch.finfo(hidden.dtype).min)
                parts.append(filled.amax(dim=1))  # (B, D)
            else:
                total = (hidden * keep).sum(dim=1)  # (B, D)
                parts.append(total / (count if mode == "mean" else count.sqrt()))
        out = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        if self.normalize if normalize is None else normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    @classmethod
    def from_folder(cls, folder: str | Path) -> Pooling:
        """The pooling a model folder asks for (module docstring); mean pooling by default."""
        folder = Path(folder)
        modules_file = folder / "modules.json"
        if not modules_file.is_file():
            return cls()
        modules = _read_modules(modules_file)
        pooling, normalize = cls(), False
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind == _POOLING:
                where = folder / module.get("path", "")
                config = model_folder.read_json(
                    where / "config.json", what="sentence-transformers pooling config"
                )
                pooling = cls._from_config(config, where)
            elif kind == _NORMALIZE:
                normalize = True
            elif kind != _TRANSFORMER:
                raise ValueError(
                    f"{modules_file}: module {module.get('type')!r} is not supported; attnkit "
                    f"understands {[_TRANSFORMER, _POOLING, _NORMALIZE]}"
                )
        return cls(pooling.modes, normalize)

    @classmethod
    def _from_config(cls, config: dict, where: Path) -> Pooling:
        if "pooling_mode" in config:  # sentence-transformers >= 6: a name or a list of names
            mode = config["pooling_mode"]
            modes = (mode,) if isinstance(mode, str) else tuple(mode)
        else:
            modes = tuple(mode for key, mode in _LEGACY_KEYS.items() if config.get(key))
        unsupported = [m for m in modes if m not in MODES]
        if unsupported:
            raise ValueError(
                f"{where}: pooling modes {unsupported} are not supported; expected {list(MODES)}"
            )
        if not modes:
            raise ValueError(
                f"{where / 'config.json'}: no pooling mode set; expected pooling_mode or one of "
                f"{list(_LEGACY_KEYS)} true"
            )
        return cls(modes)


def _read_modules(path: Path) -> list[dict]:
    """The module list of ``modules.json``, a JSON list of objects (errors name the file)."""
    modules = model_folder.read_json(path, what="sentence-transformers modules.json", expect=list)
    if not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{path}: expected a JSON list of module objects [{{...}}, ...]")
    return modules
