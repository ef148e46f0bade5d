"""The private torch APIs this package reads, in one place: each is detected at import, with a fallback on public API.

Every entry exists in all torch releases the package supports (pyproject's range: 2.13.0 and 2.14.1 are tested); the
fallbacks keep the package working, more slowly or less completely, if a release drops one.

- ``nn.Module._parameters`` / ``_buffers``: the dicts ``nn.Module.__getattr__`` reads (every torch release). The
  recurrent module reads them directly in ``forward`` (an attribute lookup costs about half a microsecond, which a
  small recurrent node notices), and the fast path's ``FastWeights`` holds the nn.LSTM/GRU/RNN's parameter dict
  because Dynamo refuses to trace into those modules. Fallback: a view that looks each name up with ``getattr``
  (slower; Dynamo may then refuse the fast path's module under torch.compile).
- ``nn.RNNBase._flat_weights_names``: the names of torch's flat RNN weights in kernel order (torch >= 1.4).
  Fallback: ``named_parameters(recurse=False)``, which nn.RNNBase registers in that same order.
- ``torch.fx.graph._custom_builtins``: the globals fx-generated code uses without importing (``inf``, ``nan``,
  ``NoneType``, ``torch``, ``device``, the pytree modules) and the statement that defines each (torch >= 1.8).
  Fallback: that table as torch 2.13 has it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import Tensor, fx, nn


class _AttributeView(Mapping):
    """A module's parameters or buffers by name, looked up through the public attribute access (names registered as
    None are readable but not listed: the public API does not list them)."""

    def __init__(self, module: nn.Module, names: Iterable[str]):
        self.module, self.names = module, tuple(names)

    def __getitem__(self, name: str) -> Tensor | None:  # also a name registered as None, which iteration skips
        try:
            return getattr(self.module, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


_HAS_TENSOR_DICTS = all(hasattr(nn.Module(), name) for name in ("_parameters", "_buffers"))


def parameter_dict(module: nn.Module) -> Mapping[str, Tensor | None]:
    """The module's own parameters by name (None where one is registered as absent), live: a parameter replaced
    later is seen."""
    if _HAS_TENSOR_DICTS:
        return module._parameters
    return _AttributeView(module, (name for name, _ in module.named_parameters(recurse=False)))


def buffer_dict(module: nn.Module) -> Mapping[str, Tensor | None]:
    """The module's own buffers by name, live (see ``parameter_dict``)."""
    if _HAS_TENSOR_DICTS:
        return module._buffers
    return _AttributeView(module, (name for name, _ in module.named_buffers(recurse=False)))


def flat_weight_names(rnn: nn.RNNBase) -> tuple[str, ...]:
    """The names of an nn.LSTM/GRU/RNN's weights in the order torch's RNN kernels take them."""
    names = getattr(rnn, "_flat_weights_names", None)
    if names is None:
        return tuple(name for name, _ in rnn.named_parameters(recurse=False))
    return tuple(names)


_FX_BUILTINS_FALLBACK = {
    "inf": "from math import inf",
    "nan": "from math import nan",
    "NoneType": "NoneType = type(None)",
    "torch": "import torch",
    "device": "from torch import device",
    "fx_pytree": "import torch.fx._pytree as fx_pytree",
    "pytree": "import torch.utils._pytree as pytree",
}


def fx_builtin_imports() -> dict[str, str]:
    """For each global that fx-generated code uses without defining it: the statement that defines it."""
    builtins = getattr(fx.graph, "_custom_builtins", None)
    if builtins is None:
        return dict(_FX_BUILTINS_FALLBACK)
    return {name: builtin.import_str for name, builtin in builtins.items()}
