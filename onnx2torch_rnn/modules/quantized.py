"""Quantized arithmetic as onnxruntime's CPU kernels compute it.

Integer products are exact: matrix products of 8-bit operands run on torch's int8 GEMM (``int8_mm``) with
int32 accumulators, the zero points applied as row and column sums (``integer_matmul``); like onnxruntime's int32
accumulator they would only wrap past 2^31 (inner dimensions above 33,000 at full uint8 range). Convolutions run in
float32 where every partial sum stays an integer below 2^24 (at most 258 taps), else in float64. Float steps follow
onnxruntime's order of operations in float32: ``float(acc) * (a_scale * b_scale / y_scale)``, then rounding half to
even, then the zero point and saturation. Where MLAS fuses a multiply and an add (FMA), ``fma`` computes the product
exactly in float64 and rounds once more to float32.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import struct
from types import MappingProxyType

import numpy as np
import torch
from torch import Tensor

from ..recurrent import kernel
from ..recurrent.cells import Cell, decode
from ..recurrent.module import Recurrent, StackOps
from ..recurrent.op import PACKS, _checked, _owned, output_shapes, state_numbers
from ..recurrent.runtime import needs_grad, recurrent
from ..torch_compat import buffer_dict, parameter_dict
from .common import NATIVE, Module, attributes_repr, is_compiling, is_tracing, kept_geometry, kept_in
from .nn import AveragePool, Conv, MaxPool, _window_counts, pad
from .shape import Transpose, broadcast_sizes

_NATIVE = NATIVE  # the native kernel's int8 ops (tests spy on them here)
# Their packed weights (int8_matrix_pack, conv_weight_pack, dynamic_quantize_lstm_pack) are kept in recurrent/op.py's
# PACKS, by the weights' identity and version: the kernel is built against PyTorch's stable ABI, which shows C++
# neither.
BYTES = (torch.uint8, torch.int8)


def integer_range(dtype: torch.dtype) -> tuple[int, int]:
    info = torch.iinfo(dtype)
    return info.min, info.max


def as_float(value: Tensor | None) -> Tensor | None:
    """Integers or 16-bit floats as float32 (uint16 has few torch kernels: through int32)."""
    if value is None:
        return None
    return value.to(torch.int32).float() if value.dtype == torch.uint16 else value.float()


def saturate(value: Tensor, dtype: torch.dtype) -> Tensor:
    """Float values that are already integral, clamped to ``dtype``'s range; NaN becomes the lowest value (what
    MLAS's vector clamp gives)."""
    low, high = integer_range(dtype)
    return value.nan_to_num(nan=low).clamp(low, high).to(dtype)


def quantize(x: Tensor, scale: Tensor, zero_point: Tensor | None, dtype: torch.dtype) -> Tensor:
    """saturate(round_half_even(x / scale) + zero_point), the division in float32 (MlasQuantizeLinear)."""
    value = torch.round(x.float() / scale.float())
    if zero_point is not None:
        value = value + as_float(zero_point)
    return saturate(value, dtype)


def dequantize(q: Tensor, scale: Tensor, zero_point: Tensor | None) -> Tensor:
    """float32((int32(q) - int32(zero_point))) * scale, in float32."""
    q = q.to(torch.int32)
    if zero_point is not None:
        q = q - zero_point.to(torch.int32)
    return q.float() * scale.float()


def requantize(acc: Tensor, multiplier: Tensor, zero_point: Tensor | None, dtype: torch.dtype) -> Tensor:
    """An exact integer accumulator (any dtype) back to ``dtype``: round_half_even(float32(acc) * multiplier) +
    zero_point, saturated (MlasRequantizeOutput)."""
    value = torch.round(acc.float() * multiplier)
    return saturate(value if zero_point is None else value + as_float(zero_point), dtype)


def fma(a: Tensor | float, b: Tensor | float, c: Tensor | float) -> Tensor:
    """float32(a * b + c) with one rounding, as an FMA instruction: the product of two float32 values is exact in
    float64 (double rounding of the sum is possible but needs a 29-bit coincidence). Python floats are float32
    values here (folded constants)."""
    def wide(v):
        return v.double() if isinstance(v, Tensor) else v
    return (wide(a) * wide(b) + wide(c)).float()


def shifted(q: Tensor, zero_point: Tensor | None, dtype: torch.dtype = torch.float64) -> Tensor:
    """q - zero_point as floats (float64: exact for every integer type up to 32 bits; float32 up to 24)."""
    value = q.to(dtype)
    return value if zero_point is None else value - zero_point.to(dtype)


def _conv_dtype(w: Tensor) -> torch.dtype:
    """float32 where a convolution of 8-bit operands shifted by their zero points (each at most 255 in magnitude)
    by ``w`` stays exact in any summation order (every partial sum an integer below 2^24), else float64."""
    taps = math.prod(w.shape[1:])
    return torch.float32 if taps * 255 * 255 < 2**24 else torch.float64


def integer_conv(conv: Conv, x: Tensor, w: Tensor, x_zero_point: Tensor | None, w_zero_point: Tensor | None):
    """The exact convolution of x - x_zero_point by w - w_zero_point (per output channel or not), as floats."""
    dtype = _conv_dtype(w)
    return Conv.forward(conv, shifted(x, x_zero_point, dtype), shifted(w, _channel(w_zero_point, w.dim(), 0), dtype))


def per_axis(parameter: Tensor | None, x: Tensor, axis: int, block_size: int = 0) -> Tensor | None:
    """A scale or zero point shaped to broadcast against ``x``: a single value as is, a 1-D per-axis tensor along
    ``axis``, a blocked one (same rank as ``x``) repeated ``block_size`` times along ``axis`` and cut to x's size."""
    if parameter is None:
        return None
    if block_size:
        return parameter.repeat_interleave(block_size, dim=axis).narrow(axis, 0, x.shape[axis])
    if parameter.numel() == 1:
        return parameter.reshape(())
    axis = axis % x.dim()
    return parameter.reshape([-1 if d == axis else 1 for d in range(x.dim())])


# ----------------------------------------------------------------------------------------------- standard ops

# the types of the native kernel's quantize_linear output, by its code, and of its dequantize_linear input
_NATIVE_QUANTIZED = (torch.uint8, torch.int8, torch.uint16, torch.int16)
_NATIVE_DEQUANTIZED = (*_NATIVE_QUANTIZED, torch.int32)


def linear_numbers(scale: Tensor | None, zero_point: Tensor | None, dtype: torch.dtype | None = None) -> Tensor | None:
    """The int64 numbers of the native kernel's quantize_linear (``dtype``: its output type) or dequantize_linear
    (kernel/quantize_linear.cpp): [bits of the float32 scale, zero point(, output type code)]; None where it takes
    no such parameters: not one float32 scale and at most one zero point (blocks and axes then change nothing)."""
    if not (isinstance(scale, Tensor) and scale.numel() == 1 and scale.dtype == torch.float32 and (
            zero_point is None or (isinstance(zero_point, Tensor) and zero_point.numel() == 1))):
        return None
    if dtype is not None and dtype not in _NATIVE_QUANTIZED:
        return None
    code = [] if dtype is None else [_NATIVE_QUANTIZED.index(dtype)]
    zero = 0 if zero_point is None else int(zero_point.reshape(()))
    return torch.tensor([int(scale.reshape(()).view(torch.int32)), zero, *code], dtype=torch.int64)


class _Linear(Module):
    """QuantizeLinear / DequantizeLinear: the scale and zero point folded in where they are constants (buffers
    ``scale``, ``zero_point``; the converter then passes None for them), else both from each call. ``numbers``:
    the native kernel's (``linear_numbers``) of folded per-tensor parameters, made once, so that an eager call costs
    one check and one op (a plain attribute: a buffer's lookup alone costs more than a microsecond's tenth)."""

    def __init__(self, axis: int, block_size: int, output_dtype: torch.dtype | None, constants: tuple | None,
                 quantized: torch.dtype | None):
        super().__init__()
        self.axis, self.block_size, self.output_dtype = axis, block_size, output_dtype
        self.folded = constants is not None
        scale, zero_point = constants if self.folded else (None, None)
        self.register_buffer("scale", scale)
        self.register_buffer("zero_point", zero_point)
        self.numbers = linear_numbers(scale, zero_point, quantized) if self.folded else None

    def parameters_of(self, x: Tensor, scale: Tensor | None, zero_point: Tensor | None) -> tuple:
        """(scale, zero point) shaped to broadcast against x (``per_axis``)."""
        if self.folded:
            scale, zero_point = self.scale, self.zero_point
        args = (x, self.axis, self.block_size)
        return per_axis(scale, *args), per_axis(zero_point, *args)

    def extra_repr(self) -> str:
        return attributes_repr(self, ["axis", "block_size", "output_dtype"])


class QuantizeLinear(_Linear):
    """ONNX QuantizeLinear: per tensor, per axis or blocked; integer outputs (float8 is refused by the converter)."""

    def __init__(self, axis: int = 1, block_size: int = 0, output_dtype: torch.dtype = torch.uint8,
                 constants: tuple | None = None):
        super().__init__(axis, block_size, output_dtype, constants, output_dtype)

    def forward(self, x: Tensor, y_scale: Tensor | None = None, y_zero_point: Tensor | None = None) -> Tensor:
        if self.numbers is not None and x.dtype == torch.float32 and native(x):
            return _NATIVE.quantize_linear.default(x, self.numbers)
        if not self.folded and x.dtype == torch.float32 and native(x) and (
                numbers := linear_numbers(y_scale, y_zero_point, self.output_dtype)) is not None:
            return _NATIVE.quantize_linear.default(x, numbers)
        return quantize(x, *self.parameters_of(x, y_scale, y_zero_point), self.output_dtype)


class DequantizeLinear(_Linear):
    """ONNX DequantizeLinear: per tensor, per axis or blocked; float32 arithmetic, then the output type."""

    def __init__(self, axis: int = 1, block_size: int = 0, output_dtype: torch.dtype | None = None,
                 constants: tuple | None = None):
        super().__init__(axis, block_size, output_dtype, constants, None)
        if output_dtype not in (None, torch.float32):
            self.numbers = None

    def forward(self, x: Tensor, x_scale: Tensor | None = None, x_zero_point: Tensor | None = None) -> Tensor:
        if self.numbers is not None and x.dtype in _NATIVE_DEQUANTIZED and native(x):
            return _NATIVE.dequantize_linear.default(x, self.numbers)
        if not self.folded and self.output_dtype in (None, torch.float32) and x.dtype in _NATIVE_DEQUANTIZED and (
                native(x) and (numbers := linear_numbers(x_scale, x_zero_point)) is not None):
            return _NATIVE.dequantize_linear.default(x, numbers)
        scale, zero_point = self.parameters_of(x, x_scale, x_zero_point)
        return dequantize(x, scale, zero_point).to(self.output_dtype or scale.dtype)


class QuantizeDequantizeLinear(Module):
    """A QuantizeLinear read only by a DequantizeLinear (passes/qdq.py): the float values of the two modules, in one
    native call where both have folded per-tensor parameters (the same numbers: the integers never leave a
    register), else the two calls."""

    def __init__(self, quantize: QuantizeLinear, dequantize: DequantizeLinear):
        super().__init__()
        self.quantize, self.dequantize = quantize, dequantize
        numbers = quantize.numbers, dequantize.numbers
        usable = None not in numbers and dequantize.output_dtype in (None, torch.float32)
        self.numbers = torch.cat(numbers) if usable else None

    def forward(self, x: Tensor) -> Tensor:
        if self.numbers is not None and x.dtype == torch.float32 and native(x):
            return _NATIVE.quantize_dequantize_linear.default(x, self.numbers)
        return self.dequantize(self.quantize(x))


def dynamic_parameters(x: Tensor, leading: int = 0) -> tuple[Tensor, Tensor]:
    """(scale, zero point) of uint8 dynamic quantization over all of ``x`` (over each slice of its first ``leading``
    axes), as onnxruntime computes them: the range [min(x, 0), max(x, 0)] over 255 steps in float32 (scale 1 for an
    all-zero range), the zero point round_half_even(clamp(-min / scale, 0, 255))."""
    flat = x.float().reshape(*x.shape[:leading], -1)
    if flat.shape[-1] == 0:
        low = high = flat.new_zeros(flat.shape[:-1])
    else:
        low, high = torch.aminmax(flat, dim=-1)
        low, high = low.clamp(max=0), high.clamp(min=0)
    scale = torch.where(high == low, torch.ones_like(high), (high - low) / 255)
    zero_point = torch.round((0 - low / scale).clamp(0, 255))
    return scale, zero_point.to(torch.uint8)


def native(*tensors: Tensor) -> bool:
    """Whether an eager call runs the native kernel's int8 op (recurrent/kernel/quantized_ops.cpp, built on first
    use) instead of the Python implementation here, which computes the same numbers: CPU inference, not compiling
    or tracing. Every eager int8 node asks (it cost 0.75 us, now 0.3): the checks bound once (dynamo knows
    is_compiling by identity), grad mode before the tensors' flags, torch.jit.is_tracing's C check (torch.compile
    never reaches it: the compiling check comes first)."""
    return (not is_compiling() and tensors[0].is_cpu and not (_GRAD_ENABLED() and needs_grad(tensors))
            and not is_tracing() and kernel.load("int8"))


_GRAD_ENABLED = torch.is_grad_enabled


