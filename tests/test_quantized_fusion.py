"""passes/quantized.py: DynamicQuantizeLinear -> MatMulInteger/ConvInteger -> Cast -> Mul(x_scale * w_scale)
[-> Add bias], as quantize_dynamic writes them, fused into one module that computes the same numbers: equal to
onnxruntime bit for bit (rtol=0, atol=0; its plain kernels at one thread, and its optimised graph, which fuses the
same nodes into DynamicQuantizeMatMul) and to the nodes converted as written, at several seeds. In eager CPU
inference the module is one call of the native kernel (dynamic_quantized_matmul / _conv): random chains (u8/s8
weights, per-tensor and per-channel scales and zero points, odd shapes, strides, groups, automatic pads) against
onnxruntime and against the Python path, bit for bit."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime
from onnx2torch_rnn.modules import nn as nn_modules
from onnx2torch_rnn.modules import quantized
from onnx2torch_rnn.modules.quantized import DynamicQuantizedProduct
from onnx2torch_rnn.recurrent import kernel
from tests.exporters.common import manifest_input_sets, read_manifest
from tests.helpers import integers, make_model


def chain(product: str, w_type, per_channel: bool, bias: bool, rng: np.random.Generator, relu: bool = False):
    """A quantize_dynamic chain on x: MatMul [2, 5, 24] x [24, 7] or Conv [2, 3, 6, 7] x [4, 3, 3, 3] (then a Relu,
    fused too)."""
    conv = product == "ConvInteger"
    w_shape, out_shape = ((4, 3, 3, 3), (2, 4, 6, 7)) if conv else ((24, 7), (2, 5, 7))
    channels = w_shape[0] if conv else w_shape[1]
    scale_shape = ((channels, 1, 1) if conv else (channels,)) if per_channel else ()
    values = {"w": integers(w_type, w_shape, rng=rng), "wz": integers(w_type, (), -3 if w_type == np.int8 else 120,
                                                                      3 if w_type == np.int8 else 135, rng=rng),
              "ws": rng.uniform(0.001, 0.02, scale_shape).astype(np.float32)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["scales"]),
             helper.make_node(product, ["xq", "w", "xz", "wz"], ["acc"], **({"pads": [1, 1, 1, 1]} if conv else {})),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "scales"], ["y" if not bias else "scaled"])]
    if bias:
        values["b"] = rng.standard_normal((channels, 1, 1) if conv else (channels,)).astype(np.float32)
        nodes.append(helper.make_node("Add", ["b", "scaled"], ["y"]))
    if relu:
        nodes[-1].output[0] = "linear"
        nodes.append(helper.make_node("Relu", ["linear"], ["y"]))
    x_shape = (2, 3, 6, 7) if conv else (2, 5, 24)
    return make_model(nodes, [("x", np.float32, x_shape)], [("y", np.float32, out_shape)], values, opset=17), x_shape


@pytest.mark.parametrize("product", ["MatMulInteger", "ConvInteger"])
@pytest.mark.parametrize("w_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias, relu", [(False, False), (True, False), (False, True)])
def test_fused_chain_is_onnxruntime_bit_for_bit(product, w_type, per_channel, bias, relu):
    rng = np.random.default_rng(0)
    model, x_shape = chain(product, w_type, per_channel, bias, rng, relu)
    fused, literal = onnx2torch_rnn.convert(model), onnx2torch_rnn.convert(model, fuse=False)
    assert [type(m) for m in fused.children()] == [DynamicQuantizedProduct]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    optimised = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32) * (1 + seed)
        with torch.no_grad():
            got, as_written = fused(torch.from_numpy(x)), literal(torch.from_numpy(x))
        assert torch.equal(got, as_written)
        for want in (run_onnxruntime(model, {"x": x})[0], optimised.run(None, {"x": x})[0]):
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=0, strict=True)


def test_a_quantizer_read_twice_is_not_fused():
    """The quantized input feeds a second MatMulInteger: the chain stays as written (and exact)."""
    rng = np.random.default_rng(1)
    model, x_shape = chain("MatMulInteger", np.int8, False, True, rng)
    model.graph.node.append(helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc2"]))
    model.graph.output.append(helper.make_tensor_value_info("acc2", TensorProto.INT32, (2, 5, 7)))
    module = onnx2torch_rnn.convert(model)
    assert not any(isinstance(m, DynamicQuantizedProduct) for m in module.modules())
    x = rng.standard_normal(x_shape).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(x))
    for g, want in zip(got, run_onnxruntime(model, {"x": x}), strict=True):
        np.testing.assert_array_equal(g.numpy(), want, strict=True)


def random_chain(rng: random.Random):
    """A random quantize_dynamic chain: MatMulInteger (x of rank 1-3, K and N off the groups of 4 and the panels of
    64, few and many columns) or ConvInteger (1-3 spatial axes, groups, strides, dilations, explicit or automatic
    pads); uint8 or int8 weights, scale and zero point per tensor or per output channel, bias or not. onnxruntime's
    ConvInteger takes one weight zero point only: per-channel ones go to the Python comparison alone."""
    generator = np.random.default_rng(rng.randrange(2**31))
    w_type = rng.choice([np.uint8, np.int8])
    conv, per_channel, zero_per_channel = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.4
    attributes = {}
    if conv:
        rank, group = rng.choice([1, 2, 2, 3]), rng.choice([1, 1, 2])
        kernel_shape = [rng.choice([1, 2, 3]) for _ in range(rank)]
        channels, out = group * rng.choice([1, 3]), group * rng.choice([1, 2, 5])
        x_shape = (rng.choice([1, 2]), channels, *[rng.choice([2, 5, 9]) + k for k in kernel_shape])
        w_shape, scale_shape = (out, channels // group, *kernel_shape), (out, *[1] * rank)
        attributes = dict(group=group, strides=[rng.choice([1, 1, 2]) for _ in range(rank)],
                          dilations=[rng.choice([1, 1, 2]) for _ in range(rank)])
        if rng.random() < 0.3:
            attributes["auto_pad"] = rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
            if attributes["auto_pad"] != "VALID":  # onnxruntime: no dilations with SAME_*
                attributes["dilations"] = [1] * rank
        else:
            attributes["pads"] = [rng.choice([0, 1, 2]) for _ in range(2 * rank)]
    else:
        k, n = rng.choice([1, 5, 24, 67]), rng.choice([1, 7, 31, 32, 47, 100])
        x_shape, w_shape, scale_shape, out = (*rng.choice([(), (3,), (2, 5), (1, 4)]), k), (k, n), (n,), n
    zero_shape = (out,) if zero_per_channel else ()
    low, high = (-5, 5) if w_type == np.int8 else (110, 145)
    values = {"w": integers(w_type, w_shape, rng=generator), "wz": integers(w_type, zero_shape, low, high,
                                                                          rng=generator),
              "ws": generator.uniform(0.001, 0.02, scale_shape if per_channel else ()).astype(np.float32)}
    product = "ConvInteger" if conv else "MatMulInteger"
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["scales"]),
             helper.make_node(product, ["xq", "w", "xz", "wz"], ["acc"], **attributes),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "scales"], ["y"])]
    if rng.random() < 0.6:
        values["b"] = generator.standard_normal(scale_shape).astype(np.float32)
        nodes[-1].output[0] = "scaled"
        nodes.append(helper.make_node("Add", ["scaled", "b"], ["y"]))
    if generator.random() < 0.4:  # a Relu after it: fused too
        nodes[-1].output[0] = "linear"
        nodes.append(helper.make_node("Relu", ["linear"], ["y"]))
    if conv and generator.random() < 0.4:  # a MaxPool after the convolution: fused too
        nodes[-1].output[0] = "unpooled"
        rank = len(x_shape) - 2
        nodes.append(helper.make_node("MaxPool", ["unpooled"], ["y"], kernel_shape=[2] * rank, pads=[1] * (2 * rank),
                                      strides=[int(generator.integers(1, 3)) for _ in range(rank)],
                                      ceil_mode=int(generator.integers(0, 2))))
    model = make_model(nodes, [("x", np.float32, x_shape)], ["y"], values, opset=17)
    return model, x_shape, conv and zero_per_channel


def spied_native(monkeypatch) -> list[str]:
    """The names of the fused native ops the module calls (through modules/quantized.py's _NATIVE)."""
    calls, native = [], torch.ops.onnx2torch_rnn

    class Op:
        def __init__(self, name):
            self.default = lambda *args: calls.append(name) or getattr(native, name).default(*args)

    class Spy:
        dynamic_quantized_matmul, dynamic_quantized_conv = Op("dynamic_quantized_matmul"), Op("dynamic_quantized_conv")

        def __getattr__(self, name):
            return getattr(native, name)

    monkeypatch.setattr(quantized, "_NATIVE", Spy())
    return calls


@pytest.mark.parametrize("seed", range(6))
def test_native_fused_product_is_onnxruntime_and_python_bit_for_bit(seed, monkeypatch):
    """Eight random chains a seed, three inputs each (one all-positive, one with a zero range): the native op runs
    (spy), equal to onnxruntime and to the module's Python path (the reference) at rtol=0, atol=0."""
    if not kernel.load():
        pytest.skip("no native kernel here: the Python path is the one tested above")
    rng = random.Random(seed)
    for case in range(8):
        model, x_shape, python_only = random_chain(rng)
        module = onnx2torch_rnn.convert(model)
        assert [type(m) for m in module.children()] == [DynamicQuantizedProduct], case
        calls = spied_native(monkeypatch)
        generator = np.random.default_rng(case)
        inputs = [generator.standard_normal(x_shape).astype(np.float32) * rng.choice([0.1, 3.0]),
                  generator.uniform(0.5, 2.0, x_shape).astype(np.float32), np.zeros(x_shape, np.float32)]
        for x in inputs:
            with torch.inference_mode():
                got = module(torch.from_numpy(x))
            with monkeypatch.context() as python:
                python.setattr(quantized, "native", lambda *tensors: False)
                with torch.inference_mode():
                    reference = module(torch.from_numpy(x))
            assert got.dtype == reference.dtype and torch.equal(got, reference), (case, model.graph.node)
            if not python_only:
                np.testing.assert_allclose(got.numpy(), run_onnxruntime(model, {"x": x})[0], rtol=0, atol=0,
                                           strict=True)
        assert len(calls) == len(inputs), (case, calls)
        monkeypatch.undo()


def test_native_operands_follow_the_weights(monkeypatch):
    """The prepared weights are kept per buffer version: a change by load_state_dict (in place) is seen; a strided
    input runs."""
    if not kernel.load():
        pytest.skip("no native kernel here")
    rng = np.random.default_rng(3)
    model, x_shape = chain("MatMulInteger", np.uint8, True, True, rng)
    module = onnx2torch_rnn.convert(model)
    x = torch.from_numpy(rng.standard_normal((*x_shape[:-1], 2 * x_shape[-1])).astype(np.float32))[..., ::2]

    def python_path():
        with monkeypatch.context() as python, torch.no_grad():
            python.setattr(quantized, "native", lambda *tensors: False)
            return module(x)

    with torch.no_grad():
        first = module(x)
    assert torch.equal(first, python_path())
    state = module.state_dict()
    name = next(k for k in state if k.endswith(".weight"))
    module.load_state_dict({**state, name: state[name] ^ 1})
    with torch.no_grad():
        second = module(x)
    assert not torch.equal(first, second) and torch.equal(second, python_path())


QUANTIZED_MODELS = Path(__file__).resolve().parent / "models" / "quantized"
# quantize_dynamic's LSTMs with their exporters' glue: torch.onnx (zero states from ConstantOfShape, sliced per layer;
# Transpose + Reshape or Squeeze between layers), tf2onnx (Expand'ed zeros, Unsqueeze, Concat, Slice + Squeeze)
STACKED = ["ts_lstm_op14_dyn_pt_s8", "ts_crnn_op18_dyn_pc_u8_rr", "ts_tagger_op17_dyn_pt_s8",
           "ts_seq2seq_op16_dyn_pt_s8", "tf_keras_bi_lstm_concat_dyn_pc_s8_rr", "tf_keras_lstm_hard_sigmoid_dyn_pt_s8"]


@pytest.mark.parametrize("name", STACKED)
def test_dynamic_quantize_lstm_glue_is_recognised_and_exact(name):
    """passes/stacked.py takes DynamicQuantizeLSTM layers with their zero states and glue (one StackedRecurrent, or
    the layer alone): no node of that glue is left, and every output is the nodes' as written bit for bit, and
    onnxruntime's (bit for bit but after the CRNN's LogSoftmax, whose exp/log are libm's)."""
    path = QUANTIZED_MODELS / f"{name}.onnx"
    module, literal = onnx2torch_rnn.convert(path), onnx2torch_rnn.convert(path, fuse=False)
    recognised = [n for n in module.graph.nodes if n.meta.get("onnx", {}).get("pattern") == "stacked_layers"]
    assert recognised, "the stacked_layers pattern did not fire"
    left = {type(m).__name__ for m in module.children()}
    glue = {"ConstantOfShape", "Slice", "Squeeze", "Unsqueeze", "Concat", "Expand", "Reshape"}
    assert not left & glue - ({"Reshape"} if "crnn" in name else set()), left  # the CRNN's Reshape of conv features
    entry = next(e for e in read_manifest(QUANTIZED_MODELS)["models"] if e["file"] == f"{name}.onnx")
    for seed in range(2):
        for feeds in manifest_input_sets(QUANTIZED_MODELS, entry, entry["sizes"], seed=seed):
            args = [torch.from_numpy(feeds[k]) for k in feeds]
            with torch.no_grad():
                got, as_written = module(*args), literal(*args)
            got, as_written = (v if isinstance(v, tuple) else (v,) for v in (got, as_written))
            for g, w, want in zip(got, as_written, run_onnxruntime(path, feeds), strict=True):
                assert torch.equal(g, w)
                np.testing.assert_allclose(g.numpy(), want, rtol=1e-6 if "crnn" in name else 0, atol=0, strict=True)


@pytest.mark.parametrize("types", [(np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize(("x_shape", "conv", "pool"), [
    ((2, 1, 8, 10), {"pads": [1, 1, 1, 1]}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 3, 9, 7), {"strides": [1, 2]}, {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}),
    ((2, 2, 11), {"pads": [2, 1]}, {"kernel_shape": [3], "dilations": [2], "strides": [2]})])
@pytest.mark.parametrize(("after", "quantized"), [(after, quantized) for after in ["MaxPool", "QLinearLeakyRelu",
                         "QLinearSigmoid"] for quantized in (False, True)] + [(None, True)])
def test_pooled_qlinear_conv_is_onnxruntime_bit_for_bit(types, x_shape, conv, pool, after, quantized):
    """QLinearConv -> MaxPool, QLinearLeakyRelu or QLinearSigmoid (QOperator CNNs) as one module
    (passes/quantized.py), the pooling or the activation's table in the native convolution's call; ``quantized``:
    with the QuantizeLinear of the float input before it (its own scale and zero point), quantized in that call:
    equal to onnxruntime and to the nodes converted as written."""
    x_type, w_type = types
    rng = np.random.default_rng(len(x_shape))
    rank, channels = len(x_shape) - 2, 4
    values = {"xs": np.float32(0.02), "xz": integers(x_type, (), rng=rng), "w": integers(w_type, (channels, x_shape[1],
              *[3] * rank), rng=rng), "ws": rng.uniform(0.005, 0.02, channels).astype(np.float32),
              "wz": np.zeros(channels, w_type), "ys": np.float32(0.15), "yz": integers(x_type, (), rng=rng),
              "b": rng.integers(-500, 500, channels).astype(np.int32)}
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                              ["c" if after else "y"], **conv)]
    if after is not None:
        nodes.append(helper.make_node("MaxPool", ["c"], ["y"], **pool) if after == "MaxPool" else helper.make_node(
            after, ["c", "ys", "yz", "as", "az"], ["y"], domain="com.microsoft",
            **({"alpha": 0.2} if after == "QLinearLeakyRelu" else {})))
    values.update({"as": np.float32(0.008 if after == "QLinearSigmoid" else 0.1), "az": integers(x_type, (), rng=rng)})
    x_input = ("x", x_type, x_shape)
    if quantized:  # by other parameters than the convolution's: each is used as given
        nodes.insert(0, helper.make_node("QuantizeLinear", ["f", "qs", "qz"], ["x"]))
        values.update({"qs": np.float32(0.03), "qz": integers(x_type, (), rng=rng)})
        x_input = ("f", np.float32, x_shape)
    model = make_model(nodes, [x_input], [("y", x_type, [None] * len(x_shape))], values, opset=12,
                       extra_opsets={"com.microsoft": 1})
    fused, literal = onnx2torch_rnn.convert(model), onnx2torch_rnn.convert(model, fuse=False)
    assert [type(m).__name__ for m in fused.children()] == ["QLinearConv"]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal(x_shape) * 3).astype(np.float32) if quantized else integers(x_type, x_shape, rng=rng)
        with torch.no_grad():
            got, as_written = fused(torch.from_numpy(x)), literal(torch.from_numpy(x))
        assert torch.equal(got, as_written)
        np.testing.assert_array_equal(got.numpy(), run_onnxruntime(model, {x_input[0]: x})[0], strict=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("x_shape", "pads", "axes", "pool"), [
    ((1, 3, 8, 8), [0, 0, 1, 1, 0, 0, 1, 1], None, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((2, 2, 7, 9), [2, 0, 1, 3], [2, 3], {"kernel_shape": [3, 2], "strides": [2, 3]}),
    ((1, 2, 10), [3, 1], [-1], {"kernel_shape": [3], "dilations": [2], "auto_pad": "VALID"}),
    ((1, 2, 4, 5), [0, 0, 0, 0, 0, 0, 0, 0], None, {"kernel_shape": [2, 2]}),
    ((1, 4, 16, 16), [0, 0, 1, 1, 0, 0, 1, 1], None, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 12, 33), [1, 2, 2, 1], [2, 3], {"kernel_shape": [3, 3], "strides": [1, 2]})])
