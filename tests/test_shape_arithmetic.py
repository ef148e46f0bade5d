"""Shape arithmetic traced back to tensor shapes (shape_arithmetic.py): the tracing reads nodes as converters do,
its memo belongs to one conversion, and its ops mean what the element-wise ops mean."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from onnx2torch_rnn.builder import ConversionContext
from onnx2torch_rnn.loading import load_model
from onnx2torch_rnn.modules import elementwise as ew
from onnx2torch_rnn.modules import shape as m
from onnx2torch_rnn.modules.common import trunc_div
from tests.helpers import check, make_model

I64 = np.int64


def _flatten_model(cast: dict | None = None, opset: int = 17):
    """x [N, 3, 4] -> Reshape(x, [N, -1]) with N read from Shape(x) (optionally through a Cast)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0)]
    if cast is not None:
        nodes.append(helper.make_node("Cast", ["n"], ["n_cast"], **cast))
    nodes += [helper.make_node("Unsqueeze", ["n_cast" if cast is not None else "n", "axes0"], ["n1"]),
              helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
              helper.make_node("Reshape", ["x", "target"], ["y"])]
    return make_model(nodes, [("x", np.float32, ["N", 3, 4])], [("y", np.float32, ["N", 12])],
                      {"zero": np.array(0, I64), "axes0": np.array([0], I64), "minus1": np.array([-1], I64)},
                      opset=opset)


def _context(model) -> ConversionContext:
    loaded = load_model(model)
    return ConversionContext(loaded, loaded.proto.graph)


def test_traced_expression():
    ctx = _context(_flatten_model())
    assert repr(ctx.shape_expression("target")) == "concat(unsqueeze(gather(x.shape, 0)), [-1])"
    assert ctx.shape_expression("zero") is None  # a constant reads no shape: nothing to trace


def test_a_node_with_an_attribute_the_tracing_does_not_read_is_not_traced():
    """The tracing reads attributes as converters do (OnnxNode): one it would ignore (as if a later opset added it;
    the checker refuses unknown ones) keeps the tensor path."""
    loaded = load_model(_flatten_model())
    gather = next(node for node in loaded.proto.graph.node if node.op_type == "Gather")
    gather.attribute.append(helper.make_attribute("later_attribute", 1))
    ctx = ConversionContext(loaded, loaded.proto.graph)
    assert ctx.shape_expression("n") is None
    assert ctx.shape_expression("target") is None


def test_cast_attributes_are_read():
    """saturate (opset 19) only changes casts to float8: an integer Cast with it is still shape arithmetic."""
    model = _flatten_model(cast={"to": TensorProto.INT64, "saturate": 1}, opset=19)
    gm = check(model, {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)})
    assert any(isinstance(module, m.FromShapes) for module in gm.modules())


def test_the_memo_belongs_to_one_conversion():
    """Nothing outside the conversion context keeps what it traced: the context (and its memo) go with it."""
    model = _flatten_model()
    loaded = load_model(model)
    first = ConversionContext(loaded, loaded.proto.graph)
    assert first.shape_expression("target") is not None
    second = ConversionContext(loaded, loaded.proto.graph)
    assert second._shapes is not first._shapes and not second._shapes._memo
    reference = weakref.ref(first)
    del first
    gc.collect()
    assert reference() is None
    gm = onnx2torch_rnn.convert(model)  # a conversion builds its own context: the derivation is wired in
    assert any(isinstance(module, m.FromShapes) for module in gm.modules())


def test_bodies_trace_their_own_shape_arithmetic_without_deriving():
    """A body traces its own nodes (its loop, compiled as torch.while_loop, then computes sizes from symbolic shapes),
    but derives no constant from the graph inputs' declared dims: only the main graph's module checks those."""
    loaded = load_model(_flatten_model())
    outer = ConversionContext(loaded, loaded.proto.graph)
    body = ConversionContext(loaded, loaded.proto.graph, parent=outer)
    assert body.shape_expression("target") is not None and body._derived("target") is None


@pytest.mark.parametrize("a", range(-7, 8))
@pytest.mark.parametrize("b", [-3, -2, -1, 1, 2, 3])
def test_one_truncating_division(a, b):
    """Ints (shape arithmetic, pads) and integer tensors (Div) divide alike, truncating toward zero as C does."""
    expected = int(np.trunc(a / b))
    assert trunc_div(a, b) == ew.div(a, b) == m.SHAPE_OPS["Div"](a, b) == expected
    assert ew.div(torch.tensor(a), torch.tensor(b)).item() == expected


def test_shape_ops_are_the_elementwise_ops_on_ints():
    assert m.SHAPE_OPS["Max"]([1, 5], 3) == [3, 5] and m.SHAPE_OPS["Min"](4, [1, 5]) == [1, 4]
    assert m.SHAPE_OPS["Where"]([True, False], [1, 2], [3, 4]) == [1, 4]
    assert m.SHAPE_OPS["Equal"]([1, 2], 2) == [False, True]
    assert m.SHAPE_OPS["Sub"]([7], [2, 3]) == [5, 4]
