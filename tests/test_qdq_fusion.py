"""passes/qdq.py: DequantizeLinear -> float op -> QuantizeLinear groups become the QLinear ops that onnxruntime's
optimizer makes of them, under its conditions: the outputs equal its default session's bit for bit (rtol=0, atol=0),
the QLinear modules built are the QLinear ops in its optimised graph (the same kinds, as many), and with fuse=False
the graph as written equals onnxruntime without graph optimisations. Small generated graphs over uint8/int8
activations, per-tensor/per-channel weights and the op kinds; the committed QDQ models."""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from onnx2torch_rnn.modules import quantized as q
from onnx2torch_rnn.recurrent import kernel
from tests.exporters.common import MODELS, manifest_input_sets, read_manifest
from tests.helpers import make_model

# our module -> the op onnxruntime writes
_OPS = {q.QLinearConv: "QLinearConv", q.QLinearMatMul: "QLinearMatMul", q.QGemm: "QGemm", q.QLinearAdd: "QLinearAdd",
        q.QLinearMul: "QLinearMul", q.QLinearAveragePool: "QLinearAveragePool",
        q.QLinearGlobalAveragePool: "QLinearGlobalAveragePool", q.QLinearSoftmax: "QLinearSoftmax",
        q.QLinearConcat: "QLinearConcat", q.MatMulIntegerToFloat: "MatMulIntegerToFloat"}
_ORT_OPS = set(_OPS.values()) | {"QLinearSigmoid", "QLinearLeakyRelu"}


def fused_ops(module: torch.nn.Module) -> collections.Counter:
    found = collections.Counter()
    for child in module.modules():
        if isinstance(child, q.QLinearLookup):
            found[f"QLinear{child.function}"] += 1
        elif type(child) in _OPS:
            found[_OPS[type(child)]] += 1
    return found


def onnxruntime_ops(model: onnx.ModelProto) -> collections.Counter:
    """The QLinear ops of onnxruntime's optimised graph (its QDQ fusions run at the extended level)."""
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    return collections.Counter(n.op_type for n in optimized.graph.node if n.op_type in _ORT_OPS)


def session(model: onnx.ModelProto, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def assert_exact(model: onnx.ModelProto, feeds_list: list[dict], fuse: bool = True) -> torch.nn.Module:
    """Every output equal to onnxruntime's (default options when fused, no graph optimisation as written)."""
    module = onnx2torch_rnn.convert(model, fuse=fuse)
    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if fuse else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = session(model, level)
    for feeds in feeds_list:
        with torch.inference_mode():
            got = module(*[torch.from_numpy(feeds[i.name]) for i in reference.get_inputs()])
        got = got if isinstance(got, tuple | list) else [got]
        for g, want in zip(got, reference.run(None, feeds), strict=True):
            np.testing.assert_allclose(g.numpy(), want, rtol=0, atol=0, strict=True)
    return module


# ----------------------------------------------------------------------------------------------- generated groups

class Builder:
    """A QDQ graph as quantize_static writes it: float inputs quantized and dequantized, constant weights
    dequantized, each op's output quantized then dequantized."""

    def __init__(self, activation, rng: np.random.Generator):
        self.activation, self.rng = activation, rng
        self.nodes, self.values, self.inputs, self.count = [], {}, [], 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def parameters(self, scale: float, dtype=None) -> tuple[str, str]:
        dtype = dtype or self.activation
        s, z = self.name("scale"), self.name("zero")
        middle = 128 if dtype == np.uint8 else 0
        self.values[s] = np.float32(scale * self.rng.uniform(0.8, 1.25))
        self.values[z] = np.asarray(middle + self.rng.integers(-20, 21), dtype=dtype)
        return s, z

    def qdq(self, x: str, scale: float, parameters=None) -> str:
        s, z = parameters or self.parameters(scale)
        xq, xd = self.name("q"), self.name("dq")
        self.nodes += [helper.make_node("QuantizeLinear", [x, s, z], [xq]),
                       helper.make_node("DequantizeLinear", [xq, s, z], [xd])]
        return xd

    def input(self, shape) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append((name, np.float32, shape))
        return self.qdq(name, 0.05)

    def weight(self, shape, axis: int | None, dtype=np.int8) -> tuple[str, np.ndarray]:
        """A constant int8/uint8 weight dequantized per tensor (axis None) or per channel along ``axis``."""
        w, s, z, out = self.name("w"), self.name("ws"), self.name("wz"), self.name("wd")
        channels = () if axis is None else (shape[axis],)
        self.values[w] = self.rng.integers(-127 if dtype == np.int8 else 0, 128 if dtype == np.int8 else 256,
                                           shape).astype(dtype)
        scale = self.rng.uniform(0.005, 0.02, channels).astype(np.float32)
        self.values[s] = scale
        self.values[z] = np.full(channels, 0 if dtype == np.int8 else 128, dtype=dtype)
        attributes = {} if axis is None else {"axis": axis}
        self.nodes.append(helper.make_node("DequantizeLinear", [w, s, z], [out], **attributes))
        return out, scale

    def bias(self, count: int, scale, x: str, factor: float = 1.0) -> str:
        """An int32 bias dequantized with x's scale times the weight's (times ``factor``), as quantize_static."""
        b, s, z, out = self.name("b"), self.name("bs"), self.name("bz"), self.name("bd")
        self.values[b] = self.rng.integers(-3000, 3000, count).astype(np.int32)
        x_scale = self.values[next(n for n in self.nodes if n.output[0] == x).input[1]]
        self.values[s] = (x_scale * np.asarray(scale, np.float32) * np.float32(factor)).astype(np.float32)
        self.values[z] = np.zeros(np.shape(scale), np.int32)
        self.nodes.append(helper.make_node("DequantizeLinear", [b, s, z], [out], **(
            {"axis": 0} if np.ndim(scale) else {})))
        return out

    def op(self, op_type: str, inputs: list[str], **attributes) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attributes))
        return out

    def model(self, y: str, opset: int = 17) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [y], ["y"]))
        return make_model(self.nodes, self.inputs, ["y"], self.values, opset=opset)

    def feeds(self, seed: int) -> dict:
        rng = np.random.default_rng(seed)
        return {name: (rng.standard_normal(shape) * 2).astype(np.float32) for name, _, shape in self.inputs}


