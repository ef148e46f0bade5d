"""Convolution, pooling, normalisation, dropout, rearrangement, resizing and padding against onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import onnx2torch_rnn
from onnx2torch_rnn import UnsupportedAttributeError
from onnx2torch_rnn.checking import random_inputs, run_onnxruntime, run_torch
from onnx2torch_rnn.modules import nn as nn_modules
from onnx2torch_rnn.recurrent import kernel
from tests.helpers import (
    CONV_CASES,
    check,
    check_reference,
    helper,
    make_model,
    parametrize_pairwise,
    weighted_model,
)

RNG = np.random.default_rng(0)


def _count(module: nn.Module, *types) -> int:
    return sum(isinstance(sub, types) for sub in module.modules())


def _node_model(op: str, x_shape, opset: int, dtype=np.float32, outputs=("y",), **attributes):
    """A one-node model with input ``x``: (model, random feeds)."""
    node = helper.make_node(op, ["x"], list(outputs), **attributes)
    return weighted_model([node], [("x", dtype, x_shape)], {}, opset, outputs=outputs)


# ----------------------------------------------------------------------------------------------- Conv

@pytest.mark.parametrize("opset", [7, 11, 25])
@pytest.mark.parametrize(("attributes", "x_shape", "w_shape", "bias"), CONV_CASES)
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_conv(opset, attributes, x_shape, w_shape, bias, kind):
    weights = {"w": RNG.standard_normal(w_shape).astype(np.float32)}
    if bias:
        weights["b"] = RNG.standard_normal(w_shape[0]).astype(np.float32)
    node = helper.make_node("Conv", ["x", *weights], ["y"], **attributes)
    model, feeds = weighted_model([node], [("x", np.float32, x_shape)], weights, opset, kind)
    module = check(model, feeds)
    assert _count(module, nn.Conv1d, nn.Conv2d, nn.Conv3d) == (kind == "initializer")


@pytest.mark.parametrize(("attributes", "x_shape", "w_shape", "bias"),
                         [(a, (*x[:2], *(d * (24 if len(x) == 4 else 1200) for d in x[2:])), w, b)
                          for a, x, w, b in CONV_CASES if len(x) < 5])
def test_conv_packed_inference(attributes, x_shape, w_shape, bias):
    """From SMALL_WORK multiply-adds, inference runs oneDNN on the weight packed once (modules/packed.py): equal to
    onnxruntime; a gradient-needing call runs torch's convolution and agrees; a changed weight is repacked."""
    from onnx2torch_rnn.modules.packed import SMALL_WORK

    weights = {"w": RNG.standard_normal(w_shape).astype(np.float32)}
    if bias:
        weights["b"] = RNG.standard_normal(w_shape[0]).astype(np.float32)
    node = helper.make_node("Conv", ["x", *weights], ["y"], **attributes)
    model, feeds = weighted_model([node], [("x", np.float32, x_shape)], weights, 13)
    module = check(model, feeds)
    conv = next(m for m in module.modules() if isinstance(m, nn.Conv1d | nn.Conv2d))
    x = torch.from_numpy(feeds["x"])
    with torch.no_grad():
        packed = module(x)
    assert "_packed_weight" in conv.__dict__ and packed[0].numel() * conv.weight.numel() >= SMALL_WORK
    np.testing.assert_allclose(module(x).detach().numpy(), packed.numpy(), rtol=1e-4, atol=1e-4)  # torch's path
    with torch.no_grad():
        conv.weight.mul_(-0.5)
        np.testing.assert_allclose(module(x).numpy(), module.train()(x.requires_grad_()).detach().numpy(), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize(("attributes", "x_shape", "w_shape"), [(a, x, w) for a, x, w, _ in CONV_CASES if len(x) == 4])
def test_window_product_is_the_convolution(attributes, x_shape, w_shape):
    """The form small convolutions take under torch.compile (modules/packed.py), against torch's convolution."""
    from onnx2torch_rnn.modules.packed import window_product

    x, w, b = (torch.from_numpy(RNG.standard_normal(s).astype(np.float32)) for s in (x_shape, w_shape, w_shape[:1]))
    pads = attributes.get("pads", [0, 0, 0, 0])[:2]  # symmetric: asymmetric pads come as a Pad before the conv
    stride, dilation = attributes.get("strides", [1, 1]), attributes.get("dilations", [1, 1])
    group = attributes.get("group", 1)
    expected = torch.nn.functional.conv2d(x, w, b, stride, pads, dilation, group)
    torch.testing.assert_close(window_product(x, w, b, pads, stride, dilation, group), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.compile
@pytest.mark.parametrize("needs_grad", [False, True])
def test_small_conv_compiles_to_the_window_product(needs_grad):
    """Compiled inference writes a small convolution as windows times weight (no convolution op left for inductor's
    reference kernel); a call that needs a gradient keeps torch's convolution. Both match onnxruntime."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1], strides=[2], dilations=[2]),  # 1-D
             helper.make_node("Unsqueeze", ["h", "axis"], ["h4"]),
             helper.make_node("Conv", ["h4", "w2"], ["y"], group=2, pads=[0, 1, 0, 1])]  # 2-D, groups
    weights = {"w1": RNG.standard_normal((4, 3, 3)).astype(np.float32), "b1": RNG.standard_normal(4).astype(np.float32),
               "w2": RNG.standard_normal((6, 2, 1, 3)).astype(np.float32)}
    model, feeds = weighted_model(nodes, [("x", np.float32, (2, 3, 20))],
                                  {**weights, "axis": np.array([2], np.int64)}, 13)
    module = onnx2torch_rnn.convert(model)
    expected = run_onnxruntime(model, feeds)[0]
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    x = torch.from_numpy(feeds["x"]).requires_grad_(needs_grad)
    with torch.set_grad_enabled(needs_grad):
        np.testing.assert_allclose(compiled(x).detach().numpy(), expected, rtol=1e-4, atol=1e-4)
    convolutions = [n for gm in graphs for n in gm.graph.nodes if "conv" in str(n.target)]
    assert bool(convolutions) == needs_grad, convolutions
    torch._dynamo.reset()


def test_conv_same_with_dilation_refused():
    model, _ = weighted_model([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", dilations=[2, 2])],
                              [("x", np.float32, (1, 2, 6, 6))], {"w": np.ones((2, 2, 3, 3), np.float32)}, 11)
    with pytest.raises(onnx2torch_rnn.UnsupportedAttributeError, match="dilations"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_conv_kernel_shape_mismatch_refused(op):
    model, _ = weighted_model([helper.make_node(op, ["x", "w"], ["y"], kernel_shape=[2, 2])],
                              [("x", np.float32, (1, 2, 6, 6))], {"w": np.ones((2, 2, 3, 3), np.float32)}, 11,
                              outputs=[("y", np.float32, [None] * 4)])
    with pytest.raises(onnx2torch_rnn.UnsupportedAttributeError, match="kernel_shape"):
        onnx2torch_rnn.convert(model)


def test_conv_batch_norm_gemm_train():
    """Converted weights are parameters of torch modules: one optimizer step changes them and the loss."""
    weights = {"w": RNG.standard_normal((4, 2, 3, 3)).astype(np.float32), **_norm_weights(4, stats=True),
               "fc": RNG.standard_normal((3, 4)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
             helper.make_node("GlobalAveragePool", ["n"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    model, feeds = weighted_model(nodes, [("x", np.float32, (2, 2, 5, 5))], weights, 13)
    module = check(model, feeds)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    x = torch.from_numpy(feeds["x"])
    before = [p.detach().clone() for p in module.parameters()]
    loss = module(x).square().sum()
    loss.backward()
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    assert module(x).square().sum() < loss


def test_batch_norm_train_mode_is_torch_batch_norm():
    """Documented behaviour: after .train() the converted nn.BatchNorm normalises with batch statistics."""
    weights = _norm_weights(3, stats=True)
    node = helper.make_node("BatchNormalization", ["x", *weights], ["y"])
    model, feeds = weighted_model([node], [("x", np.float32, (8, 3, 4))], weights, 15)
    module = onnx2torch_rnn.convert(model).train()
    y = module(torch.from_numpy(feeds["x"]))
    torch.testing.assert_close(y.mean((0, 2)), torch.from_numpy(weights["bias"]), atol=1e-5, rtol=0)


def test_conv_same_dynamic_size():
    """SAME pads with strides depend on the input size: without static sizes the generic module computes them."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])
    model = make_model([node], [("x", np.float32, (1, 2, "h", "w"))], ["y"],
                       {"w": RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)}, 13)
    for size in (5, 6):
        check(model, {"x": RNG.standard_normal((1, 2, size, size + 1)).astype(np.float32)})


CONV_TRANSPOSE_CASES = [  # (attributes, x shape, w shape)
    ({}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, (2, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "pads": [0, 1, 2, 0]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 1], "pads": [2, 0, 0, 1], "output_padding": [1, 0]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"dilations": [2, 2], "group": 2}, (1, 4, 5, 6), (4, 2, 3, 3)),
    ({"strides": [2, 2], "output_shape": [10, 12]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "output_shape": [9, 11], "auto_pad": "SAME_UPPER"}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [3, 2], "output_shape": [16, 13]}, (1, 4, 5, 6), (4, 3, 2, 2)),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 4, 5, 6), (4, 3, 3, 4)),
    ({"strides": [2, 3], "auto_pad": "SAME_LOWER", "output_padding": [1, 0]}, (1, 4, 5, 6), (4, 3, 4, 3)),
    ({"strides": [2, 2], "auto_pad": "VALID", "output_padding": [1, 1]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2], "pads": [1, 2], "dilations": [2]}, (2, 3, 7), (3, 5, 3)),
    ({"strides": [2, 1, 2], "pads": [1, 0, 0, 1, 1, 1]}, (1, 2, 3, 4, 5), (2, 3, 3, 2, 3)),
]


