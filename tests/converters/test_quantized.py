"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the integer ops against onnxruntime: every attribute,
every integer type onnxruntime runs, per-tensor / per-axis / blocked parameters, as initializers and as inputs.
Integer outputs must be equal (a difference of one step fails the tolerance)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.errors import UnsupportedAttributeError
from tests import helpers
from tests.helpers import (
    CONV_CASES,
    TensorProto,
    check,
    check_reference,
    helper,
    make_model,
    parametrize_pairwise,
    single_node,
    tensor_type,
)

RNG = np.random.default_rng(0)

INT_TYPES = {np.uint8: 10, np.int8: 10, np.uint16: 21, np.int16: 21}  # numpy type -> first opset defining it


def integers(*args, **kwargs) -> np.ndarray:
    return helpers.integers(*args, rng=RNG, **kwargs)  # this module's RNG, reseeded per test


def floats(*args, **kwargs) -> np.ndarray:
    return helpers.floats(*args, rng=RNG, **kwargs)


def split(values: dict, constant: bool, names=("x",)):
    """(feeds, initializers): the values named in ``names`` are fed, the rest are initializers when ``constant``."""
    feeds = {k: v for k, v in values.items() if k in names or not constant}
    return feeds, {k: v for k, v in values.items() if k not in feeds}


# ----------------------------------------------------------------------------------------------- QuantizeLinear

QUANTIZE_MODES = [  # (x shape, scale shape, attributes, first opset)
    ((3, 4, 5), (), {}, 10),
    ((3, 4, 5), (1,), {}, 10),
    ((3, 4, 5), (4,), {}, 13),
    ((3, 4, 5), (3,), {"axis": 0}, 13),
    ((3, 4, 5), (5,), {"axis": -1}, 13),
    ((3, 4, 5), (3, 2, 5), {"axis": 1, "block_size": 2}, 21),
    ((6, 5), (2, 5), {"axis": 0, "block_size": 3}, 21),
    ((3, 7), (3, 3), {"axis": -1, "block_size": 3}, 21),
]


def _quantize_case(dtype, x_shape, scale_shape, with_zero_point: bool):
    scale = (RNG.uniform(0.01, 0.1, scale_shape)).astype(np.float32)
    values = {"x": floats(x_shape, float(scale.reshape(-1)[0])), "s": scale}
    info = np.iinfo(dtype)
    if with_zero_point:
        values["z"] = integers(dtype, scale_shape, info.min // 4 if info.min else 0, info.max // 4)
    return values


def _cases(types: dict, opsets=(10, 13, 19, 21, 23, 25)):
    """(opset, dtype, x shape, scale shape, attributes) for every type and mode defined at each opset."""
    return [pytest.param(opset, dtype, *mode[:3], id=f"{opset}-{np.dtype(dtype).name}-{index}")
            for opset in opsets for dtype, since in types.items() for index, mode in enumerate(QUANTIZE_MODES)
            if opset >= max(since, mode[3])]


@pytest.mark.parametrize(("opset", "dtype", "x_shape", "scale_shape", "attributes"), _cases(INT_TYPES))
@pytest.mark.parametrize("constant", [True, False])
def test_quantize_linear(opset, dtype, x_shape, scale_shape, attributes, constant):
    values = _quantize_case(dtype, x_shape, scale_shape, True)
    feeds, initializers = split(values, constant)
    model, feeds = single_node("QuantizeLinear", ["x", "s", "z"], feeds, initializers, opset, **attributes)
    check(model, feeds)


@pytest.mark.parametrize("opset", [10, 19, 21, 25])
def test_quantize_linear_without_zero_point_is_uint8(opset):
    values = _quantize_case(np.uint8, (4, 6), (), False)
    model, feeds = single_node("QuantizeLinear", ["x", "s"], {"x": values["x"]},
                               {"s": values["s"]}, opset)
    check(model, feeds)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int16])
