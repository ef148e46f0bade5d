"""passes/quantized.py: DynamicQuantizeLinear -> MatMulInteger/ConvInteger -> Cast -> Mul(x_scale * w_scale)
[-> Add bias], as quantize_dynamic writes them, fused into one module that computes the same numbers: equal to
onnxruntime bit for bit (rtol=0, atol=0; its plain kernels at one thread, and its optimised graph, which fuses the
same nodes into DynamicQuantizeMatMul) and to the nodes converted as written, at several seeds."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime
from onnx2torch_rnn.modules.quantized import DynamicQuantizedProduct
from tests.helpers import integers, make_model


def chain(product: str, w_type, per_channel: bool, bias: bool, rng: np.random.Generator):
    """A quantize_dynamic chain on x: MatMul [2, 5, 24] x [24, 7] or Conv [2, 3, 6, 7] x [4, 3, 3, 3]."""
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
    x_shape = (2, 3, 6, 7) if conv else (2, 5, 24)
    return make_model(nodes, [("x", np.float32, x_shape)], [("y", np.float32, out_shape)], values, opset=17), x_shape


@pytest.mark.parametrize("product", ["MatMulInteger", "ConvInteger"])
@pytest.mark.parametrize("w_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_chain_is_onnxruntime_bit_for_bit(product, w_type, per_channel, bias):
    rng = np.random.default_rng(0)
    model, x_shape = chain(product, w_type, per_channel, bias, rng)
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