def _group(b: Builder, kind: str, per_channel: bool) -> str:
    """One group of ``kind`` on fresh inputs; its output quantized and dequantized."""
    if kind == "Conv":
        w, scale = b.weight((4, 3, 3, 3), 0 if per_channel else None)
        x = b.input((2, 3, 6, 7))
        return b.qdq(b.op("Conv", [x, w, b.bias(4, scale, x)], pads=[1, 1, 1, 1]), 0.5)
    if kind == "MatMul":
        w, _ = b.weight((6, 7), 1 if per_channel else None)
        return b.qdq(b.op("MatMul", [b.input((2, 5, 6)), w]), 0.2)
    if kind in ("Gemm", "GemmFloat"):
        w, scale = b.weight((7, 6), 0 if per_channel else None)
        x = b.input((5, 6))
        y = b.op("Gemm", [x, w, b.bias(7, scale, x)], transB=1)
        return y if kind == "GemmFloat" else b.qdq(y, 0.2)
    if kind in ("Add", "Mul"):
        return b.qdq(b.op(kind, [b.input((2, 3, 4)), b.input((3, 4))]), 0.2 if kind == "Add" else 0.5)
    if kind == "Concat":
        return b.qdq(b.op("Concat", [b.input((2, 3, 4)), b.input((2, 2, 4))], axis=1), 0.06)
    if kind == "ConvRelu":  # Relu before a Q with the lowest zero point: left out, as onnxruntime's ReluQuantFusion
        w, scale = b.weight((4, 3, 3, 3), None)
        x = b.input((1, 3, 5, 5))
        y = b.op("Relu", [b.op("Conv", [x, w, b.bias(4, scale, x)])])
        s, _ = b.parameters(0.3)
        z = b.name("zero")
        b.values[z] = np.asarray(np.iinfo(b.activation).min, dtype=b.activation)
        return b.qdq(y, 0.3, (s, z))
    x = b.input((2, 3, 6, 6))
    attributes = {"AveragePool": {"kernel_shape": [2, 2], "strides": [2, 2]}, "LeakyRelu": {"alpha": 0.2},
                  "Softmax": {"axis": -1}, "MaxPool": {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}}
    if kind in ("MaxPool", "Transpose", "Flatten"):  # dropped: the same scale and zero point
        s, z = b.nodes[-1].input[1:3]
        return b.qdq(b.op(kind, [x], **attributes.get(kind, {})), 0.05, (s, z))
    scales = {"Softmax": 1 / 256, "Sigmoid": 1 / 256}
    return b.qdq(b.op(kind, [x], **attributes.get(kind, {})), scales.get(kind, 0.05))


