"""onnxruntime's com.microsoft quantized ops against onnxruntime itself: every attribute, int8 and uint8, broadcasting,
per-column parameters, optional inputs absent. Integer outputs must be equal (one step off fails)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.checking import random_inputs, run_onnxruntime, run_torch
from onnx2torch_rnn.modules import quantized
from onnx2torch_rnn.recurrent import kernel
from tests import helpers
from tests.helpers import OpSpy, check, helper, make_model, single_node, tensor_type

RNG = np.random.default_rng(0)


def integers(*args, **kwargs) -> np.ndarray:
    return helpers.integers(*args, rng=RNG, **kwargs)  # this module's RNG, reseeded per test


def floats(*args, **kwargs) -> np.ndarray:
    return helpers.floats(*args, rng=RNG, **kwargs)
MS = "com.microsoft"
BYTES = [np.uint8, np.int8]


def scalar(value, dtype=np.float32) -> np.ndarray:
    return np.array(value, dtype)


def _params(dtype, ties: bool) -> dict:
    """Scales and zero points; with ``ties`` simple decimal scales, whose products often land near halves."""
    info = np.iinfo(dtype)
    scales = (0.1, 0.3, 0.2) if ties else RNG.uniform(0.01, 0.2, 3)
    zero_points = [integers(dtype, (), info.min // 2, info.max // 2) for _ in range(3)]
    return {"as": scalar(scales[0]), "az": zero_points[0], "bs": scalar(scales[1]), "bz": zero_points[1],
            "cs": scalar(scales[2]), "cz": zero_points[2]}


BROADCASTS = [((4, 64), (4, 64)), ((3, 5, 7), (7,)), ((6, 9), (6, 1)), ((50,), ()), ((), (33,)), ((1, 8), (5, 1))]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCASTS)
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_binary(op, dtype, a_shape, b_shape, ties):
    values = _params(dtype, ties)
    feeds = {"a": integers(dtype, a_shape), "b": integers(dtype, b_shape)}
    shape = np.broadcast_shapes(a_shape, b_shape)
    model, feeds = single_node(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], feeds, values, 17,
                               outputs=[("c", tensor_type(dtype), shape)], domain=MS)
    check(model, feeds)


# (dtype, (a_scale, a_zp, b_scale, b_zp, c_scale, c_zp)) for which some pair of values lands one float32 rounding
# from a half, so that the order of float32 steps decides (found by search): which operand MLAS gets as the vector
# and how the compiler contracted the zero-point term.
QLINEAR_ADD_SENSITIVE = [
    (np.uint8, (0.05, 80, 0.7, 34, 0.3, 5)), (np.uint8, (0.7, 77, 0.15, 92, 0.9, 69)),
    (np.uint8, (0.9, 50, 0.15, 115, 0.9, 71)), (np.uint8, (0.2, 121, 0.15, 91, 0.7, 115)),
    (np.int8, (0.05, 16, 0.7, -30, 0.3, -59)), (np.int8, (0.7, 13, 0.15, 28, 0.9, 5)),
    (np.int8, (0.05, -18, 0.15, 42, 0.7, 0)), (np.int8, (0.05, -53, 0.05, -34, 0.9, 38)),
]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize(("dtype", "parameters"), QLINEAR_ADD_SENSITIVE)
@pytest.mark.parametrize("layout", ["vectors", "a repeats", "b repeats"])
def test_qlinear_binary_float_steps(op, dtype, parameters, layout):
    """Every pair of values, as two full grids or with one operand repeated along the innermost axis."""
    a_scale, a_zp, b_scale, b_zp, c_scale, c_zp = parameters
    values = {"as": scalar(a_scale), "az": scalar(a_zp, dtype), "bs": scalar(b_scale), "bz": scalar(b_zp, dtype),
              "cs": scalar(c_scale), "cz": scalar(c_zp, dtype)}
    every = np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1).astype(dtype)
    a, b = np.broadcast_arrays(every[:, None], every[None, :])
    feeds = {"vectors": {"a": a.copy(), "b": b.copy()}, "a repeats": {"a": every[:, None], "b": b.copy()},
             "b repeats": {"a": b.copy(), "b": every[:, None]}}[layout]
    model, feeds = single_node(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], feeds, values, 17,
                               outputs=[("c", tensor_type(dtype), (256, 256))], domain=MS)
    check(model, feeds)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", BYTES)
def test_qlinear_binary_overflow(op, dtype):
    """A result past the int32 range lands on the lowest value, as MLAS's float-to-int32 conversion gives it."""
    info = np.iinfo(dtype)
    values = {"as": scalar(3000.0), "az": integers(dtype, (), 0, 0), "bs": scalar(1.0), "bz": integers(dtype, (), 0, 0),
              "cs": scalar(1e-4), "cz": integers(dtype, (), 0, 0)}
    feeds = {"a": np.array([0, 1, 60, info.max, info.min], dtype), "b": np.array([0, 2, 1, 1, 1], dtype)}
    model, feeds = single_node(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], feeds, values, 17,
                               outputs=[("c", tensor_type(dtype), (5,))], domain=MS)
    check(model, feeds)


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("case", range(6))
def test_qlinear_lookup_every_value(op, dtype, case):
    """All 256 inputs, under scales from tiny to large (the sigmoid saturates), zero points present or not."""
    x_scale = [0.001, 0.02, 0.05, 0.1, 0.3, 0.0625][case]
    y_scale = 1 / 256 if op == "QLinearSigmoid" and case % 2 else RNG.uniform(0.002, 0.05)
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype).reshape(4, 64)
    values = {"xs": scalar(x_scale), "ys": scalar(y_scale)}
    names = ["x", "xs", "", "ys", ""]
    if case < 4:
        values.update(xz=integers(dtype, ()), yz=integers(dtype, ()))
        names = ["x", "xs", "xz", "ys", "yz"]
    attributes = {"alpha": float(RNG.uniform(0.01, 0.5))} if op == "QLinearLeakyRelu" and case % 3 else {}
    model, feeds = single_node(op, names, {"x": x}, values, 17, outputs=[("y", tensor_type(dtype), (4, 64))],
                               domain=MS, **attributes)
    check(model, feeds)


