"""Module, the base of every module of this library (it keeps its constructor arguments, for codegen), and small
generic modules shared by many converters."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..torch_compat import op_callable

LITERAL_MAX_ELEMENTS = 8  # tensor arguments up to this size are kept (and written out by codegen) as they are


class NativeOp:
    """One native op: ``default`` its overload's C++ callable (torch_compat.op_callable), callable as torch.ops'
    packet is."""

    __slots__ = ("default",)

    def __init__(self, name: str):
        self.default = op_callable(getattr(torch.ops.onnx2torch_rnn, name).default)

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)


class NativeOps:
    """The native kernel's int8 library's ops (recurrent/kernel/quantized_ops.cpp, qlinear.cpp, ...) by name, as
    torch.ops has them (``NATIVE.qlinear_mul.default(...)``), each looked up on first use (the library registers
    them when it loads) and kept as an attribute: what an eager call reaches through torch.ops' namespaces and
    OpOverload.__call__ cost half a microsecond."""

    def __getattr__(self, name: str) -> NativeOp:
        op = NativeOp(name)
        setattr(self, name, op)
        return op


NATIVE = NativeOps()


def ceil_div(a, b):
    """ceil(a / b) for b > 0, written (a + b - 1) // b: exporters trace -(-a // b) as a truncating division."""
    return (a + b - 1) // b


def trunc_div(a, b):
    """Integer division truncating toward zero (C++, ONNX and onnxruntime), not Python's floor: of integer tensors,
    and of ints and symbolic sizes (shape arithmetic, pads). (No comparison of two comparisons: torch.jit tracing, as
    torch.onnx.export(dynamo=False) does, cannot compare its traced booleans.)"""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.div(a, b, rounding_mode="trunc")
    quotient = abs(a) // abs(b)
    same_sign = a >= 0 if b > 0 else a <= 0
    return quotient if same_sign else -quotient


def kept_geometry(module: nn.Module, key: tuple, make):
    """``make()`` (a window geometry: Python numbers from sizes), kept per ``key`` between the module's eager calls
    (never while compiling or tracing, where sizes may be symbolic: callers compute it then)."""
    return kept_in(module.__dict__.setdefault("_geometries", {}), key, make)


def kept_in(kept: dict, key: tuple, make):
    """``make()`` kept in ``kept`` per ``key`` (input sizes: at most 64 kept, then it starts over)."""
    value = kept.get(key)
    if value is None:
        if len(kept) >= 64:  # many input sizes: start over
            kept.clear()
        value = kept[key] = make()
    return value


# bound once: small nodes ask at every eager call (dynamo knows is_compiling by identity; torch.compile never reaches
# the C tracing check of torch.jit.is_tracing: the compiling one comes first)
is_compiling, is_tracing = torch.compiler.is_compiling, torch._C._is_tracing


def eager() -> bool:
    """Whether this is a plain eager call: not compiling, exporting or tracing (sizes are Python ints)."""
    return not is_compiling() and not is_tracing()


def attributes_repr(module: nn.Module, names: Sequence[str]) -> str:
    """``extra_repr`` text listing the given attributes (the ONNX attributes a module was built with), skipping None."""
    return ", ".join(f"{n}={getattr(module, n)!r}" for n in names if getattr(module, n) is not None)


@dataclasses.dataclass(frozen=True)
class TensorStub:
    """What a module keeps of a large tensor argument: shape, dtype and whether it is all zeros. The module holds
    what it needs of the data itself (often reordered or cast); keeping the argument too would double a model's
    memory. codegen writes it as ``torch.zeros`` / ``torch.ones`` of that shape, a placeholder that the saved
    weights replace; zeros or not matters where a constructor looks at the values (an all-zero LSTM P)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    zeros: bool


def kept(value: object) -> object:
    """A constructor argument as a module keeps it: large tensors as TensorStub, small ones copied (a view would keep
    its base tensor alive), lists, tuples and dicts item by item, anything else as it is."""
    if isinstance(value, torch.Tensor):
        if value.is_meta or value.numel() > LITERAL_MAX_ELEMENTS:
            return TensorStub(tuple(value.shape), value.dtype, value.is_meta or not bool(value.any()))
        return value.detach().clone()
    if type(value) in (list, tuple):
        return type(value)(kept(v) for v in value)
    if type(value) is dict:
        return {k: kept(v) for k, v in value.items()}
    return value


_ARGUMENTS = "_constructor_arguments"  # set in __dict__ directly: before nn.Module.__init__ has run


def _recording(init: Callable) -> Callable:
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if _ARGUMENTS not in self.__dict__:  # the outermost __init__ (the class's own) sees the caller's arguments
            self.__dict__[_ARGUMENTS] = (kept(args), kept(kwargs))
        init(self, *args, **kwargs)

    return __init__


class Module(nn.Module):
    """Base of every module of this library: it keeps the arguments it was built with (``constructor_arguments``),
    from which codegen writes the call that rebuilds it. Each subclass's own ``__init__`` is wrapped once, when the
    class is defined; nothing outside this class hierarchy is touched."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):
            cls.__init__ = _recording(vars(cls)["__init__"])

    @_recording
    def __init__(self):
        super().__init__()


def constructor_arguments(module: nn.Module) -> tuple[tuple, dict] | None:
    """``(args, kwargs)`` as ``module`` was built with (see ``kept``); None for a module not derived from Module."""
    return module.__dict__.get(_ARGUMENTS) if isinstance(module, Module) else None


class Function(Module):
    """Calls ``fn(*inputs, **kwargs)``: the module for ops that are one torch function with fixed arguments."""

    def __init__(self, fn: Callable, **kwargs):
        super().__init__()
        self.fn = fn
        self.kwargs = kwargs

    def forward(self, *inputs):
        return self.fn(*inputs, **self.kwargs)

    def extra_repr(self) -> str:
        name = getattr(self.fn, "__name__", repr(self.fn))
        return ", ".join([name, *(f"{k}={v!r}" for k, v in self.kwargs.items())])


class ConstantValue(Module):
    """Returns a fixed tensor (ONNX Constant); the builder folds it at conversion time."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.register_buffer("value", value)

    def forward(self):
        return self.value


class DeclaredShape(Module):
    """Refuses a graph input whose static dims differ from those the model declares, as onnxruntime does. Added
    only where conversion relied on them (shape arithmetic on those dims was evaluated once, at conversion)."""

    _is_impure = True  # no output: torch.fx must not drop it as dead code

    def __init__(self, name: str, dims: dict[int, int]):
        super().__init__()
        self.name, self.dims = name, dict(dims)

    def forward(self, x: torch.Tensor) -> None:
        for axis, size in self.dims.items():
            if x.dim() <= axis or x.shape[axis] != size:
                raise ValueError(f"input {self.name!r} has shape {list(x.shape)}; the model declares size {size} "
                                 f"for dimension {axis} (conversion relied on it)")

    def extra_repr(self) -> str:
        return f"{self.name!r}, dims={self.dims}"
