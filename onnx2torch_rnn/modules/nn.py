"""Modules for linear-algebra and neural-network layer ops: padding, convolution, pooling, normalisation, resizing.

Window geometry (pads, output sizes) is computed by small pure functions shared by conversion (static shapes) and
forward (shapes known only at run time). onnxruntime is the oracle: where its geometry differs from the written
spec the function says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from types import MappingProxyType

import numpy as np
import torch
import torch.nn.functional as F

from ..recurrent import kernel
from ..torch_compat import known_true
from .common import NATIVE, Module, attributes_repr, ceil_div, eager, kept_geometry, trunc_div
from .shape import ints

CONV = MappingProxyType({1: F.conv1d, 2: F.conv2d, 3: F.conv3d})
CONV_TRANSPOSE = MappingProxyType({1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d})
MAX_POOL = MappingProxyType({1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d})
_FLAT_GATHER = 1 << 16  # output elements up to which nearest Resize keeps a flat index of the whole output
_NATIVE_POOL = frozenset((torch.uint8, torch.int8))  # the native kernel's max_pool
# float32 natively only where the call's fixed cost dominates: on larger maps torch's vectorised pooling is faster
# (16384 values 2x2: 46 vs 35 us; 3x3 stride 1: 402 vs 243 us), 8-bit ones 2x faster natively from 10^5 values
_NATIVE_FLOAT_POOL_VALUES = 1 << 12


def per_axis(value, n: int, default: int) -> list[int]:
    """An optional per-axis attribute (strides, dilations, ...) as n ints, ``default`` when absent."""
    return [default] * n if not value else [int(v) for v in value]


# ----------------------------------------------------------------------------------------------- padding

def pad(x: torch.Tensor, begins: Sequence[int], ends: Sequence[int], mode: str = "constant", value=0.0):
    """ONNX padding of every axis of ``x`` by ``begins``/``ends`` (negative amounts crop).

    constant uses F.pad (any rank); reflect/edge/wrap gather indices per padded axis, so they work on any axis.
    An amount computed from traced sizes may be 0 or negative: unless that is known for every size, it is applied
    without asking which (asking would pin the sizes).
    """
    if mode == "constant":
        flat = _constant_amounts(begins, ends)
        if not flat:
            return x
        if x.dtype == torch.bool:  # F.pad has no bool kernel
            return F.pad(x.to(torch.uint8), flat, value=int(bool(value))).to(torch.bool)
        return F.pad(x, flat, value=value)
    for axis, (b, e) in enumerate(zip(begins, ends, strict=True)):
        if not (known_true(b >= 0) and known_true(e >= 0)):  # crop first, then pad what is left (as onnxruntime)
            start, stop = torch.sym_max(-b, 0), x.shape[axis] - torch.sym_max(-e, 0)
            x = x.narrow(axis, start, stop - start)
        b, e = torch.sym_max(b, 0), torch.sym_max(e, 0)
        if not (known_true(b == 0) and known_true(e == 0)):
            x = x.index_select(axis, _pad_indices(x.shape[axis], b, e, mode, x.device))
    return x


def _constant_amounts(begins: Sequence[int], ends: Sequence[int]) -> list:
    """F.pad's amounts (last axis first), or [] where nothing is padded."""
    flat = [amount for b, e in zip(reversed(begins), reversed(ends), strict=True) for amount in (b, e)]
    if all(type(a) is int and a == 0 for a in flat) or all(known_true(a == 0) for a in flat):
        return []
    return flat


def _pad_indices(n: int, before: int, after: int, mode: str, device) -> torch.Tensor:
    index = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return index.clamp(0, n - 1)
    if mode == "wrap":
        return index.remainder(n)
    period = 2 * (n - 1)  # reflect (without repeating the edge)
    if period == 0:
        return torch.zeros_like(index)
    index = index.remainder(period)
    return torch.where(index >= n, period - index, index)


class Pad(Module):
    """ONNX Pad. Static ``pads``/``value``/``axes`` are baked in; run-time ones are forward inputs."""

    def __init__(self, mode: str = "constant", pads: Sequence[int] | None = None, value: float = 0.0,
                 axes: Sequence[int] | None = None):
        super().__init__()
        self.mode, self.pads, self.value, self.axes = mode, pads, value, axes

    def forward(self, x, pads=None, value=None, axes=None):
        if pads is value is axes is None and self.mode == "constant" and x.dtype != torch.bool and eager():
            # static constant padding: F.pad's amounts kept per rank (their Python cost as much as F.pad itself)
            amounts = kept_geometry(self, x.dim(), lambda: _constant_amounts(*self._amounts(x.dim(), None, None)))
            return F.pad(x, amounts, value=self.value) if amounts else x
        value = self.value if value is None else value.item()
        return pad(x, *self._amounts(x.dim(), pads, axes), self.mode, value)

    def _amounts(self, rank: int, pads, axes) -> tuple[list, list]:
        """(begins, ends) per axis."""
        pads = ints(self.pads, pads)  # run-time pads: only known here (ints where computed from sizes)
        axes = ints(self.axes, axes)
        axes = list(range(rank)) if axes is None else [a % rank for a in axes]
        begins, ends = [0] * rank, [0] * rank
        for i, axis in enumerate(axes):
            begins[axis], ends[axis] = pads[i], pads[i + len(axes)]
        return begins, ends

    def extra_repr(self) -> str:
        return attributes_repr(self, ["mode", "pads", "value", "axes"])


def spatial_pad(pads_begin: Sequence[int], pads_end: Sequence[int], value: float = 0.0) -> Pad:
    """A Pad module for the spatial axes (2, 3, ...) of an N, C, ... tensor."""
    n = len(pads_begin)
    return Pad("constant", [*pads_begin, *pads_end], value, list(range(2, 2 + n)))


# ----------------------------------------------------------------------------------------------- convolution

def conv_pads(auto_pad: str, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
              dilations: Sequence[int], pads: Sequence[int] | None) -> tuple[list[int], list[int]]:
    """(begins, ends) of the spatial padding of Conv. SAME_* pads are never negative (as in onnxruntime)."""
    n = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True):
            need = max(0, (ceil_div(size, s) - 1) * s + (k - 1) * d + 1 - size)
            head = (need + 1) // 2 if auto_pad == "SAME_LOWER" else need // 2
            begins.append(head)
            ends.append(need - head)
        return begins, ends
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    return list(pads[:n]), list(pads[n:])


