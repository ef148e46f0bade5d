"""Shape arithmetic traced back to tensor sizes (shape_arithmetic.py) and written as fx integer nodes: the tracing
reads nodes as converters do, what it knows at conversion is computed there, its division truncates as ONNX's does,
and the ints stay symbolic under torch.compile / torch.export (tests/test_export.py runs the exporters' patterns)."""

from __future__ import annotations

import gc
import operator
import pickle
import weakref

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from torch import fx

import onnx2torch_rnn
from onnx2torch_rnn.builder import ConversionContext
from onnx2torch_rnn.loading import load_model
from onnx2torch_rnn.modules import elementwise as ew
from onnx2torch_rnn.modules.common import trunc_div
from onnx2torch_rnn.shape_arithmetic import ARITHMETIC, FxSizes, ShapeArithmetic, is_symbolic
from tests.helpers import check, make_model
from tests.shape_patterns import pattern_model, x_of

I64, F32 = np.int64, np.float32
RNG = np.random.default_rng(0)


def _flatten_model(cast: dict | None = None, opset: int = 17):
    """x [N, 3, 4] -> Reshape(x, [N, -1]) with N read from Shape(x) (optionally through a Cast)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0)]
    if cast is not None:
        nodes.append(helper.make_node("Cast", ["n"], ["n_cast"], **cast))
    nodes += [helper.make_node("Unsqueeze", ["n_cast" if cast is not None else "n", "axes0"], ["n1"]),
              helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
              helper.make_node("Reshape", ["x", "target"], ["y"])]
    return make_model(nodes, [("x", F32, ["N", 3, 4])], [("y", F32, ["N", 12])],
                      {"zero": np.array(0, I64), "axes0": np.array([0], I64), "minus1": np.array([-1], I64)},
                      opset=opset)


def _tracer(loaded, parent: ConversionContext | None = None) -> tuple[ShapeArithmetic, fx.Node]:
    """A tracer on a graph of its own, whose only tensor is x (a placeholder)."""
    ctx = ConversionContext(loaded, loaded.proto.graph, parent=parent)
    graph = fx.Graph()
    x = graph.placeholder("x")
    return ShapeArithmetic(ctx, FxSizes(ctx, graph, {"x": x}.__getitem__)), x


def _sizes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "size"]


def test_traced_value():
    tracer, x = _tracer(load_model(_flatten_model()))
    size, rest = tracer.trace("target")
    assert (size.op, size.target, size.args, rest) == ("call_method", "size", (x, 0), -1)
    assert tracer.trace("n") is size  # each value once: the same node
    assert tracer.trace("zero") == 0 and not is_symbolic(tracer.trace("zero"))  # a constant reads no size


def test_a_converted_module_reads_sizes_as_ints():
    gm = check(_flatten_model(), {"x": RNG.standard_normal((2, 3, 4)).astype(F32)})
    reshape = next(n for n in gm.graph.nodes if n.op == "call_module")
    size = _sizes(gm)[0]
    assert reshape.args == (size.args[0], [size, -1])  # Reshape(x, [x.size(0), -1]): no Shape/Gather/Concat modules
    assert len(list(gm.children())) == 1


def test_a_node_with_an_attribute_the_tracing_does_not_read_is_not_traced():
    """The tracing reads attributes as converters do (OnnxNode): one it would ignore (as if a later opset added it;
    the checker refuses unknown ones) keeps the tensor path."""
    loaded = load_model(_flatten_model())
    gather = next(node for node in loaded.proto.graph.node if node.op_type == "Gather")
    gather.attribute.append(helper.make_attribute("later_attribute", 1))
    tracer, _ = _tracer(loaded)
    assert tracer.trace("n") is None
    assert tracer.trace("target") is None


def test_cast_attributes_are_read():
    """saturate (opset 19) only changes casts to float8: an integer Cast with it is still shape arithmetic."""
    model = _flatten_model(cast={"to": TensorProto.INT64, "saturate": 1}, opset=19)
    gm = check(model, {"x": RNG.standard_normal((2, 3, 4)).astype(F32)})
    assert _sizes(gm)


def test_the_conversion_keeps_no_state_outside_itself():
    """Nothing outside a conversion keeps what it traced: the context (and its tracers) go with it."""
    loaded = load_model(_flatten_model())
    first = ConversionContext(loaded, loaded.proto.graph)
    second = ConversionContext(loaded, loaded.proto.graph)
    assert second._declared is not first._declared
    reference = weakref.ref(first)
    del first
    gc.collect()
    assert reference() is None


def test_bodies_trace_their_own_shape_arithmetic_without_deriving():
    """A body traces its own nodes (its loop, compiled as torch.while_loop, then computes sizes from symbolic shapes),
    but derives no constant from the graph inputs' declared dims: only the main graph's module checks those."""
    loaded = load_model(_flatten_model())
    body, _ = _tracer(loaded, parent=ConversionContext(loaded, loaded.proto.graph))
    assert body.trace("target") is not None and body.ctx._derived("target") is None


def _dims_model(nodes: list, target: str, symbolic_last: bool = True):
    """x [N, M, C] -> Reshape(x, target) where ``nodes`` compute ``target`` from s = Shape(x)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), *nodes, helper.make_node("Reshape", ["x", target], ["y"])]
    constants = {f"c{i}": np.array([i], I64) for i in range(4)} | {"minus1": np.array([-1], I64)}
    used = {name for node in nodes for name in node.input}
    return make_model(nodes, [("x", F32, ["N", "M", "C" if symbolic_last else 6])], ["y"],
                      {k: v for k, v in constants.items() if k in used})