def test_quantize_linear_output_dtype(dtype):
    values = _quantize_case(dtype, (4, 6), (6,), False)
    model, feeds = single_node("QuantizeLinear", ["x", "s"], {"x": values["x"]},
                               {"s": values["s"]}, 21, axis=1, output_dtype=tensor_type(dtype))
    check(model, feeds)


def test_quantize_linear_special_values():
    """NaN goes to the lowest value, infinities saturate, halves round to even (also negative ones)."""
    x = np.array([np.nan, np.inf, -np.inf, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e10, -1e10, 127.5, 128.5], np.float32)
    for dtype, zero_point in [(np.uint8, 7), (np.int8, -3), (np.uint16, 300), (np.int16, -700)]:
        model, feeds = single_node("QuantizeLinear", ["x", "s", "z"], {"x": x},
                                   {"s": np.float32(1.0), "z": np.array(zero_point, dtype)}, 21)
        check(model, feeds)


@pytest.mark.parametrize("opset", [19, 21, 25])
def test_quantize_linear_float16(opset):
    x = (np.arange(-300, 300) * 0.37).astype(np.float16).reshape(20, 30)
    model, feeds = single_node("QuantizeLinear", ["x", "s", "z"], {"x": x},
                               {"s": np.array(0.5, np.float16), "z": np.array(3, np.int8)}, opset)
    check(model, feeds)


@pytest.mark.parametrize("precision", [0, TensorProto.FLOAT])
def test_quantize_linear_precision(precision):
    values = _quantize_case(np.uint8, (4, 6), (), True)
    model, feeds = single_node("QuantizeLinear", ["x", "s", "z"], {"x": values["x"]},
                               {"s": values["s"], "z": values["z"]}, 23, precision=precision)
    check(model, feeds)


def test_quantize_linear_refuses_what_it_cannot_compute():
    x = np.ones((2, 3), np.float32)
    model, _ = single_node("QuantizeLinear", ["x", "s"], {"x": x}, {"s": np.float32(1)}, 23,
                           precision=TensorProto.FLOAT16)
    with pytest.raises(UnsupportedAttributeError, match="precision"):
        onnx2torch_rnn.convert(model)
    model, _ = single_node("QuantizeLinear", ["x", "s"], {"x": x}, {"s": np.float32(1)},
                           21, output_dtype=TensorProto.FLOAT8E4M3FN)
    with pytest.raises(UnsupportedAttributeError, match="output_dtype"):
        onnx2torch_rnn.convert(model)


# ----------------------------------------------------------------------------------------------- DequantizeLinear

@pytest.mark.parametrize(("opset", "dtype", "x_shape", "scale_shape", "attributes"),
                         _cases({**INT_TYPES, np.int32: 10}))
@pytest.mark.parametrize("constant", [True, False])
def test_dequantize_linear(opset, dtype, x_shape, scale_shape, attributes, constant):
    values = {"x": integers(dtype, x_shape), "s": RNG.uniform(0.01, 0.1, scale_shape).astype(np.float32)}
    if dtype != np.int32:  # int32 has no zero point but 0
        values["z"] = integers(dtype, scale_shape)
    feeds, initializers = split(values, constant)
    model, feeds = single_node("DequantizeLinear", ["x", "s", "z"][:len(values)], feeds, initializers, opset,
                               **attributes)
    check(model, feeds)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_dequantized_weights_are_folded_to_parameters(dtype):
    """DequantizeLinear of an initializer runs once at conversion: its float consumer reads a trainable tensor."""
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    weights = {"w": integers(dtype, (6, 4)), "s": RNG.uniform(0.01, 0.1, 6).astype(np.float32),
               "z": integers(dtype, (6,))}
    model = make_model(nodes, [("x", np.float32, (3, 6))], ["y"], weights, 21)
    module = check(model)
    assert not any(n.op == "call_module" and "Dequantize" in str(n.target) for n in module.graph.nodes)
    assert [p.shape for p in module.parameters()] == [torch.Size([4, 6])]