# (x_scale, y_scale, x_zp, y_zp) where one table entry differs between the exact sigmoid and MLAS's approximation
# (found by search): the converted table must be MLAS's.
SIGMOID_SENSITIVE = [(0.03142225369811058, 0.00390625, 178, 30), (0.06981247663497925, 0.00390625, 57, 40),
                     (0.1426064819097519, 0.00390625, 109, 10), (0.060019347816705704, 0.00390625, 51, 60),
                     (0.047880854457616806, 0.0029669953510165215, 193, 24),
                     (0.1692252904176712, 0.0005009089945815504, 160, 48)]


@pytest.mark.parametrize(("x_scale", "y_scale", "x_zero_point", "y_zero_point"), SIGMOID_SENSITIVE)
def test_qlinear_sigmoid_is_mlas_approximation(x_scale, y_scale, x_zero_point, y_zero_point):
    values = {"xs": scalar(x_scale), "xz": scalar(x_zero_point, np.uint8), "ys": scalar(y_scale),
              "yz": scalar(y_zero_point, np.uint8)}
    model, feeds = single_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"],
                               {"x": np.arange(256).astype(np.uint8).reshape(4, 64)}, values, 17,
                               outputs=[("y", tensor_type(np.uint8), (4, 64))], domain=MS)
    check(model, feeds)


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("shape", "channels_last"), [((2, 3, 5, 6), 0), ((1, 4, 7), 0), ((2, 5, 6, 3), 1),
                                                      ((3, 16, 16, 40), 0), ((1, 9, 17), 1)])
def test_qlinear_global_average_pool(dtype, shape, channels_last):
    out = (shape[0], *([1] * (len(shape) - 2)), shape[-1]) if channels_last else (*shape[:2], *[1] * (len(shape) - 2))
    values = {"xs": scalar(RNG.uniform(0.01, 0.1)), "xz": integers(dtype, ()), "ys": scalar(RNG.uniform(0.01, 0.05)),
              "yz": integers(dtype, ())}
    model, feeds = single_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"],
                               {"x": integers(dtype, shape)}, values, 17, outputs=[("y", tensor_type(dtype), out)],
                               domain=MS, channels_last=channels_last)
    check(model, feeds)


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("shapes", "axis"), [([(2, 3, 4), (2, 5, 4)], 1), ([(3, 2), (3, 4), (3, 1)], -1),
                                              ([(1, 4), (2, 4), (3, 4)], 0)])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("constant", [True, False])