@pytest.mark.parametrize("opset", [7, 11, 22])
@pytest.mark.parametrize(("attributes", "x_shape", "w_shape"), CONV_TRANSPOSE_CASES)
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_conv_transpose(opset, attributes, x_shape, w_shape, kind):
    weights = {"w": RNG.standard_normal(w_shape).astype(np.float32),
               "b": RNG.standard_normal(w_shape[1] * attributes.get("group", 1)).astype(np.float32)}
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attributes)
    model, feeds = weighted_model([node], [("x", np.float32, x_shape)], weights, opset, kind)
    module = check(model, feeds)
    assert _count(module, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d) == (kind == "initializer")


def test_conv_transpose_output_shape_dynamic_size():
    """output_shape pads depend on the input size: without static sizes the generic module computes them."""
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_shape=[9, 11])
    model = make_model([node], [("x", np.float32, (1, 2, "h", "w"))], [("y", np.float32, [None] * 4)],
                       {"w": RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)}, 13)
    module = check(model, {"x": RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)})
    assert _count(module, nn.ConvTranspose2d) == 0


# ----------------------------------------------------------------------------------------------- pooling

POOL_CASES = [  # (attributes, x shape, first opset with these attributes)
    ({"kernel_shape": [3, 3]}, (1, 3, 7, 8), 7),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0]}, (2, 3, 7, 8), 7),
    ({"kernel_shape": [2, 3], "pads": [0, 2, 1, 1], "strides": [1, 2]}, (1, 2, 6, 7), 7),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 2, 7, 8), 7),
    ({"kernel_shape": [4, 3], "strides": [2, 3], "auto_pad": "SAME_LOWER"}, (1, 2, 7, 8), 7),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}, (1, 2, 7, 8), 7),
    ({"kernel_shape": [3], "strides": [2], "pads": [1, 2]}, (2, 3, 9), 7),
    ({"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}, (1, 2, 5, 6, 7), 7),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, (1, 2, 8, 9), 10),
    ({"kernel_shape": [2], "strides": [2], "pads": [1, 1], "ceil_mode": 1}, (1, 2, 5), 10),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 2, 1], "ceil_mode": 1}, (1, 2, 8, 7), 10),
    ({"kernel_shape": [3, 3], "strides": [2, 3], "auto_pad": "SAME_UPPER", "ceil_mode": 1}, (1, 2, 8, 7), 10),
    ({"kernel_shape": [2, 3], "dilations": [2, 3], "pads": [1, 2, 0, 1]}, (1, 2, 8, 9), "dilations"),
    ({"kernel_shape": [3, 2], "dilations": [2, 2], "strides": [2, 1], "ceil_mode": 1}, (1, 2, 8, 9), "dilations"),
    ({"kernel_shape": [3], "dilations": [2], "auto_pad": "SAME_UPPER"}, (1, 2, 9), "dilations"),
]
FIRST_DILATED = {"MaxPool": 10, "AveragePool": 19, "LpPool": 18}
POOL_OPSETS = {"MaxPool": [7, 8, 10, 11, 12, 22], "AveragePool": [7, 10, 11, 19, 22], "LpPool": [7, 11, 18, 22]}


def _pool_cases(op: str):
    for opset in POOL_OPSETS[op]:
        for attributes, x_shape, first in POOL_CASES:
            first = FIRST_DILATED[op] if first == "dilations" else first
            if op == "LpPool" and attributes.get("ceil_mode"):
                first = 18
            if opset >= first:
                yield opset, attributes, x_shape


@pytest.mark.parametrize(("opset", "attributes", "x_shape"), list(_pool_cases("MaxPool")))
def test_max_pool(opset, attributes, x_shape):
    outputs = ("y", "indices") if opset >= 8 else ("y",)
    check(*_node_model("MaxPool", x_shape, opset, outputs=outputs, **attributes))


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("x_shape", [(2, 3, 5, 6), (1, 2, 4, 5, 6)])
def test_max_pool_indices_storage_order(storage_order, x_shape):
    kernel = [2] * (len(x_shape) - 2)
    model, feeds = _node_model("MaxPool", x_shape, 12, outputs=("y", "indices"), kernel_shape=kernel,
                               pads=[1] * len(kernel) * 2, strides=[2] * len(kernel), storage_order=storage_order)
    check(model, feeds)


def test_max_pool_indices_slot_only_y():
    """A node that lists an empty Indices slot still returns Y only."""
    model = make_model([helper.make_node("MaxPool", ["x"], ["y", ""], kernel_shape=[2, 2])],
                       [("x", np.float32, (1, 2, 5, 5))], ["y"], opset=12)
    check(model)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float64])
