"""Quantization (standard domain): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the integer ops.

Exact to onnxruntime's CPU kernels: integer products are exact (see ``modules/quantized.py``), float steps run in
float32 in onnxruntime's order, rounding is half to even and results saturate. Integer types int8, uint8, int16,
uint16 (int32 for DequantizeLinear); 4-bit, 2-bit and float8 types have no torch tensor type here and are refused.
"""

from __future__ import annotations

import onnx
import torch

from ..modules import quantized as q
from ..node import Converted, OnnxNode
from ..registry import register_converter
from ..tensors import torch_dtype
from .nn import _conv_attributes

QUANTIZED_TYPES = (torch.int8, torch.uint8, torch.int16, torch.uint16)


def checked_type(node: OnnxNode, ctx, index: int, allowed=QUANTIZED_TYPES, name: str | None = None):
    """The static element type of input ``index`` (None when unknown), refused unless in ``allowed``."""
    try:
        dtype = ctx.dtype(node.input(index))
    except NotImplementedError as error:  # a type torch has no tensor type for (int4, float8, ...)
        raise node.unsupported(name or f"input {index}", node.input(index), str(error)) from None
    if dtype is not None and dtype not in allowed:
        raise node.unsupported(name or f"input {index}", str(dtype).removeprefix("torch."),
                               f"expected one of {', '.join(str(t).removeprefix('torch.') for t in allowed)}")
    return dtype


def folded_constants(node: OnnxNode, ctx, indices) -> list | None:
    """The values of the inputs at ``indices`` when each present one is a constant (None for an absent one), else
    None: what a QLinear module folds into itself at conversion (scales, zero points, weights)."""
    values = [ctx.constant(node.input(i)) if node.input(i) else None for i in indices]
    if any(node.input(i) and value is None for i, value in zip(indices, values, strict=True)):
        return None
    return values


def without(node: OnnxNode, indices) -> list[str | None]:
    """The node's inputs with those at ``indices`` (folded into the module) passed as None."""
    return [None if i in indices else name for i, name in enumerate(node.inputs)]


def folded(node: OnnxNode, ctx, module_type, names: tuple[str, ...], first: int = 1, **attributes) -> Converted:
    """A QLinear module (modules/quantized.py's _Folded) with its constant inputs ``names`` (inputs ``first`` on)
    folded in when all of them are constants; else every input at run time."""
    indices = range(first, first + len(names))
    values = folded_constants(node, ctx, indices)
    if values is None:
        return Converted(module_type(**attributes), node.inputs)
    return Converted(module_type(constants=dict(zip(names, values, strict=True)), **attributes),
                     without(node, indices))


def _output_dtype(node: OnnxNode) -> torch.dtype | None:
    code = node.attr("output_dtype", 0) if node.version >= 21 else 0
    if not code:
        return None
    try:
        return torch_dtype(code)
    except NotImplementedError as error:
        raise node.unsupported("output_dtype", onnx.TensorProto.DataType.Name(code), str(error)) from None


@register_converter("QuantizeLinear", (10, 13, 19, 21, 23, 24, 25, 28))
def quantize_linear(node: OnnxNode, ctx) -> Converted:
    """y = saturate(round_half_even(x / y_scale) + y_zero_point): per tensor, per axis (axis) and blocked
    (block_size); int8, uint8, int16, uint16 outputs. Exact to onnxruntime.

    - The division runs in float32 (float16 and bfloat16 inputs and scales are widened first, as onnxruntime does);
      NaN quantizes to the lowest value of the type, infinities saturate (onnxruntime's MLAS).
    - Bit-exact for a given input. In QDQ graphs the groups onnxruntime fuses (DequantizeLinear -> Conv, MatMul,
      Gemm, Add, Mul, pooling, ... -> QuantizeLinear) become its QLinear ops (passes/qdq.py) and agree bit for
      bit; a float op it leaves in float (a recurrence, LayerNorm, 16-bit groups) agrees with its MLAS kernel only
      to float32 rounding (other summation orders), so a value within that rounding of a rounding boundary can
      quantize one step away (tested bound on the committed QDQ models: one step of the output).
    - A QuantizeLinear read only by a DequantizeLinear runs as one module (modules/quantized.py:
      QuantizeDequantizeLinear), the same numbers.
    - The output type is the zero point's, else output_dtype, else uint8. saturate only concerns float8 outputs.
    - precision (opset 23+): absent, 0 or FLOAT (what onnxruntime computes); other values are refused.
    """
    zero_point_type = checked_type(node, ctx, 2, name="y_zero_point")
    output_dtype = _output_dtype(node)
    if output_dtype is not None and output_dtype not in QUANTIZED_TYPES:
        raise node.unsupported("output_dtype", output_dtype, "integer outputs only (int8, uint8, int16, uint16)")
    if node.version >= 19:
        node.attr("saturate")  # defined for float8 outputs only, which are refused
    if node.version >= 23 and node.attr("precision") not in (0, onnx.TensorProto.FLOAT):
        raise node.unsupported("precision", node.attr("precision"), "the division runs in float32 (onnxruntime)")
    return _linear(node, ctx, q.QuantizeLinear, zero_point_type or output_dtype or torch.uint8)