def dynamic_quantize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x quantized to uint8 over its own range (dynamic_parameters): (y, scale, zero point)."""
    if native(x):
        return _NATIVE.dynamic_quantize_linear(x)
    scale, zero_point = dynamic_parameters(x)
    return quantize(x, scale, zero_point, torch.uint8), scale, zero_point


class DynamicQuantizeLinear(Module):
    """ONNX DynamicQuantizeLinear: (y, y_scale, y_zero_point), uint8."""

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return dynamic_quantize(x)


def _row_zero_point(zero_point: Tensor | None) -> Tensor | None:
    """A's zero point: a scalar, or per row (an M-vector becomes a column)."""
    if zero_point is None or zero_point.numel() == 1:
        return None if zero_point is None else zero_point.reshape(())
    return zero_point.unsqueeze(-1) if zero_point.dim() == 1 else zero_point


def as_int8(q: Tensor) -> tuple[Tensor, int]:
    """(q - offset as int8, offset): uint8 values shifted by 128 (a flip of the top bit), int8 values as they are."""
    if q.dtype == torch.uint8:
        return torch.bitwise_xor(q, 128).view(torch.int8), 128
    return q, 0


def _offset(offset: int, zero_point: Tensor | None) -> Tensor | int:
    """offset - zero_point as int32 (a Python int when there is no zero point)."""
    return offset if zero_point is None else offset - zero_point.to(torch.int32)