@pytest.mark.parametrize("attributes", [{"pads": [1, 1, 1, 1], "strides": [2, 2]},
                                        {"pads": [0, 2, 1, 0], "dilations": [2, 1], "ceil_mode": 1}])
def test_max_pool_dtypes(dtype, attributes):
    """8-bit 2-D pooling runs in its type (torch's kernel), the others in float32: padding reads the lowest value."""
    model, _ = _node_model("MaxPool", (1, 2, 6, 7), 12, dtype=dtype, kernel_shape=[3, 3], **attributes)
    x = RNG.integers(-128, 127, (1, 2, 6, 7)) if dtype == np.int8 else RNG.integers(0, 255, (1, 2, 6, 7))
    check(model, {"x": x.astype(dtype)})


# larger maps: runs of windows wholly inside the input at strides 1, 2 and 3 between windows reaching outside it
NATIVE_POOL_CASES = [({"kernel_shape": [2, 2], "strides": [2, 2]}, (1, 3, 20, 38)),
                     ({"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 2, 2, 1], "ceil_mode": 1},
                      (1, 2, 11, 40)),
                     ({"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [1, 2], "pads": [2, 1, 1, 1]},
                      (1, 2, 12, 30)),
                     ({"kernel_shape": [5], "pads": [1, 3]}, (2, 2, 40))]


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
@pytest.mark.parametrize(("attributes", "x_shape"), [case[:2] for case in POOL_CASES] + NATIVE_POOL_CASES)
def test_max_pool_native(dtype, attributes, x_shape, monkeypatch):
    """Y alone in eager CPU inference: the native kernel's max_pool (float32, uint8, int8; nn.native_max_pool),
    equal to onnxruntime and, bit for bit, to torch's pooling (the path without the kernel), NaN included."""
    if not kernel.load("int8"):
        pytest.skip("no native kernel here: torch's pooling is tested above")
    calls, native = [], nn_modules.native_max_pool
    monkeypatch.setattr(nn_modules, "native_max_pool", lambda *args: calls.append(1) or native(*args))
    x = RNG.standard_normal(x_shape).astype(np.float32) * 50
    x = x if dtype == np.float32 else x.clip(*((0, 255) if dtype == np.uint8 else (-128, 127))).astype(dtype)
    model = _node_model("MaxPool", x_shape, 12, dtype=dtype, **attributes)[0]
    module = check(model, {"x": x})
    if dtype == np.float32:
        x.reshape(-1)[::7] = np.nan
    with torch.no_grad():
        got = module(torch.from_numpy(x))
        with monkeypatch.context() as python:
            python.setattr(nn_modules.kernel, "load", lambda *_: False)
            want = onnx2torch_rnn.convert(model)(torch.from_numpy(x))
    assert len(calls) == 2 and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_max_pool_large_float_maps_use_torch(monkeypatch):
    """A float32 map of more than nn._NATIVE_FLOAT_POOL_VALUES values pools through torch (vectorised: faster than
    the native kernel's loop there), equal to onnxruntime; test_max_pool_native: smaller ones native."""
    calls, native = [], nn_modules.native_max_pool
    monkeypatch.setattr(nn_modules, "native_max_pool", lambda *args: calls.append(1) or native(*args))
    x_shape = (1, 2, 48, 48)
    assert math.prod(x_shape) > nn_modules._NATIVE_FLOAT_POOL_VALUES
    x = RNG.standard_normal(x_shape).astype(np.float32)
    module = check(*_node_model("MaxPool", x_shape, 12, kernel_shape=[2, 2], strides=[2, 2]))
    with torch.no_grad():
        module(torch.from_numpy(x))
    assert calls == []


@pytest.mark.parametrize(("opset", "attributes", "x_shape"), list(_pool_cases("AveragePool")))
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(opset, attributes, x_shape, count_include_pad):
    check(*_node_model("AveragePool", x_shape, opset, count_include_pad=count_include_pad, **attributes))


@pytest.mark.parametrize(("opset", "attributes", "x_shape"), list(_pool_cases("LpPool")))
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(opset, attributes, x_shape, p):
    check(*_node_model("LpPool", x_shape, opset, p=p, **attributes), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("x_shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("opset", [7, 22])
def test_global_pool(op, x_shape, opset):
    check(*_node_model(op, x_shape, opset))


# ----------------------------------------------------------------------------------------------- normalisation

def _norm_weights(channels: int, stats: bool = False, shape=None) -> dict:
    shape = shape or (channels,)
    weights = {"scale": RNG.standard_normal(shape).astype(np.float32),
               "bias": RNG.standard_normal(shape).astype(np.float32)}
    if stats:
        weights["mean"] = RNG.standard_normal(shape).astype(np.float32)
        weights["var"] = RNG.uniform(0.5, 2.0, shape).astype(np.float32)
    return weights


@pytest.mark.parametrize("opset", [7, 9, 14, 15, 25])
@pytest.mark.parametrize("x_shape", [(4, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_batch_normalization(opset, x_shape, kind):
    weights = _norm_weights(x_shape[1], stats=True)
    node = helper.make_node("BatchNormalization", ["x", *weights], ["y"], epsilon=1e-3, momentum=0.8)
    model, feeds = weighted_model([node], [("x", np.float32, x_shape)], weights, opset, kind)
    module = check(model, feeds)
    batch_norms = [sub for sub in module.modules() if isinstance(sub, nn.modules.batchnorm._BatchNorm)]
    assert len(batch_norms) == (kind == "initializer")
    assert all(not bn.training for bn in batch_norms)


def test_batch_normalization_spatial_0():
    weights = _norm_weights(3, stats=True, shape=(3, 4, 5))
    node = helper.make_node("BatchNormalization", ["x", *weights], ["y"], spatial=0)
    check(*weighted_model([node], [("x", np.float32, (2, 3, 4, 5))], weights, 7))


@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("x_shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batch_normalization_training_mode(opset, x_shape):
    weights = _norm_weights(3, stats=True)
    outputs = ("y", "running_mean", "running_var")
    node = helper.make_node("BatchNormalization", ["x", *weights], list(outputs), training_mode=1, momentum=0.7)
    check(*weighted_model([node], [("x", np.float32, x_shape)], weights, opset, outputs=outputs))


def test_batch_normalization_training_outputs_of_opset_9_refused():
    weights = _norm_weights(3, stats=True)
    outputs = [("y", np.float32, (4, 3, 5))] + [(name, np.float32, (3,)) for name in ("m", "v", "sm", "sv")]
    node = helper.make_node("BatchNormalization", ["x", *weights], [o[0] for o in outputs])
    model, _ = weighted_model([node], [("x", np.float32, (4, 3, 5))], weights, 9, outputs=outputs)
    with pytest.raises(onnx2torch_rnn.UnsupportedAttributeError, match="training"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("opset", [7, 22])
@pytest.mark.parametrize("x_shape", [(2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_instance_normalization(opset, x_shape, kind):
    weights = _norm_weights(x_shape[1])
    node = helper.make_node("InstanceNormalization", ["x", *weights], ["y"], epsilon=1e-4)
    module = check(*weighted_model([node], [("x", np.float32, x_shape)], weights, opset, kind))
    assert _count(module, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d) == (kind == "initializer")


@pytest.mark.parametrize("opset", [17, 25])
@pytest.mark.parametrize(("axis", "x_shape"), [(-1, (2, 3, 5)), (1, (2, 3, 4)), (-2, (2, 3, 4)), (0, (2, 3))])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", [("y",), ("y", "mean", "inv_std_dev")])
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_layer_normalization(opset, axis, x_shape, bias, outputs, kind):
    shape = x_shape[axis % len(x_shape):]
    weights = _norm_weights(0, shape=shape)
    if not bias:
        del weights["bias"]
    node = helper.make_node("LayerNormalization", ["x", *weights], list(outputs), axis=axis, epsilon=1e-3)
    module = check(*weighted_model([node], [("x", np.float32, x_shape)], weights, opset, kind, outputs=outputs))
    assert _count(module, nn.LayerNorm) == (kind == "initializer" and len(outputs) == 1)


@pytest.mark.parametrize("opset", [23, 25])
@pytest.mark.parametrize(("axis", "x_shape", "scale_shape"),
                         [(-1, (2, 3, 5), (5,)), (1, (2, 3, 4), (3, 4)), (-2, (2, 3, 4), (1, 4)), (0, (2, 3), (2, 3))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_rms_normalization(opset, axis, x_shape, scale_shape, dtype, kind):
    weights = {"scale": RNG.standard_normal(scale_shape).astype(dtype)}
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-3)
    tolerance = {"rtol": 1e-3, "atol": 1e-3} if dtype == np.float16 else {}  # float16's ulp; ORT rounds apart
    check(*weighted_model([node], [("x", dtype, x_shape)], weights, opset, kind), **tolerance)


@pytest.mark.parametrize("stash_type", [onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16])
def test_rms_normalization_stash_type(stash_type):
    """The statistics are computed in stash_type (onnxruntime supports only float32: compared with numpy). The
    magnitudes make the squares overflow in exactly one of float32 and the stash type, so ignoring it fails."""
    x = (RNG.standard_normal((2, 3, 4)) * (1e20 if stash_type == onnx.TensorProto.DOUBLE else 300)).astype(np.float32)
    scale = RNG.standard_normal(4).astype(np.float32)
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], stash_type=stash_type)
    model = make_model([node], [("x", np.float32, x.shape), ("scale", np.float32, scale.shape)], ["y"], opset=23)
    stash = onnx.helper.tensor_dtype_to_np_dtype(stash_type).type
    xs = x.astype(stash)
    with np.errstate(over="ignore"):  # float16's squares are inf, so its outputs are 0
        want = (xs / np.sqrt(np.mean(xs * xs, axis=-1, keepdims=True) + stash(1e-5))).astype(np.float32) * scale
    got = onnx2torch_rnn.convert(model)(torch.from_numpy(x), torch.from_numpy(scale)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6 if stash == np.float64 else 1e-3, atol=1e-6, strict=True)


@pytest.mark.parametrize(("opset", "per_group"), [(18, True), (21, False), (25, False)])
@pytest.mark.parametrize(("num_groups", "x_shape"), [(2, (2, 4, 5)), (3, (2, 6, 3, 4)), (1, (1, 4, 3, 3))])
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_group_normalization(opset, per_group, num_groups, x_shape, kind, monkeypatch):
    if opset == 18:  # onnx's checker refuses the deprecated opset-18 op, which onnxruntime still runs
        monkeypatch.setattr(onnx.checker, "check_model", lambda *args, **kwargs: None)
    weights = _norm_weights(num_groups if per_group else x_shape[1])
    node = helper.make_node("GroupNormalization", ["x", *weights], ["y"], num_groups=num_groups, epsilon=1e-3)
    module = check(*weighted_model([node], [("x", np.float32, x_shape)], weights, opset, kind,
                                   outputs=[("y", np.float32, x_shape)]))
    assert _count(module, nn.GroupNorm) == (kind == "initializer")


@pytest.mark.parametrize("opset", [7, 13])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("x_shape", [(2, 6, 4, 5), (1, 5, 3)])
def test_lrn(opset, size, x_shape):
    """onnxruntime runs odd sizes on 4-D inputs only: the others are checked against onnx's reference."""
    attributes = {"size": size, "alpha": 0.2, "beta": 0.6, "bias": 2.0}
    model, feeds = _node_model("LRN", x_shape, opset, **attributes)
    if size % 2 and len(x_shape) == 4:
        expected = check(model, feeds)(torch.from_numpy(feeds["x"])).numpy()
        np.testing.assert_allclose(_lrn_reference(feeds["x"], **attributes), expected, rtol=1e-5, atol=1e-6)
    else:  # onnxruntime refuses these; onnx's reference evaluator is wrong for channels >= batch size
        module = onnx2torch_rnn.convert(model)
        np.testing.assert_allclose(module(torch.from_numpy(feeds["x"])).numpy(),
                                   _lrn_reference(feeds["x"], **attributes), rtol=1e-5, atol=1e-6)


def _lrn_reference(x, size, alpha, beta, bias):
    """The spec's formula, element by element over channels."""
    channels = x.shape[1]
    square_sum = np.zeros_like(x)
    for c in range(channels):
        low, high = max(0, c - (size - 1) // 2), min(channels - 1, c + -(-(size - 1) // 2))
        square_sum[:, c] = (x[:, low:high + 1] ** 2).sum(1)
    return x / (bias + alpha / size * square_sum) ** beta


# ----------------------------------------------------------------------------------------------- Attention

BATCH, Q_LEN, KV_LEN, PAST_LEN, HEAD, V_HEAD = 2, 3, 4, 2, 8, 6
# onnxruntime refuses 1-D masks (the conformance cases have one)
MASK_SHAPES = {"bool2": (np.bool_, ("q", "kv")), "float2": (np.float32, ("q", "kv")),
               "bool4": (np.bool_, (BATCH, "qh", "q", "kv")), "float3": (np.float32, (1, "q", "kv"))}


def _attention_model(opset, rank=4, heads=(2, 2), mask=None, past=False, mode=None, nonpad=False, dtype=np.float32,
                     q_len=Q_LEN, kv_len=KV_LEN, mask_len=None, **attributes):
    """A one-Attention model: Q/K/V (3-D with the head attributes or 4-D), optional mask, cache and qk output."""
    q_heads, kv_heads = heads
    shapes = {"Q": (BATCH, q_heads, q_len, HEAD), "K": (BATCH, kv_heads, kv_len, HEAD),
              "V": (BATCH, kv_heads, kv_len, V_HEAD)}
    if rank == 3:
        shapes = {name: (b, n, h * d) for name, (b, h, n, d) in shapes.items()}
        attributes.update(q_num_heads=q_heads, kv_num_heads=kv_heads)
    inputs = [(name, dtype, shape) for name, shape in shapes.items()]
    names = ["Q", "K", "V", "", "", "", ""]
    if mask is not None:
        mask_dtype, dims = MASK_SHAPES[mask]
        sizes = {"q": q_len, "kv": mask_len or kv_len + PAST_LEN * past, "qh": q_heads}
        mask_dtype = dtype if mask_dtype == np.float32 else mask_dtype
        inputs.append(("attn_mask", mask_dtype, [sizes.get(d, d) for d in dims]))
        names[3] = "attn_mask"
    if past:
        inputs += [("past_key", dtype, (BATCH, kv_heads, PAST_LEN, HEAD)),
                   ("past_value", dtype, (BATCH, kv_heads, PAST_LEN, V_HEAD))]
        names[4:6] = ["past_key", "past_value"]
    if nonpad:
        inputs.append(("nonpad_kv_seqlen", np.int64, (BATCH,)))
        names[6] = "nonpad_kv_seqlen"
    outputs = ["Y", "present_key" if past else "", "present_value" if past else "", "qk" if mode is not None else ""]
    if mode:
        attributes["qk_matmul_output_mode"] = mode
    while names[-1] == "":
        names.pop()
    while outputs[-1] == "":
        outputs.pop()
    node = helper.make_node("Attention", names, outputs, **attributes)
    return make_model([node], inputs, [o for o in outputs if o], opset=opset)


def _check_attention(model, feeds=None, rtol=1e-4, atol=1e-5):
    """``check`` against onnxruntime, except that onnxruntime's qk_matmul_output (mode 2) has the float's lowest
    value where the spec's bias is -inf (a bool mask, causal, window or padding): read as -inf."""
    feeds = random_inputs(model) if feeds is None else feeds
    expected = run_onnxruntime(model, feeds)
    actual = run_torch(onnx2torch_rnn.convert(model), model, feeds)
    for output, want, got in zip(model.graph.output, expected, actual, strict=True):
        if output.name == "qk":
            want = np.where(want == np.finfo(want.dtype).min, -np.inf, want)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, strict=True, err_msg=f"output {output.name!r}")


@parametrize_pairwise(opset=[23, 24, 25], rank=[3, 4], heads=[(2, 2), (4, 2), (4, 1)], is_causal=[0, 1],
                      scale=[None, 0.1], softcap=[0.0, 2.0], mask=[None, *MASK_SHAPES], past=[False, True],
                      mode=[None, 0, 1, 2, 3], softmax_precision=[None, 1, 11])
def test_attention(opset, rank, heads, is_causal, scale, softcap, mask, past, mode, softmax_precision):
    attributes = {name: value for name, value in [("scale", scale), ("softmax_precision", softmax_precision)]
                  if value is not None}
    model = _attention_model(opset, rank, heads, mask, past, mode, is_causal=is_causal, softcap=softcap,
                             **attributes)
    _check_attention(model)


@pytest.mark.parametrize("opset", [24, 25])
@pytest.mark.parametrize("is_causal", [0, 1])
@pytest.mark.parametrize("mask", [None, "bool2", "float3"])
@pytest.mark.parametrize("q_len", [1, 3, 5])
def test_attention_nonpad_kv_seqlen(opset, is_causal, mask, q_len):
    """An external cache: keys past nonpad_kv_seqlen masked, the causal frontier offset per batch (a query block
    longer than the valid keys has fully masked leading rows, which are zero)."""
    model = _attention_model(opset, 4, (4, 2), mask, nonpad=True, q_len=q_len, kv_len=6, is_causal=is_causal)
    feeds = random_inputs(model)
    feeds["nonpad_kv_seqlen"] = np.array([2, 6], np.int64)
    check(model, feeds)


@pytest.mark.parametrize(("left", "right"), [(2, -1), (1, 2), (0, 0), (-1, 1), (-1, -1)])
@pytest.mark.parametrize("is_causal", [0, 1])
@pytest.mark.parametrize("cache", ["none", "past", "nonpad"])
@pytest.mark.parametrize("mask", [None, "bool2", "float3"])
def test_attention_window(left, right, is_causal, cache, mask):
    model = _attention_model(25, 4, (2, 1), mask, past=cache == "past", nonpad=cache == "nonpad", kv_len=5,
                             left_window_size=left, right_window_size=right, is_causal=is_causal)
    feeds = random_inputs(model)
    if cache == "nonpad":
        feeds["nonpad_kv_seqlen"] = np.array([3, 5], np.int64)
    check(model, feeds)


@pytest.mark.parametrize("mode", [None, 3])
@pytest.mark.parametrize("is_causal", [0, 1])
def test_attention_float16(mode, is_causal):
    model = _attention_model(23, 4, (4, 2), "float2", past=True, mode=mode, dtype=np.float16, is_causal=is_causal)
    check(model, rtol=2e-3, atol=2e-3)  # float16 ulps: onnxruntime rounds its intermediates apart


@pytest.mark.parametrize("mask", ["bool2", "float2"])
def test_attention_short_mask(mask):
    """A mask shorter than the keys masks the keys past it (the spec; onnxruntime refuses: the reference is the
    oracle)."""
    model = _attention_model(24, 4, (2, 2), mask, mask_len=2)
    check_reference(model, random_inputs(model))


def test_attention_qk_raw_before_softcap():
    """qk_matmul_output_mode=0 is the QK product before softcap (onnxruntime and the spec)."""
    check(_attention_model(23, 4, (2, 2), mode=0, softcap=0.5))


@pytest.mark.parametrize(("attributes", "message"), [({"softcap": -1.0}, "softcap"),
                                                      ({"qk_matmul_output_mode": 4}, "qk_matmul_output_mode"),
                                                      ({"left_window_size": -2}, "left_window_size"),
                                                      ({"softmax_precision": 6}, "softmax_precision")])
def test_attention_refused(attributes, message):
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, (1, 2, 3, 4))
                                            for n in "QKV"], [helper.make_tensor_value_info("Y", 1, (1, 2, 3, 4))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    with pytest.raises(UnsupportedAttributeError, match=message):
        onnx2torch_rnn.convert(model)


# ----------------------------------------------------------------------------------------------- losses

@parametrize_pairwise(op=["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"], opset=[12, 13, 22],
                      reduction=["none", "sum", "mean"], weight=[False, True], ignore_index=[None, 0, -1, 10],
                      x_shape=[(4, 3), (2, 3, 5), (2, 4, 3, 2, 2)], dtype=[np.float32, np.float64, np.float16],
                      target_dtype=[np.int64, np.int32], log_prob=[False, True])
def test_loss(op, opset, reduction, weight, ignore_index, x_shape, dtype, target_dtype, log_prob):
    """Every output against onnxruntime; every third target is ignore_index (when given), so ignoring it, or
    dividing the mean by the wrong count, fails."""
    classes = x_shape[1]
    target = RNG.integers(0, classes, (x_shape[0], *x_shape[2:]))
    if ignore_index is not None:
        target.reshape(-1)[::3] = ignore_index
    feeds = {"x": RNG.standard_normal(x_shape).astype(dtype), "target": target.astype(target_dtype)}
    if weight:
        feeds["weight"] = RNG.random(classes).astype(dtype)
    outputs = ["loss", "log_prob"] if log_prob and op == "SoftmaxCrossEntropyLoss" else ["loss"]
    attributes = {"reduction": reduction} | ({} if ignore_index is None else {"ignore_index": ignore_index})
    node = helper.make_node(op, list(feeds), outputs, **attributes)
    model = make_model([node], [(name, value.dtype, value.shape) for name, value in feeds.items()], outputs,
                       opset=opset)
    tolerance = {"rtol": 2e-3, "atol": 2e-3} if dtype == np.float16 else {}  # float16 sums: ulps apart
    check(model, feeds, **tolerance)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_loss_mean_without_weight_ignore_minus_one(op):
    """The mean divides by the targets not ignored, also for ignore_index=-1 (onnx's reference divides by all)."""
    feeds = {"x": RNG.standard_normal((6, 3)).astype(np.float32), "target": np.array([0, -1, 2, -1, 1, 0])}
    node = helper.make_node(op, ["x", "target"], ["loss"], ignore_index=-1)
    check(make_model([node], [("x", np.float32, (6, 3)), ("target", np.int64, (6,))], ["loss"], opset=13), feeds)


def test_loss_refuses_reduction():
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], reduction="max")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (2, 3)),
                                            helper.make_tensor_value_info("t", onnx.TensorProto.INT64, (2,))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ())])
    with pytest.raises(UnsupportedAttributeError, match="reduction"):
        onnx2torch_rnn.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]))


# ----------------------------------------------------------------------------------------------- dropout

@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
@pytest.mark.parametrize("outputs", [("y",), ("y", "mask")])
def test_dropout_inference(opset, outputs):
    attributes = {"ratio": 0.3} if opset < 12 else {"seed": 3}
    specs = [("y", np.float32, (2, 3, 4)), ("mask", np.float32 if opset < 10 else np.bool_, (2, 3, 4))]
    node = helper.make_node("Dropout", ["x"], list(outputs), **attributes)
    check(*weighted_model([node], [("x", np.float32, (2, 3, 4))], {}, opset, outputs=specs[:len(outputs)]))


@pytest.mark.parametrize("opset", [12, 22])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_dropout_training_mode_zero_ratio(opset, training, kind):
    """With ratio 0 training mode keeps everything, so onnxruntime can check the wiring of both inputs."""
    weights = {"ratio": np.array(0.0, np.float32), "training_mode": np.array(training)}
    node = helper.make_node("Dropout", ["x", "ratio", "training_mode"], ["y", "mask"])
    check(*weighted_model([node], [("x", np.float32, (3, 4))], weights, opset, kind, outputs=("y", "mask")))


@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_dropout_training_mode_drops(kind):
    weights = {"ratio": np.array(0.5, np.float32), "training_mode": np.array(True)}
    node = helper.make_node("Dropout", ["x", "ratio", "training_mode"], ["y", "mask"], seed=1)
    model, feeds = weighted_model([node], [("x", np.float32, (50, 40))], weights, 13, kind, outputs=("y", "mask"))
    module = onnx2torch_rnn.convert(model)
    args = [torch.from_numpy(np.asarray(feeds[i.name])) for i in model.graph.input if i.name in feeds]
    y, mask = module(*args)
    x = torch.from_numpy(feeds["x"])
    assert mask.dtype == torch.bool and 0.4 < mask.float().mean() < 0.6
    torch.testing.assert_close(y, torch.where(mask, x * 2, torch.zeros_like(x)))


# ----------------------------------------------------------------------------------------------- rearrangement

@pytest.mark.parametrize(("opset", "mode"), [(7, None), (11, "DCR"), (11, "CRD"), (13, "DCR"), (25, "CRD")])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_depth_to_space(opset, mode, blocksize):
    attributes = {"blocksize": blocksize} | ({"mode": mode} if mode else {})
    check(*_node_model("DepthToSpace", (2, 2 * blocksize**2, 3, 4), opset, **attributes))


@pytest.mark.parametrize("opset", [7, 13, 25])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_space_to_depth(opset, blocksize):
    check(*_node_model("SpaceToDepth", (2, 3, 2 * blocksize, 3 * blocksize), opset, blocksize=blocksize))


def test_depth_to_space_opset_28():
    model, feeds = _node_model("DepthToSpace", (2, 8, 3, 4), 28, blocksize=2, mode="CRD")
    check_reference(model, feeds)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_28_inverts_depth_to_space(mode):
    """onnxruntime stops at opset 25: opset 28's SpaceToDepth mode is checked as DepthToSpace's inverse."""
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["d"], blocksize=2, mode=mode),
             helper.make_node("DepthToSpace", ["d"], ["y"], blocksize=2, mode=mode)]
    model = make_model(nodes, [("x", np.float32, (2, 3, 4, 6))], ["y"], opset=28)
    x = torch.from_numpy(RNG.standard_normal((2, 3, 4, 6)).astype(np.float32))
    torch.testing.assert_close(onnx2torch_rnn.convert(model)(x), x, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------- Pad

PAD_CASES = [  # (pads over all axes, or (pads, axes))
    [0, 0, 1, 2, 0, 0, 2, 1],
    [1, 0, 0, 1, 0, 2, 1, 0],
    [0, 0, -1, 2, 0, 0, 1, -2],
    ([1, 2, 2, 0], [2, 3]),
    ([2, 1], [-1]),
]


def _pad_cases():
    for opset in (7, 11, 13, 18, 19, 21, 25):
        for mode in ("constant", "reflect", "edge", "wrap")[: 4 if opset >= 19 else 3]:
            for case in PAD_CASES:
                pads, axes = case if isinstance(case, tuple) else (case, None)
                if axes and opset < 18:
                    continue
                for kind in ("initializer", "input") if opset >= 11 else ("initializer",):
                    yield opset, mode, pads, axes, kind


@pytest.mark.parametrize(("opset", "mode", "pads", "axes", "kind"), list(_pad_cases()))
def test_pad(opset, mode, pads, axes, kind):
    x_shape = (2, 3, 4, 5)
    if opset < 11:
        check(*_node_model("Pad", x_shape, opset, mode=mode, pads=pads, value=1.5))
        return
    weights = {"pads": np.array(pads, np.int64), "value": np.array(1.5, np.float32)}
    if axes:
        weights["axes"] = np.array(axes, np.int64)
    node = helper.make_node("Pad", ["x", *weights], ["y"], mode=mode)
    check(*weighted_model([node], [("x", np.float32, x_shape)], weights, opset, kind,
                          outputs=[("y", np.float32, [None] * len(x_shape))]))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_pad_dtypes(dtype):
    weights = {"pads": np.array([1, 0, 0, 2], np.int64)}
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")
    check(*weighted_model([node], [("x", dtype, (3, 4))], weights, 13))


def test_pad_without_value():
    node = helper.make_node("Pad", ["x", "pads", ""], ["y"], mode="reflect")
    check(*weighted_model([node], [("x", np.float32, (3, 4))], {"pads": np.array([1, 2, 2, 1], np.int64)}, 13))


def test_pad_unknown_mode_refused():
    model, _ = _node_model("Pad", (3, 4), 7, mode="wrap", pads=[1, 1, 1, 1])
    with pytest.raises(onnx2torch_rnn.UnsupportedAttributeError, match="mode"):
        onnx2torch_rnn.convert(model)


# ----------------------------------------------------------------------------------------------- Resize

def _resize_model(opset, x_shape, kind="initializer", scales=None, sizes=None, roi=None, dtype=np.float32,
                  **attributes):
    """A Resize model: roi/scales/sizes as initializers or graph inputs; absent ones empty (opset 11) or ''."""
    weights, names = {}, ["x"]
    if opset >= 11:
        for name, value, np_type in (("roi", roi, np.float32), ("scales", scales, np.float32), ("sizes", sizes, None)):
            if value is not None:
                weights[name] = np.array(value, np_type or np.int64)
                names.append(name)
            elif opset == 11 and name != "sizes":
                weights[name] = np.array([], np.float32)
                names.append(name)
            elif name != "sizes":
                names.append("")
    else:
        weights["scales"] = np.array(scales, np.float32)
        names.append("scales")
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attributes)
    return weighted_model([node], [("x", dtype, x_shape)], weights, opset, kind,
                          outputs=[("y", dtype, [None] * len(x_shape))])