def test_qlinear_concat(dtype, shapes, axis, shared, constant):
    """``shared``: the first input has the output's scale and zero point (onnxruntime copies it); ``constant``: the
    scales and zero points are initializers (the copy decided at conversion), else graph inputs."""
    values = {"ys": scalar(0.05), "yz": integers(dtype, ())}
    feeds, names = {}, ["ys", "yz"]
    for index, shape in enumerate(shapes):
        feeds[f"x{index}"] = integers(dtype, shape)
        same = shared and index == 0
        values[f"s{index}"] = values["ys"] if same else scalar(RNG.uniform(0.01, 0.2))
        values[f"z{index}"] = values["yz"] if same else integers(dtype, ())
        names += [f"x{index}", f"s{index}", f"z{index}"]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    if not constant:
        feeds, values = {**feeds, **values}, {}
    model, feeds = single_node("QLinearConcat", names, feeds, values, 17,
                               outputs=[("y", tensor_type(dtype), out)], domain=MS, axis=axis)
    check(model, feeds)


QGEMM_CASES = [  # (attributes, A shape, B shape, C shape or None)
    ({}, (3, 8), (8, 5), (5,)),
    ({"alpha": 0.5}, (3, 8), (8, 5), None),
    ({"transA": 1}, (8, 3), (8, 5), (3, 5)),
    ({"transB": 1}, (3, 8), (5, 8), (1, 5)),
    ({"transA": 1, "transB": 1, "alpha": 2.0}, (8, 3), (5, 8), ()),
    ({}, (4, 30), (30, 6), (4, 1)),
]


@pytest.mark.parametrize(("attributes", "a_shape", "b_shape", "c_shape"), QGEMM_CASES)
@pytest.mark.parametrize("b_type", BYTES)
@pytest.mark.parametrize("output", ["quantized", "float"])
@pytest.mark.parametrize("per_column", [False, True])
def test_qgemm(attributes, a_shape, b_shape, c_shape, b_type, output, per_column):
    a_type = np.uint8 if b_type == np.uint8 else np.int8
    n = b_shape[0] if attributes.get("transB") else b_shape[1]
    m = a_shape[1] if attributes.get("transA") else a_shape[0]
    columns = (n,) if per_column else ()
    values = {"as": scalar(RNG.uniform(0.01, 0.05)), "az": integers(a_type, (), -10, 10),
              "b": integers(b_type, b_shape), "bs": RNG.uniform(0.005, 0.05, columns).astype(np.float32),
              "bz": np.zeros(columns, b_type) if b_type == np.int8 else integers(b_type, columns, 120, 135),
              "ys": scalar(RNG.uniform(0.2, 0.8)), "yz": integers(a_type, ())}
    names = ["a", "as", "az", "b", "bs", "bz", ""]
    if c_shape is not None:
        values["c"] = RNG.integers(-3000, 3000, c_shape).astype(np.int32)
        names[-1] = "c"
    names += ["ys", "yz"] if output == "quantized" else []
    y_type = tensor_type(a_type) if output == "quantized" else tensor_type(np.float32)
    model, feeds = single_node("QGemm", names, {"a": integers(a_type, a_shape)},
                               {k: v for k, v in values.items() if k in names}, 17,
                               outputs=[("y", y_type, (m, n))], domain=MS, **attributes)
    check(model, feeds)


MATMUL_SHAPES = [((3, 8), (8, 5)), ((2, 4, 16), (16, 3)), ((7,), (7, 2)), ((2, 3, 40), (40, 9))]


@pytest.mark.parametrize(("a_shape", "b_shape"), MATMUL_SHAPES)
@pytest.mark.parametrize("b_type", BYTES)
@pytest.mark.parametrize("optional", ["none", "zero_point", "bias", "both"])
def test_dynamic_quantize_matmul(a_shape, b_shape, b_type, optional):
    values = {"b": integers(b_type, b_shape), "bs": scalar(RNG.uniform(0.005, 0.05))}
    names = ["a", "b", "bs", "", ""]
    if optional in ("zero_point", "both"):
        values["bz"] = integers(b_type, (), -3 if b_type == np.int8 else 120, 3 if b_type == np.int8 else 135)
        names[3] = "bz"
    if optional in ("bias", "both"):
        values["bias"] = RNG.standard_normal(b_shape[-1]).astype(np.float32)
        names[4] = "bias"
    out = (*a_shape[:-1], b_shape[-1])
    model, feeds = single_node("DynamicQuantizeMatMul", names, {"a": floats(a_shape, 0.01)}, values, 17,
                               outputs=[("y", tensor_type(np.float32), out)], domain=MS)
    check(model, feeds)