KINDS = ["Conv", "MatMul", "Gemm", "GemmFloat", "Add", "Mul", "Concat", "ConvRelu", "AveragePool",
         "GlobalAveragePool", "LeakyRelu", "Sigmoid", "Softmax", "MaxPool", "Transpose", "Flatten"]


CASES = [pytest.param(kind, activation, per_channel, id=f"{kind}-{np.dtype(activation).name}"
                      f"{'-per_channel' if per_channel else ''}")
         for kind in KINDS for activation in (np.uint8, np.int8)
         for per_channel in ((False, True) if kind in ("Conv", "MatMul", "Gemm", "GemmFloat") else (False,))]


@pytest.mark.parametrize(("kind", "activation", "per_channel"), CASES)
def test_group_is_onnxruntime_bit_for_bit(kind, activation, per_channel):
    b = Builder(activation, np.random.default_rng(hash((kind, per_channel)) % 1000))
    model = b.model(_group(b, kind, per_channel))
    feeds = [b.feeds(seed) for seed in range(3)]
    module = assert_exact(model, feeds)
    assert fused_ops(module) == onnxruntime_ops(model)
    if kind != "GemmFloat":  # as written, a float Gemm's output agrees to float32 rounding only
        assert_exact(model, feeds, fuse=False)


def test_the_pass_fires():
    """The groups onnxruntime fuses become the QLinear modules (a spy on the module types), the float ops gone."""
    b = Builder(np.uint8, np.random.default_rng(5))
    model = b.model(_group(b, "Conv", False))
    module = onnx2torch_rnn.convert(model)
    kinds = {type(m).__name__ for m in module.children()}
    assert "QLinearConv" in kinds and not kinds & {"Conv2d", "Conv"}, kinds
    assert fused_ops(onnx2torch_rnn.convert(model, fuse=False)) == collections.Counter()


def test_an_op_output_read_twice_stays_float():
    """The Conv's output also feeds a graph output: onnxruntime keeps the group as written, and so do we (the float
    Conv's own output agrees to float32 rounding, the quantized one bit for bit)."""
    b = Builder(np.uint8, np.random.default_rng(6))
    y = _group(b, "Conv", False)
    conv = next(n for n in b.nodes if n.op_type == "Conv").output[0]
    b.nodes.append(helper.make_node("Identity", [conv], ["raw"]))
    model = b.model(y)
    model.graph.output.append(helper.make_tensor_value_info("raw", TensorProto.FLOAT, (2, 4, 6, 7)))
    module = onnx2torch_rnn.convert(model)
    assert fused_ops(module) == onnxruntime_ops(model) == collections.Counter()
    feeds = b.feeds(0)
    with torch.inference_mode():
        got = module(torch.from_numpy(feeds["x0"]))
    want = session(model).run(None, feeds)
    np.testing.assert_allclose(got[1].numpy(), want[1], rtol=1e-5, atol=1e-5)
    step = b.values[next(n for n in reversed(b.nodes) if n.op_type == "DequantizeLinear").input[1]]
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=0, atol=float(step) * 1.01)


def test_a_bias_off_its_scale_stays_float():
    """A bias dequantized with a scale 2% away from x_scale * w_scale: onnxruntime does not fuse (its tolerance is
    1e-6 + 1%), nor do we; at 0.5% both fuse, bit for bit."""
    for factor, fused in ((1.02, False), (1.005, True)):
        b = Builder(np.uint8, np.random.default_rng(8))
        w, scale = b.weight((4, 3, 3, 3), 0)
        x = b.input((2, 3, 6, 7))
        model = b.model(b.qdq(b.op("Conv", [x, w, b.bias(4, scale, x, factor)]), 0.5))
        assert fused_ops(onnx2torch_rnn.convert(model))["QLinearConv"] == onnxruntime_ops(model)[
            "QLinearConv"] == fused
        if fused:
            assert_exact(model, [b.feeds(seed) for seed in range(2)])