# onnxruntime's nearest path rounds coordinates within ~1e-6 of a .5 tie unlike its own float32 formula (which its
# linear path follows), so nearest cases avoid scales that put a coordinate a few ulps from a tie.
UP, DOWN, MIXED = [1, 1, 2.0, 1.5], [1, 1, 0.5, 0.75], [1, 1, 1.7, 0.7]
COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
               "half_pixel_symmetric"]


def _resize_cases(mode):
    for opset in (11, 13, 19):
        for coordinate in COORDINATES:
            if (coordinate == "half_pixel_symmetric" and opset < 19) or (coordinate == "tf_half_pixel_for_nn"
                                                                         and opset > 11):
                continue
            for scales in (UP, DOWN, MIXED):
                yield opset, coordinate, scales


@pytest.mark.parametrize(("opset", "coordinate", "scales"), list(_resize_cases("nearest")))
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest(opset, coordinate, scales, nearest_mode):
    check(*_resize_model(opset, (2, 3, 5, 7), scales=scales, mode="nearest", coordinate_transformation_mode=coordinate,
                         nearest_mode=nearest_mode))


@pytest.mark.parametrize(("x_shape", "flat"), [((2, 3, 5, 7), True), ((1, 2, 100, 200), False)])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8, np.int32])
def test_resize_nearest_gathers(x_shape, flat, dtype):
    """Static nearest resizing in eager calls: a small output is one gather of the whole tensor by a kept flat index
    (the native take, else torch.take), a large one a gather per resized axis; onnxruntime's values either way."""
    x = RNG.integers(0, 127, x_shape).astype(dtype)
    module = check(_resize_model(13, x_shape, scales=[1, 1, 2.0, 1.5], mode="nearest", dtype=dtype)[0], {"x": x})
    (kept,) = next(m for m in module.modules() if isinstance(m, nn_modules.Resize)).__dict__["_geometries"].values()
    assert isinstance(kept, torch.Tensor) == flat


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float16, torch.float32, torch.int64])
def test_native_take_is_torch_take(dtype):
    """The native kernel's take (a small image's nearest Resize) moves values of every size as torch.take does, and
    refuses an index out of range."""
    if not kernel.load("int8"):
        pytest.skip("no native kernel here")
    x = torch.arange(60).reshape(3, 4, 5).to(dtype)
    index = torch.randint(0, 60, (2, 7, 3), generator=torch.Generator().manual_seed(0))
    native = torch.ops.onnx2torch_rnn.take(x, index)
    assert native.dtype == dtype and native.shape == index.shape
    assert torch.equal(native, torch.take(x, index)) and torch.equal(nn_modules._take(x, index), native)
    with pytest.raises(RuntimeError, match="take: an index out of range"):
        torch.ops.onnx2torch_rnn.take(x, torch.tensor([60]))