@pytest.mark.parametrize(("a_shape", "b_shape"), MATMUL_SHAPES)
@pytest.mark.parametrize("b_type", BYTES)
@pytest.mark.parametrize("optional", ["none", "zero_points", "bias"])
def test_matmul_integer_to_float(a_shape, b_shape, b_type, optional):
    values = {"b": integers(b_type, b_shape), "as": scalar(RNG.uniform(0.005, 0.05)),
              "bs": scalar(RNG.uniform(0.005, 0.05))}
    names = ["a", "b", "as", "bs"]
    if optional == "zero_points":
        values.update(az=integers(np.uint8, ()), bz=integers(b_type, ()))
        names += ["az", "bz"]
    if optional == "bias":
        values["bias"] = RNG.standard_normal(b_shape[-1]).astype(np.float32)
        names += ["", "", "bias"]
    out = (*a_shape[:-1], b_shape[-1])
    model, feeds = single_node("MatMulIntegerToFloat", names, {"a": integers(np.uint8, a_shape)}, values, 17,
                               outputs=[("y", tensor_type(np.float32), out)], domain=MS)
    check(model, feeds)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
@pytest.mark.parametrize("per_axis", [False, True])
def test_microsoft_quantize_dequantize(dtype, per_axis):
    shape = (3, 4, 5)
    scale_shape = (4,) if per_axis else ()
    info = np.iinfo(dtype)
    values = {"s": RNG.uniform(0.01, 0.1, scale_shape).astype(np.float32),
              "z": integers(dtype, scale_shape, info.min // 4 if info.min else 0, info.max // 4)}
    model, feeds = single_node("QuantizeLinear", ["x", "s", "z"], {"x": floats(shape, 0.05)}, values, 17,
                               outputs=[("y", tensor_type(dtype), shape)], domain=MS, axis=1)
    check(model, feeds)
    model, feeds = single_node("DequantizeLinear", ["x", "s", "z"], {"x": integers(dtype, shape)}, values, 17,
                               outputs=[("y", tensor_type(np.float32), shape)], domain=MS, axis=1)
    check(model, feeds)


# ----------------------------------------------------------------------------------------------- DynamicQuantizeLSTM

def lstm_weights(w_type, directions: int, input_size: int, hidden: int, per_channel: bool) -> dict:
    """W [D, I, 4H], R [D, H, 4H] and their parameters, as the quantizer lays them out (int8: zero points 0;
    uint8: one zero point for everything, onnxruntime requires it)."""
    shape = (directions, 4 * hidden) if per_channel else (directions,)
    values = {}
    for name, rows in (("W", input_size), ("R", hidden)):
        values[name] = integers(w_type, (directions, rows, 4 * hidden))
        values[f"{name}s"] = RNG.uniform(0.002, 0.03, shape).astype(np.float32)
        values[f"{name}z"] = np.full(shape, 0 if w_type == np.int8 else 131, w_type)
    return values


def dqlstm_model(values, feeds, attributes, outputs=("y", "y_h", "y_c"), runtime=(), opset=17):
    """A DynamicQuantizeLSTM node over x (and the optional inputs in ``values`` / ``feeds``)."""
    names = ["x", "W", "R", "B", "lens", "h0", "c0", "P", "Ws", "Wz", "Rs", "Rz"]
    present = {**values, **feeds}
    inputs = [n if n in present else "" for n in names]
    x = feeds["x"]
    steps, batch = x.shape[:2]
    d = values.get("W", feeds.get("W")).shape[0]
    hidden = values.get("R", feeds.get("R")).shape[1]
    shapes = {"y": (steps, d, batch, hidden), "y_h": (d, batch, hidden), "y_c": (d, batch, hidden)}
    specs = [(o, np.float32, shapes[o]) if o else "" for o in outputs]
    node_outputs = [o[0] if isinstance(o, tuple) else o for o in specs]
    node = helper.make_node("DynamicQuantizeLSTM", inputs, node_outputs, domain=MS, **attributes)
    graph_inputs = [(k, v.dtype, v.shape) for k, v in feeds.items()]
    return make_model([node], graph_inputs, [s for s in specs if s], values, opset, {MS: 1})


DQLSTM_CASES = [  # (attributes, optional inputs)
    ({"hidden_size": 5}, ()),
    ({"hidden_size": 5, "direction": "reverse"}, ("B",)),
    ({"hidden_size": 4, "direction": "bidirectional"}, ("B", "h0", "c0")),
    ({"hidden_size": 4, "direction": "bidirectional"}, ("B", "lens")),
    ({"hidden_size": 3, "direction": "forward"}, ("B", "lens", "h0", "c0", "P")),
    ({"hidden_size": 3, "direction": "bidirectional", "clip": 0.7}, ("B", "P")),
    ({"hidden_size": 4, "input_forget": 1}, ("B", "h0")),
    ({"hidden_size": 4, "direction": "bidirectional",
      "activations": ["HardSigmoid", "Tanh", "Relu", "Sigmoid", "Softsign", "Tanh"],
      "activation_alpha": [0.3, 0.1], "activation_beta": [0.4]}, ("B", "lens")),
    ({"hidden_size": 6, "activations": ["Sigmoid", "ScaledTanh", "Elu"], "activation_alpha": [0.9, 0.5],
      "activation_beta": [1.1]}, ("B",)),
]
LIBM = ("ScaledTanh", "Elu", "Softplus")  # onnxruntime computes these with libm's tanh/exp: not bit for bit


def dqlstm_inputs(attributes, optional, w_type, per_channel, steps=6, batch=4, size=5, lens_kind="constant"):
    d = 2 if attributes.get("direction") == "bidirectional" else 1
    hidden = attributes["hidden_size"]
    values = lstm_weights(w_type, d, size, hidden, per_channel)
    feeds = {"x": (RNG.standard_normal((steps, batch, size)) * 1.5).astype(np.float32)}
    if "B" in optional:
        values["B"] = (RNG.standard_normal((d, 8 * hidden)) * 0.5).astype(np.float32)
    if "P" in optional:
        values["P"] = (RNG.standard_normal((d, 3 * hidden)) * 0.5).astype(np.float32)
    for name in ("h0", "c0"):
        if name in optional:
            feeds[name] = RNG.standard_normal((d, batch, hidden)).astype(np.float32)
    if "lens" in optional:
        lens = RNG.integers(0, steps + 1, batch).astype(np.int32)
        lens[0] = steps - 1
        (values if lens_kind == "constant" else feeds)["lens"] = lens
    return values, feeds


@pytest.mark.parametrize(("attributes", "optional"), DQLSTM_CASES)
@pytest.mark.parametrize("w_type", BYTES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm(attributes, optional, w_type, per_channel):
    values, feeds = dqlstm_inputs(attributes, optional, w_type, per_channel)
    libm = set(LIBM) & set(attributes.get("activations", []))
    check(dqlstm_model(values, feeds, attributes), feeds, *((1e-4, 1e-5) if libm else (0, 0)))


@pytest.mark.parametrize("outputs", [("y",), ("", "y_h"), ("", "", "y_c"), ("", "y_h", "y_c"), ("y", "y_h")])
@pytest.mark.parametrize("lens_kind", ["constant", "runtime"])
def test_dynamic_quantize_lstm_outputs_and_lengths(outputs, lens_kind):
    """Rows that end early feed zeros to the state's quantization when Y is an output, their last state when not;
    lengths baked in or given at run time (zero lengths and all rows shorter than X included)."""
    attributes = {"hidden_size": 4, "direction": "bidirectional"}
    values, feeds = dqlstm_inputs(attributes, ("B",), np.int8, False, steps=7, batch=5)
    lens = np.array([5, 2, 5, 1, 3], np.int32)  # the longest is shorter than X: X's range stops there too
    (values if lens_kind == "constant" else feeds)["lens"] = lens
    check(dqlstm_model(values, feeds, attributes, outputs), feeds, rtol=0, atol=0)


def test_dynamic_quantize_lstm_runtime_weights():
    """Weights, scales and zero points given as graph inputs (onnxruntime does not prepack them then)."""
    attributes = {"hidden_size": 3, "direction": "bidirectional"}
    values, feeds = dqlstm_inputs(attributes, ("B",), np.uint8, True)
    for name in ("W", "R", "Ws", "Rz"):
        feeds[name] = values.pop(name)
    check(dqlstm_model(values, feeds, attributes), feeds, rtol=0, atol=0)


@pytest.mark.parametrize(("steps", "batch"), [(1, 1), (9, 1), (3, 7), (12, 2)])
def test_dynamic_quantize_lstm_shapes(steps, batch):
    attributes = {"hidden_size": 8, "direction": "bidirectional"}
    values, feeds = dqlstm_inputs(attributes, ("B",), np.int8, True, steps=steps, batch=batch, size=3)
    check(dqlstm_model(values, feeds, attributes), feeds, rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("w_type", "per_channel"), [(np.int8, False), (np.uint8, True)])
@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_dynamic_quantize_lstm_long_sequences(seed, w_type, per_channel, direction):
    """60 steps with lengths and initial states, hidden sizes off the kernel's 16-unit blocks: a state quantized one
    step away from onnxruntime's would carry to every later step."""
    attributes = {"hidden_size": 20, "direction": direction}
    values, feeds = dqlstm_inputs(attributes, ("B", "lens", "h0", "c0"), w_type, per_channel, steps=60, batch=4,
                                  size=12, lens_kind="runtime")
    check(dqlstm_model(values, feeds, attributes), feeds, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------- pooling and softmax

POOL_CASES = [  # (attributes, x shape)
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, (2, 3, 6, 7)),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (1, 4, 5, 6)),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, (1, 4, 5, 6)),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}, (1, 2, 7, 8)),
    ({"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 2, 7, 8)),
    ({"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}, (1, 2, 5, 5)),
    ({"kernel_shape": [3], "strides": [2], "pads": [1, 0]}, (2, 3, 9)),
    ({"kernel_shape": [2, 2, 2]}, (1, 2, 4, 4, 3)),
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, (1, 3, 20, 38)),
    ({"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 2, 2, 1], "ceil_mode": 1}, (1, 2, 11, 40)),
    ({"kernel_shape": [4], "pads": [2, 1], "count_include_pad": 1}, (2, 3, 45)),
]


@pytest.mark.parametrize(("attributes", "shape"), POOL_CASES)
@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_average_pool(attributes, shape, dtype, channels_last):
    import torch

    from onnx2torch_rnn.modules.nn import AveragePool

    float_shape = torch.Size(shape)
    out = AveragePool(**{k: v for k, v in attributes.items()})(torch.zeros(float_shape)).shape
    if channels_last:
        shape, out = (shape[0], *shape[2:], shape[1]), (out[0], *out[2:], out[1])
    values = {"xs": scalar(RNG.uniform(0.02, 0.1)), "xz": integers(dtype, ()), "ys": scalar(RNG.uniform(0.01, 0.05)),
              "yz": integers(dtype, ())}
    model, feeds = single_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], {"x": integers(dtype, shape)},
                               values, 17, outputs=[("y", tensor_type(dtype), tuple(out))], domain=MS,
                               channels_last=channels_last, **attributes)
    check(model, feeds)


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("shape", "axis", "opset"), [((4, 10), -1, 13), ((2, 3, 7), 1, 13), ((2, 3, 5), 1, 12),
                                                      ((3, 40), 1, 11), ((2, 64, 3), -2, 13), ((4, 3, 2), 0, 13)])
@pytest.mark.parametrize("constant", [True, False])
def test_qlinear_softmax(dtype, shape, axis, opset, constant):
    """The usual output parameters (1/256 with zero point 0 or -128) and others; ``constant``: x_scale an
    initializer (its tables built once), else a graph input."""
    for y_scale, y_zero_point in ((1 / 256, 0 if dtype == np.uint8 else -128), (0.007, 3)):
        values = {"xs": scalar(RNG.uniform(0.02, 0.2)), "xz": integers(dtype, ()), "ys": scalar(y_scale),
                  "yz": scalar(y_zero_point, dtype)}
        node = helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, axis=axis,
                                opset=opset)
        feeds = {"x": integers(dtype, shape)} | ({} if constant else {"xs": values.pop("xs")})
        specs = [(name, value.dtype, value.shape) for name, value in feeds.items()]
        model = make_model([node], specs, [("y", dtype, shape)], values, 17, {MS: 1})
        check(model, feeds)


