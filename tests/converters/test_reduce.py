"""Reduce* ops against onnxruntime: axes as attribute / constant input / run-time input, keepdims,
noop_with_empty_axes, empty axes, and the element types onnxruntime implements."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import onnx2torch_rnn
from onnx2torch_rnn.converters.reduce import REDUCE_OPS
from onnx2torch_rnn.modules.shape import Reduce
from tests.helpers import check, helper, initializers_to_inputs, make_model, parametrize_pairwise, run_torch

F32, I64 = np.float32, np.int64
OPS = list(REDUCE_OPS)
RNG = np.random.default_rng(0)


def data(op: str, dtype, shape=(2, 3, 4)) -> np.ndarray:
    """Inputs each op is defined on: positive sums for ReduceLogSum, small factors for ReduceProd."""
    if np.issubdtype(dtype, np.bool_):
        return RNG.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        low = 0 if op == "ReduceLogSum" or np.issubdtype(dtype, np.unsignedinteger) else -3
        return RNG.integers(low, 4, shape).astype(dtype) + (op == "ReduceLogSum")
    x = RNG.standard_normal(shape)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    if op == "ReduceProd":
        x = 0.5 + np.abs(x)
    return x.astype(dtype)


def reduce_model(op, opset, axes, keepdims, dtype=F32, noop=None, runtime=False, shape=(2, 3, 4)):
    """One Reduce node; axes go to the attribute or the input depending on the op's version at ``opset``."""
    attrs = {"keepdims": keepdims} | ({} if noop is None else {"noop_with_empty_axes": noop})
    inputs, consts = ["x"], None
    if opset >= REDUCE_OPS[op][1]:
        if axes is not None:
            inputs, consts = ["x", "axes"], {"axes": np.array(axes, I64)}
    elif axes is not None:
        attrs["axes"] = axes
    model = make_model([helper.make_node(op, inputs, ["y"], **attrs)], [("x", dtype, list(shape))], ["y"], consts,
                       opset=opset)
    moved = {}
    if runtime:
        model, moved = initializers_to_inputs(model)
    return model, {"x": data(op, dtype, shape), **moved}


@parametrize_pairwise(op=OPS, opset=[11, 13, 18, 28],  # 28: ReduceLogSum(Exp)-28, ReduceMax/Min-20
                      axes=[None, [0], [-1], [0, 2], [2, -2]], keepdims=[0, 1])
def test_reduce(op, opset, axes, keepdims):
    model, feeds = reduce_model(op, opset, axes, keepdims)
    gm = check(model, feeds)
    module = next(mod for mod in gm.modules() if isinstance(mod, Reduce))
    assert module.axes == axes  # attribute or constant input: baked either way


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes", [None, [1], [0, 2]])
def test_reduce_first_version(op, axes):
    """Opset 7: the version-1 schema (non-negative axes)."""
    model, feeds = reduce_model(op, 7, axes, 1)
    check(model, feeds)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes", [[1], [-1, 0], []])
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_run_time_axes(op, axes, noop):
    """Axes computed at run time; an empty axes tensor means all axes, or identity with noop_with_empty_axes=1."""
    opset = REDUCE_OPS[op][1]
    model, feeds = reduce_model(op, opset, axes, 0, noop=noop, runtime=True)
    gm = check(model, feeds)
    assert next(mod for mod in gm.modules() if isinstance(mod, Reduce)).axes is None


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("noop", [0, 1])
@pytest.mark.parametrize("axes", [None, []])
def test_reduce_absent_or_empty_axes(op, noop, axes):
    model, feeds = reduce_model(op, 18, axes, 1, noop=noop)
    check(model, feeds)


# Element types onnxruntime implements (beyond float32) and the opsets that allow them.
TYPES = {op: [np.float64, np.int32, I64] for op in OPS}
for _op in ("ReduceMax", "ReduceMin"):
    TYPES[_op] += [np.int8, np.uint8, np.bool_]


@pytest.mark.parametrize("op, dtype", [(op, dtype) for op, types in TYPES.items() for dtype in types])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_types(op, dtype, keepdims):
    """Integers compute in their own type as onnxruntime does (mean truncates; sqrt, log, exp results truncate)."""
    opset = 20 if dtype == np.bool_ else 18
    model, feeds = reduce_model(op, opset, [1], keepdims, dtype=dtype, shape=(3, 9, 2))
    check(model, feeds)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceL2", "ReduceLogSumExp"])
def test_reduce_float16(op):
    model, feeds = reduce_model(op, 18, [2], 0, dtype=np.float16)
    check(model, feeds, rtol=2e-3, atol=2e-3)  # float16 results: onnxruntime and torch round partial sums differently


@pytest.mark.parametrize("op", ["ReduceLogSumExp", "ReduceL2", "ReduceMean"])
def test_reduce_integer_rounding_follows_onnxruntime(op):
    """Values where computing in float and truncating once would give another answer than onnxruntime's."""
    x = np.array([[5, 4, 4, 4, 4, 4, 4, 4, 4, 4], [-5, -2, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    model, _ = reduce_model(op, 18, [1], 0, dtype=np.int32, shape=x.shape)
    check(model, {"x": x})


def test_reduce_scalar_input():
    model, feeds = reduce_model("ReduceSum", 13, None, 0, shape=())
    check(model, feeds)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [F32, np.float64, np.int32, I64, np.int8, np.uint8, np.bool_])
@pytest.mark.parametrize("axes, keepdims, runtime", [([1], 0, False), ([1], 1, True), (None, 1, False),
                                                     ([0, -2], 0, True)])
def test_reduce_max_min_over_an_empty_axis(op, dtype, axes, keepdims, runtime):
    """The spec's identity: -inf / +inf (an integer type's lowest / highest value, as onnxruntime), bool False / True
    (onnxruntime refuses bool there: the ONNX reference evaluator instead); torch's amax/amin raise IndexError."""
    model, feeds = reduce_model(op, 20, axes, keepdims, dtype=dtype, runtime=runtime, shape=(2, 0, 3))
    if dtype != np.bool_:
        check(model, feeds)
        return
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = run_torch(onnx2torch_rnn.convert(model), model, feeds)
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_array_equal(got, want, strict=True)
