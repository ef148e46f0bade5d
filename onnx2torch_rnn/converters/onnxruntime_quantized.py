"""Quantized ops of onnxruntime's com.microsoft domain, as its quantization tool (and its graph optimizer) emit them.

Exact to onnxruntime's CPU kernels, MLAS's x86 arithmetic included (see ``modules/quantized.py``). onnxruntime
publishes no schemas for this domain: each converter reads exactly the attributes its kernel reads, with its
defaults, and the builder refuses any other.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from ..modules import quantized as q
from ..node import Converted, OnnxNode
from ..recurrent import InvalidAttribute
from ..registry import register_converter
from .quantized import QUANTIZED_TYPES, checked_type, folded, folded_constants, without

MS = "com.microsoft"
BYTE_TYPES = (torch.int8, torch.uint8)


def _check(node: OnnxNode, ctx, indices, allowed=BYTE_TYPES) -> None:
    for index in indices:
        checked_type(node, ctx, index, allowed)


@register_converter("QuantizeLinear", 1, MS)
def quantize_linear(node: OnnxNode, ctx) -> Converted:
    """QuantizeLinear of the com.microsoft domain (the quantizer's 16-bit Q/DQ before opset 21): per tensor or per
    axis, int8, uint8, int16, uint16; exact to onnxruntime, as the standard op."""
    zero_point_type = checked_type(node, ctx, 2, name="y_zero_point")
    return Converted(q.QuantizeLinear(axis=node.attr("axis", 1), output_dtype=zero_point_type or torch.uint8),
                     node.inputs)


@register_converter("DequantizeLinear", 1, MS)
def dequantize_linear(node: OnnxNode, ctx) -> Converted:
    """DequantizeLinear of the com.microsoft domain: per tensor or per axis, int8, uint8, int16, uint16, int32;
    exact to onnxruntime, as the standard op."""
    checked_type(node, ctx, 0, (*QUANTIZED_TYPES, torch.int32), "x")
    return Converted(q.DequantizeLinear(axis=node.attr("axis", 1)), node.inputs)


@register_converter("DynamicQuantizeMatMul", 1, MS)
def dynamic_quantize_matmul(node: OnnxNode, ctx) -> Converted:
    """Float A quantized to uint8 on the fly, times int8/uint8 B, scaled back to float, plus the optional bias.
    Exact to onnxruntime.

    As onnxruntime: A's scale and zero point over the whole tensor (as DynamicQuantizeLinear), the exact integer
    product, then float32(acc) * (a_scale * b_scale) + bias, each step rounded to float32.
    """
    _check(node, ctx, (1, 3))
    return Converted(q.DynamicQuantizeMatMul(), node.inputs)


@register_converter("MatMulIntegerToFloat", 1, MS)
def matmul_integer_to_float(node: OnnxNode, ctx) -> Converted:
    """MatMulInteger fused with its scaling (onnxruntime's optimizer writes it): float32(acc) * (a_scale * b_scale)
    + bias, each step rounded to float32; int8/uint8 operands. Exact to onnxruntime."""
    _check(node, ctx, (0, 1, 4, 5))
    return Converted(q.MatMulIntegerToFloat(), node.inputs)


@register_converter("QLinearAdd", 1, MS)
def qlinear_add(node: OnnxNode, ctx) -> Converted:
    """Quantized element-wise addition with numpy broadcasting, int8/uint8. Exact to onnxruntime on the values
    checked (see Details).

    As MLAS's AVX2 kernel, for the vector operand x and the other one y (A and B, swapped when A is a scalar in
    onnxruntime's broadcast spans, i.e. repeated along the innermost axis): with float32 ratios r = scale / c_scale,
    f = c_zp - fma(r_x, x_zp, r_y * y_zp) (the C++ expression r_x * x_zp + r_y * y_zp as the release build's
    compiler contracts it) and c = round_half_even(fma(x, r_x, fma(y, r_y, f))) on the raw values. Past the int32
    range the conversion gives the lowest value, as MLAS's does. Each of these choices was found on values one
    float32 rounding from a half (millions checked against onnxruntime).
    """
    _check(node, ctx, (0, 2, 3, 5, 7))
    return _binary(node, ctx, q.QLinearAdd)


@register_converter("QLinearMul", 1, MS)
def qlinear_mul(node: OnnxNode, ctx) -> Converted:
    """Quantized element-wise multiplication with numpy broadcasting, int8/uint8. Exact to onnxruntime.

    As MLAS: c = saturate(round_half_even(float32(a - a_zp) * float32(b - b_zp) * (a_scale * b_scale / c_scale))
    + c_zp), the ratio in float32 in that order.
    """
    _check(node, ctx, (0, 2, 3, 5, 7))
    return _binary(node, ctx, q.QLinearMul)


def _binary(node: OnnxNode, ctx, module_type) -> Converted:
    """QLinearAdd / QLinearMul: the scales and zero points folded into the module where they are constants."""
    indices = (1, 2, 4, 5, 6, 7)
    values = folded_constants(node, ctx, indices)
    if values is None:
        return Converted(module_type(), node.inputs)
    return Converted(module_type(tuple(values)), without(node, indices))


def _pool_parameters(node: OnnxNode, ctx) -> tuple[tuple | None, list[str | None]]:
    """(x_scale, x_zp, y_scale, y_zp) of a quantized pooling where they are per-tensor constants, else None; and
    the inputs the module then takes."""
    indices = (1, 2, 3, 4)
    values = folded_constants(node, ctx, indices)
    if values is None or any(v is not None and v.numel() != 1 for v in values):
        return None, list(node.inputs)
    return tuple(values), without(node, indices)


@register_converter("QLinearSigmoid", 1, MS)
def qlinear_sigmoid(node: OnnxNode, ctx) -> Converted:
    """Quantized sigmoid through onnxruntime's 256-entry table, int8/uint8. Exact to onnxruntime.

    The table is quantize(sigmoid(x_scale * (q - x_zp))) for every q, with the sigmoid of MLAS's FMA3 kernel
    (Eigen's rational approximation, emulated step by step: fused multiply-adds rounded once).
    """
    _check(node, ctx, (0, 2, 4))
    return _lookup(node, ctx, "Sigmoid")


@register_converter("QLinearLeakyRelu", 1, MS)
def qlinear_leaky_relu(node: OnnxNode, ctx) -> Converted:
    """Quantized LeakyRelu (alpha, default 0.01) through onnxruntime's 256-entry table, int8/uint8. Exact to
    onnxruntime: quantize(v >= 0 ? v : alpha * v) of v = x_scale * (q - x_zp), in float32."""
    _check(node, ctx, (0, 2, 4))
    return _lookup(node, ctx, "LeakyRelu", float(node.attr("alpha", 0.01)))


def _lookup(node: OnnxNode, ctx, function: str, alpha: float | None = None) -> Converted:
    """The table built at conversion where the scales and zero points are constants (one zero point at least, which
    gives the 8-bit type), else on each call from the run-time values."""
    names = [node.input(i) for i in range(1, 5)]
    values = tuple(ctx.constant(name) if name else None for name in names)
    known = all(v is not None for v, name in zip(values, names, strict=True) if name) and (
        values[1] is not None or values[3] is not None)
    if known:
        return Converted(q.QLinearLookup(function, alpha, values), node.inputs[:1])
    return Converted(q.QLinearLookup(function, alpha), node.inputs)


@register_converter("QLinearGlobalAveragePool", 1, MS)
def qlinear_global_average_pool(node: OnnxNode, ctx) -> Converted:
    """Quantized mean over the spatial axes (kept as size 1), NCHW or channels_last, int8/uint8. Exact to
    onnxruntime.

    As MLAS: the exact integer sum minus x_zp times the image size, times x_scale / (y_scale * size) in float32,
    rounded half to even, plus y_zp, saturated.
    """
    _check(node, ctx, (0, 2, 4))
    parameters, inputs = _pool_parameters(node, ctx)
    return Converted(q.QLinearGlobalAveragePool(node.attr("channels_last", 0), parameters), inputs)


@register_converter("QLinearAveragePool", 1, MS)
def qlinear_average_pool(node: OnnxNode, ctx) -> Converted:
    """Quantized 1-D/2-D/3-D average pooling (kernel_shape, strides, pads, auto_pad, ceil_mode, count_include_pad,
    channels_last), int8/uint8. Exact to onnxruntime.

    As onnxruntime: the input dequantized in float32, each window summed tap by tap in row-major order, divided by
    the taps inside the input (the whole kernel with count_include_pad), then saturate(round_half_even(y / y_scale +
    y_zp)) with the zero point added before rounding. Geometry as AveragePool.
    """
    _check(node, ctx, (0, 2, 4))
    kernel_shape = node.attr("kernel_shape", None)
    if not kernel_shape or len(kernel_shape) not in (1, 2, 3):
        raise node.unsupported("kernel_shape", kernel_shape, "1-D, 2-D or 3-D windows")
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise node.unsupported("auto_pad", auto_pad)
    parameters, inputs = _pool_parameters(node, ctx)
    module = q.QLinearAveragePool(kernel_shape, count_include_pad=node.attr("count_include_pad", 0),
                                  channels_last=node.attr("channels_last", 0), auto_pad=auto_pad,
                                  ceil_mode=node.attr("ceil_mode", 0), pads=node.attr("pads", None),
                                  strides=node.attr("strides", None), parameters=parameters)
    return Converted(module, inputs)


@register_converter("QLinearSoftmax", 1, MS)
def qlinear_softmax(node: OnnxNode, ctx) -> Converted:
    """Quantized softmax (axis, opset: the Softmax semantics, over the axes from axis on before 13, over axis from
    13), int8/uint8. Exact to onnxruntime.

    As onnxruntime: a 256-entry float32 table of exp((q - 255 + shift) * x_scale) computed in double with libm's exp
    (shift keeps each row's sum below FLT_MAX), each row looked up relative to its maximum and summed in order in
    float32, then saturate(round_half_even(table * floor(1 / y_scale) / sum) + y_zp). x's zero point does not
    matter (softmax ignores shifts).
    """
    _check(node, ctx, (0, 2, 4))
    opset = node.attr("opset", None)
    if opset is None:
        raise node.unsupported("opset", None, "QLinearSoftmax needs the opset of the Softmax it stands for")
    axis = node.attr("axis", 1 if opset < 13 else -1)
    x_scale = ctx.constant(node.input(1))
    output = folded_constants(node, ctx, (3, 4))
    if output is not None and any(v is not None and v.numel() != 1 for v in output):
        output = None
    module = q.QLinearSoftmax(axis, opset, None if x_scale is None else float(x_scale.float()),
                              None if output is None else tuple(output))
    return Converted(module, node.inputs if output is None else without(node, (3, 4)))


@register_converter("QLinearConcat", 1, MS)
def qlinear_concat(node: OnnxNode, ctx) -> Converted:
    """Concat of quantized inputs (y_scale, y_zero_point, then one (x, scale, zero point) triple per input) along
    axis; int8/uint8. Exact to onnxruntime: an input with y's scale and zero point is copied, any other requantized
    as quantize(x_scale * (q - x_zp), y_scale, y_zp) in float32."""
    if node.attr("axis", None) is None:
        raise node.unsupported("axis", None, "QLinearConcat needs an axis")
    if (len(node.inputs) - 2) % 3 or len(node.inputs) < 5:
        raise node.unsupported("inputs", len(node.inputs), "expected y_scale, y_zero_point and (x, scale, zero "
                               "point) triples")
    names = [node.input(i) for i in range(len(node.inputs))]
    values = [ctx.constant(name) if name else None for name in names]
    same = tables = None
    if all(v is not None for i, v in enumerate(values) if i < 2 or i % 3 != 2):  # the scales and zero points
        same = tuple(q.QLinearConcat.copies(*values[i:i + 2], *values[:2]) for i in range(3, len(values), 3))
        tables = tuple(q.QLinearConcat.table(*values[i:i + 2], *values[:2]) for i in range(3, len(values), 3))
    if same is None or any(table is None and not copied for table, copied in zip(tables, same, strict=True)):
        return Converted(q.QLinearConcat(node.attr("axis"), same), node.inputs)
    # every input copied or requantized through its table: no scale or zero point at run time
    folded_inputs = [name if i >= 2 and i % 3 == 2 else None for i, name in enumerate(node.inputs)]
    return Converted(q.QLinearConcat(node.attr("axis"), same, tables), folded_inputs)


@register_converter("QGemm", 1, MS)
def qgemm(node: OnnxNode, ctx) -> Converted:
    """Quantized Gemm (alpha, transA, transB): int32 C plus the exact integer product, scaled by alpha * a_scale *
    b_scale (b per column or not) and requantized to y's scale and zero point, or float output without them.
    Exact to onnxruntime.

    As onnxruntime: the scale is computed in float32 in that order and divided by y_scale when given; the
    accumulator is rounded to float32, multiplied, rounded half to even and saturated.
    """
    _check(node, ctx, (0, 2, 3, 5, 8))
    return folded(node, ctx, q.QGemm, q.QGemm.FOLDED, alpha=float(node.attr("alpha", 1.0)),
                  transA=node.attr("transA", 0), transB=node.attr("transB", 0))


_LSTM_QUANTIZED = MappingProxyType({"W": 1, "R": 2, "W_scale": 8, "W_zero_point": 9, "R_scale": 10, "R_zero_point": 11})


@register_converter("DynamicQuantizeLSTM", 1, MS)
def dynamic_quantize_lstm(node: OnnxNode, ctx) -> Converted:
    """LSTM with int8/uint8 W [D, I, 4H] and R [D, H, 4H] (scales and zero points per direction, or per direction
    and column), as onnxruntime computes it: bit-exact to its CPU kernel (checked on x86 with FMA3) for the
    default activations.

    - The shared LSTM loop (directions, sequence_lens, initial states, outputs) with onnxruntime's integer products:
      X quantized to uint8 once over every step up to the longest sequence, the state once per step and direction
      (rows that have ended count as zeros when Y is an output), exact integer products, float32(acc) *
      (a_scale * w_scale), the state's product added to the input projection, then the fused bias Wb + Rb.
    - Sigmoid and Tanh are MLAS's (Eigen's rational approximations with fused multiply-adds, emulated step by step),
      as onnxruntime's gate loop computes them; a difference in their last bit could change a later quantization
      step, so the plain torch functions would not do. Relu, HardSigmoid, Affine, LeakyRelu, ThresholdedRelu and
      Softsign are bit-exact too. ScaledTanh, Elu and Softplus go through libm's tanh/exp in onnxruntime and
      torch's here: a few float32 ulps apart (checked at rtol 1e-4, atol 1e-5).
    - Attributes: hidden_size, direction (default forward), activations, activation_alpha / activation_beta (as
      for LSTM), clip, input_forget. Inputs B, sequence_lens, initial_h, initial_c, P as for LSTM.
    - Matches onnxruntime run with one intra-op thread: with more, onnxruntime quantizes the state of each thread's
      block of batch rows separately, so its own results depend on the thread count. A row of length 0 while Y is
      not an output makes onnxruntime read an uninitialised state into the other rows' quantization range; here it
      counts as zero.
    """
    _check(node, ctx, (1, 2, 9, 11))
    constants = {name: ctx.constant(node.input(index)) for name, index in _LSTM_QUANTIZED.items()}
    lens = ctx.constant(node.input(4))
    weights = {name: ctx.constant(node.input(index)) for name, index in (("B", 3), ("P", 7))}
    runtime = tuple(k for k, i in (("B", 3), ("P", 7)) if node.input(i) is not None and weights[k] is None)
    try:
        module = q.DynamicQuantizeLSTM(
            quantized=constants, hidden_size=node.attr("hidden_size", None),
            direction=node.attr("direction", "forward"), activations=node.attr("activations", None),
            activation_alpha=node.attr("activation_alpha", None), activation_beta=node.attr("activation_beta", None),
            clip=node.attr("clip", None), input_forget=node.attr("input_forget", 0),
            outputs=[name is not None for name in node.outputs], **weights,
            sequence_lens=None if lens is None else lens.tolist(), runtime_weights=runtime)
    except InvalidAttribute as error:
        raise node.unsupported(error.attribute, error.value, error.reason) from None
    inputs = [node.input(0), *(None if constants[k] is not None else node.input(i) for k, i in
                                (("W", 1), ("R", 2))),
              node.input(3) if "B" in runtime else None, None if lens is not None else node.input(4),
              node.input(5), node.input(6), node.input(7) if "P" in runtime else None,
              *(None if constants[k] is not None else node.input(_LSTM_QUANTIZED[k])
                for k in ("W_scale", "W_zero_point", "R_scale", "R_zero_point"))]
    while inputs and inputs[-1] is None:
        inputs.pop()
    return Converted(module, inputs)