def test_dynamic_quantize_lstm_keeps_its_int8_weights_only_while_they_are_unchanged():
    """The int8 layout of W and R is kept between calls; changing the buffers (load_state_dict, in place) or moving
    the module changes the result as a fresh conversion would compute it."""
    path = Path(__file__).resolve().parents[1] / "models" / "quantized" / "shipped_like" / "voice_filter_dyn.onnx"
    module = onnx2torch_rnn.convert(path)
    feeds = random_inputs(path, 0, {"batch": 2, "time": 6})
    first = run_torch(module, path, feeds)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    changed = {k: torch.flip(v, [-1]) if k.endswith("_quantized") else v for k, v in state.items()}
    module.load_state_dict(changed)
    fresh = onnx2torch_rnn.convert(path)
    fresh.load_state_dict(changed)
    after = run_torch(module, path, feeds)
    assert not np.array_equal(after[0], first[0])
    for got, want in zip(after, run_torch(fresh, path, feeds), strict=True):
        np.testing.assert_array_equal(got, want)
    module.load_state_dict(state)
    for got, want in zip(run_torch(module, path, feeds), first, strict=True):
        np.testing.assert_array_equal(got, want)


QUANTIZED = Path(__file__).resolve().parents[1] / "models" / "quantized"
TRACED = {  # model -> dims: DynamicQuantizeLSTM alone, with ConvInteger/MatMulInteger, QOperator ops, sequence_lens
    "ts_lstm_op14_dyn_pt_s8": {"batch": 2, "time": 7},
    "ts_crnn_op18_dyn_pt_u8": {"batch": 2, "width": 10},
    "ts_crnn_op18_qop_u8s8": {"batch": 2, "width": 10},
    "ts_tagger_op17_dyn_pc_u8_rr": {"batch": 2, "time": 5},
}