def test_a_float_bias_is_quantized_as_onnxruntime_does():
    """A float bias constant (no DequantizeLinear): onnxruntime quantizes it to int32 with x_scale * w_scale and
    fuses; so do we, bit for bit."""
    for kind in ("Conv", "Gemm"):
        b = Builder(np.uint8, np.random.default_rng(9))
        b.values["fb"] = np.random.default_rng(1).standard_normal(4).astype(np.float32)
        if kind == "Conv":
            w, _ = b.weight((4, 3, 3, 3), 0)
            y = b.op("Conv", [b.input((2, 3, 6, 7)), w, "fb"], pads=[1, 1, 1, 1])
        else:
            w, _ = b.weight((4, 6), 0)
            y = b.op("Gemm", [b.input((5, 6)), w, "fb"], transB=1)
        model = b.model(b.qdq(y, 0.3))
        module = assert_exact(model, [b.feeds(seed) for seed in range(3)])
        assert fused_ops(module) == onnxruntime_ops(model) and sum(fused_ops(module).values()) == 1


def test_a_shared_dequantize_feeds_each_group():
    """One DequantizeLinear read by two ops (onnxruntime duplicates it per group): both fuse."""
    b = Builder(np.uint8, np.random.default_rng(7))
    x = b.input((2, 3, 6, 6))
    y = b.op("Concat", [b.qdq(b.op("Sigmoid", [x]), 1 / 256), b.qdq(b.op("AveragePool", [x], kernel_shape=[1, 1]),
                                                                      0.05)], axis=1)
    model = b.model(b.qdq(y, 0.05))
    module = assert_exact(model, [b.feeds(seed) for seed in range(2)])
    assert fused_ops(module) == onnxruntime_ops(model)
    assert fused_ops(module)["QLinearSigmoid"] == 1 and fused_ops(module)["QLinearConcat"] == 1


# ----------------------------------------------------------------------------------------------- committed models

FOLDER = MODELS / "quantized"
QDQ = [e for e in read_manifest(FOLDER)["models"] if e["settings"].get("quant_format") == "QDQ"]


# models whose outputs come from a DequantizeLinear: bit for bit; the others end in float ops (LogSoftmax, a float
# Gemm after GRUs) that agree with onnxruntime's to float32 rounding, as without this pass
EXACT = ("small_cnn_qdq_u8s8", "ts_tagger_op17_qdq_u8s8")


@pytest.mark.parametrize("entry", QDQ, ids=[e["file"].removesuffix(".onnx") for e in QDQ])
def test_committed_qdq_models(entry):
    """quantize_static's QDQ models: the same QLinear ops as onnxruntime's optimised graph, and its numbers."""
    model = onnx.load(FOLDER / entry["file"])
    module = onnx2torch_rnn.convert(model)
    assert fused_ops(module) == onnxruntime_ops(model)
    reference = session(model)
    for feeds in manifest_input_sets(FOLDER, entry, entry["sizes"]):
        with torch.inference_mode():
            got = module(*[torch.from_numpy(feeds[i.name]) for i in reference.get_inputs()])
        got = got if isinstance(got, tuple | list) else [got]
        for g, want in zip(got, reference.run(None, feeds), strict=True):
            tolerance = 0 if entry["file"].removesuffix(".onnx") in EXACT else 1e-4
            np.testing.assert_allclose(g.numpy(), want, rtol=0, atol=tolerance, strict=True)


def test_int8_groups_run_in_the_uint8_form_onnxruntime_gives_them():
    """onnxruntime turns int8 Q -> DQ pairs into uint8 before fusing; QLinearAdd adds the zero point in float before
    rounding, so the int8 form rounds a tie differently (seed 31: 2 of 16384 values one step off before AsUint8)."""
    b = Builder(np.int8, np.random.default_rng(31))
    model = b.model(b.qdq(b.op("Add", [b.input((4, 64, 64)), b.input((64, 64))]), 0.2))
    module = assert_exact(model, [b.feeds(31)])
    assert [type(m).__name__ for m in module.children() if isinstance(m, q.AsUint8)] == ["AsUint8"]
    assert fused_ops(module) == onnxruntime_ops(model)


def _linear_modules(module: torch.nn.Module) -> collections.Counter:
    return collections.Counter(type(m).__name__ for m in module.children()
                               if isinstance(m, q.QuantizeLinear | q.DequantizeLinear))


