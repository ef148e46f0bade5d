"""Torch-side functions and modules for the ONNX element-wise and activation ops.

Functions take the ONNX attributes as keyword arguments named like the attributes, so ``Function(fn, **attributes)``
prints like the ONNX node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .common import Module, trunc_div

_WIDENED = (torch.uint16, torch.uint32)  # torch has few kernels for these; int64 holds every value exactly


def unsigned_safe(fn: Callable | None = None, *, uint64: bool = False) -> Callable:
    """Make ``fn`` work on uint16/uint32 inputs (torch has few kernels for them) by computing in int64 and casting
    non-bool results back. ``uint64=True`` marks an op whose result bits do not depend on signedness (modular
    add/sub/mul, selection), so uint64 runs bit-for-bit as int64; other ops have no exact uint64 computation (torch
    has no kernels, int64 would read values >= 2**63 as negative): ``fn.uint64`` is False and their converters refuse
    uint64 inputs."""
    if fn is None:
        return functools.partial(unsigned_safe, uint64=uint64)

    unusual = frozenset((*_WIDENED, torch.uint64) if uint64 else _WIDENED)

    @functools.wraps(fn)
    def apply(*args):
        for a in args:  # the common case first, with as little Python as can be (it runs on every node call)
            if isinstance(a, torch.Tensor) and a.dtype in unusual:
                break
        else:
            return fn(*args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        unsigned = next((a.dtype for a in tensors if a.dtype in _WIDENED), None)
        if unsigned is not None:
            result = fn(*(a.to(torch.int64) if isinstance(a, torch.Tensor) and a.dtype in _WIDENED else a
                          for a in args))
            return result if result.dtype == torch.bool else result.to(unsigned)
        if uint64 and any(a.dtype == torch.uint64 for a in tensors):
            result = fn(*(a.view(torch.int64) if isinstance(a, torch.Tensor) and a.dtype == torch.uint64 else a
                          for a in args))
            return result if result.dtype == torch.bool else result.view(torch.uint64)
        return fn(*args)

    apply.uint64 = uint64
    return apply


# ---- arithmetic -------------------------------------------------------------------------------------------------
# The integer ops also take Python ints and symbolic sizes: shape arithmetic (modules/shape.py) computes with them.
@unsigned_safe(uint64=True)
def add(a, b):
    return a + b


@unsigned_safe(uint64=True)
def sub(a, b):
    return a - b


@unsigned_safe(uint64=True)
def mul(a, b):
    return a * b


@unsigned_safe
def div(a, b):
    """True division for floats; integers truncate toward zero (C semantics, as ONNX and onnxruntime)."""
    return torch.div(a, b) if isinstance(a, torch.Tensor) and a.is_floating_point() else trunc_div(a, b)


@unsigned_safe
def fmod(a, b):
    return torch.fmod(a, b)


@unsigned_safe
def remainder(a, b):
    return torch.remainder(a, b)


def power(x, y):
    """``x ** y`` in x's dtype. Integer bases are computed in float64 and truncated, as onnxruntime does
    (so 2 ** -1 == 0 where torch.pow would refuse negative integer exponents)."""
    if x.is_floating_point():
        return torch.pow(x, y).to(x.dtype)
    return torch.pow(x.double(), y.double()).to(x.dtype)


@unsigned_safe
def absolute(x):
    return torch.abs(x)


@unsigned_safe
def sign(x):
    """Sign that keeps NaN (torch.sign maps NaN to 0, onnxruntime keeps it)."""
    return torch.where(torch.isnan(x), x, torch.sign(x))


@unsigned_safe
def maximum(*xs):
    return functools.reduce(torch.maximum if isinstance(xs[0], torch.Tensor) else torch.sym_max, xs)


@unsigned_safe
def minimum(*xs):
    return functools.reduce(torch.minimum if isinstance(xs[0], torch.Tensor) else torch.sym_min, xs)


def sum_all(*xs):
    return functools.reduce(torch.add, xs)


def mean(*xs):
    return sum_all(*xs) / len(xs)


@unsigned_safe(uint64=True)
def where(condition, x, y):
    if not isinstance(condition, torch.Tensor):
        return x if condition else y
    return torch.where(condition, x, y)


# ---- comparison -------------------------------------------------------------------------------------------------
@unsigned_safe(uint64=True)
def equal(a, b):
    return a == b


@unsigned_safe
def less(a, b):
    return torch.lt(a, b)


@unsigned_safe
def less_equal(a, b):
    return torch.le(a, b)


@unsigned_safe
def greater(a, b):
    return torch.gt(a, b)


@unsigned_safe
def greater_equal(a, b):
    return torch.ge(a, b)


def isinf(x, detect_negative=1, detect_positive=1):
    if detect_positive and detect_negative:
        return torch.isinf(x)
    if detect_positive:
        return torch.isposinf(x)
    if detect_negative:
        return torch.isneginf(x)
    return torch.zeros_like(x, dtype=torch.bool)


# bitwise results do not depend on signedness: uint64 runs as int64 bits, uint16/uint32 in int64 cast back
@unsigned_safe(uint64=True)
def bitwise_and(a, b):
    return torch.bitwise_and(a, b)


@unsigned_safe(uint64=True)
def bitwise_or(a, b):
    return torch.bitwise_or(a, b)


@unsigned_safe(uint64=True)
def bitwise_xor(a, b):
    return torch.bitwise_xor(a, b)


@unsigned_safe(uint64=True)
def bitwise_not(x):
    return torch.bitwise_not(x)


def bitshift(x, y, direction):
    """ONNX BitShift. Unsigned: logical shifts, a shift by the bit width or more gives 0. Signed (opset 28):
    arithmetic right shift and two's-complement left shift, which is what torch's shifts do for signed types."""
    if x.dtype in _WIDENED:  # exact in int64; the cast back keeps the low bits
        return bitshift(x.to(torch.int64), y.to(torch.int64), direction).to(x.dtype)
    if x.dtype == torch.uint64:  # shift the bits as int64; a logical right shift clears the sign-extended bits
        v, s = x.view(torch.int64), y.view(torch.int64)  # a shift >= 2**63 reads negative: torch gives 0 for it
        if direction == "LEFT":
            return torch.bitwise_left_shift(v, s).view(torch.uint64)
        logical = torch.bitwise_right_shift(torch.bitwise_right_shift(v, 1) & torch.iinfo(torch.int64).max, s - 1)
        return torch.where(s == 0, v, logical).view(torch.uint64)
    shift = torch.bitwise_left_shift if direction == "LEFT" else torch.bitwise_right_shift
    return shift(x, y)


# ---- activations --------------------------------------------------------------------------------------------------
def leaky_relu(x, alpha):
    return F.leaky_relu(x, alpha)


def elu(x, alpha):
    return F.elu(x, alpha)


def selu(x, alpha, gamma):
    """Selu with the node's own alpha and gamma (F.selu has fixed constants)."""
    return gamma * F.elu(x, alpha)