@pytest.mark.parametrize("opset", [19, 21])
def test_dequantize_linear_float16_scale(opset):
    model, feeds = single_node("DequantizeLinear", ["x", "s", "z"],
                               {"x": integers(np.int8, (5, 6))},
                               {"s": np.array([0.03, 0.5, 1e-3, 7, 0.1, 2], np.float16), "z": integers(np.int8, (6,))},
                               opset, axis=1)
    check(model, feeds)


def test_dequantize_linear_output_dtype():
    model, feeds = single_node("DequantizeLinear", ["x", "s", "z"],
                               {"x": integers(np.uint8, (5, 6))},
                               {"s": np.array(0.037, np.float32), "z": np.array(100, np.uint8)},
                               23, output_dtype=TensorProto.FLOAT16)
    check(model, feeds)


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint16])
def test_opset_28(op, dtype):
    """onnxruntime stops at opset 25; opset 28 (float6 types added) is checked against onnx's reference evaluator."""
    values = _quantize_case(dtype, (3, 7), (3, 3), True)
    x = values["x"] if op == "QuantizeLinear" else integers(dtype, (3, 7))
    model, feeds = single_node(op, ["x", "s", "z"], {"x": x}, {"s": values["s"], "z": values["z"]}, 28, axis=-1,
                               block_size=3)
    check_reference(model, feeds)


# ----------------------------------------------------------------------------------------------- DynamicQuantizeLinear

@pytest.mark.parametrize(("shape", "kind"), [
    ((3, 4, 5), "normal"), ((7,), "positive"), ((2, 9), "negative"), ((4, 4), "zeros"), ((1,), "normal"),
    ((64, 33), "normal"), ((0, 3), "normal"), ((5, 5), "ties"),
])
def test_dynamic_quantize_linear(shape, kind):
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    x = {"positive": np.abs(x), "negative": -np.abs(x), "zeros": x * 0}.get(kind, x)
    if kind == "ties":  # range 255 and values on half steps
        x = (np.arange(25).reshape(shape) - 12.5).astype(np.float32)
        x[0, 0], x[-1, -1] = -127.5, 127.5
    model, feeds = single_node("DynamicQuantizeLinear", ["x"], {"x": x}, {}, 11,
                               outputs=("y", "y_scale", "y_zero_point"))
    check(model, feeds)


# ----------------------------------------------------------------------------------------------- MatMulInteger

MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((3, 4), (4,)),
                 ((1, 64), (64, 7)), ((5, 300), (300, 3))]


@parametrize_pairwise(shapes=MATMUL_SHAPES, types=[(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)],
                      zero_points=["none", "scalar", "a_only"], constant=[True, False])
def test_matmul_integer(shapes, types, zero_points, constant):
    (a_shape, b_shape), (a_type, b_type) = shapes, types
    values = {"a": integers(a_type, a_shape), "b": integers(b_type, b_shape)}
    names = ["a", "b"]
    if zero_points != "none":
        values["az"] = integers(a_type, ())
        names.append("az")
    if zero_points == "scalar":
        values["bz"] = integers(b_type, ())
        names.append("bz")
    feeds, initializers = split(values, constant, ("a",))
    model, feeds = single_node("MatMulInteger", names, feeds, initializers, 10)
    check(model, feeds)


@pytest.mark.parametrize("b_type", [np.uint8, np.int8])
def test_matmul_integer_per_column_b_zero_point(b_type):
    model, feeds = single_node("MatMulInteger", ["a", "b", "az", "bz"],
                               {"a": integers(np.uint8, (2, 3, 6))},
                               {"b": integers(b_type, (6, 5)), "az": integers(np.uint8, ()),
                                "bz": integers(b_type, (5,))}, 10)
    check(model, feeds)