def _traced_case(name: str):
    path = QUANTIZED / f"{name}.onnx"
    module = onnx2torch_rnn.convert(path)
    args = tuple(torch.from_numpy(v) for v in random_inputs(path, 0, TRACED[name]).values())
    with torch.no_grad():
        expected = module(*args)
    return module, args, expected if isinstance(expected, tuple) else (expected,)


def _assert_matches(got, expected) -> None:
    """Integer outputs equal; float outputs to float32 rounding (inductor fuses the float ops around the int8 ones:
    LogSoftmax differs in its last bit, no quantization step moves)."""
    got = got if isinstance(got, tuple) else (got,)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.detach().numpy(), e.numpy(), rtol=1e-6, atol=1e-6, strict=True)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "ts_lstm_op14_dyn_pt_s8" else pytest.mark.slow)
                                  for n in TRACED])
def test_int8_models_export(name):
    """torch.export (non-strict): DynamicQuantizeLSTM is one op (onnx2torch_rnn::dynamic_quantize_lstm), not its
    steps unrolled; the program matches the eager module."""
    module, args, expected = _traced_case(name)
    program = torch.export.export(module, args, strict=False)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert ("onnx2torch_rnn.dynamic_quantize_lstm.default" in targets) == ("_dyn_" in name)
    _assert_matches(program.module()(*args), expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TRACED))
