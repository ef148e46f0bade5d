"""convert(model, dequantize=True): each rewrite rule turns a quantized pattern into the float graph it approximates.

Each test builds the pattern as the quantization tool writes it (float input, quantized op, float output), converts
it with dequantize=True and compares with onnxruntime running the float graph written by hand: the float op on
weights dequantized in numpy, activations not quantized. Then the converted module must be float through and
through: no quantized module left, gradients reaching every weight."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime, run_torch
from onnx2torch_rnn.dequantize import dequantize_model
from tests.helpers import assert_float_only, helper, make_model

RNG = np.random.default_rng(0)
MS = "com.microsoft"


def quantized_weight(dtype, shape, axis: int | None = None):
    """(q, scale, zero point, float value) of a weight, per tensor or along ``axis``."""
    info = np.iinfo(dtype)
    channels = () if axis is None else (shape[axis],)
    scale = RNG.uniform(0.01, 0.05, channels).astype(np.float32)
    zero_point = np.zeros(channels, dtype) if dtype == np.int8 else RNG.integers(100, 150, channels).astype(dtype)
    values = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    view = [1] * len(shape)
    if axis is not None:
        view[axis] = -1
    dequantized = (values.astype(np.float32) - zero_point.reshape(view)) * scale.reshape(view)
    return values, scale, zero_point, dequantized.astype(np.float32)


def activation(dtype=np.uint8):
    """(scale, zero point) of an activation."""
    zero_point = np.array(0 if dtype == np.int8 else 128, dtype)
    return np.array(RNG.uniform(0.02, 0.05), np.float32), zero_point


def check_dequantized(model: onnx.ModelProto, reference: onnx.ModelProto, feeds: dict, rtol=1e-5, atol=1e-6):
    """The dequantized conversion of ``model`` equals onnxruntime running the float ``reference``; it holds floats
    only, and backward reaches every weight. Returns the module."""
    module = onnx2torch_rnn.convert(model, dequantize=True)
    expected = run_onnxruntime(reference, feeds)
    actual = run_torch(module, model, feeds)
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, strict=True)
    assert_float_only(module)
    inputs = [torch.from_numpy(feeds[i.name]) for i in model.graph.input if i.name in feeds]
    outputs = module(*inputs)
    sum((o * torch.randn(o.shape)).sum() for o in (outputs if isinstance(outputs, tuple) else [outputs])).backward()
    weights = [(n, p) for n, p in module.named_parameters() if p.dim() >= 1 and p.numel() > 1]
    assert weights, "no weights"
    for name, parameter in weights:
        assert parameter.grad is not None and bool(parameter.grad.abs().sum() > 0), f"no gradient reaches {name}"
    return module


def wrap(nodes, x_shape, initializers, y_shape=None, opset=17):
    """float x -> QuantizeLinear(xs, xz) -> nodes (reading "xq") -> DequantizeLinear(ys, yz) of "yq" -> float y
    (``y_shape`` where shape inference cannot tell it: after com.microsoft ops)."""
    head = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])]
    tail = [helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    output = "y" if y_shape is None else ("y", np.float32, y_shape)
    return make_model(head + list(nodes) + tail, [("x", np.float32, x_shape)], [output], initializers, opset,
                      {MS: 1})


def reference(nodes, x_shape, initializers, opset=17, output="y"):
    return make_model(list(nodes), [("x", np.float32, x_shape)], [output], initializers, opset)


# ----------------------------------------------------------------------------------------------- QOperator ops

@pytest.mark.parametrize("w_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_qlinear_conv(w_type, per_channel, bias):
    w, ws, wz, wf = quantized_weight(w_type, (4, 3, 3, 3), 0 if per_channel else None)
    (xs, xz), (ys, yz) = activation(), activation()
    inputs = ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    values = {"xs": xs, "xz": xz, "w": w, "ws": ws, "wz": wz, "ys": ys, "yz": yz}
    floats = {"w": wf}
    if bias:
        values["B"] = RNG.integers(-500, 500, 4).astype(np.int32)
        floats["B"] = (values["B"] * (xs * ws)).astype(np.float32)
        inputs.append("B")
    attributes = {"pads": [1, 1, 1, 1], "strides": [2, 1]}
    model = wrap([helper.make_node("QLinearConv", inputs, ["yq"], **attributes)], (2, 3, 7, 6), values)
    ref = reference([helper.make_node("Conv", ["x", "w"] + (["B"] if bias else []), ["y"], **attributes)],
                    (2, 3, 7, 6), floats)
    module = check_dequantized(model, ref, {"x": RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)})
    assert any(isinstance(m, torch.nn.Conv2d) for m in module.modules())  # a real nn.Conv2d: fast, trainable


@pytest.mark.parametrize("w_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_matmul(w_type, per_channel):
    w, ws, wz, wf = quantized_weight(w_type, (6, 5), 1 if per_channel else None)
    (xs, xz), (ys, yz) = activation(), activation()
    model = wrap([helper.make_node("QLinearMatMul", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"])],
                 (3, 6), {"xs": xs, "xz": xz, "w": w, "ws": ws, "wz": wz, "ys": ys, "yz": yz})
    ref = reference([helper.make_node("MatMul", ["x", "w"], ["y"])], (3, 6), {"w": wf})
    check_dequantized(model, ref, {"x": RNG.standard_normal((3, 6)).astype(np.float32)})


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("output", ["quantized", "float"])
def test_qgemm(trans_b, output):
    w, ws, wz, wf = quantized_weight(np.int8, (5, 6) if trans_b else (6, 5), 0 if trans_b else 1)
    (xs, xz), (ys, yz) = activation(), activation()
    c = RNG.integers(-500, 500, 5).astype(np.int32)
    values = {"xs": xs, "xz": xz, "w": w, "ws": ws, "wz": wz, "c": c, "ys": ys, "yz": yz}
    attributes = {"alpha": 0.5, "transB": trans_b}
    inputs = ["xq", "xs", "xz", "w", "ws", "wz", "c"] + (["ys", "yz"] if output == "quantized" else [])
    node = helper.make_node("QGemm", inputs, ["yq" if output == "quantized" else "y"], domain=MS, **attributes)
    if output == "quantized":
        model = wrap([node], (3, 6), values, (3, 5))
    else:
        quantize = helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])
        model = make_model([quantize, node], [("x", np.float32, (3, 6))], [("y", np.float32, (3, 5))],
                           {k: v for k, v in values.items() if k in inputs}, 17, {MS: 1})
    ref = reference([helper.make_node("Gemm", ["x", "w", "c"], ["y"], **attributes)], (3, 6),
                    {"w": wf, "c": (c * xs * ws).astype(np.float32)})
    check_dequantized(model, ref, {"x": RNG.standard_normal((3, 6)).astype(np.float32)})


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(op):
    """A quantized input and a quantized constant: the constant is dequantized."""
    b, bs, bz, bf = quantized_weight(np.uint8, (4, 5))
    (xs, xz), (ys, yz) = activation(), activation()
    node = helper.make_node(op, ["xq", "xs", "xz", "b", "bs", "bz", "ys", "yz"], ["yq"], domain=MS)
    model = wrap([node], (2, 4, 5), {"xs": xs, "xz": xz, "b": b, "bs": bs, "bz": bz, "ys": ys, "yz": yz}, (2, 4, 5))
    ref = reference([helper.make_node(op.removeprefix("QLinear"), ["x", "b"], ["y"])], (2, 4, 5), {"b": bf})
    check_dequantized(model, ref, {"x": RNG.standard_normal((2, 4, 5)).astype(np.float32)})


@pytest.mark.parametrize(("op", "float_op", "attributes"), [
    ("QLinearSigmoid", "Sigmoid", {}), ("QLinearLeakyRelu", "LeakyRelu", {"alpha": 0.2}),
    ("QLinearLeakyRelu", "LeakyRelu", {}), ("QLinearGlobalAveragePool", "GlobalAveragePool", {}),
    ("QLinearAveragePool", "AveragePool", {"kernel_shape": [1], "pads": [0, 0]}),
    ("QLinearSoftmax", "Softmax", {"axis": -1}),
])
def test_qlinear_unary(op, float_op, attributes):
    """Between two QLinearMatMul (weights to train), so that only the op in the middle is new."""
    w1, w1s, w1z, w1f = quantized_weight(np.int8, (4, 4, 6))
    pool = op == "QLinearGlobalAveragePool"  # [4, 5, 6] -> [4, 5, 1]
    w2, w2s, w2z, w2f = quantized_weight(np.int8, (4, 1 if pool else 6, 3))
    (xs, xz), (hs, hz), (gs, gz), (ys, yz) = (activation() for _ in range(4))
    nodes = [helper.make_node("QLinearMatMul", ["xq", "xs", "xz", "w1", "w1s", "w1z", "hs", "hz"], ["hq"]),
             helper.make_node(op, ["hq", "hs", "hz", "gs", "gz"], ["gq"], domain=MS,
                              **attributes, **({"opset": 13} if op == "QLinearSoftmax" else {})),
             helper.make_node("QLinearMatMul", ["gq", "gs", "gz", "w2", "w2s", "w2z", "ys", "yz"], ["yq"])]
    values = {"xs": xs, "xz": xz, "w1": w1, "w1s": w1s, "w1z": w1z, "hs": hs, "hz": hz, "gs": gs, "gz": gz,
              "w2": w2, "w2s": w2s, "w2z": w2z, "ys": ys, "yz": yz}
    model = wrap(nodes, (4, 5, 4), values, (4, 5, 3))
    ref = reference([helper.make_node("MatMul", ["x", "w1"], ["h"]),
                     helper.make_node(float_op, ["h"], ["g"], **attributes),
                     helper.make_node("MatMul", ["g", "w2"], ["y"])], (4, 5, 4), {"w1": w1f, "w2": w2f})
    check_dequantized(model, ref, {"x": RNG.standard_normal((4, 5, 4)).astype(np.float32)})


def test_qlinear_concat_with_movement_ops():
    """QLinearConcat of a quantized input moved by Transpose and MaxPool (on uint8) and a quantized constant."""
    c, cs, cz, cf = quantized_weight(np.uint8, (1, 2, 3, 3))
    (xs, xz), (ys, yz) = activation(), activation()
    nodes = [helper.make_node("Transpose", ["xq"], ["tq"], perm=[0, 1, 3, 2]),
             helper.make_node("MaxPool", ["tq"], ["pq"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("QLinearConcat", ["ys", "yz", "pq", "xs", "xz", "c", "cs", "cz"], ["yq"], domain=MS,
                              axis=1)]
    model = wrap(nodes, (1, 3, 6, 6), {"xs": xs, "xz": xz, "c": c, "cs": cs, "cz": cz, "ys": ys, "yz": yz},
                 (1, 5, 3, 3))
    ref = reference([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),
                     helper.make_node("MaxPool", ["t"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                     helper.make_node("Concat", ["p", "c"], ["y"], axis=1)], (1, 3, 6, 6), {"c": cf})
    check_dequantized(model, ref, {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)})


# ----------------------------------------------------------------------------------------------- dynamic quantization

def dynamic_pattern(integer_node: onnx.NodeProto, scale_name: str) -> list[onnx.NodeProto]:
    """quantize_dynamic's spelling: DynamicQuantizeLinear -> integer op -> Cast -> Mul by x_scale * w_scale."""
    return [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero_point"]),
            helper.make_node("Mul", ["x_scale", scale_name], ["scales"]),
            integer_node,
            helper.make_node("Cast", ["acc"], ["acc_float"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", ["acc_float", "scales"], ["y"])]


@pytest.mark.parametrize("w_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_matmul_pattern(w_type, per_channel):
    w, ws, wz, wf = quantized_weight(w_type, (6, 5), 1 if per_channel else None)
    nodes = dynamic_pattern(helper.make_node("MatMulInteger", ["xq", "w", "x_zero_point", "wz"], ["acc"]), "ws")
    model = make_model(nodes, [("x", np.float32, (2, 3, 6))], ["y"], {"w": w, "ws": ws, "wz": wz}, 17)
    ref = reference([helper.make_node("MatMul", ["x", "w"], ["y"])], (2, 3, 6), {"w": wf})
    module = check_dequantized(model, ref, {"x": RNG.standard_normal((2, 3, 6)).astype(np.float32)})
    assert any(isinstance(m, torch.nn.Linear) for m in module.modules())


def test_dynamic_conv_pattern():
    w, ws, wz, wf = quantized_weight(np.uint8, (4, 2, 3, 3))
    conv = helper.make_node("ConvInteger", ["xq", "w", "x_zero_point", "wz"], ["acc"], pads=[1, 1, 1, 1])
    model = make_model(dynamic_pattern(conv, "ws"), [("x", np.float32, (1, 2, 5, 5))], ["y"],
                       {"w": w, "ws": ws, "wz": wz}, 17)
    ref = reference([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], (1, 2, 5, 5), {"w": wf})
    check_dequantized(model, ref, {"x": RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)})


@pytest.mark.parametrize("bias", [False, True])
def test_dynamic_quantize_matmul(bias):
    w, ws, wz, wf = quantized_weight(np.int8, (6, 5))
    values, floats = {"w": w, "ws": ws, "wz": wz}, {"w": wf}
    inputs = ["x", "w", "ws", "wz"]
    if bias:
        values["b"] = floats["b"] = RNG.standard_normal(5).astype(np.float32)
        inputs.append("b")
    node = helper.make_node("DynamicQuantizeMatMul", inputs, ["y"], domain=MS)
    model = make_model([node], [("x", np.float32, (3, 6))], [("y", np.float32, (3, 5))], values, 17, {MS: 1})
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p" if bias else "y"])]
    nodes += [helper.make_node("Add", ["p", "b"], ["y"])] if bias else []
    check_dequantized(model, reference(nodes, (3, 6), floats), {"x": RNG.standard_normal((3, 6)).astype(np.float32)})


def test_matmul_integer_to_float():
    """onnxruntime's optimizer writes MatMulIntegerToFloat after a DynamicQuantizeLinear."""
    w, ws, wz, wf = quantized_weight(np.uint8, (6, 5))
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero_point"]),
             helper.make_node("MatMulIntegerToFloat", ["xq", "w", "x_scale", "ws", "x_zero_point", "wz"], ["y"],
                              domain=MS)]
    model = make_model(nodes, [("x", np.float32, (3, 6))], [("y", np.float32, (3, 5))],
                       {"w": w, "ws": ws, "wz": wz}, 17, {MS: 1})
    ref = reference([helper.make_node("MatMul", ["x", "w"], ["y"])], (3, 6), {"w": wf})
    check_dequantized(model, ref, {"x": RNG.standard_normal((3, 6)).astype(np.float32)})


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm_becomes_lstm(direction, per_channel):
    """W [D, I, 4H] / R [D, H, 4H] with per-direction (or per-column) parameters back to ONNX layout; the LSTM
    takes the fast path (a real nn.LSTM)."""
    d, hidden, size = (2 if direction == "bidirectional" else 1), 3, 4
    values, floats = {}, {}
    for name, rows in (("W", size), ("R", hidden)):
        q_values = RNG.integers(-128, 128, (d, rows, 4 * hidden)).astype(np.int8)
        scale = RNG.uniform(0.01, 0.05, (d, 4 * hidden) if per_channel else (d,)).astype(np.float32)
        view = scale.reshape(d, 1, -1)
        values.update({name: q_values, f"{name}s": scale, f"{name}z": np.zeros(scale.shape, np.int8)})
        floats[name] = (q_values.astype(np.float32) * view).transpose(0, 2, 1).copy()
    values["B"] = floats["B"] = RNG.standard_normal((d, 8 * hidden)).astype(np.float32)
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "W", "R", "B", "", "", "", "", "Ws", "Wz", "Rs", "Rz"],
                            ["y", "y_h"], domain=MS, hidden_size=hidden, direction=direction)
    model = make_model([node], [("x", np.float32, (5, 2, size))],
                       [("y", np.float32, (5, d, 2, hidden)), ("y_h", np.float32, (d, 2, hidden))], values, 17,
                       {MS: 1})
    ref = make_model([helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden,
                                       direction=direction)], [("x", np.float32, (5, 2, size))], ["y", "y_h"],
                     floats, 17)
    module = check_dequantized(model, ref, {"x": RNG.standard_normal((5, 2, size)).astype(np.float32)})
    assert any(isinstance(m, torch.nn.LSTM) for m in module.modules())


