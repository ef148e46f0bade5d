"""Small generic modules shared by many converters."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


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


def attributes_repr(module: nn.Module, names: Sequence[str]) -> str:
    """``extra_repr`` text listing the given attributes (the ONNX attributes a module was built with), skipping None."""
    return ", ".join(f"{n}={getattr(module, n)!r}" for n in names if getattr(module, n) is not None)


class Function(nn.Module):
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


class ConstantValue(nn.Module):
    """Returns a fixed tensor (ONNX Constant); the builder folds it at conversion time."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.register_buffer("value", value)

    def forward(self):
        return self.value


class DeclaredShape(nn.Module):
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