@pytest.mark.parametrize(("a_type", "b_type"), [(np.uint8, np.uint8), (np.int8, np.uint8)])
def test_matmul_integer_beyond_onnxruntime(a_type, b_type):
    """Per-row zero points of A and int8 x uint8 are in the spec; onnxruntime refuses them: numpy is the oracle."""
    a, b = integers(a_type, (4, 6)), integers(b_type, (6, 3))
    az, bz = integers(a_type, (4,)), integers(b_type, (3,))
    model, _ = single_node("MatMulInteger", ["a", "b", "az", "bz"], {"a": a, "b": b, "az": az,
                                                                                        "bz": bz}, {}, 10)
    got = onnx2torch_rnn.convert(model)(*(torch.from_numpy(v) for v in (a, b, az, bz)))
    want = (a.astype(np.int64) - az[:, None]) @ (b.astype(np.int64) - bz)
    np.testing.assert_array_equal(got.numpy(), want.astype(np.int32), strict=True)


# ----------------------------------------------------------------------------------------------- ConvInteger

@pytest.mark.parametrize(("attributes", "x_shape", "w_shape", "bias"), CONV_CASES)
@pytest.mark.parametrize("w_type", [np.uint8, np.int8])
@pytest.mark.parametrize("zero_points", ["none", "scalar"])
def test_conv_integer(attributes, x_shape, w_shape, bias, w_type, zero_points):
    values = {"x": integers(np.uint8, x_shape), "w": integers(w_type, w_shape)}
    names = ["x", "w"]
    if zero_points == "scalar":
        values.update(xz=integers(np.uint8, (), 60, 200), wz=integers(w_type, ()))
        names += ["xz", "wz"]
    feeds, initializers = split(values, bias)  # the bias flag of the shared cases picks constant weights
    model, feeds = single_node("ConvInteger", names, feeds, initializers, 10, **attributes)
    check(model, feeds)


# ----------------------------------------------------------------------------------------------- QLinearMatMul

def _qlinear_values(a_type, b_type, y_type, a_shape, b_shape, b_params_shape=()):
    return {"a": integers(a_type, a_shape), "as": np.array(RNG.uniform(0.01, 0.05), np.float32),
            "az": integers(a_type, (), None if a_type == np.int8 else 100, None if a_type == np.int8 else 150),
            "b": integers(b_type, b_shape), "bs": RNG.uniform(0.005, 0.05, b_params_shape).astype(np.float32),
            "bz": integers(b_type, b_params_shape, -5 if b_type == np.int8 else 120,
                           5 if b_type == np.int8 else 135),
            "ys": np.array(RNG.uniform(0.05, 0.5), np.float32), "yz": integers(y_type, ())}


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize(("a_shape", "b_shape"), [s for s in MATMUL_SHAPES if len(s[1]) > 1])
@pytest.mark.parametrize("types", [(np.uint8, np.uint8, np.uint8), (np.uint8, np.int8, np.uint8),
                                   (np.int8, np.int8, np.int8)])
@pytest.mark.parametrize("constant", [True, False])
def test_qlinear_matmul(opset, a_shape, b_shape, types, constant):
    values = _qlinear_values(*types, a_shape, b_shape)
    feeds, initializers = split(values, constant, ("a",))
    names = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    model, feeds = single_node("QLinearMatMul", names, feeds, initializers, opset)
    check(model, feeds)


@pytest.mark.parametrize("b_type", [np.uint8, np.int8])
def test_qlinear_matmul_per_column(b_type):
    values = _qlinear_values(np.uint8, b_type, np.uint8, (3, 8), (8, 5), (5,))
    names = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    model, feeds = single_node("QLinearMatMul", names, {"a": values.pop("a")}, values, 10)
    check(model, feeds)


# ----------------------------------------------------------------------------------------------- QLinearConv

