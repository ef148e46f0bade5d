"""Element-wise arithmetic, logic and activation ops.

Most ops are one function with the ONNX attributes as keyword arguments: they live in the ``_FUNCTIONS`` table
(op -> function, since_versions, operators.md note) and share one converter. Ops with conversion-time decisions
(Mod, Clip, BitShift, Gelu, PRelu, the Softmax family, Constant) have their own converters below.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import onnx
import torch
import torch.nn.functional as F
from torch import nn

from ..modules import elementwise as ew
from ..modules.common import ConstantValue, Function
from ..modules.quantized import onnxruntime_sigmoid, onnxruntime_tanh
from ..node import Converted, OnnxNode, refuse_uint64
from ..registry import register_converter
from ..tensors import to_torch
from .shape import converted

_UNSIGNED = ("uint16/uint32 are computed exactly in int64 (torch has no kernels for them); uint64 is refused at "
             "conversion.")
_ALL_INTS = "Every integer width, unsigned ones included (computed bit-exactly)."
_VARIADIC = "Any number of inputs with numpy broadcasting."

# op -> (function(*inputs, **attributes), since_versions, note for operators.md)
_FUNCTIONS: Mapping[str, tuple[Callable, tuple[int, ...], str]] = MappingProxyType({
    # arithmetic
    "Add": (ew.add, (7, 13, 14), _ALL_INTS),
    "Sub": (ew.sub, (7, 13, 14), _ALL_INTS),
    "Mul": (ew.mul, (7, 13, 14), _ALL_INTS),
    "Div": (ew.div, (7, 13, 14), "Integer division truncates toward zero (C semantics, as onnxruntime). " + _UNSIGNED),
    "Pow": (ew.power, (7, 12, 13, 15), "Mixed base/exponent types; the output has the base's type. Integer bases "
            "are computed in float64 and truncated, as onnxruntime does (2 ** -1 == 0)."),
    "Neg": (torch.neg, (6, 13), ""),
    "Abs": (ew.absolute, (6, 13), _UNSIGNED),
    "Reciprocal": (torch.reciprocal, (6, 13), ""),
    "Sqrt": (torch.sqrt, (6, 13), ""),
    "Exp": (torch.exp, (6, 13), ""),
    "Log": (torch.log, (6, 13), ""),
    "Floor": (torch.floor, (6, 13), ""),
    "Ceil": (torch.ceil, (6, 13), ""),
    "Round": (torch.round, (11, 22), "Halves round to even."),
    "Sign": (ew.sign, (9, 13), "NaN stays NaN (as onnxruntime for float32/float64). " + _UNSIGNED),
    "Erf": (torch.erf, (9, 13), "Float types."),
    "Sin": (torch.sin, (7, 22), ""),
    "Cos": (torch.cos, (7, 22), ""),
    "Tan": (torch.tan, (7, 22), ""),
    "Asin": (torch.asin, (7, 22), ""),
    "Acos": (torch.acos, (7, 22), ""),
    "Atan": (torch.atan, (7, 22), ""),
    "Sinh": (torch.sinh, (9, 22), ""),
    "Cosh": (torch.cosh, (9, 22), ""),
    "Asinh": (torch.asinh, (9, 22), ""),
    "Acosh": (torch.acosh, (9, 22), ""),
    "Atanh": (torch.atanh, (9, 22), ""),
    "Max": (ew.maximum, (6, 8, 12, 13), _VARIADIC + " NaN propagates. " + _UNSIGNED),
    "Min": (ew.minimum, (6, 8, 12, 13), _VARIADIC + " NaN propagates. " + _UNSIGNED),
    "Sum": (ew.sum_all, (6, 8, 13), _VARIADIC),
    "Mean": (ew.mean, (6, 8, 13), _VARIADIC),
    "Where": (ew.where, (9, 16), "Numpy broadcasting over all three inputs. " + _ALL_INTS),
    # comparison and logic (bool outputs)
    "Equal": (ew.equal, (7, 11, 13, 19), "Numeric and bool inputs (strings have no torch type). " + _ALL_INTS),
    "Less": (ew.less, (7, 9, 13), _UNSIGNED),
    "LessOrEqual": (ew.less_equal, (12, 16), _UNSIGNED),
    "Greater": (ew.greater, (7, 9, 13), _UNSIGNED),
    "GreaterOrEqual": (ew.greater_equal, (12, 16), _UNSIGNED),
    "Not": (torch.logical_not, (1,), ""),
    "And": (torch.logical_and, (7,), ""),
    "Or": (torch.logical_or, (7,), ""),
    "Xor": (torch.logical_xor, (7,), ""),
    "BitwiseAnd": (ew.bitwise_and, (18,), _ALL_INTS),
    "BitwiseOr": (ew.bitwise_or, (18,), _ALL_INTS),
    "BitwiseXor": (ew.bitwise_xor, (18,), _ALL_INTS),
    "BitwiseNot": (ew.bitwise_not, (18,), _ALL_INTS),
    "IsNaN": (torch.isnan, (9, 13, 20), ""),
    "IsInf": (ew.isinf, (10, 20), "detect_positive and detect_negative honoured."),
    # activations
    "Relu": (torch.relu, (6, 13, 14), ""),
    "LeakyRelu": (ew.leaky_relu, (6, 16), ""),
    "Elu": (ew.elu, (6, 22), ""),
    "Selu": (ew.selu, (6, 22), "The node's alpha and gamma (not F.selu's fixed constants)."),
    "Celu": (ew.celu, (12, 28), ""),
    "HardSigmoid": (ew.hard_sigmoid, (6, 22), "The node's alpha and beta (not F.hardsigmoid's fixed 1/6, 1/2)."),
    "HardSwish": (F.hardswish, (14, 22), ""),
    "Softplus": (F.softplus, (1, 22), ""),
    "Softsign": (F.softsign, (1, 22), ""),
    "Mish": (F.mish, (18, 22), ""),
    "ThresholdedRelu": (ew.thresholded_relu, (10, 22), "NaN gives 0, as in onnxruntime."),
})


def _function_converter(op: str, fn: Callable, note: str):
    def convert(node: OnnxNode, ctx) -> Converted:
        if not getattr(fn, "uint64", True):  # unsigned_safe says whether uint64 is exact (modules/elementwise.py)
            refuse_uint64(node, ctx)
        attributes = {name: node.attr(name) for name in node.schema.attributes}  # every attribute, schema defaults
        return Converted(Function(fn, **attributes), node.inputs)

    convert.__name__ = convert.__qualname__ = f"convert_{op}"
    convert.__doc__ = note or "Fully supported."
    return convert


for _op, (_fn, _versions, _note) in _FUNCTIONS.items():
    register_converter(_op, _versions)(_function_converter(_op, _fn, _note))


# Ops that quantize a float value on the fly: in a model that has them, a float value that differs from onnxruntime's
# in its last bit can land one quantization step away, so its Tanh and Sigmoid compute as onnxruntime's kernels do.
DYNAMIC_QUANTIZERS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul"})
_EXACT_NOTE = ("In a model that quantizes dynamically (DynamicQuantizeLinear, DynamicQuantizeLSTM, "
               "DynamicQuantizeMatMul), float32 values are computed bit for bit as onnxruntime's MLAS kernel computes "
               "them (its rational approximation, emulated step by step: a last-bit difference upstream of a dynamic "
               "quantizer can move a quantization step); elsewhere torch.{fn} (a few float32 ulps from onnxruntime's).")


def _mlas_activation(op: str, versions: tuple[int, ...], exact: Callable, fast: Callable) -> None:
    def convert(node: OnnxNode, ctx) -> Converted:
        return Converted(Function(exact if ctx.loaded.op_types & DYNAMIC_QUANTIZERS else fast), node.inputs)

    convert.__name__ = convert.__qualname__ = f"convert_{op}"
    convert.__doc__ = _EXACT_NOTE.format(fn=fast.__name__)
    register_converter(op, versions)(convert)


_mlas_activation("Sigmoid", (6, 13), onnxruntime_sigmoid, torch.sigmoid)
_mlas_activation("Tanh", (6, 13), onnxruntime_tanh, torch.tanh)


@register_converter("Mod", (10, 13, 28))
def mod(node: OnnxNode, ctx) -> Converted:
    """fmod=1: C fmod (sign of the dividend); fmod=0: Python-style remainder (sign of the divisor). Before opset 28
    fmod=0 on floats is refused, as onnxruntime refuses it. uint16/uint32 computed exactly in int64; uint64 refused
    at conversion."""
    fmod = node.attr("fmod")
    if fmod not in (0, 1):
        raise node.unsupported("fmod", fmod, "must be 0 or 1")
    dtype = ctx.dtype(node.input(0))
    if fmod == 0 and node.version < 28 and dtype is not None and dtype.is_floating_point:
        raise node.unsupported("fmod", fmod, f"a floating-point Mod ({dtype}) needs fmod=1 before opset 28")
    refuse_uint64(node, ctx)
    return Converted(Function(ew.fmod if fmod else ew.remainder), node.inputs)


@register_converter("BitShift", (11, 28))
def bitshift(node: OnnxNode, ctx) -> Converted:
    """direction LEFT/RIGHT. Unsigned types of every width (a shift by the bit width or more gives 0); signed types
    (opset 28) shift arithmetically."""
    direction = node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise node.unsupported("direction", direction, "must be 'LEFT' or 'RIGHT'")
    return Converted(Function(ew.bitshift, direction=direction), node.inputs)


@register_converter("Gelu", 20)
def gelu(node: OnnxNode, ctx) -> Converted:
    """approximate 'none' (erf) and 'tanh'."""
    approximate = node.attr("approximate")
    if approximate not in ("none", "tanh"):
        raise node.unsupported("approximate", approximate, "must be 'none' or 'tanh'")
    return Converted(Function(ew.gelu, approximate=approximate), node.inputs)


def _in_dtype(value: float, dtype: torch.dtype | None) -> float:
    """A float attribute rounded to the input's dtype as onnxruntime sees it (FLT_MAX is inf in float16)."""
    return value if dtype is None else torch.tensor(value, dtype=torch.float64).to(dtype).item()