@pytest.mark.parametrize("activation", [np.uint8, np.int8])
@pytest.mark.parametrize(("mode", "value"), [("constant", 0.0), ("constant", 0.73), ("constant", -1e9),
                                             ("reflect", None), ("edge", None)])
def test_a_pad_between_the_same_parameters_runs_on_the_integers(activation, mode, value):
    """DQ -> Pad -> Q of one scale and zero point: the Pad on the integers, its value quantized (onnxruntime keeps the
    float Pad; quantize(dequantize(q)) = q makes the numbers the same)."""
    b = Builder(activation, np.random.default_rng(5))
    x = b.input((2, 3, 4, 5))
    s, z = b.nodes[-1].input[1:3]
    pads, b.values["pads"] = "pads", np.array([0, 1, 2, 0, 0, 2, 1, 0], np.int64)
    inputs = [x, pads]
    if value is not None:
        b.values["pad_value"] = np.float32(value)
        inputs.append("pad_value")
    model = b.model(b.qdq(b.op("Pad", inputs, mode=mode), 0.05, (s, z)))
    module = assert_exact(model, [b.feeds(seed) for seed in range(3)])
    assert _linear_modules(module) == {"QuantizeLinear": 1, "DequantizeLinear": 1}


def test_the_sizes_of_a_dequantized_value_are_its_input_s():
    """Shape reading a DequantizeLinear whose other reader (a Reshape) runs on the integers: its sizes are read from
    the integers, and the DequantizeLinear runs no more (the committed CRNN QDQ models)."""
    b = Builder(np.uint8, np.random.default_rng(6))
    x = b.input(("batch", 3, 4))
    s, z = b.nodes[-1].input[1:3]
    b.values.update(start=np.array([0], np.int64), end=np.array([1], np.int64), rest=np.array([-1], np.int64))
    first = b.op("Slice", [b.op("Shape", [x]), "start", "end"])
    y = b.op("Reshape", [x, b.op("Concat", [first, "rest"], axis=0)])
    feeds = [{"x0": np.random.default_rng(seed).standard_normal((batch, 3, 4)).astype(np.float32)}
             for seed, batch in enumerate((1, 3))]
    module = assert_exact(b.model(b.qdq(y, 0.05, (s, z))), feeds)
    assert _linear_modules(module) == {"QuantizeLinear": 1, "DequantizeLinear": 1}


@pytest.mark.parametrize("activation", [np.uint8, np.int8, np.uint16, np.int16])
def test_a_quantize_read_by_one_dequantize_is_one_module(activation):
    """QuantizeLinear -> DequantizeLinear around float ops that stay float (16-bit ones, or a Tanh): one
    QuantizeDequantizeLinear each, onnxruntime's numbers."""
    b = Builder(activation, np.random.default_rng(7))
    x = b.input((2, 3, 5))
    y = b.qdq(b.op("Tanh", [x]), 1 / 128)
    module = assert_exact(b.model(y, opset=21), [b.feeds(seed) for seed in range(3)])
    assert _linear_modules(module) == {}
    assert sum(isinstance(m, q.QuantizeDequantizeLinear) for m in module.children()) == 2


@pytest.mark.parametrize("constant_first", [False, True])
@pytest.mark.parametrize("shape", [(7,), (1,)])
@pytest.mark.parametrize(("activation", "constant"), [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.uint8),
                                                      (np.int8, np.int8)])
def test_a_product_and_its_constant_addend_are_one_module(constant_first, shape, activation, constant):
    """MatMul -> Add of a dequantized constant (a classifier's bias), both groups: one QLinearMatMulAdd
    (passes/qlinear.py), onnxruntime's QLinearMatMul and QLinearAdd bit for bit, where onnxruntime makes a QLinearAdd:
    with a uint8 constant (int8 activations become uint8 in its Q -> DQ pairs, an int8 constant stays int8 at its
    default settings); else the Add stays float, as there (int8 activations, uint8 constant: 1 value of 70 one step
    off while we kept it float)."""
    b = Builder(activation, np.random.default_rng(7 + constant_first))
    w, _ = b.weight((6, 7), 1)
    y = b.qdq(b.op("MatMul", [b.input((2, 5, 6)), w]), 0.2)
    c, _ = b.weight(shape, None, dtype=constant)
    model = b.model(b.qdq(b.op("Add", [c, y] if constant_first else [y, c]), 0.2))
    module = assert_exact(model, [b.feeds(seed) for seed in range(4)])
    assert fused_ops(module) == onnxruntime_ops(model)
    assert onnxruntime_ops(model)["QLinearAdd"] == (constant == np.uint8)
    assert [type(m) for m in module.children()].count(q.QLinearMatMulAdd) == (constant == np.uint8)