def int8_mm(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for int8 matrices, exact in int32. torch's int8 GEMM on CPU; on CUDA it takes only more than 16 rows
    and sizes that are multiples of 8: other shapes (a recurrence's state, a batch of one) as float64 products,
    exact (|a @ b| < 2^14 * K, far below 2^53)."""
    (m, k), n = a.shape, b.shape[1]
    if a.device.type == "cpu" or (m > 16 and k % 8 == 0 and n % 8 == 0):
        return torch._int_mm(a, b)
    return torch.mm(a.double(), b.double()).to(torch.int32)


def integer_matmul(a: Tensor, b: Tensor, a_zero_point: Tensor | None, b_zero_point: Tensor | None) -> Tensor:
    """(a - a_zero_point) @ (b - b_zero_point) as int32, exact (a's zero point scalar or per row, b's scalar or per
    column; int8/uint8 operands), as onnxruntime's int32 accumulator (which wraps past 2^31 as int32 does here).

    With a 2-D b, torch's int8 GEMM (``torch._int_mm``) on the operands shifted to int8 (a = a8 + ca, b = b8 + cb),
    plus the zero-point terms: with da = ca - a_zp and db = cb - b_zp, the product is a8 @ b8 + da * colsum(b8) +
    rowsum(a8) * db + K * da * db. A batched b: float64 products of the shifted operands (exact)."""
    if b.dim() != 2:
        acc = torch.matmul(shifted(a, _row_zero_point(a_zero_point)), shifted(b, b_zero_point))
        return acc.to(torch.int32)
    if _native_matmul(a, b, a_zero_point, b_zero_point):
        return _NATIVE.matmul_integer(a, *packed_matrix(b, b_zero_point), a_zero_point)
    (a8, ca), (b8, cb) = as_int8(a), as_int8(b)
    da, db = _offset(ca, _row_zero_point(a_zero_point)), _offset(cb, b_zero_point)
    acc = int8_mm(a8.reshape(-1, a8.shape[-1]), b8).reshape(*a8.shape[:-1], b8.shape[-1])
    if not isinstance(da, int) or da:
        acc = acc + da * b8.sum(0, dtype=torch.int32)
    if not isinstance(db, int) or db:
        acc = acc + a8.sum(-1, keepdim=True, dtype=torch.int32) * db
        acc = acc + a8.shape[-1] * da * db if not isinstance(da, int) or da else acc
    return acc


def _native_matmul(a: Tensor, b: Tensor, a_zero_point: Tensor | None, b_zero_point: Tensor | None) -> bool:
    """Whether the native kernel's matmul_integer takes these operands (8-bit, zero points as it reads them)."""
    def fits(zero_point: Tensor | None, count: int) -> bool:
        return zero_point is None or zero_point.numel() == 1 or (zero_point.dim() == 1 and len(zero_point) == count)

    byte = (torch.uint8, torch.int8)
    return (a.dtype in byte and b.dtype in byte and fits(a_zero_point, a.shape[-2] if a.dim() > 1 else 1)
            and fits(b_zero_point, b.shape[1]) and native(a))


def packed_matrix(b: Tensor, zero_point: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """b [K, N] (8-bit) as the native products read it, kept per version (PACKS): int8_matrix_pack's panels and column
    sums, and the offsets (``weight_offsets``)."""
    def pack():
        return (*_NATIVE.int8_matrix_pack(b.contiguous()), weight_offsets(b, zero_point, b.shape[1]))

    return PACKS.made([b] if zero_point is None else [b, zero_point], ("int8_matrix_pack",), pack)


def weight_offsets(weight: Tensor, zero_point: Tensor | None, channels: int) -> Tensor:
    """What turns the packed int8 weights back into weight - zero point, per output channel (int32, contiguous): 128
    for uint8 weights (packed shifted by 128), minus the zero point (one value or one per channel)."""
    shift = torch.full((channels,), 128 if weight.dtype == torch.uint8 else 0, dtype=torch.int32)
    return shift if zero_point is None else (shift - zero_point.to(torch.int32).reshape(-1)).contiguous()


class MatMulInteger(Module):
    """ONNX MatMulInteger: the exact int32 product of the zero-point-shifted operands."""

    def forward(self, a: Tensor, b: Tensor, a_zero_point: Tensor | None = None,
                b_zero_point: Tensor | None = None) -> Tensor:
        return integer_matmul(a, b, a_zero_point, b_zero_point)


def _channel(parameter: Tensor | None, rank: int, axis: int = 1) -> Tensor | None:
    """A per-output-channel parameter ([M] or a single value) shaped to broadcast along ``axis`` of a tensor of
    ``rank`` dims (axis 1 of the output, axis 0 of the weight)."""
    if parameter is None or parameter.numel() == 1:
        return None if parameter is None else parameter.reshape(())
    return parameter.reshape([-1 if d == axis else 1 for d in range(rank)])


def native_conv(conv: Conv, x: Tensor, w: Tensor, x_zero_point: Tensor | None,
                w_zero_point: Tensor | None) -> Tensor | None:
    """The exact int32 convolution by the native kernel's conv_integer (recurrent/kernel/conv_integer.cpp) where it
    takes these operands (8-bit, 1-3 spatial axes, x's zero point one value, w's one or per output channel), else
    None (the caller computes it as ``integer_conv`` does: the same numbers)."""
    byte = (torch.uint8, torch.int8)
    if not (x.dtype in byte and w.dtype in byte and 3 <= x.dim() <= 5 and w.dim() == x.dim()
            and (x_zero_point is None or x_zero_point.numel() == 1)
            and (w_zero_point is None or w_zero_point.numel() in (1, w.shape[0])) and native(x)):
        return None
    strides, dilations, begins, ends = conv.geometry(x, w)
    if min(begins + ends) < 0:
        return None
    return _NATIVE.conv_integer(x, *packed_conv(w, w_zero_point, conv.group), x_zero_point, list(w.shape), strides,
                                begins + ends, dilations, conv.group)


def packed_conv(w: Tensor, zero_point: Tensor | None, group: int) -> tuple[Tensor, Tensor, Tensor]:
    """w [M, C / group, *kernel] (8-bit) as the native convolutions read it, kept per version (PACKS):
    conv_weight_pack's panels and column sums, and the offsets (``weight_offsets``)."""
    def pack():
        return (*_NATIVE.conv_weight_pack(w.contiguous(), group), weight_offsets(w, zero_point, w.shape[0]))

    return PACKS.made([w] if zero_point is None else [w, zero_point], ("conv_weight_pack", group), pack)


class ConvInteger(Conv):
    """ONNX ConvInteger: exact int32 convolution of x - x_zero_point by w - w_zero_point (per output channel or
    not); padding counts as x_zero_point, i.e. zero after the shift."""

    def forward(self, x: Tensor, w: Tensor, x_zero_point: Tensor | None = None,
                w_zero_point: Tensor | None = None) -> Tensor:
        acc = native_conv(self, x, w, x_zero_point, w_zero_point)
        return integer_conv(self, x, w, x_zero_point, w_zero_point).to(torch.int32) if acc is None else acc


def native_requantize(acc: Tensor, multiplier: Tensor, bias: Tensor | None, zero_point: Tensor | int | None,
                      dtype: torch.dtype, inner: int) -> Tensor | None:
    """``requantize`` of an int32 accumulator (plus an int32 bias, added first, wrapping) by the native kernel's
    requantize (recurrent/kernel/qlinear.cpp) where it takes it: multiplier and bias one value or one per run of
    ``inner`` outputs (per channel of a convolution, per column of a product), a single zero point; else None."""
    if not (acc.dtype == torch.int32 and dtype in BYTES and multiplier.dtype == torch.float32 and native(acc)
            and (zero_point is None or isinstance(zero_point, int) or zero_point.numel() == 1)
            and (bias is None or bias.dtype == torch.int32)):
        return None
    zero = zero_point if isinstance(zero_point, int) else 0 if zero_point is None else int(zero_point)
    bias = None if bias is None else bias.reshape(-1)
    return _NATIVE.requantize.default(acc.contiguous(), multiplier.reshape(-1), bias, zero, dtype, inner)


class _Folded(Module):
    """A QLinear module whose constant inputs the converter folded into buffers (``FOLDED``, by forward argument
    name; None where a folded input is absent) plus the requantization multiplier and the output zero point as an
    int, computed once; the converter then passes None for those inputs."""

    FOLDED: tuple[str, ...] = ()

    def fold(self, constants: dict[str, Tensor | None] | None, multiplier) -> None:
        self.folded = constants is not None
        for name in self.FOLDED:
            self.register_buffer(name, None if constants is None else constants[name])
        self.register_buffer("multiplier", None if constants is None else multiplier(**constants))
        zero_point = None if constants is None else constants["y_zero_point"]
        self.y_zero = None if zero_point is None else int(zero_point)

    def fold_product(self, b: str, bias: str | None) -> None:
        """Whether the native kernel's qlinear_matmul can compute the folded product: b [K, N] 8-bit, a's zero point
        one value, b's one or per column, the multiplier and the int32 bias (buffer ``bias``) one or per column, an
        8-bit output (``self.fused``: N, else None)."""
        buffers, self.fused = buffer_dict(self), None
        w, a_zero, b_zero, y_zero = (buffers.get(n) for n in (b, "a_zero_point", "b_zero_point", "y_zero_point"))
        c = buffers.get(bias) if bias else None
        if not self.folded or w is None or w.dim() != 2 or w.dtype not in BYTES or y_zero is None:
            return
        n, multiplier = w.shape[1], buffers["multiplier"]

        def per_column(t: Tensor) -> bool:
            return t.numel() == 1 or (t.numel() == n and t.shape[-1] == n)

        if (y_zero.dtype in BYTES and y_zero.numel() == 1 and (a_zero is None or a_zero.numel() == 1)
                and (b_zero is None or b_zero.numel() == 1 or (b_zero.dim() == 1 and len(b_zero) == n))
                and multiplier.dtype == torch.float32 and per_column(multiplier)
                and (c is None or (c.dtype == torch.int32 and per_column(c)))):
            self.fused = n
            self.product_names = (b, "a_zero_point", "b_zero_point", "multiplier", bias)

    def fused_product(self, a: Tensor) -> Tensor | None:
        """The folded product by the native kernel's qlinear_matmul (one call: the int8 product and the
        requantization) where it takes ``a`` (8-bit [..., K], or of any rank flattened to [rows, K] by the module's
        ``flatten``, a Flatten before it; CPU inference), else None. Its arguments are kept per input shape while
        the buffers are the same tensors at the same versions (``kept_values``)."""
        if not native(a):
            return None
        buffers = buffer_dict(self)
        calls, operands = kept_values(self, [None if name is None else buffers[name] for name in self.product_names],
                                      self._product_calls)
        call = kept_in(calls, (a.shape, a.dtype), lambda: self._product_call(a, operands))
        return _NATIVE.qlinear_matmul.default(a if a.is_contiguous() else a.contiguous(), *call) if call else None

    def _product_calls(self, *values) -> tuple[dict, tuple]:
        """An empty dict of qlinear_matmul's arguments per input shape, and its operands for these buffers."""
        return {}, self._product_operands(*values)

    def _product_call(self, a: Tensor, operands: tuple) -> tuple:
        """qlinear_matmul's arguments after ``a`` of this shape and type, () where it does not take it."""
        flatten, k = self._modules.get("flatten"), buffer_dict(self)[self.product_names[0]].shape[0]
        axis = -1 if flatten is None else flatten.axis + a.dim() if flatten.axis < 0 else flatten.axis
        if not (a.dtype in BYTES and (a.dim() >= 1 and a.shape[-1] == k if flatten is None else
                                      0 <= axis <= a.dim() and math.prod(a.shape[axis:]) == k)):
            return ()
        *product, numbers = operands
        return (*product, numbers) if flatten is None else (*product, torch.cat([numbers, torch.tensor(
            [axis], dtype=torch.int32)]))

    def _product_operands(self, b, a_zero_point, b_zero_point, multiplier, bias) -> tuple:
        """qlinear_matmul's operands after a: b packed, its offsets (128 for uint8 b, minus its zero point), the
        multiplier, the int32 bias per column (None), [a_zero, y_zero, int8 output]."""
        panels, sums = _NATIVE.int8_matrix_pack(b.contiguous())
        n = b.shape[1]
        offsets = weight_offsets(b, b_zero_point, n)
        bias = None if bias is None else bias.reshape(-1).expand(n).contiguous()
        signed = int(buffer_dict(self)["y_zero_point"].dtype == torch.int8)
        a_zero = 0 if a_zero_point is None else int(a_zero_point)
        numbers = torch.tensor([a_zero, self.y_zero, signed], dtype=torch.int32)
        return panels, sums, offsets, multiplier.reshape(-1).contiguous(), bias, numbers

    def folded_values(self, given: dict) -> tuple[dict, Tensor | None, int | Tensor | None]:
        """(inputs by name, multiplier, output zero point) from the buffers when folded, else as given."""
        if not self.folded:
            return given, None, given.get("y_zero_point")
        buffers = buffer_dict(self)
        return {**given, **{name: buffers[name] for name in self.FOLDED}}, buffers["multiplier"], self.y_zero


def _matmul_multiplier(a_scale, b_scale, y_scale, **_):
    return as_float(a_scale) * as_float(b_scale) / as_float(y_scale)


class QLinearMatMul(_Folded):
    """ONNX QLinearMatMul: exact integer product, requantized with a_scale * b_scale / y_scale (float32)."""

    FOLDED = ("a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point")

    def __init__(self, constants: dict[str, Tensor | None] | None = None):
        super().__init__()
        self.fold(constants, _matmul_multiplier)
        self.fold_product("b", None)

    def forward(self, a, a_scale=None, a_zero_point=None, b=None, b_scale=None, b_zero_point=None, y_scale=None,
                y_zero_point=None):
        if self.fused and (y := self.fused_product(a)) is not None:
            return y
        v, multiplier, zero = self.folded_values(dict(a_scale=a_scale, a_zero_point=a_zero_point, b=b,
                                                      b_scale=b_scale, b_zero_point=b_zero_point, y_scale=y_scale,
                                                      y_zero_point=y_zero_point))
        multiplier = _matmul_multiplier(**v) if multiplier is None else multiplier
        acc = integer_matmul(a, v["b"], v["a_zero_point"], v["b_zero_point"])
        dtype = v["y_zero_point"].dtype
        if multiplier.numel() in (1, acc.shape[-1]) and acc.dim() >= 1 and (
                y := native_requantize(acc, multiplier, None, zero, dtype, 1)) is not None:
            return y
        return requantize(acc, multiplier, v["y_zero_point"], dtype)


def _conv_multiplier(x_scale, w_scale, y_scale, **_):
    return as_float(x_scale) * as_float(w_scale) / as_float(y_scale)


class QLinearConv(Conv, _Folded):
    """ONNX QLinearConv: exact integer convolution plus the int32 bias, requantized per output channel with
    x_scale * w_scale / y_scale (float32)."""

    FOLDED = ("x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B")

    def __init__(self, constants: dict[str, Tensor | None] | None = None, pool: MaxPool | None = None,
                 lookup: QLinearLookup | None = None, quantize: QuantizeLinear | None = None, **attributes):
        super().__init__(**attributes)
        self.fold(constants, _conv_multiplier)
        # a MaxPool or a QLinearLookup after it, the QuantizeLinear that makes its x from floats before it
        # (passes/quantized.py): in the native call with folded constants
        self.pool, self.lookup, self.quantize = pool, lookup, quantize

    def forward(self, x, x_scale=None, x_zero_point=None, w=None, w_scale=None, w_zero_point=None, y_scale=None,
                y_zero_point=None, B=None):
        if self.folded and native(x):  # the converter's case: one kept lookup, one call
            call = self._native_call(x)
            if call:
                return _NATIVE.qlinear_conv.default(x if x.is_contiguous() else x.contiguous(), *call)
        x = x if self.quantize is None else self.quantize(x)
        y = self._convolve(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B)
        y = y if self.lookup is None else self.lookup(y)
        return y if self.pool is None else self.pool(y)

    def _convolve(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B):
        """The convolution alone, by the native kernel where it takes it, else here (the reference)."""
        v, multiplier, zero = self.folded_values(dict(x_scale=x_scale, x_zero_point=x_zero_point, w=w,
                                                      w_scale=w_scale, w_zero_point=w_zero_point, y_scale=y_scale,
                                                      y_zero_point=y_zero_point, B=B))
        multiplier = _conv_multiplier(**v) if multiplier is None else multiplier
        w, B, dtype = v["w"], v["B"], v["y_zero_point"].dtype
        if x.dtype in BYTES and native(x) and (numbers := self._numbers(x, v, multiplier, zero)) is not None:
            return _NATIVE.qlinear_conv.default(x.contiguous(), *self._operands(w, v["w_zero_point"], multiplier, B),
                                                numbers, None)
        acc = native_conv(self, x, w, v["x_zero_point"], v["w_zero_point"])  # int32
        if acc is None:
            acc = integer_conv(self, x, w, v["x_zero_point"], v["w_zero_point"]).double()
        if B is not None:  # + the int32 bias as onnxruntime adds it
            acc = acc + _channel(B.to(acc.dtype), acc.dim())
        return requantize(acc, _channel(multiplier, acc.dim()), v["y_zero_point"], dtype)

    def _native_call(self, x: Tensor) -> tuple:
        """qlinear_conv's arguments after x with the folded constants, () where it does not take this input: the
        packed weights and the lookup's table, kept while the buffers are the same tensors at the same versions
        (``kept_values``), with the numbers of each input shape (kept alike)."""
        buffers, lookup = buffer_dict(self), self._modules.get("lookup")  # __getattr__ would cost a microsecond
        table = None if lookup is None else buffer_dict(lookup)["constant_table"]
        calls, operands = kept_values(self, [buffers["w"], buffers["w_zero_point"], buffers["multiplier"],
                                             buffers["B"], table], self._calls)
        return kept_in(calls, (x.shape, x.dtype), lambda: self._call(x, operands, table))

    def _call(self, x: Tensor, operands: tuple, table: Tensor | None) -> tuple:
        numbers = self._numbers(x, self.folded_values({})[0], pooled=True)
        return () if numbers is None else (*operands, numbers, table)

    def _calls(self, w, w_zero_point, multiplier, B, table) -> tuple[dict, tuple]:
        """An empty dict of qlinear_conv's arguments per input shape, and its operands for these buffers."""
        return {}, self._operands(w, w_zero_point, multiplier, B)

    def _operands(self, w: Tensor, w_zero_point: Tensor | None, multiplier: Tensor, B: Tensor | None) -> tuple:
        """qlinear_conv's operands between x and the numbers: w packed (``packed_conv``), the multiplier and the
        bias as vectors."""
        bias = None if B is None else B.reshape(-1).contiguous()
        return (*packed_conv(w, w_zero_point, self.group), multiplier.reshape(-1).contiguous(), bias)

    def _numbers(self, x: Tensor, v: dict, multiplier: Tensor | None = None, zero=None,
                 pooled: bool = False) -> Tensor | None:
        """The native kernel's qlinear_conv numbers (recurrent/kernel/conv_integer.cpp: zero points, output type,
        group, kernel, geometry; ``pooled``, the fused call: with the quantization of a float x where a
        QuantizeLinear comes first, then the MaxPool's, if any) where it takes this node (8-bit x, or float32 x with
        a QuantizeLinear of folded per-tensor parameters to 8 bits; 1-3 spatial axes, x's zero point one value, w's
        one or per output channel, an int32 bias per output channel), else None. Folded: computed once per input
        shape (the multiplier a buffer)."""
        if multiplier is None:
            multiplier, zero = buffer_dict(self)["multiplier"], self.y_zero
        w, x_zero_point, w_zero_point, B = v["w"], v["x_zero_point"], v["w_zero_point"], v["B"]
        dtype, quantizing = v["y_zero_point"].dtype, pooled and self.quantize is not None
        quantization = self.quantize.numbers if quantizing else None  # [scale bits, zero point, type: 0 or 1]
        if not (x.dtype == torch.float32 and quantization is not None and int(quantization[2]) in (0, 1)
                if quantizing else x.dtype in BYTES):
            return None
        if not (w.dtype in BYTES and dtype in BYTES and 3 <= x.dim() <= 5 and w.dim() == x.dim()
                and x.shape[1] == w.shape[1] * self.group and w.shape[0] % self.group == 0
                and (x_zero_point is None or x_zero_point.numel() == 1) and multiplier.dtype == torch.float32
                and (w_zero_point is None or w_zero_point.numel() in (1, w.shape[0]))
                and multiplier.numel() in (1, w.shape[0])
                and (B is None or (B.dtype == torch.int32 and B.numel() == w.shape[0]))
                and v["y_zero_point"].numel() == 1 and (not self.folded or multiplier.dim() <= 1)):
            return None
        geometry = self.geometry(x, w)
        pool = pooled_numbers(self.pool if pooled else None, x, w, *geometry)
        table = None if self.lookup is None else self.lookup.constant_table
        if min(geometry[2] + geometry[3]) < 0 or pool is None or (pooled and self.lookup is not None and (
                self.pool is not None or table is None or table.dtype != dtype or not table.is_contiguous())):
            return None
        x_zero = 0 if x_zero_point is None else int(x_zero_point)
        return torch.tensor([x_zero, int(zero), int(dtype == torch.int8), *([] if quantization is None else
                             quantization.tolist()), self.group, *conv_numbers(w, *geometry), *pool], dtype=torch.int64)


# ----------------------------------------------------------------------------------------------- com.microsoft ops

_CHUNK = 1 << 17  # elements of a large tensor per pass of the rational approximations


def _rational(x: Tensor, bound: float, p: tuple[float, ...], q: tuple[float, ...]) -> Tensor:
    """clamp(x, -bound, bound) * p(x^2) / q(x^2) in float32, p and q by Horner's rule with one fused multiply-add
    per step (the float32 product is exact in float64: one rounding per step), both evaluated at once (the shorter
    one padded with leading zeros, which leave its steps unchanged). NaN stays NaN (torch's clamp keeps it, as
    MLAS's max/min order does)."""
    x = x.float()
    # float64 temporaries of a large tensor: eager runs chunks that stay in cache (5-10x faster), joined out of place
    # (autograd); compiled code is fused, and chunking would tie the program to a size range
    if not torch.compiler.is_compiling() and x.numel() > _CHUNK:
        parts = [_rational(part, bound, p, q) for part in x.reshape(-1).split(_CHUNK)]
        return torch.cat(parts).reshape(x.shape)
    clamped = x.clamp(-bound, bound)
    x2 = (clamped * clamped).double()
    n = max(len(p), len(q))
    pairs = list(zip((0.0,) * (n - len(p)) + p, (0.0,) * (n - len(q)) + q, strict=True))
    coefficients = torch.tensor(pairs, dtype=torch.float64, device=x.device).reshape(n, 2, *[1] * x.dim())
    value = coefficients[0].float()
    for k in range(1, n):
        value = torch.addcmul(coefficients[k], x2, value).float()
    return clamped * value[0] / value[1]


def mlas_logistic(x: Tensor) -> Tensor:
    """MlasComputeLogistic as its FMA3 kernel computes it (float32, x clamped to [-18, 18]): Eigen's rational
    approximation p(x) / q(x) + 0.5 with fused multiply-adds, then max(0, .). NaN stays NaN."""
    return (_rational(x, 18.0, _LOGISTIC_P, _LOGISTIC_Q) + 0.5).clamp(min=0.0)


def _float32(*values: float) -> tuple[float, ...]:
    """The float32 constants of a C++ kernel, as Python floats."""
    return tuple(float(np.float32(v)) for v in values)


_LOGISTIC_P = _float32(4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
               2.48287947061529e-01)  # alpha_9 ... alpha_1
_LOGISTIC_Q = _float32(6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
               1.16817656904453e-01, 9.93151921023180e-01)  # beta_10 ... beta_0


def dynamic_matmul(a_float: Tensor, b: Tensor, b_zero_point: Tensor | None) -> tuple[Tensor, Tensor]:
    """A quantized on the fly to uint8 (dynamic_parameters), times B: (exact integer product, a's scale)."""
    a, scale, zero_point = dynamic_quantize(a_float)
    return integer_matmul(a, b, zero_point, b_zero_point), scale


def scale_bias(acc: Tensor, multiplier: Tensor, bias: Tensor | None) -> Tensor:
    """float32(acc) * multiplier (+ bias), each step rounded to float32 (MLAS's scale-bias output processor)."""
    value = acc.float() * multiplier
    return value if bias is None else value + bias.float()


class DynamicQuantizeMatMul(Module):
    """com.microsoft DynamicQuantizeMatMul: A quantized to uint8 over the whole tensor, integer product with B,
    scaled by a_scale * b_scale (float32), plus the bias."""

    def forward(self, a, b, b_scale, b_zero_point=None, bias=None):
        acc, a_scale = dynamic_matmul(a, b, b_zero_point)
        return scale_bias(acc, a_scale * b_scale.float(), bias)


class MatMulIntegerToFloat(Module):
    """com.microsoft MatMulIntegerToFloat: integer product scaled by a_scale * b_scale (float32), plus the bias."""

    def forward(self, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        acc = integer_matmul(a, b, a_zero_point, b_zero_point)
        return scale_bias(acc, a_scale.float() * b_scale.float(), bias)


class DynamicQuantizedProduct(Module):
    """DynamicQuantizeLinear -> MatMulInteger or ConvInteger by constant weights -> Cast to float -> Mul by
    x_scale * w_scale (-> Add of a constant bias) (-> Relu) (-> MaxPool after a convolution) in one module
    (passes/quantized.py): the same float32 steps as those nodes. In eager CPU inference one call of the native
    kernel (``dynamic_quantized_matmul`` or ``dynamic_quantized_conv``, which applies the Relu and the pooling too) on
    the weights prepared once per weight version (``_operands``), where the scale and bias vary along the output
    channel only; else those steps here (the reference)."""

    def __init__(self, integer: MatMulInteger | ConvInteger, weight: Tensor, weight_zero_point: Tensor | None,
                 weight_scale: Tensor, bias: Tensor | None, relu: bool = False, pool: MaxPool | None = None):
        super().__init__()
        self.integer, self.relu, self.pool = integer, relu, pool
        for name, value in (("weight", weight), ("weight_zero_point", weight_zero_point),
                            ("weight_scale", weight_scale), ("bias", bias)):
            self.register_buffer(name, value)
        self.native_form = _native_form(integer, weight, weight_zero_point, weight_scale, bias)
        # the matmul's output rank must not grow by the scale's or bias's broadcast
        self.min_rank = max([1, *(t.dim() for t in (weight_scale, bias) if t is not None)])
        self.group = getattr(integer, "group", 1)  # read at every call: a plain attribute, not the child's

    def forward(self, x: Tensor) -> Tensor:
        if self.native_form is not None and x.dtype == torch.float32 and native(x):
            y = self._native(x)
            if y is not None:
                return y
        q, scale, zero_point = dynamic_quantize(x)
        acc = type(self.integer).forward(self.integer, q, self.weight, zero_point, self.weight_zero_point)
        value = acc.float() * (scale * self.weight_scale)
        value = value if self.bias is None else value + self.bias
        value = torch.relu(value) if self.relu else value
        return value if self.pool is None else self.pool(value)

    def _native(self, x: Tensor) -> Tensor | None:
        """The native kernel's call, or None where x does not fit it (the reference path then says why, if at all)."""
        weight, operands = self._operands()
        x = x if x.is_contiguous() else x.contiguous()
        if self.native_form == "matmul":
            if x.dim() < self.min_rank or x.shape[-1] != weight.shape[0]:
                return None
            y = _NATIVE.dynamic_quantized_matmul.default(x, *operands)
            return torch.relu_(y) if self.relu else y
        numbers = kept_geometry(self, x.shape, lambda: self._numbers(x, weight))
        return None if numbers is None else _NATIVE.dynamic_quantized_conv.default(x, *operands, numbers)

    def _numbers(self, x: Tensor, weight: Tensor) -> Tensor | None:
        """dynamic_quantized_conv's numbers for this input shape (automatic pads depend on it): Relu, group, kernel,
        strides, pads, dilations (and the pooling's: ``pooled_numbers``); None where x does not fit the op."""
        if x.dim() != weight.dim() or x.shape[1] != weight.shape[1] * self.group:
            return None
        numbers = self.integer.geometry(x, weight)
        pool = pooled_numbers(self.pool, x, weight, *numbers)
        if min(numbers[2] + numbers[3], default=0) < 0 or pool is None:
            return None
        return torch.tensor([int(self.relu), self.group, *conv_numbers(weight, *numbers), *pool], dtype=torch.int64)

    def _operands(self) -> tuple[Tensor, tuple]:
        """(weight, the native op's weight operands), prepared once per version of the buffers: packing costs more
        than a small product."""
        return kept_operands(self, ("weight", "weight_zero_point", "weight_scale", "bias"),
                             lambda w, z, s, b: (w, _prepare(self.native_form, self.group, w, z, s, b)))


def conv_numbers(weight: Tensor, strides: list, dilations: list, begins: list, ends: list) -> list[int]:
    """A native convolution's geometry numbers (recurrent/kernel/conv_integer.cpp): kernel, strides, pads, dilations
    per spatial axis."""
    return [*weight.shape[2:], *strides, *begins, *ends, *dilations]


def pooled_numbers(pool, x: Tensor, weight: Tensor, strides: list, dilations: list, begins: list,
                   ends: list) -> list[int] | None:
    """The numbers of the MaxPool a native convolution applies to its output (none: []), None where that pooling
    does not fit (the caller then runs its Python path)."""
    if pool is None:
        return []
    sizes = [(size + b + e - (k - 1) * d - 1) // s + 1 for size, k, s, d, b, e in
             zip(x.shape[2:], weight.shape[2:], strides, dilations, begins, ends, strict=True)]
    if min(sizes, default=1) < 1:
        return None
    numbers = pool.native_numbers(torch.empty(x.shape[0], weight.shape[0], *sizes, device="meta"))
    return None if numbers is None else numbers.tolist()


def kept_operands(module: Module, names: tuple[str | None, ...], prepare):
    """``prepare(*buffers)`` of the module's buffers ``names`` (None for a name None), kept in the module between
    eager calls while each is the same tensor at the same version (load_state_dict and .to() change them). Inference
    tensors have no version counter: prepared at every call."""
    buffers = buffer_dict(module)
    return kept_values(module, [None if name is None else buffers[name] for name in names], prepare)


def kept_values(module: Module, values: list[Tensor | None], prepare):
    """``prepare(*values)``, kept as ``kept_operands`` keeps it (tensors from anywhere: a child's buffers too)."""
    try:
        versions = [None if t is None else t._version for t in values]
    except RuntimeError:
        return prepare(*values)
    kept = module.__dict__.get("_kept_operands")  # identities are safe to compare: the kept values hold the tensors
    if kept is None or kept[0] != versions or not all(map(operator.is_, values, kept[1])):
        kept = module.__dict__["_kept_operands"] = (versions, values, prepare(*values))
    return kept[2]


def _per_channel(t: Tensor | None, channels: int, rank: int, axis: int) -> bool:
    """Whether t is absent, one value, or ``channels`` values along ``axis`` (from the end) of a rank-``rank``
    output, without growing its rank."""
    if t is None or (t.numel() == 1 and t.dim() <= rank):
        return True
    return t.dim() <= rank and t.dim() >= axis and t.shape[-axis] == channels and t.numel() == channels


def _native_form(integer, weight: Tensor, zero_point: Tensor | None, scale: Tensor, bias: Tensor | None):
    """"matmul" or "conv" where the native kernel's fused ops compute this product, else None."""
    if weight.dtype not in (torch.uint8, torch.int8) or (zero_point is not None and zero_point.dtype != weight.dtype):
        return None
    if isinstance(integer, MatMulInteger) and weight.dim() == 2:
        columns = weight.shape[1]
        ok = zero_point is None or zero_point.numel() == 1 or (zero_point.dim() == 1 and len(zero_point) == columns)
        return "matmul" if ok and all(_per_channel(t, columns, max(t.dim(), 1), 1) for t in (scale, bias)
                                      if t is not None) else None
    if isinstance(integer, ConvInteger) and 3 <= weight.dim() <= 5:
        channels, rank = weight.shape[0], weight.dim()
        ok = zero_point is None or zero_point.numel() in (1, channels)
        return "conv" if ok and all(_per_channel(t, channels, rank, rank - 1) for t in (scale, bias)) else None
    return None


def _prepare(form: str, group: int, weight: Tensor, zero_point: Tensor | None, scale: Tensor,
             bias: Tensor | None) -> tuple:
    """The native op's weight operands: the weights packed (int8_matrix_pack or conv_weight_pack), their column
    sums, their offsets (128 for uint8 weights, minus the zero point, per output channel), the scale and the bias
    as float32 vectors."""
    vectors = (scale.float().reshape(-1).contiguous(), None if bias is None else bias.float().reshape(-1).contiguous())
    matmul, contiguous = form == "matmul", weight.contiguous()
    panels, sums = _NATIVE.int8_matrix_pack(contiguous) if matmul else _NATIVE.conv_weight_pack(contiguous, group)
    operands = (panels, sums, weight_offsets(weight, zero_point, weight.shape[1 if matmul else 0]), *vectors)
    return operands


def convert_and_pack(value: Tensor, dtype: torch.dtype) -> Tensor:
    """MLAS's vector conversion of a float to ``dtype``: cvtps2dq (round half to even; NaN and values past the int32
    range give INT32_MIN), then saturating packs. Unlike a clamp in float, overflow lands on the lowest value."""
    low = integer_range(dtype)[0]
    overflow = value.isnan() | (value.abs() >= 2.0**31)
    return saturate(torch.where(overflow, torch.full_like(value, low), torch.round(value)), dtype)


def _repeats_innermost(x: Tensor, shape: torch.Size) -> bool:
    """Whether ``x`` is one value along the innermost axis of the broadcast ``shape`` while that axis is longer:
    onnxruntime's broadcaster then hands MLAS spans in which x is a scalar."""
    return len(shape) > 0 and shape[-1] > 1 and (x.dim() == 0 or x.shape[-1] == 1)


def broadcast_shape(a: torch.Size, b: torch.Size) -> torch.Size:
    """numpy's broadcast of two shapes (torch.broadcast_shapes, which costs a small node's time in eager calls)."""
    if a == b:
        return a
    size = None if torch.compiler.is_compiling() else broadcast_sizes(a, b)
    return torch.broadcast_shapes(a, b) if size is None else torch.Size(size)


def _native_binary(x: Tensor, y: Tensor) -> bool:
    """Whether the native kernel's binary QLinear ops take these operands (any shapes that broadcast, any strides)."""
    return x.dtype in BYTES and x.dtype == y.dtype and native(x, y)


def _add_terms(x_scale, x_zero_point, y_scale, y_zero_point, c_scale, c_zero_point):
    """(x_ratio, y_ratio, offset) of MLAS's QLinearAdd for the vector operand x and the other one y."""
    x_ratio, y_ratio = x_scale.float() / c_scale.float(), y_scale.float() / c_scale.float()
    # the C++ expression r_x * x_zp + r_y * y_zp, as the release build's compiler contracts it
    offset = fma(x_ratio, torch.as_tensor(_zero(x_zero_point)), y_ratio * _zero(y_zero_point))
    return x_ratio, y_ratio, _zero(c_zero_point) - offset


class QLinearAdd(Module):
    """com.microsoft QLinearAdd as MLAS's AVX2 kernel computes it, for the vector operand x and the other operand y
    (a, unless a is a scalar within onnxruntime's broadcast spans): with r = scale / c_scale per operand,
    f = c_zp - fma(r_x, x_zp, r_y * y_zp) and c = convert(fma(x, r_x, fma(y, r_y, f))) on the raw values.
    ``parameters`` (a_scale, a_zp, b_scale, b_zp, c_scale, c_zp), when the converter knows them: the terms are then
    computed once per operand order (as Python floats: float32 values; ``numbers``: both orders as the native
    qlinear_add takes them), and forward's parameters are None."""

    def __init__(self, parameters: tuple | None = None):
        super().__init__()
        self.terms = self.numbers = None
        if parameters is not None:
            a, b, c = parameters[:2], parameters[2:4], parameters[4:]
            self.terms = tuple(tuple(float(t) for t in _add_terms(*x, *y, *c)) for x, y in ((a, b), (b, a)))
            self.numbers = torch.tensor([*self.terms[0], *self.terms[1]], dtype=torch.float32)

    def forward(self, a, a_scale=None, a_zero_point=None, b=None, b_scale=None, b_zero_point=None, c_scale=None,
                c_zero_point=None):
        if self.numbers is not None and _native_binary(a, b):  # the converter's case: one check, one call
            return _NATIVE.qlinear_add.default(a, b, self.numbers)
        shape = broadcast_shape(a.shape, b.shape)
        swap = _repeats_innermost(a, shape) and not _repeats_innermost(b, shape)  # onnxruntime hands MLAS the vector
        x, y = (b, a) if swap else (a, b)
        if self.terms is not None:
            terms = self.terms[swap]
        else:
            given = ((a_scale, a_zero_point), (b_scale, b_zero_point))
            terms = _add_terms(*given[swap], *given[not swap], c_scale, c_zero_point)
        if _native_binary(x, y):  # x varies along the innermost axis: the kernel keeps this order
            return _NATIVE.qlinear_add.default(x, y, torch.tensor([*map(float, terms)] * 2, dtype=torch.float32))
        x_ratio, y_ratio, offset = terms
        value = fma(x.float(), x_ratio, fma(y.float(), y_ratio, offset))
        return convert_and_pack(value.expand(shape), a.dtype)


class QLinearMatMulAdd(Module):
    """A QLinearMatMul whose output only a QLinearAdd with a constant other operand reads (passes/qlinear.py): in
    eager CPU inference one native call (qlinear_matmul_add: each product value requantized, then the add's
    arithmetic on it and the constant's value for its column, one rounding each, as the two ops) where the product
    is folded (``fused``), the add's terms known and the constant one value or one per output column of the product's
    type; else the two modules as built. ``position``: the product's among the add's inputs (0: a, 3: b)."""

    def __init__(self, matmul: Module, add: Module, operand: Tensor, position: int):
        super().__init__()
        self.matmul, self.add, self.position = matmul, add, position
        self.register_buffer("operand", operand)
        self.swap = self._swap()
        self.product_names = getattr(matmul, "product_names", ())  # read at every call: a plain attribute

    def _swap(self) -> bool | None:
        """QLinearAdd's operand order for the product's shape [..., N] (``_plan``: the constant's rank at most the
        product's), or None where the native call does not take these modules."""
        matmul, add, operand = self.matmul, self.add, self.operand
        if not (type(matmul) is QLinearMatMul and matmul.fused and type(add) is QLinearAdd and add.terms is not None
                and operand.dtype == buffer_dict(matmul)["y_zero_point"].dtype
                and operand.numel() in (1, matmul.fused) and operand.shape[-1:] in ((), (1,), (matmul.fused,))):
            return None
        shape = (matmul.fused,)  # the innermost axis decides (_repeats_innermost); the product never repeats there
        return self.position == 3 and _repeats_innermost(operand, shape)

    def forward(self, a: Tensor, *inputs) -> Tensor:
        if self.swap is not None and a.dtype in BYTES and native(a):
            product, operand = buffer_dict(self._modules["matmul"]), buffer_dict(self)["operand"]
            if a.dim() >= max(1, operand.dim()) and a.shape[-1] == product["b"].shape[0]:
                values = [None if name is None else product[name] for name in self.product_names]
                return _NATIVE.qlinear_matmul_add.default(a if a.is_contiguous() else a.contiguous(),
                                                          *kept_values(self, [*values, operand], self._operands))
        y = self.matmul(a, *inputs)
        args = [None] * 8
        args[self.position], args[3 - self.position] = y, self.operand
        return self.add(*args)

    def _operands(self, *values) -> tuple:
        """qlinear_matmul's operands, its numbers with 1 where the product is the add's x, the add's terms for this
        order and the constant per column."""
        *product, numbers = self.matmul._product_operands(*values[:-1])
        product_is_x = (self.position == 0) != self.swap
        terms = torch.tensor(self.add.terms[self.swap], dtype=torch.float32)
        column = values[-1].float().reshape(-1).expand(self.matmul.fused)
        return (*product, torch.cat([numbers, torch.tensor([int(product_is_x)], dtype=torch.int32)]),
                torch.cat([terms, column]))


def _mul_terms(a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point):
    """(a_zp, b_zp, ratio, c_zp) of MLAS's QLinearMul, the ratio a_scale * b_scale / c_scale in float32."""
    ratio = a_scale.float() * b_scale.float() / c_scale.float()
    return _zero(a_zero_point), _zero(b_zero_point), ratio, _zero(c_zero_point)


class QLinearMul(Module):
    """com.microsoft QLinearMul as MLAS's SSE2 kernel computes it: c = convert(float32((a - a_zp) * (b - b_zp)) *
    (a_scale * b_scale / c_scale) + c_zp), the zero point added in float32 before rounding. ``parameters`` as
    QLinearAdd's: the terms then computed once (``numbers``: as the native qlinear_mul takes them)."""

    def __init__(self, parameters: tuple | None = None):
        super().__init__()
        self.terms = self.numbers = None
        if parameters is not None:
            a_zero, b_zero, ratio, c_zero = _mul_terms(*parameters)
            self.terms = (int(a_zero), int(b_zero), float(ratio), int(c_zero))
            self.numbers = torch.tensor(self.terms, dtype=torch.float32)

    def forward(self, a, a_scale=None, a_zero_point=None, b=None, b_scale=None, b_zero_point=None, c_scale=None,
                c_zero_point=None):
        if self.numbers is not None and _native_binary(a, b):  # the converter's case: one check, one call
            return _NATIVE.qlinear_mul.default(a, b, self.numbers)
        terms = self.terms or _mul_terms(a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point)
        if _native_binary(a, b):
            return _NATIVE.qlinear_mul.default(a, b, torch.tensor([*map(float, terms)], dtype=torch.float32))
        a_zero, b_zero, ratio, c_zero = terms
        product = (a.float() - a_zero) * (b.float() - b_zero)  # exact in float32
        return convert_and_pack(product * ratio + c_zero, a.dtype)


def _zero(zero_point: Tensor | None) -> Tensor | float:
    """A zero point as float32 (exact for 8 and 16 bits), 0 when absent."""
    return 0.0 if zero_point is None else as_float(zero_point)


def lookup(x: Tensor, table: Tensor) -> Tensor:
    """table[x - lowest] for 8-bit x and a table of 256 values (the native kernel's qlinear_lookup where it runs)."""
    if x.dtype in BYTES and table.dtype in BYTES and native(x, table):
        return _NATIVE.qlinear_lookup.default(x.contiguous(), table)
    return table[x.long() - integer_range(x.dtype)[0]]


class QLinearLookup(Module):
    """com.microsoft QLinearSigmoid / QLinearLeakyRelu: onnxruntime's 256-entry table y = quantize(f(x_scale * (q -
    x_zp))) for every q, then looked up: built once here when the converter knows the scales and zero points
    (``parameters``: x_scale, x_zp, y_scale, y_zp, their 8-bit type given by a zero point), else on each call."""

    def __init__(self, function: str, alpha: float | None = None, parameters: tuple | None = None):
        super().__init__()
        self.function, self.alpha = function, alpha
        dtype = next((p.dtype for p in (parameters or ())[1::2] if p is not None), None)
        self.register_buffer("constant_table", None if dtype is None else self.table(dtype, *parameters))

    def table(self, dtype, x_scale, x_zero_point, y_scale, y_zero_point) -> Tensor:
        low, high = integer_range(dtype)
        values = torch.arange(low, high + 1, device=x_scale.device, dtype=torch.int32)
        x = (values - (0 if x_zero_point is None else x_zero_point.to(torch.int32))).float() * x_scale.float()
        if self.function == "Sigmoid":
            y = mlas_logistic(x)
        else:
            y = torch.where(x >= 0, x, torch.tensor(self.alpha, dtype=torch.float32) * x)
        return quantize(y, y_scale, y_zero_point, dtype)

    def forward(self, x, x_scale=None, x_zero_point=None, y_scale=None, y_zero_point=None):
        table = buffer_dict(self)["constant_table"]  # not through nn.Module.__getattr__ (a third of a microsecond)
        if table is None or table.dtype != x.dtype:
            table = self.table(x.dtype, x_scale, x_zero_point, y_scale, y_zero_point)
        return lookup(x, table)

    def extra_repr(self) -> str:
        return attributes_repr(self, ["function", "alpha"])


def _parameters(scale: Tensor | None, zero_point: Tensor | None) -> tuple[float, int]:
    """A per-tensor scale and zero point as numbers (a float32 value, an int; 1 and 0 when absent)."""
    return 1.0 if scale is None else float(scale), 0 if zero_point is None else int(zero_point)


def _stacked(parameters: tuple | None) -> Tensor | None:
    """Per-tensor (scale, zero point, ...) as one float32 buffer (exact for 8-bit zero points; absent ones 0)."""
    if parameters is None:
        return None
    return torch.stack([torch.as_tensor(0 if p is None else p, dtype=torch.float32).reshape(()) for p in parameters])


def _per_tensor_parameters(*values: Tensor | None) -> bool:
    return all(v is None or v.numel() == 1 for v in values)


def float_bits(value: float) -> int:
    """The bits of a float32 value as an int: a scale among a native op's int64 numbers (exact, and one tensor
    argument instead of a boxed scalar each)."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _pool_numbers(parameters: tuple, flag: int) -> list[int]:
    """The head of a quantized pooling's native numbers: [x_zero, y_zero, flag, bits of x_scale and y_scale], of
    per-tensor (x_scale, x_zp, y_scale, y_zp)."""
    (x_scale, x_zero), (y_scale, y_zero) = _parameters(*parameters[:2]), _parameters(*parameters[2:])
    return [x_zero, y_zero, flag, float_bits(x_scale), float_bits(y_scale)]


class QLinearGlobalAveragePool(Module):
    """com.microsoft QLinearGlobalAveragePool as MLAS computes it: the integer sum over the image minus x_zp times
    its size, times x_scale / (y_scale * size) in float32, rounded, plus y_zp, saturated. ``parameters`` (x_scale,
    x_zp, y_scale, y_zp) when the converter knows them: forward's are then None."""

    def __init__(self, channels_last: int = 0, parameters: tuple | None = None):
        super().__init__()
        self.channels_last = channels_last
        self.register_buffer("quantization", _stacked(parameters))
        # the native op's numbers of folded (per-tensor: float() of them succeeded) parameters, made once
        self.numbers = None if parameters is None else torch.tensor(_pool_numbers(parameters, int(bool(
            channels_last))), dtype=torch.int64)

    def forward(self, x, x_scale=None, x_zero_point=None, y_scale=None, y_zero_point=None):
        if x.dtype in BYTES and x.dim() >= 3 and native(x) and (self.numbers is not None or _per_tensor_parameters(
                x_scale, x_zero_point, y_scale, y_zero_point)):
            numbers = self.numbers if self.numbers is not None else torch.tensor(_pool_numbers(
                (x_scale, x_zero_point, y_scale, y_zero_point), int(bool(self.channels_last))), dtype=torch.int64)
            return _NATIVE.qlinear_global_average_pool.default(x if x.is_contiguous() else x.contiguous(), numbers)
        if self.quantization is not None:
            x_scale, x_zero_point, y_scale, y_zero_point = self.quantization.unbind()
        axes = list(range(1, x.dim() - 1)) if self.channels_last else list(range(2, x.dim()))
        size = 1
        for axis in axes:
            size *= x.shape[axis]
        acc = shifted(x, x_zero_point).sum(axes, keepdim=True)  # exact integers: sum(x) - size * x_zp
        multiplier = x_scale.float() / (y_scale.float() * float(size))
        return requantize(acc, multiplier, y_zero_point, x.dtype)

    def extra_repr(self) -> str:
        return f"channels_last={self.channels_last}"


class QLinearAveragePool(AveragePool):
    """com.microsoft QLinearAveragePool as onnxruntime computes it: the input dequantized (float32), each window
    summed tap by tap in row-major order, divided by its count (the whole kernel with count_include_pad), then
    saturate(round_half_even(y / y_scale + y_zp)) (the zero point added before rounding). ``parameters`` as
    QLinearGlobalAveragePool's."""

    EXTRA = ("count_include_pad", "channels_last")

    def __init__(self, kernel_shape, count_include_pad=0, channels_last=0, parameters: tuple | None = None,
                 **attributes):
        super().__init__(kernel_shape, count_include_pad, **attributes)
        self.channels_last = channels_last
        self.register_buffer("quantization", _stacked(parameters))
        # the head of the native op's numbers of folded (per-tensor) parameters, made once
        self.numbers = None if parameters is None else _pool_numbers(parameters, int(bool(count_include_pad)))

    def forward(self, x, x_scale=None, x_zero_point=None, y_scale=None, y_zero_point=None):
        dtype = x.dtype
        if self.channels_last:
            x = x.movedim(-1, 1)
        kept = self.__dict__.get("_native")  # the last folded native call's (shape, dtype, numbers): checked first
        if kept is not None and native(x) and kept[0] == x.shape and kept[1] == dtype:
            y = _NATIVE.qlinear_average_pool.default(x if x.is_contiguous() else x.contiguous(), kept[2])
            return y.movedim(1, -1) if self.channels_last else y
        if dtype in BYTES and 3 <= x.dim() <= 5 and native(x) and (self.numbers is not None or _per_tensor_parameters(
                x_scale, x_zero_point, y_scale, y_zero_point)):
            if self.numbers is not None:  # folded: the numbers kept for the input's shape
                numbers = self._window(x, self.numbers)
                self.__dict__["_native"] = (x.shape, dtype, numbers)
            else:
                numbers = self._window(x, _pool_numbers((x_scale, x_zero_point, y_scale, y_zero_point),
                                                        int(bool(self.count_include_pad))))
            y = _NATIVE.qlinear_average_pool.default(x if x.is_contiguous() else x.contiguous(), numbers)
            return y.movedim(1, -1) if self.channels_last else y
        if self.quantization is not None:
            x_scale, x_zero_point, y_scale, y_zero_point = self.quantization.unbind()
        geometry, strides, _, begins, ends = self._geometry(x)
        padded = pad(dequantize(x, x_scale, x_zero_point), [0, 0, *begins], [0, 0, *ends])
        total = None
        for offsets in itertools.product(*(range(k) for k in self.kernel_shape)):  # onnxruntime's summation order
            index = [slice(None), slice(None)] + [slice(o, o + (out - 1) * s + 1, s) for o, (_, _, out), s in
                                                  zip(offsets, geometry, strides, strict=True)]
            total = padded[tuple(index)] if total is None else total + padded[tuple(index)]
        sizes = list(x.shape[2:])
        if self.count_include_pad:
            counts = torch.tensor(float(math.prod(self.kernel_shape)))
        else:
            counts = _window_counts(geometry, self.kernel_shape, strides, [1] * len(sizes), [0] * len(sizes), sizes,
                                    x.device).float()
        value = torch.round(total / counts / y_scale.float() + _zero(y_zero_point))
        y = saturate(value, dtype)
        return y.movedim(1, -1) if self.channels_last else y

    def _window(self, x: Tensor, head: list[int]) -> Tensor:
        """The native pooling's numbers: ``head`` (``_pool_numbers``), then per spatial axis the kernel, strides,
        head pads and output sizes."""
        geometry, strides, _, begins, _ = self._geometry(x)
        return torch.tensor([*head, *self.kernel_shape, *strides, *begins, *[out for _, _, out in geometry]],
                            dtype=torch.int64)


class QLinearSoftmax(Module):
    """com.microsoft QLinearSoftmax as onnxruntime computes it: a 256-entry float32 table exp((q - 255 + shift) *
    x_scale) (in double, shift keeping the sum below FLT_MAX), each row looked up relative to its maximum and summed
    in order in float32, then saturate(round_half_even(table * floor(1 / y_scale) / sum) + y_zp). ``opset`` < 13
    reduces over all axes from ``axis`` on, 13 and later over ``axis`` only. ``x_scale``: given by the converter where
    it is a constant; the tables (one per row length and type) are then built once, else on each call. ``output``
    (y_scale, y_zp) when the converter knows them: forward's are then None."""

    def __init__(self, axis: int, opset: int, x_scale: float | None = None, output: tuple | None = None):
        super().__init__()
        self.axis, self.opset, self.x_scale = axis, opset, x_scale
        self.tables: dict[tuple[int, bool], Tensor] = {}
        self.register_buffer("quantization", _stacked(output))
        self.numbers = None if output is None else (float(_inverse(output[0])), _parameters(*output)[1])

    def table(self, x_scale: float, size: int, signed: bool) -> Tensor:
        float_max = np.float32(np.finfo(np.float32).max)
        shift = max(0.0, math.log(float(float_max / np.float32(size))) - 5) / x_scale
        values = [math.exp((i - 255 + shift) * x_scale) for i in range(256)]
        table = torch.tensor(values, dtype=torch.float64).float()
        return torch.roll(table, -128) if signed else table  # the int8 table is indexed by uint8(q + 127 - max)

    def forward(self, x, x_scale=None, x_zero_point=None, y_scale=None, y_zero_point=None):
        kept = self.__dict__.get("_native")  # the last folded native call's (shape, dtype, table, numbers)
        if kept is not None and native(x) and kept[0] == x.shape and kept[1] == x.dtype:
            return _NATIVE.qlinear_softmax.default(x if x.is_contiguous() else x.contiguous(), kept[2], kept[3])
        if x.dtype in BYTES and x.numel() and native(x) and (self.numbers is not None or _per_tensor_parameters(
                y_scale, y_zero_point)):
            if self.numbers is not None and self.x_scale is not None:  # folded: planned for the input's shape
                plan = self._plan(x, self.x_scale, *self.numbers)
                self.__dict__["_native"] = (x.shape, x.dtype, *plan)
            else:
                output = self.numbers or (float(_inverse(y_scale)), _parameters(y_scale, y_zero_point)[1])
                plan = self._plan(x, float(x_scale.float()) if self.x_scale is None else self.x_scale, *output)
            return _NATIVE.qlinear_softmax.default(x if x.is_contiguous() else x.contiguous(), *plan)
        if self.quantization is not None:
            y_scale, y_zero_point = self.quantization.unbind()
        axis = self.axis % x.dim()
        rows = x.movedim(axis, -1) if self.opset >= 13 else x.reshape(*x.shape[:axis], -1)
        signed = x.dtype == torch.int8
        table = self._table(float(x_scale.float()) if self.x_scale is None else self.x_scale, rows.shape[-1],
                            signed).to(x.device)
        top = (255 if not signed else 127) - rows.amax(-1, keepdim=True).long()
        values = table[(rows.long() + top) & 0xFF]
        total = values[..., 0]
        for k in range(1, values.shape[-1]):  # summed in order, in float32
            total = total + values[..., k]
        y = saturate(torch.round(values * _inverse(y_scale) / total[..., None]) + _zero(y_zero_point), x.dtype)
        return y.movedim(-1, axis) if self.opset >= 13 else y.reshape(x.shape)

    def _table(self, x_scale: float, size: int, signed: bool) -> Tensor:
        """``table``, kept per (size, signed) where x_scale is the converter's constant."""
        if (table := self.tables.get((size, signed))) is None or self.x_scale is None:
            table = self.table(x_scale, size, signed)
            if self.x_scale is not None and not torch.compiler.is_compiling():  # no attribute set while tracing
                self.tables[(size, signed)] = table
        return table

    def _plan(self, x: Tensor, x_scale: float, inverse: float, y_zero: int) -> tuple[Tensor, Tensor]:
        """(table, numbers) of the native call on x (not empty): rows of L values ``inner`` apart."""
        axis = self.axis % x.dim()
        length = x.shape[axis] if self.opset >= 13 else math.prod(x.shape[axis:])
        inner = math.prod(x.shape[axis + 1:]) if self.opset >= 13 else 1
        numbers = torch.tensor([length, inner, y_zero, float_bits(inverse)], dtype=torch.int64)
        return self._table(x_scale, length, x.dtype == torch.int8), numbers

    def extra_repr(self) -> str:
        return f"axis={self.axis}, opset={self.opset}"


def _inverse(y_scale: Tensor) -> Tensor:
    """floor(1 / y_scale) in float32 (QLinearSoftmax's output multiplier)."""
    return torch.floor(1 / y_scale.float())


class QLinearConcat(Module):
    """com.microsoft QLinearConcat: each input requantized to the output's scale and zero point through
    onnxruntime's table, quantize(x_scale * (q - x_zp)), or copied when its scale and zero point are the output's.
    ``same``: that decision per input, made by the converter where the scales and zero points are constants (no
    data-dependent branch then: torch.export works), else compared on each call. ``tables``: per input, where the
    converter knows them, the 256 values of that requantization (None for a copied input)."""

    def __init__(self, axis: int, same: tuple[bool, ...] | None = None, tables: tuple | None = None):
        super().__init__()
        self.axis, self.same = axis, same
        self.count = 0 if tables is None else len(tables)
        for index, table in enumerate(tables or ()):
            self.register_buffer(f"table_{index}", table)
        # every input by a table (an identity one where copied): the native kernel's qlinear_concat, one call
        self.native_tables = tuple(f"table_{index}" for index in range(self.count)) if any(
            t is not None for t in tables or ()) else None

    @staticmethod
    def copies(x_scale, x_zero_point, y_scale, y_zero_point) -> bool:
        """Whether onnxruntime copies the input: its scale and zero point are the output's."""
        return bool((x_scale == y_scale).all()) and bool((x_zero_point == y_zero_point).all())

    @staticmethod
    def table(x_scale, x_zero_point, y_scale, y_zero_point) -> Tensor | None:
        """The requantization of every 8-bit value (per-tensor parameters; the type is x's zero point's), else None
        (run-time parameters, or the input is copied)."""
        values = (x_scale, x_zero_point, y_scale, y_zero_point)
        if any(v is None or v.numel() != 1 for v in values) or x_zero_point.dtype not in BYTES or QLinearConcat.copies(
                *values):
            return None
        low, high = integer_range(x_zero_point.dtype)
        q = torch.arange(low, high + 1, dtype=torch.int32)
        return quantize(dequantize(q, x_scale, x_zero_point), y_scale, y_zero_point, x_zero_point.dtype)

    @staticmethod
    def _stacked(*tables: Tensor | None) -> Tensor | None:
        """The tables as qlinear_concat's [inputs, 256], an identity table for a copied input; None where they
        differ in type."""
        dtype = next(t.dtype for t in tables if t is not None)
        if any(t is not None and (t.dtype != dtype or t.numel() != 256) for t in tables):
            return None
        low, high = integer_range(dtype)
        identity = torch.arange(low, high + 1).to(dtype)
        return torch.stack([identity if t is None else t.reshape(-1) for t in tables]).contiguous()

    def forward(self, y_scale, y_zero_point, *tuples):
        xs = tuples[::3]
        if self.native_tables is not None and len(xs) == self.count and native(xs[0]) and (
                tables := kept_operands(self, self.native_tables, self._stacked)) is not None:
            return _NATIVE.qlinear_concat.default(xs, tables, self.axis)  # checks the inputs' type (the tables')
        parts, buffers = [], buffer_dict(self)
        for index, (x, x_scale, x_zero_point) in enumerate(zip(xs, tuples[1::3], tuples[2::3], strict=True)):
            same = self.same[index] if self.same is not None else self.copies(x_scale, x_zero_point, y_scale,
                                                                               y_zero_point)
            table = buffers[f"table_{index}"] if index < self.count else None
            if same:
                parts.append(x)
            elif table is not None and table.dtype == x.dtype:
                parts.append(lookup(x, table))
            else:
                parts.append(quantize(dequantize(x, x_scale, x_zero_point), y_scale, y_zero_point, x.dtype))
        return torch.cat(parts, self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}" + ("" if self.same is None else f", same={self.same}")


class QuantizeConcatDequantize(Module):
    """QuantizeLinear of each input -> QLinearConcat -> DequantizeLinear, each value read by the next alone
    (passes/qlinear.py): in eager CPU inference one native call (quantize_concat_dequantize: each input quantized as
    its QuantizeLinear does, then the float value that the concat's table and the DequantizeLinear give that
    integer), where the quantizations are folded per tensor into one 8-bit type, the concat's inputs all copied or
    by tables and the DequantizeLinear folded per tensor to float32; else the modules as built. ``view``: a module
    of the one output (a Transpose between the concat and the DequantizeLinear: it moves values only), or None."""

    def __init__(self, quantizers: list[Module], concat: Module, dequantizer: Module, view: Module | None = None):
        super().__init__()
        self.quantizers, self.concat = torch.nn.ModuleList(quantizers), concat
        self.dequantizer, self.view = dequantizer, view
        numbers = [getattr(q, "numbers", None) for q in quantizers]
        dtypes = {getattr(q, "output_dtype", None) for q in quantizers}
        usable = (all(type(q) is QuantizeLinear for q in quantizers) and None not in numbers and len(dtypes) == 1
                  and dtypes <= set(BYTES) and type(concat) is QLinearConcat and concat.same is not None
                  and type(dequantizer) is DequantizeLinear and dequantizer.numbers is not None)
        tables = [t for t in buffer_dict(concat).values() if t is not None] if usable else []
        # every input copied (no tables) or each copied or by a table of the quantized type
        usable = usable and (concat.count == len(quantizers) or (concat.count == 0 and all(concat.same))) and all(
            t.dtype in dtypes and t.numel() == 256 for t in tables)
        self.numbers = torch.cat(numbers) if usable and (view is None or type(view) is Transpose) else None
        self.dtype = dtypes.pop() if usable else None
        self.axis, self.transposed = concat.axis, view is not None  # read at every call: plain attributes
        # made once, as the quantizers' numbers are (a lookup of the four buffers at each call cost 1.5 us)
        self.tables = None if self.numbers is None else self._tables(
            *[buffer_dict(concat)[name] for name in concat.native_tables or ()],
            *buffer_dict(dequantizer).values())

    def forward(self, *xs: Tensor) -> Tensor:
        if self.numbers is None or not all(x.dtype == torch.float32 for x in xs) or not native(xs[0]):
            parts = [part for q, x in zip(self.quantizers, xs, strict=True) for part in (q(x, None, None), None, None)]
            y = self.concat(None, None, *parts)
            return self.dequantizer(y if self.view is None else self.view(y), None, None)
        y = _NATIVE.quantize_concat_dequantize.default(xs, self.numbers, self.tables, self.axis)
        return self._modules["view"].forward(y) if self.transposed else y  # on the float values: it moves them only

    def _tables(self, *values: Tensor | None) -> Tensor:
        """[inputs, 256] float32: the value each integer of each input ends as (concat's table, or its copy, then
        the DequantizeLinear's float32 arithmetic)."""
        low, high = integer_range(self.dtype)
        identity = torch.arange(low, high + 1).to(self.dtype)
        tables = values[:-2] or [None] * len(self.quantizers)
        stacked = torch.stack([identity if t is None else t.reshape(-1) for t in tables])
        return dequantize(stacked, *values[-2:]).contiguous()


def _gemm_multiplier(alpha: float, a_scale, b_scale, y_scale=None, **_):
    multiplier = torch.tensor(alpha, dtype=torch.float32) * a_scale.float() * b_scale.float()
    return multiplier if y_scale is None else multiplier / y_scale.float()


class QGemm(_Folded):
    """com.microsoft QGemm: int32 C plus the exact integer product of op(A) and op(B), scaled by alpha * a_scale *
    b_scale (per column of B or not), divided by y_scale and requantized when y's zero point is given, else float.
    ``constants`` (FOLDED) when the converter knows them, B then stored as op(B)."""

    FOLDED = ("a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "c", "y_scale", "y_zero_point")

    def __init__(self, alpha: float = 1.0, transA: int = 0, transB: int = 0,
                 constants: dict[str, Tensor | None] | None = None, flatten: Module | None = None):
        super().__init__()
        self.alpha, self.transA, self.transB = alpha, transA, transB
        self.flatten = flatten  # the Flatten that makes A (passes/quantized.py), in the native call
        if constants is not None and transB:  # op(B) once (the native product keeps its packing per tensor)
            constants = {**constants, "b": constants["b"].t().contiguous()}
        self.fold(constants, functools.partial(_gemm_multiplier, alpha))
        self.fold_product("b", "c")
        self.fused = None if transA else self.fused

    def forward(self, a, a_scale=None, a_zero_point=None, b=None, b_scale=None, b_zero_point=None, c=None,
                y_scale=None, y_zero_point=None):
        if self.fused and (y := self.fused_product(a)) is not None:
            return y
        a = a if self.flatten is None else self.flatten(a)
        v, multiplier, zero = self.folded_values(dict(a_scale=a_scale, a_zero_point=a_zero_point, b=b,
                                                      b_scale=b_scale, b_zero_point=b_zero_point, c=c,
                                                      y_scale=y_scale, y_zero_point=y_zero_point))
        multiplier = _gemm_multiplier(self.alpha, **v) if multiplier is None else multiplier
        a, b, c, y_zero_point = (a.t() if self.transA else a), v["b"], v["c"], v["y_zero_point"]
        b = b.t() if self.transB and not self.folded else b
        acc = integer_matmul(a, b, v["a_zero_point"], v["b_zero_point"])
        if y_zero_point is not None and multiplier.numel() in (1, acc.shape[-1]):
            # C as the bias of each column, else added first (int32 as onnxruntime's accumulator)
            per_column = c is None or c.numel() == 1 or (c.dim() >= 1 and c.numel() == c.shape[-1])
            total = acc if per_column or c.dtype != torch.int32 else acc + c
            y = native_requantize(total, multiplier, c if per_column else None, zero, y_zero_point.dtype, 1)
            if y is not None:
                return y
        if c is not None:
            acc = acc + c.double()
        if y_zero_point is None:
            return scale_bias(acc, multiplier, None)
        return requantize(acc, multiplier, y_zero_point, y_zero_point.dtype)

    def extra_repr(self) -> str:
        return attributes_repr(self, ["alpha", "transA", "transB"])


# ----------------------------------------------------------------------------------------------- DynamicQuantizeLSTM

def mlas_tanh(x: Tensor) -> Tensor:
    """MlasComputeTanh as its FMA3 kernel computes it (float32, x clamped to [-9, 9]): Eigen's rational
    approximation x * p(x^2) / q(x^2) with fused multiply-adds. NaN stays NaN."""
    return _rational(x, 9.0, _TANH_P, _TANH_Q)


def onnxruntime_sigmoid(x: Tensor) -> Tensor:
    """onnxruntime's Sigmoid: MLAS's for float32 (the native kernel's where it runs), torch's for the other types."""
    if x.dtype != torch.float32:
        return torch.sigmoid(x)
    if native(x):
        return _NATIVE.mlas_logistic(x)
    return _MLAS_ACTIVATION(x, "logistic") if _opaque(x) else mlas_logistic(x)


def onnxruntime_tanh(x: Tensor) -> Tensor:
    """onnxruntime's Tanh: MLAS's for float32 (the native kernel's where it runs), torch's for the other types."""
    if x.dtype != torch.float32:
        return torch.tanh(x)
    if native(x):
        return _NATIVE.mlas_tanh(x)
    return _MLAS_ACTIVATION(x, "tanh") if _opaque(x) else mlas_tanh(x)


def _opaque(x: Tensor) -> bool:
    """Whether a compiled graph calls MLAS's activation as one op (``mlas_activation``): on CPU, without grad (the op
    has no derivative; the emulation traced step by step has), not exporting (an exported program keeps plain ops:
    to_onnx writes them)."""
    return (torch.compiler.is_compiling() and not torch.compiler.is_exporting() and x.is_cpu
            and not needs_grad((x,)))


@torch.library.custom_op("onnx2torch_rnn::mlas_activation", mutates_args=())
def mlas_activation(x: Tensor, name: str) -> Tensor:
    """MLAS's "tanh" or "logistic" of a float32 tensor as one op, for torch.compile: traced, the rational
    approximation is a dozen ops over the whole tensor (compiled text2tashkeel's attention). The native kernel's
    where it is built, else the emulation here."""
    if kernel.load("int8"):
        return (_NATIVE.mlas_tanh if name == "tanh" else _NATIVE.mlas_logistic)(x.contiguous())
    return (mlas_tanh if name == "tanh" else mlas_logistic)(x)


@mlas_activation.register_fake
def _(x: Tensor, name: str) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_MLAS_ACTIVATION = torch.ops.onnx2torch_rnn.mlas_activation.default


_TANH_P = _float32(-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,  # alpha_13 ... alpha_1
                   5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = _float32(1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,  # beta_6 ... beta_0
                   4.89352518554385e-03)
MLAS_ACTIVATIONS = MappingProxyType({"Sigmoid": mlas_logistic, "Tanh": mlas_tanh})
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def quantize_int8(x: Tensor, scale: Tensor, zero_point: Tensor) -> Tensor:
    """quantize(x, scale, zero_point, uint8) - 128, as int8 (NaN gives the lowest value, as quantize does)."""
    value = torch.round(x.float() / scale) + (zero_point.float() - 128)
    return value.nan_to_num(nan=-128.0).clamp(-128, 127).to(torch.int8)


class IntegerProducts:
    """The two matrix products of onnxruntime's DynamicQuantizeLSTM, for the shared recurrent loop
    (``recurrent.runtime._cell_loop``): each float operand is quantized to uint8 on the fly over the whole matrix
    (the inputs of every step up to the longest sequence at once, the state once per step and direction), multiplied
    exactly by the weights, and scaled back by float32(a_scale * w_scale) (per column or not). Like onnxruntime, the
    weights' zero point is the first of each direction's, and rows that have ended feed zeros to the state's
    quantization when Y is computed (their last state otherwise).

    The products run on torch's int8 GEMM (``integer_matmul``'s decomposition): the quantized operand shifted to
    int8, the weights as int8 with their column sums computed once per call."""

    def __init__(self, w_scale: Tensor, w_zero_point: Tensor, r_scale: Tensor, r_zero_point: Tensor,
                 ended_rows_are_zero: bool, prepare=None):
        self.prepare = prepare or _Int8Weights  # (w, zero point, few_rows) -> _Int8Weights
        directions = w_scale.shape[0]
        self.w_scale, self.r_scale = (s.float().reshape(directions, -1) for s in (w_scale, r_scale))
        self.w_zero_point, self.r_zero_point = (z.reshape(directions, -1)[:, 0] for z in (w_zero_point, r_zero_point))
        self.ended_rows_are_zero = ended_rows_are_zero

    def project(self, xs: Tensor, W: Tensor, lens: Tensor | None) -> Tensor:
        """xs [D, T, N, I] (reversed where a direction runs backwards), W [D, gH, I]: [D, T * N, gH]."""
        directions, steps, batch, size = xs.shape
        longest = steps if lens is None or lens.numel() == 0 else int(lens.max())  # max() refuses an empty batch
        scale, zero_point = dynamic_parameters(xs[0, :longest])  # reversing a row keeps its values: one range
        x = quantize_int8(xs, scale, zero_point).reshape(directions, steps * batch, size)
        weights = self.prepare(W, self.w_zero_point, False)
        return weights.product(x, 128 - zero_point.to(torch.int32), scale * self.w_scale[:, None])

    def bind(self, R: Tensor) -> StateProduct:
        """The state's product for R [D, gH, H]: h [D, N, H] -> [D, N, gH], each direction quantized alone."""
        activations = GateActivations(R.shape[-1], 3, R.device)
        return StateProduct(self.prepare(R, self.r_zero_point, True), self.r_scale, activations)

    def state(self, h: Tensor, t: int, valid: Tensor | None) -> Tensor:
        if valid is None or t == 0 or not self.ended_rows_are_zero:
            return h
        return torch.where(valid[t - 1], h, 0.0)


class StateProduct:
    """The recurrent product of one call (``IntegerProducts.bind``), and the gate activations its steps share."""

    def __init__(self, weights: _Int8Weights, r_scale: Tensor, gate_activations: GateActivations):
        self.weights, self.r_scale, self.gate_activations = weights, r_scale, gate_activations

    def __call__(self, h: Tensor) -> Tensor:
        """dynamic_parameters and quantize_int8 per direction, in fewer steps (the same float32 operations)."""
        flat = h.reshape(h.shape[0], 1, -1)
        if flat.shape[-1] == 0:  # an empty batch (aminmax refuses empty rows): nothing to quantize
            low = high = flat.new_zeros(flat.shape[0], 1, 1)
        else:
            low, high = torch.aminmax(flat, dim=-1, keepdim=True)  # [D, 1, 1]
        low, high = low.clamp(max=0), high.clamp(min=0)
        scale = torch.where(high == low, 1.0, (high - low) / 255)
        zero_point = torch.round((0 - low / scale).clamp(0, 255))
        q = (torch.round(h / scale) + (zero_point - 128)).nan_to_num_(nan=-128.0).clamp_(-128, 127)
        offset = (128 - zero_point).to(torch.int32)
        return self.weights.product(q.to(torch.int8), offset, scale * self.r_scale[:, None])


class _Int8Weights:
    """One call's int8/uint8 weights [D, gH, K] as int8 matrices [K, gH] per direction (uint8 shifted by 128), with
    what the product needs besides the int8 GEMM. ``few_rows``: the operand has few rows (the state), for which
    torch's int8 GEMM is fastest on weights stored row by row of gH (else column by column)."""

    def __init__(self, w: Tensor, zero_point: Tensor, few_rows: bool):
        w8, shift = as_int8(w)
        rows = [m.contiguous() for m in w8.unbind(0)]  # [gH, K] each
        self.matrices = [m.t() if few_rows else m.t().contiguous() for m in rows]
        self.column_sums = torch.stack([m.sum(-1, dtype=torch.int32) for m in rows])[:, None]  # [D, 1, gH]
        offset = shift - zero_point.to(torch.int32)  # [D]: (w - w_zp) = w8 + offset
        # eager: the term is left out when the weights need none (symmetric int8); a traced graph keeps it
        zero = not torch.compiler.is_compiling() and not bool((offset != 0).any())
        self.offset = None if zero else offset[:, None, None]

    def product(self, a8: Tensor, a_offset: Tensor, multiplier: Tensor) -> Tensor:
        """float32((a8 + a_offset) @ (w8 + offset), exact) * multiplier for a8 [D, M, K] int8, a_offset [D, 1, 1] (or
        a scalar) int32."""
        acc = torch.stack([int8_mm(a, m) for a, m in zip(a8.unbind(0), self.matrices, strict=True)])
        acc = acc + a_offset * self.column_sums
        if self.offset is not None:
            rows = a8.sum(-1, keepdim=True, dtype=torch.int32) + a8.shape[-1] * a_offset
            acc = acc + rows * self.offset
        return acc.float() * multiplier


def _activate(activations, x: Tensor) -> Tensor:
    """One activation per direction (x is [D, ...]); MLAS's sigmoid and tanh as onnxruntime computes them."""
    def one(act, value):
        mlas = MLAS_ACTIVATIONS.get(act.name)
        return mlas(value) if mlas is not None else act(value)
    if all(a == activations[0] for a in activations):
        return one(activations[0], x)
    return torch.stack([one(act, x[d]) for d, act in enumerate(activations)])


class _Rational:
    """``_rational`` with its constants made once, per lane of the last axis: lanes of (count, bound, p, q, offset,
    low) give clamp(x, -bound, bound) * p(x^2) / q(x^2) + offset, then max(., low) (the shorter polynomials padded
    with leading zeros, which leave their Horner steps unchanged)."""

    def __init__(self, groups, rank: int, device: torch.device):
        n = max(len(c) for group in groups for c in group[2:4])

        def lanes(index, dtype=torch.float32):
            values = [v for group in groups for v in [group[index]] * group[0]]
            return torch.tensor(values, dtype=dtype, device=device)

        self.bound, self.offset, self.low = lanes(1), lanes(4), lanes(5)
        parts = []
        for count, _, p, q, _, _ in groups:
            padded = [(0.0,) * (n - len(c)) + c for c in (p, q)]
            parts.append(torch.tensor(padded, dtype=torch.float64).t()[:, :, None].expand(n, 2, count))
        table = torch.cat(parts, -1).reshape(n, 2, *[1] * (rank - 1), -1).to(device)  # [n, 2 (p, q), ..., lanes]
        self.first, self.coefficients = table[0].float(), list(table[1:].unbind(0))

    def __call__(self, x: Tensor) -> Tensor:
        clamped = torch.clamp(x, -self.bound, self.bound)
        x2 = (clamped * clamped).double()
        value = self.first
        for coefficient in self.coefficients:
            value = torch.addcmul(coefficient, x2, value).float()
        return torch.clamp(clamped * value[0] / value[1] + self.offset, min=self.low)


class GateActivations:
    """MLAS's activations of an LSTM step with the default ones, their constants made once per call: the sigmoid of
    the i, o, f gates with the tanh of the c gate in one pass (``gates``: [..., 4H] in ONNX order; an offset of -0.0
    keeps tanh's signed zeros, a lower bound of -inf leaves it unclamped), and the tanh of the cell (``cell``)."""

    def __init__(self, hidden: int, rank: int, device: torch.device):
        sigmoid = (3 * hidden, 18.0, _LOGISTIC_P, _LOGISTIC_Q, 0.5, 0.0)
        tanh = (hidden, 9.0, _TANH_P, _TANH_Q, -0.0, -math.inf)
        self.gates, self.cell = _Rational([sigmoid, tanh], rank, device), _Rational([tanh], rank, device)


def _default_activations(cfg) -> bool:
    f_act, g_act, h_act = cfg.activations
    return all(a.name == "Sigmoid" for a in f_act) and all(a.name == "Tanh" for a in (*g_act, *h_act))


def quantized_lstm_step(cfg, x, h, c, product, bias, p):
    """One LSTM step in onnxruntime's order on its quantized path (deep_cpu_lstm's gate loop): the state's product
    added to the input projection, then per gate the peephole term, the fused bias Wb + Rb, the clip (FLT_MAX when
    none) and the activation; C(t) = C(t-1) * f + i * g; H(t) = h(C(t)) * o. Without peepholes the gates i, o, f
    (adjacent in ONNX order) share one activation call: element-wise, the same numbers; with the default
    activations all four gates share one (GateActivations), and without a clip the FLT_MAX clamp is left out (the
    activations clamp infinities to the same bounds)."""
    f_act, g_act, h_act = cfg.activations
    limit = FLOAT32_MAX if cfg.clip is None else cfg.clip
    gates = x + product(h)
    if p is not None:
        return _peephole_step(cfg, gates, c, bias, p, limit)
    gates = gates if bias is None else gates + bias
    if not cfg.input_forget and _default_activations(cfg):
        gates = gates if cfg.clip is None else gates.clamp(-limit, limit)
        activations = product.gate_activations
        i, o, f, g = activations.gates(gates).chunk(4, -1)
        c = c * f + i * g
        return activations.cell(c) * o, c
    gates = gates.clamp(-limit, limit)
    split = 3 * h.shape[-1]
    i, o, f = _activate(f_act, gates[..., :split]).chunk(3, -1)
    f = 1 - i if cfg.input_forget else f
    c = c * f + i * _activate(g_act, gates[..., split:])
    return _activate(h_act, c) * o, c


def _peephole_step(cfg, gates, c, bias, p, limit):
    """The step with peepholes: the i and f terms read C(t-1), the o term C(t), each added before the bias."""
    f_act, g_act, h_act = cfg.activations
    i, o, f, g = gates.chunk(4, -1)
    b_i, b_o, b_f, b_c = (None,) * 4 if bias is None else bias.chunk(4, -1)
    p_i, p_o, p_f = p.chunk(3, -1)

    def gate(value, peephole, state, gate_bias, act):
        value = value if peephole is None else value + state * peephole
        value = value if gate_bias is None else value + gate_bias
        return _activate(act, value.clamp(-limit, limit))

    i = gate(i, p_i, c, b_i, f_act)
    f = 1 - i if cfg.input_forget else gate(f, p_f, c, b_f, f_act)
    c = c * f + i * gate(g, None, None, b_c, g_act)
    o = gate(o, p_o, c, b_o, f_act)
    return _activate(h_act, c) * o, c


QUANTIZED_LSTM_CELL = Cell("LSTM", "iofc", "ifco", True, ("Sigmoid", "Tanh", "Tanh"), quantized_lstm_step,
                           lambda cfg: None)


class DynamicQuantizeLSTM(Recurrent):
    """com.microsoft DynamicQuantizeLSTM: the shared LSTM loop with onnxruntime's integer products and its order of
    float operations. W [D, I, 4H] and R [D, H, 4H] (int8/uint8) with their scales and zero points (per direction,
    or per direction and column) are buffers when constant, else inputs of ``forward``."""

    cell = QUANTIZED_LSTM_CELL
    QUANTIZED = ("W", "R", "W_scale", "W_zero_point", "R_scale", "R_zero_point")
    BUFFERS = tuple(f"{name}_quantized" if name in ("W", "R") else name for name in QUANTIZED)

    def __init__(self, *, quantized: dict[str, Tensor | None], **attributes):
        super().__init__(**attributes)
        for name, buffer in zip(self.QUANTIZED, self.BUFFERS, strict=True):
            self.register_buffer(buffer, quantized.get(name))

    def forward(self, X, W=None, R=None, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
                W_scale=None, W_zero_point=None, R_scale=None, R_zero_point=None):
        # buffers and parameters read from their dicts: nn.Module's attribute lookup costs a small node's time
        buffers, parameters = buffer_dict(self), parameter_dict(self)
        own = [buffers[name] for name in self.BUFFERS]
        q = [g if o is None else o for o, g in zip(own, (W, R, W_scale, W_zero_point, R_scale, R_zero_point),
                                                    strict=True)]
        B = B if (mine := parameters["B"]) is None else mine
        P = P if (mine := parameters["P"]) is None else mine
        # one opaque node while compiling (the loop is not traced step by step); the native kernel in CPU inference
        compiling = torch.compiler.is_compiling()
        packed = None if compiling else self._native_weights(X, q, B, P, initial_h, initial_c)
        if compiling or packed is not None:
            lens = buffers["static_lens"] if sequence_lens is None else sequence_lens
            outputs = (_DYNAMIC_QUANTIZE_LSTM(X, q[0], q[1], B, lens, initial_h, initial_c, P, *q[2:], self.op_config)
                       if compiling else _run_packed(X, packed, lens, initial_h, initial_c))
            wanted = self.config.outputs
            outputs = [outputs[0] if wanted[0] else None, outputs[1] if wanted[1] else None,
                       outputs[2] if wanted[2] else None]
        else:
            constant = all(own[k] is not None for k in (0, 1, 3, 5))  # W, R and their zero points
            products = IntegerProducts(*q[2:], ended_rows_are_zero=self.config.outputs[0],
                                       prepare=self._kept_weights if constant else None)
            lens = self.sequence_lens if sequence_lens is None else sequence_lens
            outputs = recurrent(self.cell, self.config, X, q[0].transpose(1, 2), q[1].transpose(1, 2), B,
                                lens, initial_h, initial_c, P, products=products)
        outputs = tuple(outputs[: self.num_outputs])
        return outputs[0] if self.num_outputs == 1 else outputs

    def stack_sources(self) -> list[tuple[dict, str]] | None:
        """W, R, B, P, then the scales and zero points (``_pack``'s order), all constant but B and P (else None)."""
        buffers, parameters = buffer_dict(self), parameter_dict(self)
        if any(buffers[name] is None for name in self.BUFFERS):
            return None
        sources = [(buffers, name) for name in self.BUFFERS]
        return [*sources[:2], (parameters, "B"), (parameters, "P"), *sources[2:]]

    def _native_weights(self, X: Tensor, q: list, B: Tensor | None, P: Tensor | None, initial_h: Tensor | None,
                        initial_c: Tensor | None) -> Tensor | None:
        """The weights packed for the native kernel where this eager call runs there (CPU inference, not float64),
        else None. Held by the module (op.Kept: the same tensors at the same versions): the kernel is loaded where
        they are (once loaded, it stays), so only packing asks."""
        if X.dtype == torch.float64 or not X.is_cpu or torch.jit.is_tracing() or (
                torch.is_grad_enabled() and needs_grad((X, B, P, initial_h, initial_c))):
            return None
        weights = [q[0], q[1], B, P, *q[2:]]
        return self._packed.get(weights, self.op_config,
                                lambda: _pack(weights, self.op_config) if kernel.loaded("int8") else None)

    def _kept_weights(self, w: Tensor, zero_point: Tensor, few_rows: bool) -> _Int8Weights:
        """The int8 layout of a weight buffer, kept between calls while the buffer is the same tensor, unchanged
        (its storage and version counter: ``load_state_dict`` and ``.to()`` change them): the layout copies cost
        more than the products of a short sequence."""
        if torch.compiler.is_compiling() or w.is_inference():  # inference tensors have no version counter
            return _Int8Weights(w, zero_point, few_rows)
        key = (w.data_ptr(), w._version, zero_point.data_ptr(), zero_point._version, few_rows)
        kept = self.__dict__.setdefault("_kept", {})
        if kept.get(few_rows, (None,))[0] != key:
            kept[few_rows] = (key, _Int8Weights(w, zero_point, few_rows))
        return kept[few_rows][1]


def _pack_stack(weights: list, counts: list[int], configs: tuple[str, ...], key: tuple) -> tuple[Tensor, Tensor] | None:
    """dynamic_quantize_lstm_stack's packed weights (every layer's ``_pack``, one after the other: each a multiple of
    64 bytes) and numbers (the stack's four flags, then per layer where its weights start and its states'
    ``state_numbers``); None without the kernel."""
    if not kernel.loaded("int8"):
        return None
    packs, numbers, start = [], [*map(int, key[1:5])], 0
    for config, count, rows in zip(configs, counts, state_numbers(*key[5:]), strict=True):
        numbers += (sum(p.numel() for p in packs), *rows)
        packs.append(_pack(weights[start:start + count], config))
        start += count
    return torch.cat(packs), torch.tensor(numbers, dtype=torch.int64)


def _run_stack(x: Tensor, packed: Tensor, numbers: Tensor, lengths: Tensor | None, states: list):
    try:
        return _NATIVE.dynamic_quantize_lstm_stack.default(x, packed, numbers, lengths, states)
    except RuntimeError as error:
        raise _checked(error) from None


# StackedRecurrent's eager inference of DynamicQuantizeLSTM layers: one call (the int8 library's stack op)
DynamicQuantizeLSTM.STACK = StackOps(DynamicQuantizeLSTM.forward, _pack_stack, _run_stack, (torch.float32,))


@torch.library.custom_op("onnx2torch_rnn::dynamic_quantize_lstm", mutates_args=())
def dynamic_quantize_lstm_op(X: Tensor, W: Tensor, R: Tensor, B: Tensor | None, sequence_lens: Tensor | None,
                             initial_h: Tensor | None, initial_c: Tensor | None, P: Tensor | None, W_scale: Tensor,
                             W_zero_point: Tensor, R_scale: Tensor, R_zero_point: Tensor,
                             config: str) -> tuple[Tensor, Tensor, Tensor]:
    """DynamicQuantizeLSTM as one op: what torch.compile and torch.export trace. The ONNX inputs (W [D, I, 4H],
    R [D, H, 4H]), ``config`` the recurrent op's (``cells.encode``); (Y, Y_h, Y_c), an empty tensor for an output the
    config does not ask for. On CPU with the native kernel loaded it runs there (``native_dynamic_quantize_lstm``);
    this Python implementation (``reference_dynamic_quantize_lstm``) runs elsewhere and is the kernel's reference."""
    return reference_dynamic_quantize_lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point,
                                           R_scale, R_zero_point, config)


def reference_dynamic_quantize_lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point,
                                    R_scale, R_zero_point, config):
    """The op's Python implementation: the shared LSTM loop with IntegerProducts and quantized_lstm_step."""
    cfg = decode(config)[1]
    products = IntegerProducts(W_scale, W_zero_point, R_scale, R_zero_point, ended_rows_are_zero=cfg.outputs[0])
    outputs = recurrent(QUANTIZED_LSTM_CELL, cfg, X, W.transpose(1, 2), R.transpose(1, 2), B, sequence_lens,
                        initial_h, initial_c, P, products=products)
    outputs = [X.new_empty(0) if o is None else o for o in outputs]
    return tuple(_owned(outputs, [X, W, R, B, sequence_lens, initial_h, initial_c, P]))


_DYNAMIC_QUANTIZE_LSTM = torch.ops.onnx2torch_rnn.dynamic_quantize_lstm.default  # the op without its Python wrapper


def native_dynamic_quantize_lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale,
                                 R_zero_point, config):
    """The op on the native kernel (recurrent/kernel/dynamic_quantize_lstm.cpp; loaded, X on CPU, not float64): the
    weights packed by dynamic_quantize_lstm_pack once per version of each (PACKS), then the node on them."""
    weights = [W, R, B, P, W_scale, W_zero_point, R_scale, R_zero_point]
    packed = PACKS.made([t for t in weights if t is not None], ("DynamicQuantizeLSTM", config, B is None, P is None),
                        lambda: _pack(weights, config))
    return _run_packed(X, packed, sequence_lens, initial_h, initial_c)


def _pack(weights: list, config: str) -> Tensor:
    """dynamic_quantize_lstm_pack of [W, R, B, P, W_scale, W_zero_point, R_scale, R_zero_point]."""
    try:
        return _NATIVE.dynamic_quantize_lstm_pack.default(*weights, config)
    except RuntimeError as error:
        raise _checked(error) from None


def _run_packed(X, packed, sequence_lens, initial_h, initial_c):
    try:
        return _NATIVE.dynamic_quantize_lstm_packed.default(X, packed, sequence_lens, initial_h, initial_c)
    except RuntimeError as error:
        raise _checked(error) from None


@dynamic_quantize_lstm_op.register_kernel("cpu")
def _(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point, config):
    run = (native_dynamic_quantize_lstm if X.dtype != torch.float64 and kernel.load("int8")
           else reference_dynamic_quantize_lstm)
    return run(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point,
               config)


@dynamic_quantize_lstm_op.register_fake
def _(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point, config):
    shapes = output_shapes(config, X, [W.transpose(1, 2), R.transpose(1, 2)])
    return tuple(X.new_empty(shape) for shape in shapes)


class AsUint8(Module):
    """An 8-bit op on int8 values as onnxruntime computes it once its QDQS8ToU8Transformer has made them uint8
    (values and zero points + 128; passes/qdq.py): the int8 inputs at ``positions`` shifted to uint8, ``module``
    (built with the shifted zero points) run, its output shifted back to int8 where ``positions`` has -1. The same
    numbers but where the op adds the output's zero point in float before rounding (QLinearAdd, QLinearMul,
    QLinearAveragePool): there the last bit of that sum, so a rounding tie, differs otherwise; and one type where
    the op's values as written are of both."""

    def __init__(self, module: Module, positions: tuple[int, ...]):
        super().__init__()
        self.module, self.positions = module, tuple(positions)

    def forward(self, *args):
        args = [_flip(a) if i in self.positions else a for i, a in enumerate(args)]
        y = self.module(*args)
        return _flip(y) if -1 in self.positions else y


def _flip(q: Tensor) -> Tensor:
    """int8 <-> uint8 by 128 (a flip of the top bit)."""
    return torch.bitwise_xor(q.view(torch.uint8), 128) if q.dtype == torch.int8 else torch.bitwise_xor(
        q, 128).view(torch.int8)


# The modules of ONNX's integer ops: ``to_onnx`` refuses them by name (torch has no ONNX translation to integer ops,
# and its float64 or Python-loop forms would not be what onnxruntime runs); Q/DQ modules export as float arithmetic.
INTEGER_OPS = (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, DynamicQuantizeMatMul, MatMulIntegerToFloat,
               QLinearAdd, QLinearMatMulAdd, QLinearMul, QLinearLookup, QLinearGlobalAveragePool, QLinearAveragePool,
               QLinearSoftmax, QLinearConcat, QuantizeConcatDequantize, QGemm, DynamicQuantizeLSTM,
               DynamicQuantizedProduct, AsUint8)

