"""QuantizeLinear -> com.microsoft QLinearConcat -> [Transpose] -> DequantizeLinear as one module (passes/qlinear.py:
quantize_concat_dequantize; every value, ties and NaN: tests/test_qlinear_kernel.py): inputs that are strided views
(a biLSTM's directions) read through their strides; a chain with another reader stays as written."""

from __future__ import annotations

import numpy as np
import torch
from onnx import helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime
from onnx2torch_rnn.modules.quantized import QuantizeConcatDequantize
from tests.helpers import make_model

RNG = np.random.default_rng(0)
MS = "com.microsoft"


def chain_model(dtype, shapes, axis, perm, shared, extra_reader=False):
    """y = DQ([Transpose](QLinearConcat(Q(x0), Q(x1), ...))); ``shared``: input 0 has the output's scale and zero
    point (onnxruntime copies it)."""
    info = np.iinfo(dtype)
    init = {"ys": np.float32(0.05), "yz": np.array(RNG.integers(info.min // 2, info.max // 2), dtype)}
    nodes, names = [], ["ys", "yz"]
    for index in range(len(shapes)):
        same = shared and index == 0
        init[f"s{index}"] = init["ys"] if same else np.float32(RNG.uniform(0.01, 0.2))
        init[f"z{index}"] = init["yz"] if same else np.array(RNG.integers(info.min // 2, info.max // 2), dtype)
        nodes.append(helper.make_node("QuantizeLinear", [f"x{index}", f"s{index}", f"z{index}"], [f"q{index}"]))
        names += [f"q{index}", f"s{index}", f"z{index}"]
    nodes.append(helper.make_node("QLinearConcat", names, ["c"], domain=MS, axis=axis))
    if perm is not None:
        nodes.append(helper.make_node("Transpose", ["c"], ["t"], perm=perm))
    nodes.append(helper.make_node("DequantizeLinear", ["t" if perm is not None else "c", "ys", "yz"], ["y"]))
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    outputs = [("y", np.float32, out if perm is None else [out[p] for p in perm])]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["c"], ["c_out"]))
        outputs.append(("c_out", dtype, out))
    inputs = [(f"x{index}", np.float32, list(shape)) for index, shape in enumerate(shapes)]
    model = make_model(nodes, inputs, outputs, init, extra_opsets={MS: 1})
    return model


def _feeds(shapes) -> dict:
    """Values past both ends of the range, ties (multiples of half a step of 0.05), and a NaN."""
    feeds = {}
    for index, shape in enumerate(shapes):
        x = RNG.standard_normal(shape).astype(np.float32) * 8
        flat = x.reshape(-1)
        flat[: flat.size // 3] = RNG.integers(-300, 300, flat.size // 3) * np.float32(0.025)
        flat[-1] = np.nan
        feeds[f"x{index}"] = x
    return feeds


def test_strided_input():
    """An input that is a view with strides (a biLSTM's direction) is read through them."""
    shapes = [(3, 2, 6), (3, 2, 6)]
    module = onnx2torch_rnn.convert(chain_model(np.uint8, shapes, 2, [1, 0, 2], False))
    assert [m.numbers is not None for m in module.modules() if isinstance(m, QuantizeConcatDequantize)] == [True]
    both = torch.randn(3, 2, 2, 6) * 4
    with torch.no_grad():
        strided = module(both[:, :, 0], both[:, :, 1])
        dense = module(both[:, :, 0].contiguous(), both[:, :, 1].contiguous())
    torch.testing.assert_close(strided, dense, rtol=0, atol=0)


def test_other_reader_keeps_the_chain():
    shapes = [(3, 4), (3, 4)]
    model = chain_model(np.uint8, shapes, 1, None, False, extra_reader=True)
    module = onnx2torch_rnn.convert(model)
    assert not any(isinstance(m, QuantizeConcatDequantize) for m in module.modules())
    feeds = _feeds(shapes)
    with torch.no_grad():
        got = module(*[torch.from_numpy(v) for v in feeds.values()])
    for want, have in zip(run_onnxruntime(model, feeds), got, strict=True):
        np.testing.assert_array_equal(have.numpy(), want)