def celu(x, alpha):
    return F.celu(x, alpha)


def gelu(x, approximate):
    """F.gelu, except that +inf stays inf (torch's vectorised float32 erf path gives NaN there; onnxruntime inf)."""
    return torch.where(x == torch.inf, x, F.gelu(x, approximate=approximate))


def hard_sigmoid(x, alpha, beta):
    """max(0, min(1, alpha * x + beta)) with the node's alpha and beta (F.hardsigmoid fixes them to 1/6, 1/2)."""
    return torch.clamp(alpha * x + beta, 0, 1)


def thresholded_relu(x, alpha):
    """x where x > alpha, else 0 (NaN gives 0, as in onnxruntime; F.threshold would keep NaN)."""
    return torch.where(x > alpha, x, 0)


def prelu(x, slope):
    """slope * x where x < 0, else x; slope broadcasts to x (also integer types, any slope shape)."""
    return torch.where(x < 0, x * slope, x)


def hardmax(x, dim):
    """1 at the first maximum along ``dim``, 0 elsewhere, in x's dtype.

    NaN as onnxruntime (which scans for a strictly larger value from the first element): a NaN is skipped, except
    that a NaN first element leaves no maximum (all zeros). torch.argmax alone would pick the NaN.
    """
    nan = x.isnan()
    first = torch.where(nan, -torch.inf, x).argmax(dim, keepdim=True)
    return torch.zeros_like(x).scatter(dim, first, 1).masked_fill(nan.narrow(dim, 0, 1), 0)


class Clip(Module):
    """ONNX Clip: ``min(max(x, min), max)``, so min > max gives max everywhere, as onnxruntime does.

    Static bounds are Python numbers given at construction; bounds computed at run time arrive as tensors in
    ``forward``. An absent float bound is the dtype's lowest/largest finite value (onnxruntime's
    ``numeric_limits``), so -inf/inf inputs come out finite.
    """

    def __init__(self, min: float | None = None, max: float | None = None):
        super().__init__()
        self.min, self.max = min, max

    def forward(self, x, min=None, max=None):
        if x.dtype in _WIDENED:  # no torch kernels: clip exactly in int64
            wide = [None if t is None else t.to(torch.int64) for t in (min, max)]
            return self(x.to(torch.int64), *wide).to(x.dtype)
        low = self.min if min is None else min
        high = self.max if max is None else max
        if x.is_floating_point():
            limits = torch.finfo(x.dtype)
            low = limits.min if low is None else low
            high = limits.max if high is None else high
        if low is not None:
            x = torch.clamp(x, min=low)
        if high is not None:
            x = torch.clamp(x, max=high)
        return x

    def extra_repr(self) -> str:
        return f"min={self.min}, max={self.max}"


class Softmax(Module):
    """Softmax / LogSoftmax / Hardmax (``fn(x, dim)``) at ``axis``.

    ``coerce_2d`` (ONNX versions before 13): the input is flattened to 2-D at ``axis`` and the function runs over
    the whole second dimension, i.e. jointly over every dimension from ``axis`` on.
    """

    def __init__(self, fn: Callable, axis: int, coerce_2d: bool):
        super().__init__()
        self.fn, self.axis, self.coerce_2d = fn, axis, coerce_2d

    def forward(self, x):
        if self.coerce_2d:
            return self.fn(x.flatten(self.axis), -1).reshape(x.shape)
        return self.fn(x, self.axis)

    def extra_repr(self) -> str:
        return f"{self.fn.__name__}, axis={self.axis}, coerce_2d={self.coerce_2d}"