def test_padded_max_pool_is_onnxruntime_bit_for_bit(dtype, x_shape, pads, axes, pool, monkeypatch):
    """A constant Pad of 8-bit values -> MaxPool as one MaxPool (passes/quantized.py) whose native call reads the
    Pad's value outside its input: equal to onnxruntime and to the nodes converted as written, native or not (the
    Pad then the pooling)."""
    rng = np.random.default_rng(len(pads))
    values = {"pads": np.array(pads, np.int64), "value": integers(dtype, (), rng=rng)}
    names = ["x", "pads", "value"]
    if axes is not None:
        values["axes"] = np.array(axes, np.int64)
        names.append("axes")
    nodes = [helper.make_node("Pad", names, ["padded"]), helper.make_node("MaxPool", ["padded"], ["y"], **pool)]
    model = make_model(nodes, [("x", dtype, x_shape)], ["y"], values, opset=18)
    fused, literal = onnx2torch_rnn.convert(model), onnx2torch_rnn.convert(model, fuse=False)
    assert [type(m).__name__ for m in fused.children()] == ["MaxPool"]
    calls, native = [], nn_modules.native_max_pool
    monkeypatch.setattr(nn_modules, "native_max_pool", lambda *args: calls.append(args[1].numel()) or native(*args))
    with monkeypatch.context() as python:
        python.setattr(nn_modules.kernel, "load", lambda *_: False)
        reference = onnx2torch_rnn.convert(model)
    for seed in range(3):
        x = integers(dtype, x_shape, rng=np.random.default_rng(seed))
        with torch.no_grad():
            got, as_written, python_path = (m(torch.from_numpy(x)) for m in (fused, literal, reference))
        assert torch.equal(got, as_written) and torch.equal(got, python_path)
        np.testing.assert_array_equal(got.numpy(), run_onnxruntime(model, {"x": x})[0], strict=True)
    if kernel.load("int8"):  # the fused pooling's native call has the fill
        assert calls[0] == 5 * (len(x_shape) - 2) + 1, calls