def test_arithmetic_is_written_as_python_operators():
    """[N, M * C] from Slice / ReduceProd: the graph reads as the arithmetic (x.size(1) * x.size(2))."""
    nodes = [helper.make_node("Slice", ["s", "c0", "c1"], ["n"]),
             helper.make_node("Slice", ["s", "c1", "c3"], ["mc"]),
             helper.make_node("ReduceProd", ["mc"], ["p"], keepdims=1),
             helper.make_node("Concat", ["n", "p"], ["target"], axis=0)]
    gm = check(_dims_model(nodes, "target"), {"x": RNG.standard_normal((2, 3, 4)).astype(F32)})
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [operator.mul] and "size_1 * size_2" in gm.code


@pytest.mark.parametrize("batch", [1, 2, 3, 7])
def test_division_of_a_value_that_may_be_negative_truncates(batch):
    """(N - 4) / 2 and (N - 4) / -2 truncate toward zero as ONNX's Div does (N = 1: -1, where floor division gives
    -2), in operators that fx traces again when the module is pickled; a quotient of sizes is a plain floor
    division."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "c0", "c1"], ["n"]),
             helper.make_node("Sub", ["n", "four"], ["d"]), helper.make_node("Div", ["d", "two"], ["q"]),
             helper.make_node("Add", ["q", "two"], ["k"]),
             helper.make_node("Div", ["d", "minus_two"], ["m"]), helper.make_node("Add", ["m", "two"], ["j"]),
             helper.make_node("Div", ["n", "c1"], ["n1"]),  # a size over a positive constant
             helper.make_node("Expand", ["row", "wide"], ["e"]),
             helper.make_node("Concat", ["k", "n1", "j", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["e", "target"], ["y"])]
    constants = {"c0": np.array([0], I64), "c1": np.array([1], I64), "four": np.array([4], I64),
                 "two": np.array([2], I64), "minus_two": np.array([-2], I64), "minus1": np.array([-1], I64),
                 "row": np.arange(6, dtype=F32).reshape(1, 1, 6), "wide": np.array([4, 7, 6], I64)}
    model = make_model(nodes, [("x", F32, ["N", 6])], ["y"], constants)
    x = RNG.standard_normal((batch, 6)).astype(F32)
    gm = check(model, {"x": x})
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert targets == {operator.sub, operator.add, operator.floordiv, operator.neg, torch.sym_max, torch.sym_min}
    torch.testing.assert_close(pickle.loads(pickle.dumps(gm))(torch.from_numpy(x)), gm(torch.from_numpy(x)))


def test_a_known_comparison_is_decided_at_conversion():
    """torch.onnx's "-1 means keep" (Equal(target, -1) -> Where) on sizes: a size is never -1, so no comparison is
    left in the graph, only the sizes themselves."""
    gm = check(pattern_model("expand"), {"x": x_of(3, 4).numpy()}, fuse=False)
    assert [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")] == ["size", "size"]


@pytest.mark.parametrize("batch", [2, 3])
def test_a_selection_on_a_run_time_condition_keeps_the_tensor_path(batch):
    """Where(N == 2, 1, N): a choice on a size is control flow, which fx cannot trace again (pickling), so the
    shape is read as a tensor, as ONNX computes it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "c0", "c1"], ["n"]),
             helper.make_node("Equal", ["n", "two"], ["is_two"]),
             helper.make_node("Where", ["is_two", "c1", "n"], ["w"]),
             helper.make_node("Concat", ["w", "six"], ["target"], axis=0),
             helper.make_node("Expand", ["row", "target"], ["y"])]
    constants = {"c0": np.array([0], I64), "c1": np.array([1], I64), "two": np.array([2], I64),
                 "six": np.array([6], I64), "row": np.arange(6, dtype=F32).reshape(1, 6)}
    x = RNG.standard_normal((batch, 6)).astype(F32)
    gm = check(make_model(nodes, [("x", F32, ["N", 6])], ["y"], constants), {"x": x})
    assert not [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    torch.testing.assert_close(pickle.loads(pickle.dumps(gm))(torch.from_numpy(x)), gm(torch.from_numpy(x)))


@pytest.mark.parametrize("a", range(-7, 8))
@pytest.mark.parametrize("b", [-3, -2, -1, 1, 2, 3])
def test_one_truncating_division(a, b):
    """Ints (shape arithmetic, pads) and integer tensors (Div) divide alike, truncating toward zero as C does."""
    expected = int(np.trunc(a / b))
    assert trunc_div(a, b) == ew.div(a, b) == ARITHMETIC["Div"](a, b) == expected
    assert ew.div(torch.tensor(a), torch.tensor(b)).item() == expected


@pytest.mark.parametrize("op, fn", [("Add", ew.add), ("Sub", ew.sub), ("Mul", ew.mul), ("Div", ew.div),
                                    ("Max", ew.maximum), ("Min", ew.minimum), ("Equal", ew.equal)])
def test_shape_ops_are_the_elementwise_ops_on_ints(op, fn):
    for a, b in [(7, 2), (-7, 2), (0, 5), (3, 3), (2, -4)]:
        assert ARITHMETIC[op](a, b) == fn(a, b)
    assert ARITHMETIC["Where"](True, 1, 2) == ew.where(True, 1, 2) == 1


def test_the_module_computes_nothing_it_does_not_need():
    """A traced value that no module reads as ints leaves no node behind."""
    gm = onnx2torch_rnn.convert(pattern_model("reshape"), fuse=False)
    assert len(_sizes(gm)) == 1 and not [n for n in gm.graph.nodes if n.op == "call_function"]