_BINARY = ("Add", "Mul")


@pytest.mark.parametrize("kind", ["LeakyRelu", "Sigmoid", "Softmax", "AveragePool", "GlobalAveragePool", "Add", "Mul",
                                  "Concat"])
@pytest.mark.parametrize(("activation", "output"), [(np.int8, np.uint8), (np.uint8, np.int8)])
def test_a_group_of_both_8_bit_types_runs_in_one(kind, activation, output):
    """int8 values of a Q -> DQ pair into an op whose QuantizeLinear gives uint8, or the reverse: onnxruntime sees
    uint8 throughout (its Q -> DQ pairs made uint8) and fuses; so do we, the int8 side shifted (AsUint8), bit for bit
    (the group as written was read as int8 throughout: most values wrong). A Concat of both stays float (the same
    numbers: QLinearConcat requantizes as DequantizeLinear then QuantizeLinear do)."""
    b = Builder(activation, np.random.default_rng(3))
    x = b.input((2, 3, 6, 6))
    inputs = [x, b.input((3, 6, 6) if kind in _BINARY else (2, 2, 6, 6))] if kind in (*_BINARY, "Concat") else [x]
    attributes = {"LeakyRelu": {"alpha": 0.2}, "AveragePool": {"kernel_shape": [2, 2]}, "Concat": {"axis": 1}}
    y = b.qdq(b.op(kind, inputs, **attributes.get(kind, {})), 0,
              b.parameters(1 / 256 if kind in ("Sigmoid", "Softmax") else 0.1, output))
    model = b.model(y)
    module = assert_exact(model, [b.feeds(seed) for seed in range(3)])
    assert sum(fused_ops(module).values()) == (kind != "Concat") and sum(onnxruntime_ops(model).values()) == 1


# ------------------------------------------------------------------ passes/quantized.py's fusions on QDQ groups

def _patterns(module: torch.nn.Module) -> collections.Counter:
    return collections.Counter(n.meta["onnx"]["pattern"] for n in module.graph.nodes
                               if n.meta.get("onnx", {}).get("pattern"))


def _children(module: torch.nn.Module) -> list[str]:
    return [type(m).__name__ for m in module.children() if type(m).__name__ != "Identity"]


def _python_path_is_exact(model: onnx.ModelProto, feeds: list[dict], monkeypatch) -> None:
    """The module converted and run without the native kernel: onnxruntime's numbers too."""
    with monkeypatch.context() as python:
        python.setattr(kernel, "load", lambda *_: False)
        assert_exact(model, feeds)


@pytest.mark.parametrize("activation", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize(("after", "attributes"), [
    ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 1]})])
def test_a_conv_group_and_the_group_after_it_are_one_module(activation, per_channel, after, attributes, monkeypatch):
    """Conv -> LeakyRelu / Sigmoid / MaxPool as QDQ groups: one QLinearConv whose native call looks the activation's
    table up or pools (passes/quantized.py's patterns, as on QOperator models), the QuantizeLinear of the float
    input too (quantized in that call): onnxruntime's QuantizeLinear, QLinearConv then QLinearLeakyRelu /
    QLinearSigmoid / MaxPool on the integers bit for bit, native or not."""
    b = Builder(activation, np.random.default_rng(len(after) + len(attributes) + per_channel))
    y = _group(b, "Conv", per_channel)
    if after == "MaxPool":  # dropped: the same scale and zero point
        parameters = tuple(b.nodes[-1].input[1:3])
        y = b.qdq(b.op("MaxPool", [y], **attributes), 0.5, parameters)
    else:
        y = b.qdq(b.op(after, [y], **attributes), 1 / 256 if after == "Sigmoid" else 0.1)
    model = b.model(y)
    feeds = [b.feeds(seed) for seed in range(3)]
    module = assert_exact(model, feeds)
    assert fused_ops(module) == onnxruntime_ops(model)
    pattern = "pooled_qlinear_conv" if after == "MaxPool" else "looked_up_qlinear_conv"
    assert _patterns(module)[pattern] == 1
    assert _children(module) == ["QLinearConv", "DequantizeLinear"]
    _python_path_is_exact(model, feeds, monkeypatch)