def test_a_pad_of_floats_before_max_pool_is_not_fused():
    """Only 8-bit values: a float Pad -> MaxPool stays as written (torch's pooling takes the padded floats)."""
    values = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "value": np.float32(0.5)}
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["padded"]),
             helper.make_node("MaxPool", ["padded"], ["y"], kernel_shape=[2, 2])]
    model = make_model(nodes, [("x", np.float32, (1, 2, 4, 4))], ["y"], values, opset=18)
    assert [type(m).__name__ for m in onnx2torch_rnn.convert(model).children()] == ["Pad", "MaxPool"]


@pytest.mark.parametrize("types", [(np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize(("x_shape", "axis"), [((2, 4, 1, 1), 1), ((2, 3, 2, 2), 2), ((3, 2, 5), -1), ((2, 3, 4), 0)])
@pytest.mark.parametrize("per_column", [False, True])
def test_flattened_qgemm_is_onnxruntime_bit_for_bit(types, x_shape, axis, per_column):
    """Flatten -> QGemm (a QOperator classifier's head) as one module (passes/quantized.py), the native product
    reading A flattened: equal to onnxruntime and to the nodes converted as written."""
    a_type, b_type = types
    rng = np.random.default_rng(len(x_shape) + axis)
    k = int(np.prod(x_shape[axis % len(x_shape):]))
    n = 5
    values = {"as": np.float32(0.03), "az": integers(a_type, (), rng=rng), "b": integers(b_type, (k, n), rng=rng),
              "bs": rng.uniform(0.005, 0.02, n if per_column else ()).astype(np.float32),
              "bz": np.zeros(n if per_column else (), b_type), "c": rng.integers(-500, 500, n).astype(np.int32),
              "ys": np.float32(0.2), "yz": integers(a_type, (), rng=rng)}
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=axis),
             helper.make_node("QGemm", ["f", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"],
                              domain="com.microsoft")]
    model = make_model(nodes, [("x", a_type, x_shape)], [("y", a_type, [None, n])], values, opset=13,
                       extra_opsets={"com.microsoft": 1})
    fused, literal = onnx2torch_rnn.convert(model), onnx2torch_rnn.convert(model, fuse=False)
    assert [type(m).__name__ for m in fused.children()] == ["QGemm"]
    for seed in range(3):
        x = integers(a_type, x_shape, rng=np.random.default_rng(seed))
        with torch.no_grad():
            got, as_written = fused(torch.from_numpy(x)), literal(torch.from_numpy(x))
        assert torch.equal(got, as_written)
        np.testing.assert_array_equal(got.numpy(), run_onnxruntime(model, {"x": x})[0], strict=True)
