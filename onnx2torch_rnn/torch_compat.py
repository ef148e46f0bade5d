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
- ``torch.fx.graph_module._forward_from_src`` and ``_deserialize_graph_module(..., graph_module_cls)``: fx's
  unpickling of a GraphModule (``reduce_graph_module``) made to build a converted graph's own class (executor.Graph,
  whose forward keeps its wrapper; torch >= 2.2). Fallback: ``reduce_graph_module`` (a plain GraphModule: the same
  numbers, without the wrapper's fast calls).
- ``torch.while_loop`` (public since 2.13, a prototype; before that ``torch._higher_order_ops.while_loop``): the
  structured loop that Loop and Scan become while compiling or exporting. Fallback: none (None), and those modules
  then say that this torch cannot compile them in one graph.
- ``torch.fx.experimental.proxy_tensor.disable_proxy_modes_tracing``: runs a function on torch.export's fake tensors
  without recording it, to learn the shapes of a loop body's outputs before the loop (torch >= 2.0). Fallback: run
  it recorded (the result is unused but for its shape, so it only costs one body evaluation, unless dead code
  elimination drops it).
- ``torch.fx.experimental.symbolic_shapes.guard_or_false``: whether a traced size is 0 without failing on a size
  that tracing cannot know (a compiled loop's iteration count): then not 0, checked at run time (torch >= 2.7).
  Fallback: ``size == 0``, which fails on such sizes as torch did before.
- ``torch.fx.experimental.symbolic_shapes.statically_known_true``: whether a condition on traced sizes holds for
  every size, without a guard (a pad amount computed from sizes that may be 0). Fallback: ``bool``, which guards.
- ``torch._dynamo.graph_break(msg=...)``: where a control-flow node has no structured form, compiling breaks the
  graph there with the reason (fullgraph=True turns it into an error that shows it). Fallback: no break is forced;
  Dynamo then stops at the first data-dependent value of the Python path, with its own message.
- ``torch._ops.OpOverload._op``: the C++ callable an op overload's ``__call__`` wraps in a Python frame (a quarter
  microsecond, which a small int8 node's eager call notices; torch >= 1.13). Fallback: the overload itself.
- ``torch.ops.mkldnn._reorder_convolution_weight`` / ``_convolution_pointwise``: oneDNN's convolution on a weight
  reordered once into its blocked layout (what inductor's freezing uses; x86 builds of torch >= 2.1). Fallback: None
  (the inference path of a convolution then runs torch's own, which reorders the weight on every call).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import torch
from torch import Tensor, fx, nn
from torch.nn.modules import module as module_internals


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


def has_forward_hooks(module: nn.Module) -> bool:
    """Whether calling the module runs forward hooks (its own or global ones): a caller that skips
    nn.Module.__call__ for speed must call the module when it does. Internals not found: assume hooks."""
    try:
        return bool(module._forward_hooks or module._forward_pre_hooks or module_internals._global_forward_hooks
                    or module_internals._global_forward_pre_hooks)
    except AttributeError:
        return True


def op_callable(overload: Callable) -> Callable:
    """What calling the op overload runs, without its Python ``__call__`` (eager calls only: the native kernel's ops
    are never traced)."""
    return getattr(overload, "_op", overload)


def flat_weight_names(rnn: nn.RNNBase) -> tuple[str, ...]:
    """The names of an nn.LSTM/GRU/RNN's weights in the order torch's RNN kernels take them."""
    names = getattr(rnn, "_flat_weights_names", None)
    if names is None:
        return tuple(name for name, _ in rnn.named_parameters(recurse=False))
    return tuple(names)


_FX_BUILTINS_FALLBACK = MappingProxyType({
    "inf": "from math import inf",
    "nan": "from math import nan",
    "NoneType": "NoneType = type(None)",
    "torch": "import torch",
    "device": "from torch import device",
    "fx_pytree": "import torch.fx._pytree as fx_pytree",
    "pytree": "import torch.utils._pytree as pytree",
})


def fx_builtin_imports() -> dict[str, str]:
    """For each global that fx-generated code uses without defining it: the statement that defines it."""
    builtins = getattr(fx.graph, "_custom_builtins", None)
    if builtins is None:
        return dict(_FX_BUILTINS_FALLBACK)
    return {name: builtin.import_str for name, builtin in builtins.items()}


def unpickle_graph_module(body: dict, import_block: str, cls: type) -> fx.GraphModule:
    """fx's ``reduce_graph_module(body, import_block)`` (what a pickled GraphModule calls), as a ``cls``."""
    from torch.fx import graph_module

    forward_from_src = getattr(graph_module, "_forward_from_src", None)
    deserialize = getattr(graph_module, "_deserialize_graph_module", None)
    if forward_from_src is None or deserialize is None:
        return graph_module.reduce_graph_module(body, import_block)
    return deserialize(forward_from_src(import_block + (body.get("_code") or body["code"]), {}), body, cls)


def _find_while_loop() -> Callable | None:
    public = getattr(torch, "while_loop", None)
    if public is not None:
        return public
    try:
        from torch._higher_order_ops.while_loop import while_loop
    except ImportError:
        return None
    return while_loop


while_loop = _find_while_loop()


def _untraced() -> contextlib.AbstractContextManager:
    try:
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    except ImportError:
        return contextlib.nullcontext()
    return disable_proxy_modes_tracing()


def metadata_only(fn: Callable, *args):
    """``fn(*args)`` for the shapes and dtypes of its outputs: outside Dynamo (non-strict torch.export), on the fake
    tensors without recording it in the exported graph; under Dynamo it is traced, and AOTAutograd and Inductor drop
    it as dead code."""
    if torch.compiler.is_dynamo_compiling():
        return fn(*args)
    with _untraced():
        return fn(*args)


def graph_break(message: str) -> None:
    """Under Dynamo, break the graph here, with ``message`` as the reason."""
    try:
        from torch._dynamo import graph_break as force
    except ImportError:
        return
    force(msg=message)


try:
    from torch.fx.experimental.symbolic_shapes import guard_or_false as _guard_or_false
except ImportError:  # before torch 2.7
    _guard_or_false = None
try:
    from torch.fx.experimental.symbolic_shapes import statically_known_true as _statically_known_true
except ImportError:  # before torch 2.1
    _statically_known_true = bool


def known_true(condition) -> bool:
    """A condition on sizes, True only where it holds without a guard: a plain bool as it is; on traced sizes, what
    the shape environment proves for every size (asking the traced sizes' values would pin them); torch.jit
    tracing's size tensors as they are."""
    return bool(condition) if isinstance(condition, Tensor) else _statically_known_true(condition)


def is_zero(size) -> bool:
    """``size == 0``; for a traced size whose value is unknown while tracing (unbacked), False, and the traced
    program checks at run time that it is not 0."""
    if isinstance(size, int) and not isinstance(size, torch.SymInt) and not torch.compiler.is_compiling():
        return size == 0  # eager: a plain int (Dynamo answers isinstance(size, int) for a traced size too)
    if isinstance(size, Tensor) or _guard_or_false is None:  # torch.jit tracing's size tensor; an older torch
        return size == 0
    if _guard_or_false(size == 0):
        return True
    torch._check(size != 0)
    return False


def _find_onednn_convolution() -> tuple[Callable, Callable] | None:
    try:
        ops = torch.ops.mkldnn
        found = ops._reorder_convolution_weight.default, ops._convolution_pointwise.default
    except (AttributeError, RuntimeError):
        return None
    return found if torch.backends.mkldnn.is_available() else None


onednn_convolution = _find_onednn_convolution()  # (reorder the weight, convolve), or None