def test_int8_models_compile_fullgraph(name):
    module, args, expected = _traced_case(name)
    compiled = torch.compile(module, fullgraph=True, dynamic=False)
    with torch.no_grad():
        _assert_matches(compiled(*args), expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["small_cnn_qop_u8s8", "small_cnn_qop_s8s8_pc"])
def test_qoperator_cnn_export_matches_onnxruntime(name):
    """torch.export (non-strict) of onnxruntime's QOperator ops (QLinearConcat's copy of an input with the output's
    scale and zero point decided at conversion: no data-dependent branch), bit for bit against onnxruntime."""
    path = QUANTIZED / f"{name}.onnx"
    feeds = random_inputs(path, 0, {})
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    program = torch.export.export(onnx2torch_rnn.convert(path), args, strict=False)
    (want,) = run_onnxruntime(path, feeds)
    np.testing.assert_allclose(program.module()(*args).numpy(), want, rtol=0, atol=0, strict=True)


@pytest.mark.parametrize("op", ["QLinearMatMul", "QGemm"])
@pytest.mark.parametrize(("a_type", "b_type"), [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize(("m", "k", "n"), [(3, 8, 5), (1, 17, 40), (9, 70, 65)])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_product_in_one_native_call(monkeypatch, op, a_type, b_type, m, k, n, per_column):
    """QLinearMatMul and QGemm by constant weights as one call of the native qlinear_matmul (few columns stored by
    column, more as panels), equal to onnxruntime."""
    if not kernel.load("int8"):
        pytest.skip("no native kernel")
    columns = (n,) if per_column else ()
    info = np.iinfo(b_type)
    values = {"as": scalar(RNG.uniform(0.01, 0.05)), "az": integers(a_type, (), -20, 20) if a_type == np.int8 else
              integers(a_type, (), 100, 150), "b": integers(b_type, (k, n)),
              "bs": RNG.uniform(0.002, 0.02, columns).astype(np.float32),
              "bz": np.zeros(columns, b_type) if op == "QGemm" and b_type == np.int8 else
              integers(b_type, columns, info.min // 4, info.max // 4),
              "c": RNG.integers(-3000, 3000, (n,)).astype(np.int32), "ys": scalar(RNG.uniform(0.1, 0.4)),
              "yz": integers(a_type, (), -10, 10) if a_type == np.int8 else integers(a_type, (), 100, 150)}
    names = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"] if op == "QLinearMatMul" else \
        ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"]
    model, feeds = single_node(op, names, {"a": integers(a_type, (m, k))}, {name: values[name] for name in names[1:]},
                               17 if op == "QGemm" else 10, outputs=[("y", tensor_type(a_type), (m, n))],
                               domain=MS if op == "QGemm" else "")
    spy = OpSpy()
    monkeypatch.setattr(quantized, "_NATIVE", spy)
    check(model, feeds, rtol=0, atol=0)
    assert "qlinear_matmul" in spy.called


@pytest.mark.parametrize(("dtype", "parameters"), QLINEAR_ADD_SENSITIVE[::2])
@pytest.mark.parametrize(("position", "bias_shape"), [(0, (6,)), (3, (6,)), (0, (1,)), (3, ())])
def test_qlinear_matmul_then_constant_add_in_one_native_call(monkeypatch, dtype, parameters, position, bias_shape):
    """QLinearMatMul -> QLinearAdd of a constant (passes/qlinear.py: one QLinearMatMulAdd module, one call of the
    native qlinear_matmul_add), the constant either operand, with add parameters where the order of float32 steps
    decides: both roundings equal onnxruntime's two ops."""
    if not kernel.load("int8"):
        pytest.skip("no native kernel")
    info = np.iinfo(dtype)
    product_scale = np.float32(parameters[0] if position == 0 else parameters[2])
    values = {"as": scalar(0.03), "az": integers(dtype, (), info.min // 4, info.max // 4),
              "b": integers(np.int8, (9, 6)), "bs": RNG.uniform(0.002, 0.02, (6,)).astype(np.float32),
              "bz": np.zeros((6,), np.int8), "ys": scalar(product_scale), "yz": np.asarray(
                  parameters[1] if position == 0 else parameters[3], dtype), "c": integers(dtype, bias_shape),
              **{f"p{i}": np.asarray(v, np.float32 if i % 2 == 0 else dtype) for i, v in enumerate(parameters)}}
    add = ["y", "p0", "p1", "c", "p2", "p3", "p4", "p5"] if position == 0 else ["c", "p0", "p1", "y", "p2", "p3", "p4",
                                                                                  "p5"]
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"]),
             helper.make_node("QLinearAdd", add, ["z"], domain=MS)]
    model = make_model(nodes, [("a", dtype, (2, 4, 9))], [("z", tensor_type(dtype), (2, 4, 6))], values, 17,
                       {"com.microsoft": 1})
    spy = OpSpy()
    monkeypatch.setattr(quantized, "_NATIVE", spy)
    for _ in range(3):
        module = check(model, {"a": integers(dtype, (2, 4, 9))}, rtol=0, atol=0)
    assert [type(m) for m in module.children()] == [quantized.QLinearMatMulAdd]
    assert "qlinear_matmul_add" in spy.called


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_quantized_inputs_concatenated_and_dequantized_in_one_native_call(monkeypatch, dtype, shared, transposed):
    """QuantizeLinear of each float input -> QLinearConcat -> (Transpose ->) DequantizeLinear (passes/qlinear.py: one
    QuantizeConcatDequantize module, one call of the native quantize_concat_dequantize), inputs on rounding ties:
    onnxruntime's four or five ops bit for bit. ``shared``: the first input has the output's scale and zero point."""
    if not kernel.load("int8"):
        pytest.skip("no native kernel")
    values = {"ys": scalar(0.05), "yz": integers(dtype, ())}
    nodes, names, feeds = [], ["ys", "yz"], {}
    for index, shape in enumerate([(4, 2, 3), (4, 2, 5)]):
        same = shared and index == 0
        values[f"s{index}"] = values["ys"] if same else scalar(RNG.uniform(0.01, 0.2))
        values[f"z{index}"] = values["yz"] if same else integers(dtype, ())
        feeds[f"x{index}"] = (RNG.integers(-400, 400, shape) * values[f"s{index}"] / 2).astype(np.float32)
        nodes.append(helper.make_node("QuantizeLinear", [f"x{index}", f"s{index}", f"z{index}"], [f"q{index}"]))
        names += [f"q{index}", f"s{index}", f"z{index}"]
    nodes.append(helper.make_node("QLinearConcat", names, ["c"], domain=MS, axis=-1))
    if transposed:
        nodes.append(helper.make_node("Transpose", ["c"], ["t"], perm=[1, 0, 2]))
    nodes.append(helper.make_node("DequantizeLinear", ["t" if transposed else "c", "ys", "yz"], ["y"]))
    model = make_model(nodes, [(name, np.float32, x.shape) for name, x in feeds.items()],
                       [("y", np.float32, (2, 4, 8) if transposed else (4, 2, 8))], values, 17, {MS: 1})
    spy = OpSpy()
    monkeypatch.setattr(quantized, "_NATIVE", spy)
    module = check(model, feeds, rtol=0, atol=0)
    assert [type(m) for m in module.children()] == [quantized.QuantizeConcatDequantize]
    assert "quantize_concat_dequantize" in spy.called