@pytest.mark.parametrize(("opset", "coordinate", "scales"), list(_resize_cases("linear")))
@pytest.mark.parametrize("x_shape", [(2, 3, 5, 7), (5, 7)])
def test_resize_linear(opset, coordinate, scales, x_shape):
    scales = scales[-len(x_shape):]
    check(*_resize_model(opset, x_shape, scales=scales, mode="linear", coordinate_transformation_mode=coordinate))


@pytest.mark.parametrize("x_shape", [(1, 2, 4, 5, 6), (4, 5, 6)])
@pytest.mark.parametrize("scales", [[2.0, 0.5, 1.5], [0.7, 1.3, 0.5]])
def test_resize_trilinear(x_shape, scales):
    scales = [1.0] * (len(x_shape) - 3) + scales
    check(*_resize_model(13, x_shape, scales=scales, mode="linear"))


@pytest.mark.parametrize(("opset", "coordinate", "scales"), list(_resize_cases("cubic")))
@pytest.mark.parametrize(("cubic_coeff_a", "exclude_outside"), [(-0.75, 0), (-0.5, 1), (-0.6, 0)])
def test_resize_cubic(opset, coordinate, scales, cubic_coeff_a, exclude_outside):
    check(*_resize_model(opset, (2, 3, 5, 7), scales=scales, mode="cubic", coordinate_transformation_mode=coordinate,
                         cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside))


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [UP, DOWN, [1, 1, 3.0, 2.0]])
def test_resize_opset_10_semantics(opset, mode, scales):
    """Opset 10 is asymmetric with onnxruntime's legacy nearest rounding; opset 13 with the same attributes."""
    attributes = {} if opset == 10 else {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    if opset == 10 or mode == "linear" or min(scales) >= 1:
        check(*_resize_model(opset, (2, 3, 5, 7), scales=scales, mode=mode, **attributes))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize(("roi", "extrapolation_value"), [([0, 0, 0.2, 0.1, 1, 1, 0.8, 0.9], 0.0),
                                                          ([0, 0, -0.3, 0.4, 1, 1, 1.2, 0.7], -2.5),
                                                          ([0, 0, 0.5, 0.5, 1, 1, 0.5, 0.5], 1.0)])
@pytest.mark.parametrize("opset", [11, 19])
def test_resize_tf_crop_and_resize(mode, roi, extrapolation_value, opset):
    check(*_resize_model(opset, (1, 2, 6, 7), sizes=[1, 2, 4, 5], roi=roi, mode=mode,
                         coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=extrapolation_value))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [[2, 3, 9, 4], [2, 3, 1, 1], [2, 3, 5, 7]])
