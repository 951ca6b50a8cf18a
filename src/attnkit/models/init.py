"""Building a model whose parameters a checkpoint will overwrite, without drawing them first.

:func:`skip_random_init` is used by every ``from_pretrained`` (BERT, GPT-2): random init of
bert-base takes seconds on a small CPU and the checkpoint overwrites every parameter anyway.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = ["skip_random_init"]


class _SkipRandomInit(TorchFunctionMode):
    """Skips the random fills of module constructors (thread-local, unlike patching nn.init).

    Building on the meta device instead would be free, but ``normal_`` on meta tensors
    imports torch._dynamo, which costs more than the init itself.
    """

    _SKIPPED = {
        nn.init.normal_,
        nn.init.uniform_,
        nn.init.kaiming_uniform_,
        Tensor.normal_,
        Tensor.uniform_,
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if (
            func in self._SKIPPED
        ):  # nn.init passes the tensor by keyword, Tensor methods by position
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def skip_random_init() -> TorchFunctionMode:
    """A context manager under which modules are built with uninitialised parameters (the
    random fills ``normal_``, ``uniform_`` and ``kaiming_uniform_`` are skipped; constant
    fills such as LayerNorm's ones stay). Use it only when every parameter is loaded next::

        with skip_random_init():
            model = BertModel(config)
        load_state_dict_into(model, state, source=path)
    """
    return _SkipRandomInit()