class Conv(Module):
    """ONNX Conv with run-time weights (constant weights become nn.ConvNd)."""

    def __init__(self, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
        super().__init__()
        self.auto_pad, self.dilations, self.group = auto_pad, dilations, group
        self.kernel_shape, self.pads, self.strides = kernel_shape, pads, strides

    def geometry(self, x, w) -> tuple[list[int], list[int], list[int], list[int]]:
        """(strides, dilations, pad begins, pad ends) per spatial axis of this convolution of x by w."""
        n = w.dim() - 2
        kernel = list(w.shape[2:])
        if self.kernel_shape is not None and list(self.kernel_shape) != kernel:
            raise ValueError(f"Conv: kernel_shape {self.kernel_shape} does not match the weight shape {kernel}")
        strides, dilations = per_axis(self.strides, n, 1), per_axis(self.dilations, n, 1)
        return strides, dilations, *conv_pads(self.auto_pad, x.shape[2:], kernel, strides, dilations, self.pads)

    def forward(self, x, w, b=None):
        n = w.dim() - 2
        strides, dilations, begins, ends = self.geometry(x, w)
        padding = begins
        if begins != ends:  # torch pads symmetrically: pad explicitly first
            x, padding = pad(x, [0, 0, *begins], [0, 0, *ends]), 0
        return CONV[n](x, w, b, strides, padding, dilations, self.group)

    def extra_repr(self) -> str:
        return attributes_repr(self, ["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"])


def conv_transpose_crop(auto_pad: str, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                        dilations: Sequence[int], output_padding: Sequence[int], output_shape: Sequence[int] | None,
                        pads: Sequence[int] | None) -> tuple[list[int], list[int]]:
    """(begins, ends) to crop from the full transposed convolution (length L = (in-1)*s + (k-1)*d + 1 per axis).

    The output is full[begins : L - ends], zeros past L (a negative end extends). As onnxruntime computes it:
    with output_shape the total padding is max(0, L + output_padding - output_shape), SAME_UPPER puts the smaller
    half first and every other auto_pad the larger half; SAME_* without output_shape gives in*stride outputs
    (total max(0, L + output_padding - in*stride), SAME_UPPER smaller half first); VALID ignores pads.
    """
    n = len(kernel)
    begins, ends = [], []
    for i, (size, k, s, d, op) in enumerate(zip(sizes, kernel, strides, dilations, output_padding, strict=True)):
        full = (size - 1) * s + (k - 1) * d + 1
        if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = output_shape[i] if output_shape else size * s
            total = max(0, full + op - out)
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            if not output_shape:
                out = full + op - total
        elif auto_pad == "VALID" or not pads:
            head, out = 0, full + op
        else:
            head, out = pads[i], full + op - pads[i] - pads[i + n]
        begins.append(head)
        ends.append(full - head - out)
    return begins, ends


class ConvTranspose(Module):
    """ONNX ConvTranspose with run-time weights or geometry torch cannot express (else nn.ConvTransposeNd)."""

    def __init__(self, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None,
                 output_shape=None, pads=None, strides=None):
        super().__init__()
        self.auto_pad, self.dilations, self.group, self.kernel_shape = auto_pad, dilations, group, kernel_shape
        self.output_padding, self.output_shape, self.pads, self.strides = output_padding, output_shape, pads, strides

    def forward(self, x, w, b=None):
        n = w.dim() - 2
        kernel = list(w.shape[2:])
        if self.kernel_shape is not None and list(self.kernel_shape) != kernel:
            raise ValueError(f"ConvTranspose: kernel_shape {self.kernel_shape} does not match the weight {kernel}")
        strides, dilations = per_axis(self.strides, n, 1), per_axis(self.dilations, n, 1)
        output_shape = self.output_shape[-n:] if self.output_shape else None
        begins, ends = conv_transpose_crop(self.auto_pad, x.shape[2:], kernel, strides, dilations,
                                           per_axis(self.output_padding, n, 0), output_shape, self.pads)
        y = CONV_TRANSPOSE[n](x, w, None, strides, 0, 0, self.group, dilations)
        y = pad(y, [0, 0, *(-v for v in begins)], [0, 0, *(-v for v in ends)])
        return y if b is None else y + b.reshape(1, -1, *[1] * n)

    def extra_repr(self) -> str:
        return attributes_repr(self, ["auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                                      "output_shape", "pads", "strides"])


# ----------------------------------------------------------------------------------------------- pooling

def pool_geometry(auto_pad: str, ceil_mode: int, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int], pads: Sequence[int] | None):
    """Per spatial axis (head pad, tail pad, output size), as onnxruntime computes them.

    onnxruntime quirks: SAME_* pads use the undilated kernel, divide with C++ truncation, and may be negative;
    ceil_mode drops a last window that would start past the input and its head padding (as torch does).
    """
    n = len(kernel)
    result = []
    for i, (size, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations, strict=True)):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            need = (ceil_div(size, s) - 1) * s + k - size
            head = trunc_div(need + 1, 2) if auto_pad == "SAME_LOWER" else trunc_div(need, 2)
            tail = need - head
        elif auto_pad == "VALID" or not pads:
            head = tail = 0
        else:
            head, tail = pads[i], pads[i + n]
        # integer division, so sizes stay symbolic under torch.export (a window count below 0 is invalid anyway)
        reach = size + head + tail - ((k - 1) * d + 1)
        out = (ceil_div(reach, s) if ceil_mode else reach // s) + 1
        if ceil_mode and (out - 1) * s >= size + head:
            out -= 1
        result.append((head, tail, out))
    return result


def _window_counts(geometry, kernel, strides, dilations, lower, upper, device) -> torch.Tensor:
    """How many taps of each window fall in [lower[i], upper[i]) per axis, multiplied over axes (broadcastable)."""
    counts = None
    n = len(kernel)
    for axis, ((head, _, out), k, s, d, lo, hi) in enumerate(zip(geometry, kernel, strides, dilations, lower, upper,
                                                                  strict=True)):
        taps = (torch.arange(out, device=device) * s - head)[:, None] + torch.arange(k, device=device) * d
        count = ((taps >= lo) & (taps < hi)).sum(1).reshape(out, *[1] * (n - 1 - axis))
        counts = count if counts is None else counts * count
    return counts


class _Pool(Module):
    """Shared geometry of MaxPool / AveragePool / LpPool: the input is padded explicitly so that one floor-mode
    torch window pass yields onnxruntime's output size (including ceil_mode), whatever the pads."""

    ATTRIBUTES = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")

    def __init__(self, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, strides=None):
        super().__init__()
        self.kernel_shape = [int(k) for k in kernel_shape]
        self.auto_pad, self.ceil_mode, self.dilations, self.pads, self.strides = (
            auto_pad, ceil_mode, dilations, pads, strides)

    def _geometry(self, x):
        """(geometry, strides, dilations, head pads, tail pads) per spatial axis; kept per input shape in eager
        calls."""
        if eager():
            return kept_geometry(self, ("pool", x.shape), lambda: self._compute_geometry(x))
        return self._compute_geometry(x)

    def _compute_geometry(self, x):
        n = len(self.kernel_shape)
        strides, dilations = per_axis(self.strides, n, 1), per_axis(self.dilations, n, 1)
        sizes = list(x.shape[2:])
        geometry = pool_geometry(self.auto_pad, self.ceil_mode, sizes, self.kernel_shape, strides, dilations,
                                 self.pads)
        # pad exactly to what the windows read: head padding, and the tail up to the end of the last window
        ends = [(out - 1) * s + (k - 1) * d + 1 - size - head
                for (head, _, out), size, k, s, d in zip(geometry, sizes, self.kernel_shape, strides, dilations,
                                                         strict=True)]
        return geometry, strides, dilations, [g[0] for g in geometry], ends

    def _window_sum(self, x, strides, dilations, begins, ends):
        """Sum of each (dilated) window over the zero-padded input: a depthwise convolution with a ones kernel."""
        n = len(self.kernel_shape)
        x = pad(x, [0, 0, *begins], [0, 0, *ends])
        flat = x.reshape(-1, 1, *x.shape[2:])
        ones = torch.ones(1, 1, *self.kernel_shape, dtype=x.dtype, device=x.device)
        y = CONV[n](flat, ones, None, strides, 0, dilations)
        return y.reshape(*x.shape[:2], *y.shape[2:])

    def extra_repr(self) -> str:
        return attributes_repr(self, self.ATTRIBUTES + tuple(getattr(self, "EXTRA", ())))


def native_max_pool(x: torch.Tensor, numbers: torch.Tensor) -> torch.Tensor:
    return NATIVE.max_pool.default(x, numbers)


class MaxPool(_Pool):
    """ONNX MaxPool; returns (Y, Indices) when ``indices`` is set. Indices count over the whole N x C x ... input,
    in row-major (storage_order=0) or column-major (1) order of the spatial axes. ``padding``: (begins, ends, value)
    of a constant Pad before it (passes/quantized.py fuses one), applied first."""

    EXTRA = ("storage_order", "indices", "padding")

    def __init__(self, kernel_shape, storage_order=0, indices=False, padding=None, **attributes):
        super().__init__(kernel_shape, **attributes)
        self.storage_order, self.indices, self.padding = storage_order, indices, padding

    def forward(self, x):
        n = len(self.kernel_shape)
        if not self.indices and eager():
            kept = self.__dict__.get("_native")  # the last eager call's (shape, dtype, native numbers or None)
            if (kept is not None and kept[2] is not None and kept[0] == x.shape and kept[1] == x.dtype and x.is_cpu
                    and not (x.requires_grad and torch.is_grad_enabled())):  # as _eager decides, in fewer steps
                return native_max_pool(x if x.is_contiguous() else x.contiguous(), kept[2])
            pooled = self._eager(x)
            if pooled is not None:
                return pooled
        if self.padding is not None:
            x = pad(x, self.padding[0], self.padding[1], value=self.padding[2])
        _, strides, dilations, begins, ends = self._geometry(x)
        dtype = x.dtype
        # what onnxruntime reads outside the input: the lowest value, not -inf
        lowest = torch.finfo(dtype).min if dtype.is_floating_point else torch.iinfo(dtype).min
        if n == 2 and dtype in (torch.uint8, torch.int8) and x.device.type == "cpu" and not self.indices:
            # torch's 2-D max pooling takes them on CPU (not on CUDA)
            return F.max_pool2d(pad(x, [0, 0, *begins], [0, 0, *ends], value=lowest), self.kernel_shape, strides, 0,
                                dilations)
        if not dtype.is_floating_point:  # else torch max pooling is float-only; int8/uint8 are exact in float32
            x = x.float()
        padded = pad(x, [0, 0, *begins], [0, 0, *ends], value=lowest)
        y, flat = MAX_POOL[n](padded, self.kernel_shape, strides, 0, dilations, False, True)
        y = y.to(dtype)
        if not self.indices:
            return y
        # torch indexes the padded plane: unravel, remove the head padding, ravel in the input's storage order
        sizes, padded_sizes = list(x.shape[2:]), list(padded.shape[2:])
        index, stride, coords = torch.zeros_like(flat), 1, []
        for size in reversed(padded_sizes):
            coords.insert(0, (flat // stride) % size)
            stride *= size
        order = range(n) if self.storage_order else reversed(range(n))  # fastest-varying axis first
        stride = 1
        for axis in order:
            index = index + (coords[axis] - begins[axis]) * stride
            stride *= sizes[axis]
        planes = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(x.shape[0], x.shape[1], *[1] * n)
        return y, index + planes * stride


    def _eager(self, x):
        """An eager call without indices: the native kernel's max_pool (recurrent/kernel/qlinear.cpp; float32,
        uint8, int8 on CPU, no gradient) on numbers kept per input shape, else torch's pooling on the window geometry
        kept per input shape (its Python arithmetic costs as much as a small pool), no padding where none is
        needed. None where the general path must run (integer types other than 8-bit on CPU, which torch's pooling
        takes)."""
        if (x.dtype in _NATIVE_POOL or (x.dtype == torch.float32 and x.numel() <= _NATIVE_FLOAT_POOL_VALUES)) and (
                x.is_cpu and not (x.requires_grad and torch.is_grad_enabled())):
            kept = self.__dict__.get("_native")  # (input shape, dtype, numbers or None without the kernel)
            if kept is None or kept[0] != x.shape or kept[1] != x.dtype:
                kept = self.__dict__["_native"] = (x.shape, x.dtype,
                                                   self.native_numbers(x) if kernel.load("int8") else None)
            if kept[2] is not None:
                return native_max_pool(x if x.is_contiguous() else x.contiguous(), kept[2])
        n = len(self.kernel_shape)
        if self.padding is not None or not (x.dtype.is_floating_point or (
                n == 2 and x.dtype in (torch.uint8, torch.int8) and x.is_cpu)):
            return None
        strides, dilations, begins, ends = self._geometry(x)[1:]  # kept per input shape
        if begins.count(0) + ends.count(0) < 2 * n:
            lowest = torch.finfo(x.dtype).min if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
            x = pad(x, [0, 0, *begins], [0, 0, *ends], value=lowest)
        return MAX_POOL[n](x, self.kernel_shape, strides, 0, dilations)

    def native_numbers(self, x) -> torch.Tensor | None:
        """The native max_pool's numbers for x's shape: kernel, strides, head pads, output sizes, dilations (None
        where it does not fit: with indices, or some output size not positive: torch's pooling says why)."""
        if self.indices or len(self.kernel_shape) != x.dim() - 2:
            return None
        fill, padded = [], [0] * x.dim()
        if self.padding is not None:  # pooled as padded: where the pooling itself pads nothing (onnxruntime's lowest)
            padded, ends, value = self.padding
            if x.dtype.is_floating_point or self.ceil_mode or self.auto_pad not in ("NOTSET", "VALID") or any(
                    self.pads or ()) or min(padded + ends) < 0 or any(padded[:2] + ends[:2]):
                return None
            x, fill = torch.empty([s + b + e for s, b, e in zip(x.shape, padded, ends, strict=True)], device="meta"), [
                int(value)]
        geometry, strides, dilations, begins, _ = self._compute_geometry(x)
        outs = [out for _, _, out in geometry]
        if min(outs) < 1:
            return None
        begins = [b + p for b, p in zip(begins, padded[2:], strict=True)]
        return torch.tensor([*self.kernel_shape, *strides, *begins, *outs, *dilations, *fill], dtype=torch.int64)


class AveragePool(_Pool):
    """ONNX AveragePool: window sums divided by the taps inside the input (count_include_pad=0) or inside the
    input and its explicit pads (count_include_pad=1); taps past the pads (ceil_mode) never count."""

    EXTRA = ("count_include_pad",)

    def __init__(self, kernel_shape, count_include_pad=0, **attributes):
        super().__init__(kernel_shape, **attributes)
        self.count_include_pad = count_include_pad

    def forward(self, x):
        _, strides, dilations, begins, ends = self._geometry(x)
        if eager():  # the counts depend on the sizes only (an inference tensor must not meet autograd later)
            key = ("counts", x.shape[2:], x.dtype, x.device, torch.is_inference_mode_enabled())
            counts = kept_geometry(self, key, lambda: self._counts(x))
        else:
            counts = self._counts(x)
        return self._window_sum(x, strides, dilations, begins, ends) / counts

    def _counts(self, x):
        """The taps each window averages (at least 1: a window with none averages to 0, as in onnxruntime)."""
        geometry, strides, dilations, _, _ = self._geometry(x)
        sizes = list(x.shape[2:])
        if self.count_include_pad:
            lower, upper = [-g[0] for g in geometry], [size + g[1] for size, g in zip(sizes, geometry, strict=True)]
        else:
            lower, upper = [0] * len(sizes), sizes
        counts = _window_counts(geometry, self.kernel_shape, strides, dilations, lower, upper, x.device)
        return counts.clamp(min=1).to(x.dtype)


class LpPool(_Pool):
    """ONNX LpPool: (sum over each window of |x|^p)^(1/p), padding contributing zero."""

    EXTRA = ("p",)

    def __init__(self, kernel_shape, p=2, **attributes):
        super().__init__(kernel_shape, **attributes)
        self.p = p

    def forward(self, x):
        _, strides, dilations, begins, ends = self._geometry(x)
        return self._window_sum(x.abs().pow(self.p), strides, dilations, begins, ends).pow(1.0 / self.p)


class GlobalPool(Module):
    """GlobalAveragePool / GlobalMaxPool: reduce every spatial axis, keeping it as size 1."""

    def __init__(self, reduce: str):
        super().__init__()
        self.reduce = reduce

    def forward(self, x):
        dims = tuple(range(2, x.dim()))
        if not dims:  # torch would read an empty dims tuple as "all axes"
            return x
        return x.mean(dims, keepdim=True) if self.reduce == "mean" else x.amax(dims, keepdim=True)

    def extra_repr(self) -> str:
        return self.reduce


# ----------------------------------------------------------------------------------------------- normalisation

def _channel_view(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t.reshape(1, -1, *[1] * (rank - 2))


class BatchNormalization(Module):
    """ONNX BatchNormalization with run-time statistics, spatial=0, or training_mode=1 (else nn.BatchNormNd).

    training_mode=1 normalises with the batch statistics (population variance) and returns the updated running
    statistics ``input * momentum + batch * (1 - momentum)``, as the spec writes it.
    """

    def __init__(self, epsilon=1e-5, momentum=0.9, spatial=1, training_mode=0, outputs=1):
        super().__init__()
        self.epsilon, self.momentum, self.spatial = epsilon, momentum, spatial
        self.training_mode, self.outputs = training_mode, outputs

    def forward(self, x, scale, b, mean, var):
        rank = x.dim()
        if self.training_mode:
            dims = [0, *range(2, rank)]
            batch_mean, batch_var = x.mean(dims), x.var(dims, unbiased=False)
            y = F.batch_norm(x, batch_mean, batch_var, scale, b, False, 0.0, self.epsilon)
            running = (mean * self.momentum + batch_mean * (1 - self.momentum),
                       var * self.momentum + batch_var * (1 - self.momentum))
            return (y, *running)[: self.outputs] if self.outputs > 1 else y
        if self.spatial and not (torch.compiler.is_compiling() and (mean.requires_grad or var.requires_grad)):
            return F.batch_norm(x, mean, var, scale, b, False, 0.0, self.epsilon)
        if self.spatial:  # statistics that are parameters (shared): batch_norm's export refuses their gradient
            shape = (-1, *[1] * (rank - 2))
            mean, var, scale, b = (t.reshape(shape) for t in (mean, var, scale, b))
        # spatial=0: statistics per channel and position, shaped (C, D1, ..., Dn)
        return (x - mean) / torch.sqrt(var + self.epsilon) * scale + b

    def extra_repr(self) -> str:
        return attributes_repr(self, ["epsilon", "momentum", "spatial", "training_mode"])


class InstanceNormalization(Module):
    """ONNX InstanceNormalization with run-time scale/bias (constant ones become nn.InstanceNormNd)."""

    def __init__(self, epsilon=1e-5):
        super().__init__()
        self.epsilon = epsilon

    def forward(self, x, scale, b):
        return F.instance_norm(x, weight=scale, bias=b, eps=self.epsilon)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}"


class LayerNormalization(Module):
    """ONNX LayerNormalization computed in the stash type; returns (Y, Mean, InvStdDev) up to ``outputs``."""

    def __init__(self, axis=-1, epsilon=1e-5, stash_type=torch.float32, outputs=1):
        super().__init__()
        self.axis, self.epsilon, self.stash_type, self.outputs = axis, epsilon, stash_type, outputs

    def forward(self, x, scale, b=None):
        dims = tuple(range(self.axis % x.dim(), x.dim()))
        xs = x.to(self.stash_type)
        mean = xs.mean(dims, keepdim=True)
        centered = xs - mean
        inv_std = torch.rsqrt(centered.square().mean(dims, keepdim=True) + self.epsilon)
        y = (centered * inv_std).to(x.dtype) * scale
        if b is not None:
            y = y + b
        return (y, mean, inv_std)[: self.outputs] if self.outputs > 1 else y

    def extra_repr(self) -> str:
        return attributes_repr(self, ["axis", "epsilon", "stash_type"])


class RMSNormalization(Module):
    """ONNX RMSNormalization: x / sqrt(mean(x^2 over the axes from ``axis`` on) + epsilon) in the stash type, cast
    back to x's type, times scale (the order of the spec's function body)."""

    def __init__(self, axis=-1, epsilon=1e-5, stash_type=torch.float32):
        super().__init__()
        self.axis, self.epsilon, self.stash_type = axis, epsilon, stash_type

    def forward(self, x, scale):
        dims = tuple(range(self.axis % x.dim(), x.dim()))
        xs = x.to(self.stash_type)
        return (xs * torch.rsqrt(xs.square().mean(dims, keepdim=True) + self.epsilon)).to(x.dtype) * scale

    def extra_repr(self) -> str:
        return attributes_repr(self, ["axis", "epsilon", "stash_type"])


def _allowed_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, -inf elsewhere: the spec's select-not-multiply form (0 * -inf would be NaN)."""
    return torch.where(allowed, torch.zeros((), dtype=dtype), torch.full((), -math.inf, dtype=dtype))


class Attention(Module):
    """ONNX Attention (opsets 23-25) in the order of the spec's reference: Q and K each times sqrt(scale) (cast to
    Q's type), past keys/values concatenated, K/V heads repeated for GQA, QK^T, softcap, the additive bias (attn_mask
    padded to the key length, causal frontier offset by the past length or nonpad_kv_seqlen - q_length, sliding
    window, padding of nonpad_kv_seqlen), softmax in ``softmax_precision``, fully masked rows zero, times V.
    Returns (Y, present_key, present_value, qk_matmul_output) up to ``outputs``."""

    def __init__(self, is_causal=0, scale=None, softcap=0.0, qk_matmul_output_mode=0, q_num_heads=None,
                 kv_num_heads=None, softmax_precision=None, left_window_size=-1, right_window_size=-1, outputs=1):
        super().__init__()
        self.is_causal, self.scale, self.softcap = is_causal, scale, softcap
        self.qk_matmul_output_mode = qk_matmul_output_mode
        self.q_num_heads, self.kv_num_heads = q_num_heads, kv_num_heads
        self.softmax_precision = softmax_precision
        self.left_window_size, self.right_window_size, self.outputs = left_window_size, right_window_size, outputs

    def _heads(self, x, heads):
        """A 3-D [batch, seq, heads * size] input as [batch, heads, seq, size]."""
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads).transpose(1, 2)

    def _bias(self, q, q_len, kv_len, attn_mask, past_len, nonpad_kv_seqlen):
        """The additive bias broadcastable to [batch, heads, q, kv], or None when nothing is masked."""
        bias = None
        if attn_mask is not None:
            pad = kv_len - attn_mask.shape[-1]  # a mask shorter than the keys masks the rest
            if attn_mask.dtype == torch.bool:
                attn_mask = _allowed_bias(F.pad(attn_mask, (0, pad), value=False), q.dtype)
            else:
                attn_mask = F.pad(attn_mask, (0, pad), value=-math.inf)
            bias = attn_mask
        windowed = self.left_window_size >= 0 or self.right_window_size >= 0
        if not (self.is_causal or windowed or nonpad_kv_seqlen is not None):
            return bias
        i = torch.arange(q_len, device=q.device)[:, None]
        j = torch.arange(kv_len, device=q.device)
        # a query's absolute position: after the past keys, or per batch in an external cache (never both)
        offset = past_len if nonpad_kv_seqlen is None else (nonpad_kv_seqlen - q_len).reshape(-1, 1, 1, 1)
        position = i + offset
        bias = torch.zeros((q_len, kv_len), dtype=q.dtype, device=q.device) if bias is None else bias
        if self.is_causal:
            bias = bias + _allowed_bias(j <= position, q.dtype)
        if windowed:
            allowed = torch.ones_like(j, dtype=torch.bool)
            if self.left_window_size >= 0:
                allowed = allowed & (position - j <= self.left_window_size)
            if self.right_window_size >= 0:
                allowed = allowed & (j - position <= self.right_window_size)
            bias = bias + _allowed_bias(allowed, q.dtype)
        if nonpad_kv_seqlen is not None:
            bias = bias + _allowed_bias(j < nonpad_kv_seqlen.reshape(-1, 1, 1, 1), q.dtype)
        return bias

    def forward(self, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        rank = q.dim()
        if rank == 3:
            if self.q_num_heads is None or self.kv_num_heads is None:
                raise ValueError("Attention: 3-D inputs need the q_num_heads and kv_num_heads attributes")
            q = self._heads(q, self.q_num_heads)
            k, v = self._heads(k, self.kv_num_heads), self._heads(v, self.kv_num_heads)
        elif (self.q_num_heads not in (None, q.shape[1])) or (self.kv_num_heads not in (None, k.shape[1])):
            raise ValueError(f"Attention: q_num_heads={self.q_num_heads}, kv_num_heads={self.kv_num_heads} contradict "
                             f"the 4-D inputs' heads {q.shape[1]}, {k.shape[1]}")
        scale = 1 / math.sqrt(q.shape[3]) if self.scale is None else self.scale
        root = torch.tensor(math.sqrt(scale), dtype=q.dtype)  # the spec casts sqrt(scale) to Q's type
        if past_key is not None:
            k, v = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
        present_key, present_value = k, v
        past_len = 0 if past_key is None else past_key.shape[2]
        bias = self._bias(q, q.shape[2], k.shape[2], attn_mask, past_len, nonpad_kv_seqlen)
        if q.shape[1] != k.shape[1]:  # grouped-query attention: each K/V head serves consecutive Q heads
            k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
        qk = torch.matmul(q * root, (k * root).transpose(-1, -2))
        outputs = [qk]  # by qk_matmul_output_mode: raw, softcapped, with bias, softmax
        if self.softcap > 0:
            qk = self.softcap * torch.tanh(qk / self.softcap)
        outputs.append(qk)
        if bias is not None:
            qk = qk + bias
        outputs.append(qk)
        probs = torch.softmax(qk.to(self.softmax_precision or q.dtype), -1)
        if bias is not None:  # a row with no attendable key is zero (softmax made it NaN)
            probs = torch.where(bias.amax(-1, keepdim=True) == -math.inf, 0, probs)
        probs = probs.to(q.dtype)
        outputs.append(probs)
        y = torch.matmul(probs, v)
        if rank == 3:
            y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
        results = (y, present_key, present_value, outputs[self.qk_matmul_output_mode])
        return results[: self.outputs] if self.outputs > 1 else y

    def extra_repr(self) -> str:
        return attributes_repr(self, ["is_causal", "scale", "softcap", "qk_matmul_output_mode", "q_num_heads",
                                      "kv_num_heads", "softmax_precision", "left_window_size", "right_window_size"])


class NegativeLogLikelihoodLoss(Module):
    """ONNX NegativeLogLikelihoodLoss, and SoftmaxCrossEntropyLoss with ``log_softmax`` (the loss of the input's
    log-softmax over axis 1, which is the second output when ``outputs`` is 2): ``-input[n, target[n, d...], d...]``
    times the target's weight, 0 where the target is ignore_index; reduced by none, sum, or mean (divided by the sum
    of the applied weights)."""

    def __init__(self, reduction="mean", ignore_index=None, log_softmax=False, outputs=1):
        super().__init__()
        self.reduction, self.ignore_index = reduction, ignore_index
        self.log_softmax, self.outputs = log_softmax, outputs

    def forward(self, x, target, weight=None):
        log_prob = torch.log_softmax(x, 1) if self.log_softmax else x
        # without ignore_index no target is ignored (torch's default -100 would be)
        ignore_index = torch.iinfo(torch.int64).min if self.ignore_index is None else self.ignore_index
        loss = F.nll_loss(log_prob, target.long(), weight, ignore_index=ignore_index, reduction=self.reduction)
        return (loss, log_prob) if self.outputs > 1 else loss

    def extra_repr(self) -> str:
        return attributes_repr(self, ["reduction", "ignore_index"])


class GroupNormalization(Module):
    """ONNX GroupNormalization; ``per_group`` scale/bias (opset 18) are repeated over each group's channels."""

    def __init__(self, num_groups, epsilon=1e-5, stash_type=torch.float32, per_group=False):
        super().__init__()
        self.num_groups, self.epsilon, self.stash_type, self.per_group = num_groups, epsilon, stash_type, per_group

    def forward(self, x, scale, bias):
        if self.per_group:
            repeat = x.shape[1] // self.num_groups
            scale, bias = scale.repeat_interleave(repeat), bias.repeat_interleave(repeat)
        y = F.group_norm(x.to(self.stash_type), self.num_groups, None, None, self.epsilon).to(x.dtype)
        return y * _channel_view(scale, x.dim()) + _channel_view(bias, x.dim())

    def extra_repr(self) -> str:
        return attributes_repr(self, ["num_groups", "epsilon", "stash_type", "per_group"])


class LRN(Module):
    """ONNX LRN: the channel window is [c - floor((size-1)/2), c + ceil((size-1)/2)] (torch's
    nn.LocalResponseNorm centres even sizes the other way)."""

    def __init__(self, size, alpha=1e-4, beta=0.75, bias=1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.bias = size, alpha, beta, bias

    def forward(self, x):
        before = (self.size - 1) // 2
        squares = pad(x.square(), [0, before] + [0] * (x.dim() - 2), [0, self.size - 1 - before] + [0] * (x.dim() - 2))
        window = squares.unfold(1, self.size, 1).sum(-1)
        return x / (self.bias + self.alpha / self.size * window).pow(self.beta)

    def extra_repr(self) -> str:
        return attributes_repr(self, ["size", "alpha", "beta", "bias"])


class Dropout(Module):
    """ONNX Dropout. Inference (the default) is the identity; its mask is all ``inference_mask`` (onnxruntime:
    true from opset 12, false before), bool or (``bool_mask`` false, opset 7) of the input's type. In training mode
    (a constant or run-time ``training_mode`` input) elements are zeroed with probability ``ratio`` by torch's
    generator (seeded with ``seed`` when given; its numbers cannot match onnxruntime's), the rest scaled by
    1/(1-ratio).
    """

    def __init__(self, ratio=0.5, seed=None, training_mode=False, outputs=1, inference_mask=True, bool_mask=True):
        super().__init__()
        self.ratio, self.seed, self.training_mode, self.outputs = ratio, seed, training_mode, outputs
        self.inference_mask, self.bool_mask = inference_mask, bool_mask
        self._generator = None

    def forward(self, x, ratio=None, training_mode=None):
        if training_mode is None and not self.training_mode:
            y, mask = x, torch.full_like(x, self.inference_mask, dtype=torch.bool)
        else:
            ratio = self.ratio if ratio is None else ratio
            if self.seed is not None and self._generator is None:
                self._generator = torch.Generator(x.device).manual_seed(self.seed)
            mask = torch.rand(x.shape, generator=self._generator, device=x.device) >= ratio
            keep = mask.to(x.dtype) / (1 - ratio)
            if training_mode is not None:  # a run-time flag: when false, keep everything unscaled
                training = training_mode.to(torch.bool)
                mask, keep = mask | ~training, torch.where(training, keep, torch.ones_like(keep))
            y = x * keep
        if self.outputs == 1:
            return y
        return y, (mask if self.bool_mask else mask.to(x.dtype))

    def extra_repr(self) -> str:
        return attributes_repr(self, ["ratio", "seed", "training_mode", "inference_mask"])


# ----------------------------------------------------------------------------------------------- rearrangement

class DepthToSpace(Module):
    """ONNX DepthToSpace: DCR (depth, column, row) or CRD (column, row, depth = nn.PixelShuffle's order)."""

    def __init__(self, blocksize, mode="DCR"):
        super().__init__()
        self.blocksize, self.mode = blocksize, mode

    def forward(self, x):
        b, c, h, w = x.shape
        bs = self.blocksize
        if self.mode == "DCR":
            x = x.reshape(b, bs, bs, c // bs**2, h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            x = x.reshape(b, c // bs**2, bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
        return x.reshape(b, c // bs**2, h * bs, w * bs)

    def extra_repr(self) -> str:
        return f"blocksize={self.blocksize}, mode={self.mode!r}"


class SpaceToDepth(Module):
    """ONNX SpaceToDepth, the inverse of DepthToSpace in the same mode."""

    def __init__(self, blocksize, mode="DCR"):
        super().__init__()
        self.blocksize, self.mode = blocksize, mode

    def forward(self, x):
        b, c, h, w = x.shape
        bs = self.blocksize
        x = x.reshape(b, c, h // bs, bs, w // bs, bs)
        x = x.permute(0, 3, 5, 1, 2, 4) if self.mode == "DCR" else x.permute(0, 1, 3, 5, 2, 4)
        return x.reshape(b, c * bs * bs, h // bs, w // bs)

    def extra_repr(self) -> str:
        return f"blocksize={self.blocksize}, mode={self.mode!r}"


# ----------------------------------------------------------------------------------------------- linear algebra

class Gemm(Module):
    """ONNX Gemm with a run-time B (or C that is not a bias): alpha * A' @ B' + beta * C."""

    def __init__(self, alpha=1.0, beta=1.0, transA=0, transB=0):
        super().__init__()
        self.alpha, self.beta, self.transA, self.transB = alpha, beta, transA, transB

    def forward(self, a, b, c=None):
        y = (a.t() if self.transA else a) @ (b.t() if self.transB else b)
        if self.alpha != 1.0:
            y = y * self.alpha
        if c is not None:
            y = y + (c * self.beta if self.beta != 1.0 else c)
        return y

    def extra_repr(self) -> str:
        return attributes_repr(self, ["alpha", "beta", "transA", "transB"])


class Einsum(Module):
    """torch.einsum with a fixed equation."""

    def __init__(self, equation: str):
        super().__init__()
        self.equation = equation

    def forward(self, *operands):
        return torch.einsum(self.equation, *operands)

    def extra_repr(self) -> str:
        return repr(self.equation)


# ----------------------------------------------------------------------------------------------- resizing

def resize_geometry(in_sizes: Sequence[int], scales: Sequence[float] | None, sizes: Sequence[int] | None,
                    axes: Sequence[int] | None, policy: str = "stretch",
                    ratios: Sequence | None = None) -> tuple[list[int], list[float]]:
    """(output sizes, per-axis float32 scales as Python floats) as onnxruntime computes them: floor(scale * in) in
    float32 from scales (given as float32 values); from sizes the scale is out / in, and keep_aspect_ratio_policy
    rounds min/max(scale) * in half up.

    A whole scale k gives k * in without numpy: symbolic under compile/export (exact while float32 holds k * in
    exactly, below 2**24), and no numpy scalar for Dynamo to trace. A traced size under another scale is
    (in * p) // q, from ``ratios`` (each scale's ``floor_ratio``, computed at construction: numpy), with a check that
    it is within the sizes where that is proven."""
    rank = len(in_sizes)
    axes = list(range(rank)) if not axes else [a % rank for a in axes]
    factors = [1.0] * rank
    out = list(in_sizes)
    if scales:
        for i, (axis, value) in enumerate(zip(axes, scales, strict=True)):
            factors[axis] = value
            size = in_sizes[axis]
            if value == int(value) and (isinstance(size, torch.SymInt) or value * size < 2**24):
                out[axis] = int(value) * size
            elif isinstance(size, torch.SymInt) and ratios and ratios[i] is not None:
                p, q, limit = ratios[i]
                # guards on the input size, whose bounds torch.export's solver reads (it fails on the rational
                # bounds that the output size's >= 2, asked by broadcasting and contiguity, would give) and
                # names with the Dim to use where the Dim allows other sizes: outputs of 2 or more, exact sizes
                torch._check(size >= -(-2 * q // p))
                torch._check(size <= limit)
                out[axis] = size * p // q
            else:
                out[axis] = int(np.float32(value) * np.float32(size))
        return out, factors
    for axis, value in zip(axes, sizes, strict=True):
        out[axis] = value
        factors[axis] = _size_ratio(value, in_sizes[axis])
    if policy != "stretch":
        if torch.compiler.is_compiling():
            raise NotImplementedError(f"Resize: keep_aspect_ratio_policy {policy!r} under compile or export")
        chosen = (min if policy == "not_larger" else max)(factors[axis] for axis in axes)
        for axis in axes:
            factors[axis] = chosen
            out[axis] = math.floor(float(np.float32(chosen) * np.float32(in_sizes[axis])) + 0.5)
    return out, factors


def floor_ratio(scale: float, checked: int = 2**20) -> tuple[int, int, int] | None:
    """(p, q, limit): onnxruntime's output size under a float32 ``scale``, int(float32(n) * scale) in float32, is
    (n * p) // q for every size 0 <= n <= limit, or None where no p / q holds for n up to 2 (the scale is no
    ratio of small integers). p / q is the nearest ratio with q <= 2**16, compared with onnxruntime's arithmetic for
    every n below ``checked``; a scale that float32 holds exactly as p / q (q a power of 2: 0.5, 1.5, 0.375) has
    the exact product float32(n * p / q) while n * p < 2**24, so its limit extends that far."""
    ratio = Fraction(float(np.float32(scale))).limit_denominator(2**16)
    p, q = ratio.numerator, ratio.denominator
    n = np.arange(checked, dtype=np.int64)
    wrong = np.flatnonzero((n.astype(np.float32) * np.float32(scale)).astype(np.int64) != n * p // q)
    limit = int(wrong[0]) - 1 if wrong.size else checked - 1
    if ratio == float(np.float32(scale)) and not wrong.size:
        limit = max(limit, (2**24 - 1) // p)
    return (p, q, limit) if limit >= 2 else None


def _size_ratio(out: int, size: int) -> float | torch.Tensor:
    """float32(out) / float32(size), onnxruntime's scale of a resize to ``out``; for sizes torch.export traces, a 0-d
    float32 tensor computed from them (numpy would pin them: a Resize to the Shape of another tensor, as feature
    pyramids upsample, stays symbolic). Dynamo, which shows no SymInt here, guards on them as before."""
    if isinstance(out, torch.SymInt) or isinstance(size, torch.SymInt):
        return torch.full((), out, dtype=torch.float32) / torch.full((), size, dtype=torch.float32)
    return float(np.float32(out) / np.float32(size)) if size else 1.0


def _float32s(values: Sequence[float] | None) -> list[float] | None:
    """Each value rounded to float32, as a Python float."""
    return None if values is None else [float(np.float32(v)) for v in values]


def _original_coordinates(mode: str, length_out: int, length_in: int, scale, start: float, end: float):
    """Source coordinate of each output index on one axis, in float32 with onnxruntime's operation order."""
    x = torch.arange(length_out, dtype=torch.float32)
    scale = torch.as_tensor(scale, dtype=torch.float32)
    zeros = torch.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if length_out > 1 else zeros
    if mode == "align_corners":
        return zeros if length_out == 1 else x * (length_in - 1) / (length_out - 1)  # ints: traced sizes stay
    if mode == "tf_crop_and_resize":
        start32, end32 = torch.tensor(start, dtype=torch.float32), torch.tensor(end, dtype=torch.float32)
        if length_out > 1:
            return start32 * (length_in - 1) + x * (end32 - start32) * (length_in - 1) / (length_out - 1)
        return zeros + 0.5 * float(np.float32(start) + np.float32(end)) * (length_in - 1)
    if mode == "half_pixel_symmetric":  # onnxruntime mixes float and double here
        adjustment = np.float32(length_out) / (scale.numpy() * np.float32(length_in))
        offset = np.float32(length_in) / np.float32(2) * (np.float32(1) - adjustment)
        return (float(offset) + (x.double() + 0.5) / float(scale) - 0.5).float()
    return (x + 0.5) / scale - 0.5  # half_pixel


def _rounded(coordinates, nearest_mode: str, scale):
    floor = coordinates.floor()
    if nearest_mode == "simple":  # opset < 11 (Resize 10, Upsample): ceil when downscaling, else truncate
        return coordinates.ceil() if scale < 1 else coordinates.trunc()
    if nearest_mode == "floor":
        return floor
    if nearest_mode == "ceil":
        return coordinates.ceil()
    tie = coordinates - floor == 0.5  # torch.round breaks ties to even: decide ties explicitly
    return torch.where(tie, floor if nearest_mode == "round_prefer_floor" else coordinates.ceil(), coordinates.round())


def _cubic_coefficients(s, a):
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for fractions ``s`` (onnxruntime's formula)."""
    return torch.stack([((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
                        ((a + 2) * s - (a + 3)) * s * s + 1,
                        ((a + 2) * (1 - s) - (a + 3)) * (1 - s) * (1 - s) + 1,
                        ((a * (2 - s) - 5 * a) * (2 - s) + 8 * a) * (2 - s) - 4 * a], 1)


def _antialias_filter(u, mode: str, a):
    u = u.abs()
    if mode == "linear":
        return (1 - u).clamp(min=0)
    return torch.where(u < 1, ((a + 2) * u - (a + 3)) * u * u + 1, torch.where(u < 2, (((u - 5) * u + 8) * u - 4) * a,
                                                                                  torch.zeros_like(u)))


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """torch.take (eager); the native kernel's take (kernel/quantized_ops.cpp: no dispatch, 3.7 -> 2 us for a small
    image) where x is a contiguous CPU tensor that records no gradient."""
    if x.is_cpu and x.is_contiguous() and not (x.requires_grad and torch.is_grad_enabled()) and kernel.load("int8"):
        return NATIVE.take.default(x, index)
    return torch.take(x, index)


class Resize(Module):
    """ONNX Resize (and Upsample): separable per-axis resampling, exact to onnxruntime's arithmetic.

    Each resized axis becomes a table of source indices and weights (1 tap for nearest, 2 linear, 4 cubic, a
    stretched filter with antialias) computed in float32 as onnxruntime does, applied by gathering along the
    axis. Axes whose scale is 1 are left alone, and an input whose size does not change is returned as is (as
    onnxruntime does, also for tf_crop_and_resize). Static roi/scales/sizes are baked in; run-time ones are inputs.
    """

    ATTRIBUTES = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside",
                  "extrapolation_value", "antialias", "axes", "keep_aspect_ratio_policy", "roi", "scales", "sizes")

    def __init__(self, mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor",
                 cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, antialias=0, axes=None,
                 keep_aspect_ratio_policy="stretch", roi=None, scales=None, sizes=None):
        super().__init__()
        self.mode = mode
        self.coordinate_transformation_mode = coordinate_transformation_mode
        self.nearest_mode = nearest_mode
        self.cubic_coeff_a = cubic_coeff_a
        self.exclude_outside = exclude_outside
        self.extrapolation_value = extrapolation_value
        self.antialias = antialias
        self.axes = axes
        self.keep_aspect_ratio_policy = keep_aspect_ratio_policy
        self.roi, self.scales, self.sizes = roi, scales, sizes
        self._scales32 = _float32s(scales)  # numpy at construction, not in a traced forward
        self._ratios = scales and [None if v == int(v) else floor_ratio(v) for v in self._scales32]

    def forward(self, x, roi=None, scales=None, sizes=None):
        if (roi is None and scales is None and sizes is None and self.mode == "nearest"
                and self.coordinate_transformation_mode != "tf_crop_and_resize" and eager()):
            # static geometry: one gather per resized axis, its index kept per input size; a small output in one
            # gather of the whole tensor (torch.take: several times faster than index_select along an inner axis)
            key = (x.shape, x.device, torch.is_inference_mode_enabled())
            gathers = kept_geometry(self, key, lambda: self._gathers(x))
            if isinstance(gathers, torch.Tensor):
                return _take(x, gathers)
            y = x
            for axis, index in gathers:
                y = y.index_select(axis, index)
            return y
        # run-time values: only known here (an empty scales tensor means "use sizes")
        roi = self.roi if roi is None else roi.tolist()
        scales = self._scales32 if scales is None else _float32s(scales.tolist())
        sizes = ints(self.sizes, sizes)  # ints where computed from sizes (shape arithmetic): symbolic while traced
        in_sizes = list(x.shape)
        out_sizes, factors = resize_geometry(in_sizes, scales, sizes, self.axes, self.keep_aspect_ratio_policy,
                                             self._ratios if scales is self._scales32 else None)
        if all(known_true(o == i) for o, i in zip(out_sizes, in_sizes, strict=True)):
            return x
        if any(isinstance(f, torch.Tensor) for f in factors):
            self._refuse_traced_sizes()
        if self.mode != "nearest" and not x.is_floating_point():
            raise NotImplementedError(f"Resize mode {self.mode!r} on {x.dtype} is not supported")
        rank = x.dim()
        starts, ends = self._roi_bounds(rank, roi)
        y, valid = x, None
        for axis in range(rank):
            # a traced size known to stay (else resampled: an axis that keeps its size at run time is resampled as
            # the identity, where onnxruntime returns it as is: the same values but that linear and cubic weights of
            # 0 carry an inf or NaN to its neighbours)
            if known_true(out_sizes[axis] == in_sizes[axis]) if isinstance(factors[axis], torch.Tensor) \
                    else factors[axis] == 1:
                continue
            index, weight, inside = self._kept_taps(in_sizes[axis], out_sizes[axis], factors[axis], starts[axis],
                                                    ends[axis])
            if weight is None and not torch.compiler.is_compiling() and not torch.jit.is_tracing():
                y = y.index_select(axis, index[:, 0].to(x.device))  # nearest: one gather (eager)
            else:
                # (..., out, taps); rank - 1, not -1: the TorchScript exporter writes a -1 into a Transpose's perm
                moved = y.movedim(axis, rank - 1)[..., index.to(x.device)]
                if weight is None:
                    moved = moved[..., 0]
                else:
                    weight = weight.to(device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))
                    moved = (moved * weight).sum(-1)
                y = moved.to(x.dtype).movedim(rank - 1, axis)
            if self.coordinate_transformation_mode == "tf_crop_and_resize":
                inside = inside.to(x.device).reshape(-1, *[1] * (rank - 1 - axis))
                valid = inside if valid is None else valid & inside
        if valid is not None:
            y = torch.where(valid, y, torch.tensor(self.extrapolation_value, dtype=y.dtype, device=y.device))
        return y

    def _gathers(self, x) -> list[tuple[int, torch.Tensor]] | torch.Tensor:
        """(axis, source index) of each axis that nearest resizing with the static roi, scales and sizes changes
        (none where no size changes: onnxruntime then returns the input as is); for an output of up to
        ``_FLAT_GATHER`` elements, the flat source index of every output element instead (shaped as the output)."""
        in_sizes = list(x.shape)
        out_sizes, factors = resize_geometry(in_sizes, self._scales32, ints(self.sizes, None), self.axes,
                                             self.keep_aspect_ratio_policy, self._ratios)
        if out_sizes == in_sizes:
            return []
        starts, ends = self._roi_bounds(x.dim(), self.roi)
        gathers = [(axis, self._axis_taps(in_sizes[axis], out_sizes[axis], factors[axis], starts[axis],
                                          ends[axis])[0][:, 0].to(x.device))
                   for axis in range(x.dim()) if factors[axis] != 1]
        if math.prod(out_sizes) > _FLAT_GATHER:
            return gathers
        flat = torch.arange(x.numel(), device=x.device).reshape(in_sizes)
        for axis, index in gathers:
            flat = flat.index_select(axis, index)
        return flat

    def _roi_bounds(self, rank: int, roi) -> tuple[list[float], list[float]]:
        """Per axis (start, end) of the region of interest (0 and 1 where none)."""
        starts, ends = [0.0] * rank, [1.0] * rank
        if roi:
            axes = list(range(rank)) if not self.axes else [a % rank for a in self.axes]
            for i, axis in enumerate(axes):
                starts[axis], ends[axis] = roi[i], roi[i + len(axes)]
        return starts, ends

    def _refuse_traced_sizes(self) -> None:
        """Sizes computed at run time under compile/export: the modes whose arithmetic stays symbolic."""
        mode = self.coordinate_transformation_mode
        if self.antialias or mode in ("tf_crop_and_resize", "half_pixel_symmetric", "tf_half_pixel_for_nn"):
            what = "antialias" if self.antialias else f"coordinate_transformation_mode {mode!r}"
            raise NotImplementedError(f"Resize to sizes computed at run time with {what} under compile or export: "
                                      "export with the input's dims static")

    def _kept_taps(self, length_in, length_out, scale, start: float, end: float):
        """``_axis_taps``, kept per geometry between eager calls where the sizes and the scale are Python numbers
        (the tables cost several small ops per axis, more than a small image's gather)."""
        key = (length_in, length_out, scale, start, end)
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or any(
                isinstance(v, torch.Tensor | torch.SymInt | torch.SymFloat) for v in key):
            return self._axis_taps(*key)
        kept = self.__dict__.setdefault("_taps", {})
        if key not in kept:
            if len(kept) >= 64:  # many input sizes: start over
                kept.clear()
            kept[key] = self._axis_taps(*key)
        return kept[key]

    def _axis_taps(self, length_in: int, length_out: int, scale, start: float, end: float):
        """(source indices (out, taps), weights (out, taps) or None, in-range mask (out,)) for one axis."""
        original = _original_coordinates(self.coordinate_transformation_mode, length_out, length_in, scale, start, end)
        inside = (original >= 0) & (original <= length_in - 1)
        last = length_in - 1
        if self.mode == "nearest":
            return _rounded(original, self.nearest_mode, scale).long().clamp(0, last)[:, None], None, inside
        a = torch.tensor(self.cubic_coeff_a, dtype=torch.float32)
        if self.antialias:
            return (*self._antialias_taps(original, length_in, scale, a), inside)
        if self.mode == "linear":
            v = original.clamp(0, last)
            low = v.long().clamp(max=last)
            high = (low + 1).clamp(max=last)
            d_low, d_high = (v - low).abs(), (v - high).abs()
            same = low == high
            d_low, d_high = torch.where(same, 0.5, d_low), torch.where(same, 0.5, d_high)
            return torch.stack([low, high], 1), torch.stack([d_high, d_low], 1), inside
        base = original.floor()
        weight = _cubic_coefficients(original - base, a)
        taps = base.long()[:, None] + torch.arange(-1, 3)
        if self.exclude_outside:
            weight = torch.where((taps >= 0) & (taps <= last), weight, 0.0)
            weight = weight / weight.sum(1, keepdim=True)
        return taps.clamp(0, last), weight, inside

    def _antialias_taps(self, original, length_in: int, scale, a):
        """onnxruntime's antialiasing filter (Pillow's): the kernel stretched by 1/scale when downscaling, weights
        normalised; taps outside the input are dropped (exclude_outside) or read at the edge."""
        support_size = np.float32(2.0 if self.mode == "linear" else 4.0)
        stretch = np.float32(1.0) / np.float32(scale)
        support = support_size * np.float32(0.5) * (stretch if stretch >= 1 else np.float32(1.0))
        inv_scale = np.float32(1.0) / stretch if stretch >= 1 else np.float32(1.0)
        window = math.ceil(support) * 2 + 1
        center = original + 0.5
        low = ((center - float(support)).double() + 0.5).floor().long()
        high = ((center + float(support)).double() + 0.5).floor().long()
        if self.exclude_outside:
            low, high = low.clamp(min=0), high.clamp(max=length_in)
        taps = low[:, None] + torch.arange(window)
        used = torch.arange(window) < (high - low)[:, None]
        weight = _antialias_filter((taps.float() - center[:, None] + 0.5) * float(inv_scale), self.mode, a)
        weight = torch.where(used, weight, 0.0)
        total = weight.sum(1, keepdim=True)
        weight = torch.where((total != 0) & (total != 1), weight / total, weight)
        return taps.clamp(0, length_in - 1), weight

    def extra_repr(self) -> str:
        return attributes_repr(self, self.ATTRIBUTES)