@register_converter("DequantizeLinear", (10, 13, 19, 21, 23, 24, 25, 28))
def dequantize_linear(node: OnnxNode, ctx) -> Converted:
    """y = (x - x_zero_point) * x_scale: per tensor, per axis (axis) and blocked (block_size); int8, uint8, int16,
    uint16 and int32 inputs. Exact to onnxruntime.

    - float32((int32(x) - int32(zero point))) * float32(scale), then the output type: x_scale's (float32, float16,
      bfloat16) or output_dtype (opset 23+).
    - With constant inputs (quantized weights) the node is evaluated once at conversion: its consumer reads a float
      tensor.
    """
    checked_type(node, ctx, 0, (*QUANTIZED_TYPES, torch.int32), "x")
    output_dtype = _output_dtype(node)
    if output_dtype is not None and not output_dtype.is_floating_point:
        raise node.unsupported("output_dtype", output_dtype, "must be a float type")
    return _linear(node, ctx, q.DequantizeLinear, output_dtype)


def _linear(node: OnnxNode, ctx, module_type, output_dtype: torch.dtype | None) -> Converted:
    """QuantizeLinear / DequantizeLinear with a constant scale and zero point folded into the module."""
    attributes = dict(axis=node.attr("axis", 1), block_size=node.attr("block_size", 0), output_dtype=output_dtype)
    values = folded_constants(node, ctx, (1, 2))
    if values is None:
        return Converted(module_type(**attributes), node.inputs)
    return Converted(module_type(**attributes, constants=tuple(values)), without(node, (1, 2)))


@register_converter("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(node: OnnxNode, ctx) -> Converted:
    """uint8 quantization with a scale and zero point computed from the input; exact to onnxruntime.

    As onnxruntime: the range [min(x, 0), max(x, 0)] in float32, scale = (max - min) / 255 (1 when the range is
    empty), zero point = round_half_even(clamp(-min / scale, 0, 255)), then QuantizeLinear.
    """
    return Converted(q.DynamicQuantizeLinear(), node.inputs)


@register_converter("MatMulInteger", 10)
def matmul_integer(node: OnnxNode, ctx) -> Converted:
    """int32 (A - a_zero_point) @ (B - b_zero_point) with numpy matmul broadcasting; int8/uint8 operands in any
    combination. Exact.

    a_zero_point is a scalar or per row of A (an M-vector, or [..., M, 1]); b_zero_point a scalar or per column
    of B ([N] or [..., 1, N]). Products are exact: torch's int8 GEMM with int32 accumulators (float64 when B is
    batched), wrapping past 2^31 as onnxruntime's int32 accumulator does.
    """
    for index in range(4):
        checked_type(node, ctx, index, (torch.int8, torch.uint8))
    return Converted(q.MatMulInteger(), node.inputs)


@register_converter("ConvInteger", 10)
def conv_integer(node: OnnxNode, ctx) -> Converted:
    """int32 convolution of x - x_zero_point by w - w_zero_point with Conv's attributes (group, strides, dilations,
    pads, auto_pad); int8/uint8 operands. Exact.

    w_zero_point is a scalar or per output channel; padding counts as x_zero_point (zero after the shift), as
    onnxruntime pads. Computed in float32 where every partial sum stays an integer below 2^24 (at most 258 taps per
    output: input channels per group times kernel size), else in float64.
    """
    for index in range(4):
        checked_type(node, ctx, index, (torch.int8, torch.uint8))
    return Converted(q.ConvInteger(**_conv_attributes(node)), node.inputs)


@register_converter("QLinearMatMul", (10, 21))
def qlinear_matmul(node: OnnxNode, ctx) -> Converted:
    """Quantized matmul: the exact integer product requantized to y's scale and zero point; int8/uint8. Exact to
    onnxruntime.

    As onnxruntime: y = saturate(round_half_even(float32(acc) * (a_scale * b_scale / y_scale)) + y_zero_point), the
    multiplier computed in float32 in that order; b's scale and zero point may be per column.
    """
    for index in (0, 2, 3, 5, 7):
        checked_type(node, ctx, index, (torch.int8, torch.uint8))
    return folded(node, ctx, q.QLinearMatMul, q.QLinearMatMul.FOLDED)


@register_converter("QLinearConv", 10)
def qlinear_conv(node: OnnxNode, ctx) -> Converted:
    """Quantized convolution with Conv's attributes: the exact integer convolution plus the int32 bias B,
    requantized per output channel; int8/uint8. Exact to onnxruntime.

    As onnxruntime: y = saturate(round_half_even(float32(acc + B) * (x_scale * w_scale / y_scale)) + y_zero_point),
    the multiplier in float32 in that order; w's scale and zero point may be per output channel.
    """
    for index in (0, 2, 3, 5, 7):
        checked_type(node, ctx, index, (torch.int8, torch.uint8))
    return folded(node, ctx, q.QLinearConv, q.QLinearConv.FOLDED, **_conv_attributes(node))