@register_converter("Clip", (6, 11, 12, 13), static=(1, 2))
def clip(node: OnnxNode, ctx) -> Converted:
    """Opset 6: min/max attributes (min > max is refused, as onnxruntime refuses it). Opset 11+: min/max inputs,
    absent, constant (baked in) or computed at run time; min > max gives max, and an absent float bound is the
    dtype's finite limit (so inf becomes the largest finite value), as in onnxruntime. Integer types from opset 12."""
    refuse_uint64(node, ctx)
    x = node.input(0)
    dtype = ctx.dtype(x)
    if node.version < 11:
        low, high = node.attr("min"), node.attr("max")
        if low > high:
            raise node.unsupported("min", low, f"greater than max={high}: onnxruntime refuses Clip-6 with min > max")
        return Converted(ew.Clip(_in_dtype(low, dtype), _in_dtype(high, dtype)), [x])
    bounds = [ctx.static(node, 1), ctx.static(node, 2)]
    for attribute, bound in zip(("min", "max"), bounds, strict=True):
        if bound.value is not None and bound.value.numel() != 1:
            raise node.unsupported(attribute, list(bound.value.shape), "a Clip bound must be a scalar")
    return converted(ew.Clip(*(bound.scalar() for bound in bounds)), [x, *(bound.run_time for bound in bounds)])