@pytest.mark.parametrize("opset", [11, 13, 19, 25])
def test_resize_sizes(mode, sizes, opset):
    check(*_resize_model(opset, (2, 3, 5, 7), sizes=sizes, mode=mode))


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize(("axes", "sizes", "mode"), [(None, [2, 3, 9, 8], "nearest"), ([2, 3], [4, 9], "nearest"),
                                                     ([2, 3], [4, 9], "linear"), ([3, 2], [12, 4], "linear")])
def test_resize_axes_and_aspect_ratio(policy, axes, sizes, mode):
    attributes = {"keep_aspect_ratio_policy": policy} | ({"axes": axes} if axes else {})
    check(*_resize_model(18, (2, 3, 5, 7), sizes=sizes, mode=mode, **attributes))


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_negative_axes(policy):
    """onnxruntime ignores negative axes under keep_aspect_ratio_policy (it resizes nothing); the spec counts them
    from the back, so they must convert like their positive equivalents."""
    x = torch.from_numpy(RNG.standard_normal((2, 3, 5, 7)).astype(np.float32))
    negative, _ = _resize_model(18, (2, 3, 5, 7), sizes=[3, 9], axes=[-1, -2], mode="linear",
                                keep_aspect_ratio_policy=policy)
    positive, _ = _resize_model(18, (2, 3, 5, 7), sizes=[3, 9], axes=[3, 2], mode="linear",
                                keep_aspect_ratio_policy=policy)
    check(positive)
    torch.testing.assert_close(onnx2torch_rnn.convert(negative)(x), onnx2torch_rnn.convert(positive)(x))