# ----------------------------------------------------------------------------------------------- QDQ graphs

def test_qdq_pairs_disappear_and_weights_dequantize_per_axis():
    """quantize_static's QDQ format: weights DQ(constant, per channel), activations Q -> DQ pairs, a bias DQ."""
    w, ws, wz, wf = quantized_weight(np.int8, (4, 3, 3, 3), 0)
    (xs, xz), (ys, yz) = activation(), activation()
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "ys", "yz"], ["y"])]
    values = {"xs": xs, "xz": xz, "w": w, "ws": ws, "wz": wz, "b": bias, "bs": (xs * ws).astype(np.float32),
              "ys": ys, "yz": yz}
    model = make_model(nodes, [("x", np.float32, (1, 3, 5, 5))], ["y"], values, 17)
    ref = reference([helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                    (1, 3, 5, 5), {"w": wf, "b": (bias * xs * ws).astype(np.float32)})
    check_dequantized(model, ref, {"x": RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)})


def test_quantized_embedding_gather():
    """quantize_dynamic's embedding: Gather of an int8 table, a Transpose on int8, then DequantizeLinear."""
    table, ts, tz, tf = quantized_weight(np.uint8, (10, 4))
    nodes = [helper.make_node("Gather", ["table", "ids"], ["gq"]),
             helper.make_node("Transpose", ["gq"], ["tq"], perm=[1, 0, 2]),
             helper.make_node("DequantizeLinear", ["tq", "ts", "tz"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["y"])]
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    model = make_model(nodes, [("ids", np.int64, (2, 5))], ["y"], {"table": table, "ts": ts, "tz": tz, "w": w}, 17)
    ref = make_model([helper.make_node("Gather", ["table", "ids"], ["g"]),
                      helper.make_node("Transpose", ["g"], ["t"], perm=[1, 0, 2]),
                      helper.make_node("MatMul", ["t", "w"], ["y"])], [("ids", np.int64, (2, 5))], ["y"],
                     {"table": tf, "w": w}, 17)
    check_dequantized(model, ref, {"ids": RNG.integers(0, 10, (2, 5))})


def test_split_on_quantized_values():
    xs, xz = activation()
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("Split", ["xq", "sizes"], ["aq", "bq"], axis=1),
             helper.make_node("DequantizeLinear", ["aq", "xs", "xz"], ["a"]),
             helper.make_node("DequantizeLinear", ["bq", "xs", "xz"], ["b"]),
             helper.make_node("MatMul", ["a", "w"], ["p"]),
             helper.make_node("Add", ["p", "b"], ["y"])]
    w = RNG.standard_normal((3, 3)).astype(np.float32)
    sizes = np.array([3, 3], np.int64)
    model = make_model(nodes, [("x", np.float32, (4, 6))], ["y"], {"xs": xs, "xz": xz, "sizes": sizes, "w": w}, 17)
    ref = reference([helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
                     helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
                    (4, 6), {"sizes": sizes, "w": w})
    check_dequantized(model, ref, {"x": RNG.standard_normal((4, 6)).astype(np.float32)})


def test_a_quantized_graph_output_stays_quantized():
    """What the graph returns keeps its type: the QuantizeLinear in front of a quantized output stays (exact)."""
    w, ws, wz, wf = quantized_weight(np.int8, (6, 5))
    (xs, xz), (ys, yz) = activation(), activation()
    node = helper.make_node("QLinearMatMul", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"])
    quantize = helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])
    model = make_model([quantize, node], [("x", np.float32, (3, 6))], ["yq"],
                       {"xs": xs, "xz": xz, "w": w, "ws": ws, "wz": wz, "ys": ys, "yz": yz}, 17)
    ref = reference([helper.make_node("MatMul", ["x", "w"], ["m"]),
                     helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["yq"])], (3, 6),
                    {"w": wf, "ys": ys, "yz": yz}, output="yq")
    feeds = {"x": RNG.standard_normal((3, 6)).astype(np.float32)}
    module = onnx2torch_rnn.convert(model, dequantize=True)
    np.testing.assert_array_equal(run_torch(module, model, feeds)[0], run_onnxruntime(ref, feeds)[0], strict=True)
    assert [type(m).__name__ for m in module.children()].count("QuantizeLinear") == 1