def _prelu_channels(slope: torch.Tensor | None, rank: int | None) -> int | None:
    """C when a constant slope is exactly nn.PReLU's weight for an input of ``rank``: a single value, or a shape
    (C, 1, ..., 1) that broadcasting aligns with dim 1 (leading 1s allowed); else None."""
    if slope is None or rank is None or not slope.is_floating_point():
        return None
    if slope.numel() == 1 and slope.dim() <= rank:
        return 1
    dims = list(slope.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    if rank >= 2 and len(dims) == rank - 1 and all(d == 1 for d in dims[1:]):
        return dims[0]
    return None


@register_converter("PRelu", (7, 9, 16))
def prelu(node: OnnxNode, ctx) -> Converted:
    """slope broadcasts to X (any shape; integer types too). A constant float slope used by this node alone that
    is one value or per channel (C, 1, ..., 1) becomes nn.PReLU with the slope as its trainable weight; otherwise an
    element-wise formula with the slope as an input."""
    x, slope_name = node.inputs
    slope = ctx.owned_constant(slope_name)
    shape = ctx.shape(x)
    channels = _prelu_channels(slope, None if shape is None else len(shape))
    if channels is None:
        return Converted(Function(ew.prelu), node.inputs)
    module = nn.PReLU(channels, dtype=slope.dtype)
    with torch.no_grad():
        module.weight.copy_(slope.reshape(-1))
    return Converted(module, [x])


_SOFTMAX = MappingProxyType({"Softmax": torch.softmax, "LogSoftmax": torch.log_softmax, "Hardmax": ew.hardmax})


def softmax(node: OnnxNode, ctx) -> Converted:
    """Versions 1 and 11 coerce the input to 2-D at ``axis`` (the op runs jointly over every dimension from
    ``axis`` on); version 13 runs along ``axis`` alone. Hardmax marks the first maximum; NaN as onnxruntime
    (skipped, but a NaN first element gives all zeros)."""
    return Converted(ew.Softmax(_SOFTMAX[node.op_type], node.attr("axis"), coerce_2d=node.version < 13), node.inputs)


for _op in _SOFTMAX:
    register_converter(_op, (1, 11, 13))(softmax)


@register_converter("Identity", (1, 13, 14, 16, 19, 21, 23, 24, 25))
def identity(node: OnnxNode, ctx) -> Converted:
    """Tensors (and whatever value the input carries) pass through."""
    return Converted(nn.Identity(), node.inputs)


_CONSTANT_KINDS = ("value", "value_float", "value_floats", "value_int", "value_ints", "sparse_value", "value_string",
                   "value_strings")


def _dense(sparse: onnx.SparseTensorProto) -> torch.Tensor:
    """A SparseTensorProto as a dense tensor (indices are linear positions [NNZ] or coordinates [NNZ, rank])."""
    values, indices, dims = to_torch(sparse.values), to_torch(sparse.indices), list(sparse.dims)
    if indices.dim() == 2:
        strides = torch.tensor([math.prod(dims[i + 1:]) for i in range(len(dims))], dtype=torch.int64)
        indices = (indices * strides).sum(-1)
    dense = torch.zeros(math.prod(dims), dtype=values.dtype)
    dense[indices.reshape(-1)] = values.reshape(-1)
    return dense.reshape(dims)


@register_converter("Constant", (1, 9, 11, 12, 13, 19, 21, 23, 24, 25))
def constant(node: OnnxNode, ctx) -> Converted:
    """value, value_float(s), value_int(s) and sparse_value (made dense); string constants are refused."""
    given = [kind for kind in _CONSTANT_KINDS if node.has_attr(kind)]
    if len(given) != 1:
        raise node.unsupported("value", given, "a Constant needs exactly one value attribute")
    kind = given[0]
    value = node.attr(kind)
    if kind in ("value_string", "value_strings"):
        raise node.unsupported(kind, value, "string constants have no torch equivalent")
    if kind == "sparse_value":
        value = _dense(value)
    elif not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=torch.float32 if kind.startswith("value_float") else torch.int64)
    return Converted(ConstantValue(value), [])