@pytest.mark.parametrize(("axes", "scales", "roi"), [([2, 3], [0.5, 2.0], [0.1, 0.2, 0.9, 0.8]),
                                                     ([3], [1.5], [0.2, 0.7])])
def test_resize_axes_scales_roi(axes, scales, roi):
    check(*_resize_model(19, (2, 3, 5, 7), scales=scales, roi=roi, axes=axes, mode="linear",
                         coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.0))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 0.5, 0.3], [1, 1, 0.8, 0.45], [1, 1, 1.5, 0.6], [1, 1, 2.0, 3.0]])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("coordinate", ["half_pixel", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric"])
def test_resize_antialias(mode, scales, exclude_outside, coordinate):
    check(*_resize_model(19, (1, 2, 9, 11), scales=scales, mode=mode, antialias=1, exclude_outside=exclude_outside,
                         coordinate_transformation_mode=coordinate))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", [[1, 2, 4, 5], [1, 2, 12, 15]])
def test_resize_antialias_tf_crop_and_resize(mode, sizes):
    check(*_resize_model(19, (1, 2, 9, 11), sizes=sizes, roi=[0, 0, -0.2, 0.1, 1, 1, 1.1, 0.8], mode=mode,
                         antialias=1, coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=2.0))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_run_time_inputs(mode):
    """Run-time scales/sizes/roi are read in forward."""
    check(*_resize_model(13, (1, 2, 5, 6), "input", scales=[1, 1, 1.5, 0.5], mode=mode))
    check(*_resize_model(13, (1, 2, 5, 6), "input", sizes=[1, 2, 7, 4], mode=mode))
    check(*_resize_model(13, (1, 2, 5, 6), "input", sizes=[1, 2, 7, 4], roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9],
                         mode=mode, coordinate_transformation_mode="tf_crop_and_resize"))


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int8])
def test_resize_nearest_integers(dtype):
    model, _ = _resize_model(13, (1, 2, 4, 5), scales=[1, 1, 1.5, 2.5], dtype=dtype, mode="nearest")
    check(model, {"x": RNG.integers(0, 100, (1, 2, 4, 5)).astype(dtype)})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_tables_kept_per_size(mode):
    """The per-axis tables are kept between calls per input size: calls at changing sizes each match onnxruntime."""
    model, _ = _resize_model(13, ("n", "c", "h", "w"), scales=[1, 1, 1.5, 0.75], mode=mode)
    module = onnx2torch_rnn.convert(model)
    for shape in [(1, 2, 4, 5), (2, 1, 7, 3), (1, 2, 4, 5), (1, 1, 9, 8), (2, 1, 7, 3)]:
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(run_torch(module, model, feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-5,
                                   atol=1e-6, strict=True)


def test_resize_linear_integers_refused():
    model, _ = _resize_model(13, (1, 2, 4, 5), scales=[1, 1, 2, 2], dtype=np.uint8, mode="linear")
    with pytest.raises(onnx2torch_rnn.UnsupportedAttributeError, match="mode"):
        onnx2torch_rnn.convert(model)


def test_resize_antialias_nearest_refused():
    model, _ = _resize_model(18, (1, 2, 4, 5), scales=[1, 1, 0.5, 0.5], mode="nearest", antialias=1)
    with pytest.raises(onnx2torch_rnn.UnsupportedAttributeError, match="antialias"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 3.0], [1, 1, 1.5, 2.5]])
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_upsample(opset, mode, scales, kind):
    if opset == 7:
        if kind == "input":
            return
        node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)
        model, feeds = weighted_model([node], [("x", np.float32, (1, 2, 4, 5))], {}, opset,
                                      outputs=[("y", np.float32, [None] * 4)])
    else:
        node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)
        model, feeds = weighted_model([node], [("x", np.float32, (1, 2, 4, 5))],
                                      {"scales": np.array(scales, np.float32)}, opset, kind,
                                      outputs=[("y", np.float32, [None] * 4)])
    check(model, feeds)