@pytest.mark.parametrize("activation", [np.uint8, np.int8])
@pytest.mark.parametrize(("mode", "value"), [("constant", None), ("constant", 0.73), ("constant", -1e9),
                                             ("reflect", None), ("edge", None)])
@pytest.mark.parametrize("pool", [{"kernel_shape": [2, 2], "strides": [2, 2]},
                                  {"kernel_shape": [3, 2], "strides": [2, 3], "dilations": [1, 2]},
                                  {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}])
def test_a_constant_pad_group_and_a_max_pool_group_are_one_max_pool(activation, mode, value, pool, monkeypatch):
    """DQ -> Pad -> Q -> DQ -> MaxPool -> Q of one scale and zero point (onnxruntime: the float Pad, then MaxPool on
    the integers): one MaxPool reading the Pad's quantized value outside its input where the Pad is constant and the
    pooling has no padding of its own and floor mode (padded_max_pool, as on QOperator models); bit for bit."""
    b = Builder(activation, np.random.default_rng(11))
    x = b.input((2, 3, 7, 8))
    parameters = tuple(b.nodes[-1].input[1:3])
    b.values["pads"] = np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)
    inputs = [x, "pads"]
    if value is not None:
        b.values["pad_value"] = np.float32(value)
        inputs.append("pad_value")
    y = b.qdq(b.op("Pad", inputs, mode=mode), 0.05, parameters)
    model = b.model(b.qdq(b.op("MaxPool", [y], **pool), 0.05, parameters))
    feeds = [b.feeds(seed) for seed in range(3)]
    module = assert_exact(model, feeds)
    fused = mode == "constant" and not pool.get("ceil_mode")
    assert _patterns(module)["padded_max_pool"] == fused
    assert _children(module) == ["QuantizeLinear", *(["MaxPool"] if fused else ["Pad", "MaxPool"]), "DequantizeLinear"]
    _python_path_is_exact(model, feeds, monkeypatch)


@pytest.mark.parametrize("case", ["read twice", "other parameters", "opset 11"])
def test_groups_onnxruntime_keeps_apart_stay_apart(case):
    """No fusion where a group's output has another reader (a graph output: Conv -> LeakyRelu, Pad -> MaxPool), or
    where onnxruntime keeps the MaxPool in float (its QuantizeLinear's parameters differ from its DequantizeLinear's;
    opset 11, no 8-bit MaxPool): the groups as the qdq pattern makes them, onnxruntime's numbers."""
    b = Builder(np.uint8, np.random.default_rng(12))
    same = case != "other parameters"
    x = b.input((2, 3, 7, 8))
    b.values["pads"] = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    parameters = tuple(b.nodes[-1].input[1:3])
    padded = b.qdq(b.op("Pad", [x, "pads"]), 0.05, parameters)
    pooled = b.qdq(b.op("MaxPool", [padded], kernel_shape=[2, 2]), 0.05, parameters if same else None)
    conv = _group(b, "Conv", False)
    y = b.qdq(b.op("LeakyRelu", [conv], alpha=0.1), 0.1)
    parameters = tuple(b.nodes[-1].input[1:3])
    y = b.qdq(b.op("MaxPool", [y], kernel_shape=[2, 2]), 0.1, parameters if same else None)
    model = b.model(y, opset=11 if case == "opset 11" else 17)
    model.graph.output.append(helper.make_tensor_value_info(pooled, TensorProto.FLOAT, [None] * 4))
    if case == "read twice":
        model.graph.output.append(helper.make_tensor_value_info(conv, TensorProto.FLOAT, [None] * 4))
        model.graph.output.append(helper.make_tensor_value_info(padded, TensorProto.FLOAT, [None] * 4))
    module = assert_exact(model, [b.feeds(seed) for seed in range(2)])
    assert fused_ops(module) == onnxruntime_ops(model)
    fused = _patterns(module).keys() & {"looked_up_qlinear_conv", "pooled_qlinear_conv", "padded_max_pool"}
    assert fused == (set() if case == "read twice" else {"looked_up_qlinear_conv"})  # the MaxPools stay apart