@pytest.mark.parametrize(("attributes", "x_shape", "w_shape", "bias"), CONV_CASES)
@pytest.mark.parametrize("types", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(attributes, x_shape, w_shape, bias, types, per_channel):
    x_type, w_type = types
    channels = (w_shape[0],) if per_channel else ()
    values = {"x": integers(x_type, x_shape), "xs": np.array(RNG.uniform(0.01, 0.05), np.float32),
              "xz": integers(x_type, (), -20 if x_type == np.int8 else 100, 20 if x_type == np.int8 else 150),
              "w": integers(w_type, w_shape), "ws": RNG.uniform(0.002, 0.02, channels).astype(np.float32),
              "wz": np.full(channels, 0 if w_type == np.int8 else 128, w_type),
              "ys": np.array(RNG.uniform(0.05, 0.3), np.float32), "yz": integers(x_type, ())}
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        values["B"] = RNG.integers(-3000, 3000, (w_shape[0],)).astype(np.int32)
        names.append("B")
    model, feeds = single_node("QLinearConv", names, {"x": values.pop("x")}, values, 10,
                               **attributes)
    check(model, feeds)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_runtime_parameters(per_channel):
    """Scales, zero points, weights and bias as graph inputs (not folded into the module at conversion)."""
    channels = (5,) if per_channel else ()
    feeds = {"x": integers(np.uint8, (2, 3, 7, 9)), "xs": np.array(0.03, np.float32), "xz": integers(np.uint8, ()),
             "w": integers(np.int8, (5, 3, 3, 2)), "ws": RNG.uniform(0.002, 0.02, channels).astype(np.float32),
             "wz": np.zeros(channels, np.int8), "ys": np.array(0.2, np.float32), "yz": integers(np.uint8, ()),
             "B": RNG.integers(-3000, 3000, (5,)).astype(np.int32)}
    model, feeds = single_node("QLinearConv", list(feeds), feeds, {}, 10, pads=[1, 0, 2, 1], strides=[2, 1])
    check(model, feeds)


@pytest.mark.parametrize("op", ["QLinearMatMul", "QLinearConv"])
@pytest.mark.parametrize("types", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_requantization_ties_round_to_even(op, types):
    """x_scale * w_scale / y_scale = 0.5 exactly and small operands: every odd accumulator lands on a half."""
    x_type, w_type = types
    x_shape, w_shape = ((2, 4, 6, 6), (5, 4, 3, 3)) if op == "QLinearConv" else ((6, 20), (20, 7))
    x_zero_point = integers(x_type, (), -5 if x_type == np.int8 else 100, 5 if x_type == np.int8 else 110)
    w_low = -3 if w_type == np.int8 else 125
    values = {"x": integers(x_type, x_shape, int(x_zero_point) - 3, int(x_zero_point) + 3),
              "xs": np.array(0.5, np.float32), "xz": x_zero_point, "w": integers(w_type, w_shape, w_low, w_low + 6),
              "ws": np.array(0.25, np.float32), "wz": np.array(0 if w_type == np.int8 else 128, w_type),
              "ys": np.array(0.25, np.float32), "yz": integers(x_type, (), -10 if x_type == np.int8 else 120,
                                                               10 if x_type == np.int8 else 130)}
    if op == "QLinearMatMul":
        acc = (values["x"].astype(np.int64) - x_zero_point) @ (values["w"].astype(np.int64) - values["wz"])
        assert (acc % 2 == 1).sum() > 5  # halves to round
    model, feeds = single_node(op, ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], {"x": values.pop("x")}, values,
                               10)
    check(model, feeds)


def test_conv_integer_per_channel_weight_zero_points():
    """Per output channel zero points are in the spec; onnxruntime refuses them: onnx's reference evaluator is the
    oracle."""
    values = {"w": integers(np.uint8, (4, 2, 3, 3)), "xz": integers(np.uint8, ()), "wz": integers(np.uint8, (4,))}
    model, feeds = single_node("ConvInteger", ["x", "w", "xz", "wz"], {"x": integers(np.uint8, (1, 2, 5, 6))}, values,
                               10, pads=[1, 0, 1, 2], strides=[1, 2])
    check_reference(model, feeds, rtol=0, atol=0)