def test_blocked_dequantization_stays_exact():
    """A blocked DequantizeLinear of run-time values is not rewritten (it converts exactly)."""
    nodes = [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"], axis=1, block_size=2)]
    values = {"s": RNG.uniform(0.01, 0.1, (3, 2)).astype(np.float32), "z": np.zeros((3, 2), np.uint8)}
    model = make_model(nodes, [("xq", np.uint8, (3, 4))], ["y"], values, 21)
    assert [n.op_type for n in dequantize_model(model).graph.node] == ["DequantizeLinear"]
    feeds = {"xq": RNG.integers(0, 256, (3, 4)).astype(np.uint8)}
    np.testing.assert_array_equal(run_torch(onnx2torch_rnn.convert(model, dequantize=True), model, feeds)[0],
                                  run_onnxruntime(model, feeds)[0], strict=True)


def test_the_model_given_is_not_changed():
    w, ws, wz, _ = quantized_weight(np.int8, (6, 5))
    nodes = dynamic_pattern(helper.make_node("MatMulInteger", ["xq", "w", "x_zero_point", "wz"], ["acc"]), "ws")
    model = make_model(nodes, [("x", np.float32, (2, 6))], ["y"], {"w": w, "ws": ws, "wz": wz}, 17)
    before = model.SerializeToString()
    onnx2torch_rnn.convert(model, dequantize=True)
    assert model.SerializeToString() == before


def test_a_body_reading_a_dequantized_value():
    """A Loop/If body reads an outer value by name: a value the rewrite replaced keeps its name for it."""
    w, ws, wz, wf = quantized_weight(np.int8, (6, 6))
    out = helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, None)
    then_branch = helper.make_graph([helper.make_node("MatMul", ["x", "wd"], ["o"])], "then", [], [out])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "else", [], [out])
    nodes = [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    model = make_model(nodes, [("x", np.float32, (2, 6)), ("c", np.bool_, ())], [("y", np.float32, (2, 6))],
                       {"w": w, "ws": ws, "wz": wz}, 17)
    module = onnx2torch_rnn.convert(model, dequantize=True)
    assert_float_only(module)
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    for condition in (True, False):
        got = module(torch.from_numpy(x), torch.tensor(condition)).detach().numpy()
        np.testing.assert_allclose(got, x @ wf if condition else x, rtol=1e-5, atol=1e-6, strict=True)


@pytest.mark.parametrize("constant", ["zero point", "absent"])
def test_pad_and_resize_on_quantized_values(constant):
    """QOperator graphs pad and resize uint8 values: the pad constant becomes the float value it stands for (the
    zero point: 0.0; absent: 0, i.e. -zero_point * scale); nearest resizing selects values."""
    xs, xz = activation()
    pad_inputs = ["xq", "pads"] + (["xz"] if constant == "zero point" else [])
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("Pad", pad_inputs, ["pq"], mode="constant"),
             helper.make_node("Resize", ["pq", "", "scales"], ["rq"], mode="nearest"),
             helper.make_node("DequantizeLinear", ["rq", "xs", "xz"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    pads, scales = np.array([0, 1, 1, 0], np.int64), np.array([1.0, 2.0], np.float32)
    w = RNG.standard_normal((8, 3)).astype(np.float32)
    model = make_model(nodes, [("x", np.float32, (2, 3))], ["y"],
                       {"xs": xs, "xz": xz, "pads": pads, "scales": scales, "w": w}, 17)
    pad_value = np.float32(0.0) if constant == "zero point" else np.float32(-float(xz) * xs)
    ref = reference([helper.make_node("Pad", ["x", "pads", "cv"], ["p"], mode="constant"),
                     helper.make_node("Resize", ["p", "", "scales"], ["r"], mode="nearest"),
                     helper.make_node("MatMul", ["r", "w"], ["y"])], (2, 3),
                    {"pads": pads, "scales": scales, "w": w, "cv": np.array(pad_value, np.float32)})
    check_dequantized(model, ref, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