# ----------------------------------------------------------------------------------------------- GridSample

def _check_grid_sample(opset, mode, padding_mode, align_corners, x_shape, grid_shape, dtype=np.float32):
    """Grid points reach past [-1, 1], so every padding mode matters."""
    feeds = {"x": RNG.standard_normal(x_shape).astype(dtype),
             "grid": RNG.uniform(-1.3, 1.3, grid_shape).astype(dtype)}
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding_mode,
                            align_corners=align_corners)
    check(make_model([node], [("x", dtype, x_shape), ("grid", dtype, grid_shape)], ["y"], opset=opset), feeds)


@parametrize_pairwise(opset=[16, 20, 22], mode=[0, 1, 2], padding_mode=["zeros", "border", "reflection"],
                      align_corners=[0, 1], dtype=[np.float32, np.float64])
def test_grid_sample(opset, mode, padding_mode, align_corners, dtype):
    mode = (("bilinear", "nearest", "bicubic") if opset < 20 else ("linear", "nearest", "cubic"))[mode]
    dtype = np.float32 if opset == 16 else dtype  # onnxruntime's opset-16 kernel is float32 only
    _check_grid_sample(opset, mode, padding_mode, align_corners, (2, 3, 4, 5), (2, 3, 6, 2), dtype)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    _check_grid_sample(22, mode, padding_mode, align_corners, (1, 2, 3, 4, 5), (1, 2, 3, 4, 3))


def test_grid_sample_refuses_3d_cubic():
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode="cubic")
    model = make_model([node], [("x", np.float32, (1, 1, 2, 2, 2)), ("grid", np.float32, (1, 2, 2, 2, 3))], ["y"],
                       opset=22)
    with pytest.raises(UnsupportedAttributeError, match="cubic"):
        onnx2torch_rnn.convert(model)


# ----------------------------------------------------------------------------------------------- dtypes

FLOAT16_CASES = [
    ("Conv", {"w": (3, 2, 3, 3), "b": (3,)}, {"pads": [1, 0, 1, 1]}),
    ("ConvTranspose", {"w": (2, 3, 3, 3), "b": (3,)}, {"strides": [2, 2]}),
    ("BatchNormalization", {"scale": (2,), "bias": (2,), "mean": (2,), "var": (2,)}, {}),
    ("InstanceNormalization", {"scale": (2,), "bias": (2,)}, {}),
    ("AveragePool", {}, {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]}),
    ("MaxPool", {}, {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]}),
]


@pytest.mark.parametrize(("op", "shapes", "attributes"), FLOAT16_CASES)
@pytest.mark.parametrize("kind", ["initializer", "input"])
def test_float16(op, shapes, attributes, kind):
    """float16 in, float16 out; tolerances sized for float16's 11-bit mantissa."""
    weights = {name: RNG.uniform(0.5, 1.5, shape).astype(np.float16) for name, shape in shapes.items()}
    node = helper.make_node(op, ["x", *weights], ["y"], **attributes)
    check(*weighted_model([node], [("x", np.float16, (1, 2, 5, 6))], weights, 17, kind,
                          outputs=[("y", np.float16, [None] * 4)]), rtol=2e-3, atol=2e-3)


def test_resize_float16():
    model, feeds = _resize_model(13, (1, 2, 5, 6), scales=[1, 1, 2, 1.5], mode="linear", dtype=np.float16)
    check(model, feeds, rtol=2e-3, atol=2e-3)  # float16 precision
