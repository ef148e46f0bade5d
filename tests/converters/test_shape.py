"""Tensor and shape manipulation ops against onnxruntime: attributes, dtypes, versions, constant vs run-time inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn import UnsupportedAttributeError, UnsupportedTypeError
from onnx2torch_rnn.modules import shape as m
from tests.helpers import (
    TensorProto,
    check,
    helper,
    initializers_to_inputs,
    make_model,
    parametrize_pairwise,
    random_inputs,
    run_onnxruntime,
    run_torch,
)

F32, I64 = np.float32, np.int64
RNG = np.random.default_rng(0)


def run(nodes, inputs, outputs, opset, consts=None, runtime=False, feeds=None, **tolerance):
    """Build, optionally turn every initializer into a graph input (the run-time path), compare with onnxruntime."""
    model = make_model(nodes, inputs, outputs, consts, opset)
    moved = {}
    if runtime:
        model, moved = initializers_to_inputs(model)
    if not model.graph.input:
        return check_folded(model, **tolerance)
    return check(model, {**random_inputs(model), **(feeds or {}), **moved}, **tolerance)


def check_folded(model, rtol=1e-4, atol=1e-5):
    """check() for a model without run-time inputs: everything folds, and the GraphModule returns its constants
    (float ones as nn.Parameter, which run_torch cannot turn into numpy)."""
    gm = onnx2torch_rnn.convert(model)
    result = gm()
    actual = result if isinstance(result, tuple) else (result,)
    for want, got in zip(run_onnxruntime(model, {}), actual, strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=rtol, atol=atol, strict=True)
    return gm


def node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), **attrs)


def module_of(gm, cls):
    found = [mod for mod in gm.modules() if isinstance(mod, cls)]
    assert len(found) == 1, found
    return found[0]


def refuses(nodes, inputs, outputs, opset, attribute, consts=None):
    model = make_model(nodes, inputs, outputs, consts, opset=opset)
    with pytest.raises(UnsupportedAttributeError, match=attribute):
        onnx2torch_rnn.convert(model)


# ---- Shape / Size ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [7, 13, 25])
@pytest.mark.parametrize("dtype", [F32, I64, np.bool_])
def test_shape_and_size(opset, dtype):
    gm = run([node("Shape", ["x"], ["s"]), node("Size", ["x"], ["n"])], [("x", dtype, [2, 3, 4])], ["s", "n"], opset)
    assert module_of(gm, m.Shape) is not None


@pytest.mark.parametrize("start, end", [(None, None), (-1, None), (None, -1), (1, 2), (-10, 10), (2, 1), (0, 3)])
@pytest.mark.parametrize("opset", [15, 25])
def test_shape_start_end(start, end, opset):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    run([node("Shape", ["x"], **attrs)], [("x", F32, [2, 3, 4])], ["y"], opset)


# ---- Reshape, Flatten, Squeeze, Unsqueeze, Transpose -----------------------------------------------------------------


@pytest.mark.parametrize("opset", [7, 13, 14, 25])
@pytest.mark.parametrize("x_shape, target", [
    ([2, 3, 4], [0, -1]), ([2, 3, 4], [-1]), ([2, 3, 4], [2, 0, 4]), ([2, 3, 4], [2, -1, 2]), ([2, 3, 4], [24]),
    ([1, 2, 3, 4], [1, 0, 3, 0]), ([2, 3, 4], [-1, 1, 1]), ([1, 1], []),
])
@pytest.mark.parametrize("runtime", [False, True])
def test_reshape(opset, x_shape, target, runtime):
    gm = run([node("Reshape", ["x", "shape"])], [("x", F32, x_shape)], ["y"], opset, {"shape": np.array(target, I64)},
             runtime)
    assert module_of(gm, m.Reshape).shape == (None if runtime else target)


@pytest.mark.parametrize("runtime", [False, True])
def test_reshape_allowzero(runtime):
    model = make_model([node("Reshape", ["x", "shape"], allowzero=1)], [("x", F32, [0, 3])], ["y"],
                       {"shape": np.array([3, 0], I64)}, opset=14)
    if runtime:
        model, moved = initializers_to_inputs(model)
    check(model, {"x": np.zeros((0, 3), F32), **(moved if runtime else {})})
    zero_copied = make_model([node("Reshape", ["x", "shape"], allowzero=0)], [("x", F32, [2, 3])], ["y"],
                             {"shape": np.array([3, 0], I64)}, opset=14)
    with pytest.raises(Exception):  # noqa: B017 - 0 copies dim 1 (3): 3x3 != 6 in both runtimes
        onnx2torch_rnn.convert(zero_copied)(torch.zeros(2, 3))


@pytest.mark.parametrize("opset", [13, 25])
def test_reshape_shape_computed_at_run_time(opset):
    """The exporter pattern Shape -> Gather -> Unsqueeze -> Concat -> Reshape on a dynamic batch."""
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["batch"], axis=0),
        node("Unsqueeze", ["batch", "axes"], ["b1"]),
        node("Concat", ["b1", "tail"], ["target"], axis=0),
        node("Reshape", ["x", "target"]),
    ]
    consts = {"zero": np.array(0, I64), "axes": np.array([0], I64), "tail": np.array([-1, 0], I64)}
    outputs = [("y", F32, ["N", "M", 4]), ("batch", I64, [])]  # batch as a tensor too: the Gather module stays
    model = make_model(nodes, [("x", F32, ["N", 3, 4, 5])], outputs, consts, opset=opset)
    gm = check(model)
    assert module_of(gm, m.Reshape).shape is None  # the shape really is computed at run time
    # ... from x's shape as ints (symbolic under torch.compile / torch.export), not read back from a tensor
    reshape = next(n for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target),
                                                                                       m.Reshape))
    size, *tail = reshape.args[1]
    assert (size.op, size.target, size.args, tail) == ("call_method", "size", (reshape.args[0], 0), [-1, 0])
    assert module_of(gm, m.Gather).index == 0  # the constant scalar index is baked
    for batch in (1, 5):
        x = RNG.standard_normal((batch, 3, 4, 5)).astype(F32)
        check(model, {"x": x})


@pytest.mark.parametrize("opset, axis", [(7, 0), (7, 2), (7, 3), (11, -1), (11, -3), (13, 1), (25, -2)])
def test_flatten(opset, axis):
    run([node("Flatten", ["x"], axis=axis)], [("x", F32, [2, 3, 4])], ["y"], opset)


@pytest.mark.parametrize("opset, axes, runtime", [
    (7, [0], False), (7, None, False), (11, [-1, 0], False), (13, [0, 3], False), (13, [0, -1], True),
    (13, None, False), (25, [3], True), (25, [-4], False),
])
def test_squeeze(opset, axes, runtime):
    inputs, consts, attrs = ["x"], None, {}
    if axes is not None and opset >= 13:
        inputs, consts = ["x", "axes"], {"axes": np.array(axes, I64)}
    elif axes is not None:
        attrs = {"axes": axes}
    run([node("Squeeze", inputs, **attrs)], [("x", F32, [1, 3, 2, 1])], ["y"], opset, consts, runtime)


def test_squeeze_of_a_dim_that_is_not_one_fails_like_onnxruntime():
    """ONNX requires each squeezed dim to be 1 and onnxruntime fails otherwise; torch's squeeze would keep the dim."""
    with pytest.raises(ValueError, match=r"Squeeze: dim 1 of \[1, 3, 2\] is not 1"):
        m.Squeeze(axes=[0, 1])(torch.zeros(1, 3, 2))


def test_squeeze_of_a_size_unknown_while_compiling_drops_the_dim():
    """A dim whose size is only known at run time (from a tensor's value) still goes: the traced program checks it."""
    def f(x, n):
        return m.Squeeze(axes=[0])(x[: n.item()])

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    x = torch.randn(4, 3)
    assert compiled(x, torch.tensor(1)).shape == (3,)
    with pytest.raises(RuntimeError):
        compiled(x, torch.tensor(2))


@pytest.mark.parametrize("opset, axes, runtime", [
    (7, [0], False), (7, [1, 3], False), (11, [-1, 0], False), (13, [0, 3], False), (13, [4, -2, 0], True),
    (25, [2], True), (25, [-4, 2], False),
])
def test_unsqueeze(opset, axes, runtime):
    if opset >= 13:
        nodes, consts = [node("Unsqueeze", ["x", "axes"])], {"axes": np.array(axes, I64)}
    else:
        nodes, consts = [node("Unsqueeze", ["x"], axes=axes)], None
    run(nodes, [("x", F32, [3, 2])], ["y"], opset, consts, runtime)


@pytest.mark.parametrize("opset", [7, 13, 25])
@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1], [0, 1, 2]])
def test_transpose(opset, perm):
    attrs = {} if perm is None else {"perm": perm}
    run([node("Transpose", ["x"], **attrs)], [("x", I64, [2, 3, 4])], ["y"], opset)


# ---- Concat, Split, Slice, Expand, Tile ------------------------------------------------------------------------------


@pytest.mark.parametrize("opset, axis", [(7, 0), (7, 1), (11, -1), (13, 2), (13, -3)])
@pytest.mark.parametrize("dtype", [F32, I64, np.bool_])
def test_concat(opset, axis, dtype):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for s in shapes[1:]:
        s[axis] = 1 + len(s)  # sizes differ along the axis
    inputs = [(f"x{i}", dtype, s) for i, s in enumerate(shapes)]
    run([node("Concat", [i[0] for i in inputs], axis=axis)], inputs, ["y"], opset)


@pytest.mark.parametrize("opset, split, axis, runtime", [
    (7, None, 0, False), (7, [1, 5], 0, False), (11, [2, 2, 2], -1, False), (13, None, 1, False),
    (13, [4, 2], 0, False), (13, [1, 0, 5], -1, True), (18, [3, 3], 0, True), (18, [2, 4], 0, False),
])
def test_split(opset, split, axis, runtime):
    parts = 3 if split is None else len(split)
    outs = [f"y{i}" for i in range(parts)]
    inputs, consts, attrs = ["x"], None, {"axis": axis}
    if split is not None and opset >= 13:
        inputs, consts = ["x", "split"], {"split": np.array(split, I64)}
    elif split is not None:
        attrs["split"] = split
    elif opset >= 18:
        attrs["num_outputs"] = parts
    run([node("Split", inputs, outs, **attrs)], [("x", F32, [6, 6])], outs, opset, consts, runtime)


@pytest.mark.parametrize("size, parts", [(7, 3), (6, 4), (5, 2), (6, 3)])
def test_split_num_outputs_uneven(size, parts):
    outs = [f"y{i}" for i in range(parts)]
    run([node("Split", ["x"], outs, axis=0, num_outputs=parts)], [("x", F32, [size, 2])], outs, 18)


def test_split_num_outputs_must_match_outputs():
    model = make_model([node("Split", ["x"], ["a", "b"], num_outputs=2)], [("x", F32, [4])], ["a", "b"], opset=18)
    model.graph.node[0].attribute[0].i = 3  # inconsistent with the node's two outputs
    with pytest.raises(UnsupportedAttributeError, match="num_outputs"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("opset, split, runtime", [(11, None, True), (13, [1], True), (18, None, True),
                                                    (13, None, False)])
def test_split_with_one_output(opset, split, runtime):
    """tf2onnx's unstack of a length-1 axis: Split into one output, then Squeeze. The output is a tensor, as for
    every one-output node, not a 1-tuple; also when folded (runtime=False: x is an initializer)."""
    inputs, consts, attrs = ["x"], {"axes": np.array([0], I64)}, {"axis": 0}
    if split is not None:
        inputs, consts["split"] = ["x", "split"], np.array(split, I64)
    if opset >= 18:
        attrs["num_outputs"] = 1
    nodes = [node("Split", inputs, ["part"], **attrs), node("Squeeze", ["part", "axes"], ["y"])]
    if opset < 13:
        nodes[1] = node("Squeeze", ["part"], ["y"], axes=[0])
        del consts["axes"]
    if runtime:
        run(nodes, [("x", F32, [1, 4])], ["y"], opset, consts)
    else:
        consts["x"] = RNG.standard_normal((1, 4)).astype(F32)
        model = make_model([*nodes, node("Relu", ["y"], ["z"])], [("w", F32, [4])], ["z"], consts, opset)
        check(model)


def test_split_unused_output():
    """An empty output name keeps its slot (onnxruntime 1.32 crashes on such a node, so numpy is the reference)."""
    model = make_model([node("Split", ["x"], ["a", "", "c"], axis=0)], [("x", F32, [6])], ["a", "c"], opset=13)
    a, c = onnx2torch_rnn.convert(model)(torch.arange(6.0))
    assert a.tolist() == [0, 1] and c.tolist() == [4, 5]


SLICES = [  # starts, ends, axes, steps
    ([1, 0], [3, 10], None, None),
    ([0], [-1], [1], None),
    ([-3, 1], [100, -1], [0, 2], [1, 2]),
    ([3], [0], [1], [-1]),
    ([-1, -1], [-100, -6], [0, 1], [-2, -1]),
    ([10], [-10], [2], [-3]),
    ([2], [1], [0], [1]),  # empty
    ([-1], [2**63 - 1], [-1], None),
    ([2**63 - 1], [-(2**63)], [1], [-1]),  # INT_MAX / INT_MIN: full reversal
    ([0, 0, 0], [1, 1, 1], [-3, -2, -1], None),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
@pytest.mark.parametrize("opset, runtime", [(10, False), (13, False), (13, True)])
def test_slice(starts, ends, axes, steps, opset, runtime):
    names, consts = ["x", "starts", "ends"], {"starts": np.array(starts, I64), "ends": np.array(ends, I64)}
    if axes is not None or steps is not None:
        names.append("axes" if axes is not None else "")
        if axes is not None:
            consts["axes"] = np.array(axes, I64)
    if steps is not None:
        names.append("steps")
        consts["steps"] = np.array(steps, I64)
    if opset == 10 and axes is not None:  # negative axes arrive in opset 11
        consts["axes"] = np.array(axes, I64) % 3
    gm = run([node("Slice", names)], [("x", F32, [4, 5, 6])], ["y"], opset, consts, runtime)
    assert (module_of(gm, m.Slice).starts is None) == runtime


@pytest.mark.parametrize("starts, ends, axes", [([1], [3], None), ([0, 1], [-1, 100], [1, 0]), ([-2], [-1], [2])])
def test_slice_v1_attributes(starts, ends, axes):
    attrs = {"starts": starts, "ends": ends} | ({} if axes is None else {"axes": axes})
    run([node("Slice", ["x"], **attrs)], [("x", F32, [4, 5, 6])], [("y", F32, ["a", "b", "c"])], 7)


def test_slice_int32_indices():
    consts = {"starts": np.array([1], np.int32), "ends": np.array([-1], np.int32), "axes": np.array([0], np.int32)}
    run([node("Slice", ["x", "starts", "ends", "axes"])], [("x", I64, [5, 2])], ["y"], 13, consts)


@pytest.mark.parametrize("opset", [8, 13, 25])
@pytest.mark.parametrize("x_shape, target", [
    ([3, 1], [2, 3, 4]), ([3, 1], [1, 1]), ([1, 4], [3, 1]), ([2, 3], [3]), ([], [2, 2]), ([3, 1], [3, 0]),
])
@pytest.mark.parametrize("runtime", [False, True])
def test_expand(opset, x_shape, target, runtime):
    run([node("Expand", ["x", "shape"])], [("x", F32, x_shape)], ["y"], opset, {"shape": np.array(target, I64)},
        runtime)


@pytest.mark.parametrize("opset", [7, 13])
@pytest.mark.parametrize("repeats", [[1, 1], [2, 3], [1, 0], [3, 1]])
@pytest.mark.parametrize("runtime", [False, True])
def test_tile(opset, repeats, runtime):
    run([node("Tile", ["x", "r"])], [("x", I64, [2, 3])], ["y"], opset, {"r": np.array(repeats, I64)}, runtime)


# ---- Gather / Scatter ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset, axis", [(7, 0), (7, 1), (11, -1), (13, 2), (13, -3)])
@pytest.mark.parametrize("indices", [np.array(1), np.array(-1), np.array([0, -2, 1]), np.array([[2, -1], [0, 0]])])
@pytest.mark.parametrize("index_type", [I64, np.int32])
@pytest.mark.parametrize("runtime", [False, True])
def test_gather(opset, axis, indices, index_type, runtime):
    if opset < 11 and (indices < 0).any():
        indices = indices % 3
    run([node("Gather", ["x", "i"], axis=axis)], [("x", F32, [3, 3, 3])], ["y"], opset,
        {"i": indices.astype(index_type)}, runtime)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(opset, axis):
    indices = RNG.integers(-3, 3, (2, 3, 2))
    run([node("GatherElements", ["x", "i"], axis=axis)], [("x", F32, [3, 3, 3]), ("i", I64, [2, 3, 2])], ["y"],
        opset, feeds={"i": indices})


@pytest.mark.parametrize("opset, batch_dims, data_shape, indices", [
    (11, 0, [2, 3], [[0, 1], [1, -1]]),
    (11, 0, [2, 3, 4], [[1], [-2]]),
    (12, 0, [2, 3, 4], [[[0, 1, 2]], [[1, -1, -4]]]),
    (12, 1, [2, 3, 4], [[1], [-1]]),
    (13, 1, [2, 3, 4], [[[1, 2], [0, 0], [2, -1]], [[0, 0], [1, 1], [2, 2]]]),
    (13, 2, [2, 3, 4], [[[1], [2], [3]], [[0], [-1], [0]]]),
    (13, 0, [2, 3], np.zeros((4, 0), I64)),
])
def test_gather_nd(opset, batch_dims, data_shape, indices):
    indices = np.array(indices, I64)
    attrs = {"batch_dims": batch_dims} if opset >= 12 else {}
    run([node("GatherND", ["x", "i"], **attrs)], [("x", F32, data_shape)], ["y"], opset,
        {"i": indices})


# reduction -> first opset that has it
SCATTER_OPSETS = {"none": 11, "add": 16, "mul": 16, "max": 18, "min": 18}


@pytest.mark.parametrize("reduction", list(SCATTER_OPSETS))
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [F32, I64])
def test_scatter_elements(reduction, axis, dtype):
    data = RNG.integers(-5, 5, (3, 4)).astype(dtype)
    if reduction == "none":  # no duplicate targets: the result would be unspecified
        indices = np.stack([RNG.permutation(3 if axis == 0 else 4)[:2] - (1 if axis == 0 else 4) for _ in range(3)])
        indices = indices.T if axis == 0 else indices
    else:
        indices = RNG.integers(-3, 3, (2, 3)) if axis == 0 else RNG.integers(-4, 4, (3, 2))
    updates = RNG.integers(-5, 5, indices.shape).astype(dtype)
    inputs = [("x", dtype, data.shape), ("i", I64, indices.shape), ("u", dtype, updates.shape)]
    attrs = {"axis": axis} | ({} if reduction == "none" else {"reduction": reduction})
    for opset in sorted({SCATTER_OPSETS[reduction], 18}):
        run([node("ScatterElements", ["x", "i", "u"], **attrs)], inputs, ["y"], opset,
            feeds={"x": data, "i": indices, "u": updates})


@pytest.mark.parametrize("opset", [9, 10, 13])
def test_scatter_deprecated_and_first_version(opset):
    op = "Scatter" if opset < 13 else "ScatterElements"
    indices = np.array([[1, 0, 2], [0, 2, 1]], I64)
    run([node(op, ["x", "i", "u"], axis=0)], [("x", F32, [3, 3]), ("i", I64, [2, 3]), ("u", F32, [2, 3])],
        ["y"], opset, feeds={"i": indices})


@pytest.mark.parametrize("reduction", list(SCATTER_OPSETS))
@pytest.mark.parametrize("data_shape, indices", [
    ([8], [[4], [3], [-7], [7]]),
    ([4, 4, 4], [[0], [-2]]),
    ([4, 4, 4], [[0, 1], [2, -1], [3, 3]]),
    ([2, 3, 4], [[[0, 1, 2], [1, -1, -4]]]),
])
def test_scatter_nd(reduction, data_shape, indices):
    indices = np.array(indices, I64)
    k = indices.shape[-1]
    updates_shape = list(indices.shape[:-1]) + data_shape[k:]
    inputs = [("x", F32, data_shape), ("i", I64, indices.shape), ("u", F32, updates_shape)]
    attrs = {} if reduction == "none" else {"reduction": reduction}
    for opset in sorted({SCATTER_OPSETS[reduction], 18}):
        run([node("ScatterND", ["x", "i", "u"], **attrs)], inputs, ["y"], opset, feeds={"i": indices})


def _box_indices(starts, sizes):
    """The index tuples of a box in row-major order, shaped [*sizes, k] as a streaming model writes them."""
    grid = np.meshgrid(*(np.arange(a, a + n) for a, n in zip(starts, sizes, strict=True)), indexing="ij")
    return np.stack(grid, -1).astype(I64)


@pytest.mark.parametrize("data_shape, indices, box", [
    ([2, 3, 5, 4], _box_indices([0, 0, 2], [1, 3, 2]), True),  # gtcrn's conv cache: cache[0, :, 2:4] = new
    ([3, 4], _box_indices([1], [1]), True),  # state[1] = new
    ([4, 6], _box_indices([1, 2], [2, 3]).reshape(-1, 2), True),  # the tuples flattened
    ([4, 6], _box_indices([1, 2], [2, 3])[::-1].copy(), False),  # rows in another order
    ([4, 6], np.array([[0, 1], [0, 3]], I64), False),  # a gap
    ([4, 6], np.array([[1, 1], [1, 1]], I64), False),  # a duplicate (unspecified in ONNX; the scatter keeps one)
    ([4, 6], np.array([[-1, 0], [-1, 1]], I64), False),  # negative: depends on the size
])
def test_scatter_nd_constant_box(data_shape, indices, box):
    """Constant indices that list a box in row-major order become a block assignment (ScatterBox); anything else
    stays a scatter. Both against onnxruntime."""
    k = indices.shape[-1]
    updates_shape = list(indices.shape[:-1]) + data_shape[k:]
    inputs = [("x", F32, data_shape), ("u", F32, updates_shape)]
    model = make_model([node("ScatterND", ["x", "i", "u"])], inputs, ["y"], {"i": indices}, 18)
    duplicates = len(np.unique(indices.reshape(-1, k), axis=0)) < len(indices.reshape(-1, k))
    gm = onnx2torch_rnn.convert(model) if duplicates else check(model, random_inputs(model))  # duplicates: no oracle
    assert any(isinstance(mod, m.ScatterBox) for mod in gm.modules()) == box
    assert any(isinstance(mod, m.ScatterND) for mod in gm.modules()) != box


def test_scatter_box_refuses_indices_past_the_data():
    indices = _box_indices([0, 2], [1, 2])
    model = make_model([node("ScatterND", ["x", "i", "u"])], [("x", F32, ["a", "b"]), ("u", F32, [1, 2])], ["y"],
                       {"i": indices}, 18)
    gm = onnx2torch_rnn.convert(model)
    assert isinstance(module_of(gm, m.ScatterBox), m.ScatterBox)
    with pytest.raises(IndexError, match="out of bounds"):
        gm(torch.zeros(2, 3), torch.ones(1, 2))


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_scatter_reduction_refused_before_its_opset(op):
    indices = np.zeros((1, 1), I64)
    model = make_model([node(op, ["x", "i", "u"], reduction="add")], [("x", F32, [2, 2]), ("u", F32, [1, 1])],
                       ["y"], {"i": indices}, opset=18)
    model.opset_import[0].version = 16
    model.graph.node[0].attribute[0].s = b"max"  # max arrives in opset 18
    with pytest.raises(UnsupportedAttributeError, match="reduction"):
        onnx2torch_rnn.convert(model)


# ---- Compress, NonZero -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [9, 11, 28])
@pytest.mark.parametrize("axis, condition", [
    (None, [True, False, True, True, False]), (0, [False, True, True]), (1, [True, False]), (-1, [1, 0, 1, 1]),
    (0, [True]), (0, [False, False, False]),
])
def test_compress(opset, axis, condition):
    if opset < 11 and axis is not None and axis < 0:
        axis += 2
    attrs = {} if axis is None else {"axis": axis}
    out = ("y", F32, ["n"] if axis is None else ["a", "b"])  # shape inference leaves the output untyped at opset 9
    run([node("Compress", ["x", "c"], **attrs)], [("x", F32, [3, 4]), ("c", np.bool_, [len(condition)])], [out],
        opset, feeds={"c": np.array(condition, bool)})


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("dtype, shape", [(F32, [3, 4]), (I64, [2, 3, 2]), (np.bool_, [5]), (F32, [])])
def test_nonzero(opset, dtype, shape):
    x = (RNG.integers(0, 2, shape) * RNG.integers(1, 4, shape)).astype(dtype)
    run([node("NonZero", ["x"])], [("x", dtype, shape)], ["y"], opset, feeds={"x": np.asarray(x)})


# ---- Unique ---------------------------------------------------------------------------------------------------------


@parametrize_pairwise(opset=[11, 28], dtype=[F32, I64, np.int8, np.float64], axis=[None, 0, 1, -1],
                      sorted_=[0, 1], outputs=[1, 2, 3, 4], shape=[(6, 3), (3, 5, 2)])
def test_unique(opset, dtype, axis, sorted_, outputs, shape):
    """Every output against onnxruntime; values from 0..2 so slices repeat, shuffled so that the order of first
    occurrence (sorted=0) differs from the ascending one."""
    x = RNG.integers(0, 3, shape).astype(dtype)
    if axis is not None:  # repeat some slices along the axis
        x = np.take(x, RNG.permutation(np.arange(x.shape[axis]) % 2 + np.arange(x.shape[axis]) // 2), axis=axis)
    names = ["y", "indices", "inverse_indices", "counts"][:outputs]
    attributes = {"sorted": sorted_} | ({} if axis is None else {"axis": axis})
    run([helper.make_node("Unique", ["x"], names, **attributes)], [("x", dtype, shape)], names, opset,
        feeds={"x": x})


# ---- Range, ConstantOfShape, EyeLike, OneHot, Trilu ------------------------------------------------------------------


INT_RANGES = [(0, 10, 1), (3, 9, 3), (10, 4, -2), (5, 5, 1), (5, 1, 1), (-3, 7, 4)]
FLOAT_RANGES = [(0.5, 3.7, 0.3), (1.0, -2.0, -0.25), (0.1, 10.3, 0.1)]
RANGE_CASES = [(r, t) for t in (I64, np.int32, np.int16) for r in INT_RANGES] + [
    (r, t) for t in (F32, np.float64) for r in INT_RANGES + FLOAT_RANGES]


@pytest.mark.parametrize("bounds, dtype", RANGE_CASES)
@pytest.mark.parametrize("opset, runtime", [(11, True), (25, False), (25, True)])
def test_range(bounds, dtype, opset, runtime):
    start, limit, delta = bounds
    consts = {"s": np.array(start, dtype), "l": np.array(limit, dtype), "d": np.array(delta, dtype)}
    run([node("Range", ["s", "l", "d"])], [], ["y"], opset, consts, runtime)


@pytest.mark.parametrize("dtype", [np.float16, F32])
def test_range_stash_type(dtype):
    """Opset 27: float16 computed in float32 (stash_type=1); stash_type=0 is refused for float16."""
    consts = {"s": np.array(0.5, dtype), "l": np.array(9.0, dtype), "d": np.array(0.3, dtype)}
    run([node("Range", ["s", "l", "d"])], [], ["y"], 27, consts, runtime=True)
    if dtype == np.float16:
        refuses([node("Range", ["s", "l", "d"], stash_type=0)], [("s", dtype, []), ("l", dtype, []),
                                                                 ("d", dtype, [])], ["y"], 27, "stash_type")


@pytest.mark.parametrize("opset", [9, 20, 25])
@pytest.mark.parametrize("value", [None, np.array([2.5], F32), np.array([7], I64), np.array([True]),
                                   np.array([-1.5], np.float16), np.array([3], np.int32), np.array([1.25])])
@pytest.mark.parametrize("shape, runtime", [([2, 3], False), ([2, 3], True), ([], True), ([4, 0], False)])
def test_constant_of_shape(opset, value, shape, runtime):
    attrs = {} if value is None else {"value": helper.make_tensor("v", helper.np_dtype_to_tensor_dtype(value.dtype),
                                                                   [1], value.tolist())}
    gm = run([node("ConstantOfShape", ["shape"], **attrs)], [], ["y"], opset, {"shape": np.array(shape, I64)},
             runtime)
    if runtime:
        assert module_of(gm, m.ConstantOfShape).shape is None


def test_constant_of_shape_feeds_an_op():
    """The usual exporter use: zeros shaped like a run-time input."""
    nodes = [node("Shape", ["x"], ["s"]), node("ConstantOfShape", ["s"], ["z"]), node("Add", ["x", "z"])]
    run(nodes, [("x", F32, ["N", 3])], ["y"], 13)


@parametrize_pairwise(opset=[9, 22, 25], shape=[[3, 3], [2, 5], [4, 2]], k=[0, 1, -2, 7],
                      dtype=[None, TensorProto.FLOAT, TensorProto.INT64, TensorProto.DOUBLE])  # no bool in ORT
def test_eye_like(opset, shape, k, dtype):
    attrs = {"k": k} | ({} if dtype is None else {"dtype": dtype})
    run([node("EyeLike", ["x"], **attrs)], [("x", np.int32, shape)], ["y"], opset)


def test_eye_like_refuses_string_dtype():
    refuses([node("EyeLike", ["x"], dtype=TensorProto.STRING)], [("x", F32, [2, 2])], ["y"], 22, "dtype")


# (indices, depth, values) type combinations that onnxruntime implements
ONE_HOT_TYPES = [(I64, I64, F32), (I64, np.int32, F32), (np.int32, F32, F32), (F32, F32, F32), (F32, I64, I64),
                 (I64, I64, I64)]


@parametrize_pairwise(opset=[9, 11, 28], axis=[-1, 0, 1, -2], types=ONE_HOT_TYPES, runtime=[False, True])
def test_one_hot(opset, axis, types, runtime):
    index_type, depth_type, value_type = types
    indices = np.array([[0, 3, -1], [-4, 2, 9]], index_type)  # 9 is out of range: all off values
    if index_type == F32:
        indices = np.array([[0.7, 2.9, -1.2], [-0.5, 1.5, -3.0]], F32)  # truncated toward zero
    depth = np.array(4.7 if depth_type == F32 else 4, depth_type)
    consts = {"d": depth, "v": np.array([-2, 5], value_type)}
    run([node("OneHot", ["i", "d", "v"], axis=axis)], [("i", index_type, [2, 3])], ["y"], opset, consts, runtime,
        feeds={"i": indices})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("dtype, shape", [(F32, [4, 5]), (I64, [2, 3, 3]), (np.bool_, [3, 2])])
def test_trilu(upper, k, runtime, dtype, shape):
    inputs, consts = (["x"], None) if k is None else (["x", "k"], {"k": np.array(k, I64)})
    run([node("Trilu", inputs, upper=upper)], [("x", dtype, shape)], ["y"], 14, consts, runtime)


# ---- Cast / CastLike -------------------------------------------------------------------------------------------------


CAST_TYPES = [F32, np.float64, np.float16, np.int8, np.int16, np.int32, I64, np.uint8, np.uint16, np.uint32,
              np.uint64, np.bool_]


@pytest.mark.parametrize("source", CAST_TYPES)
@pytest.mark.parametrize("target", CAST_TYPES)
def test_cast(source, target):
    values = np.array([0.0, 1.0, 2.7, 3.5, 100.9, 0.49, 7.0, 1.5])
    if not np.issubdtype(target, np.unsignedinteger) and not np.issubdtype(source, np.unsignedinteger):
        values = values * np.array([1, -1, 1, -1, -1, 1, -1, -1])  # float -> int truncates toward zero
    x = values.astype(source)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    for opset in (7, 13, 28):
        run([node("Cast", ["x"], to=to)], [("x", source, [8])], ["y"], opset, feeds={"x": x})


def test_cast_bfloat16_round_trip():
    nodes = [node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16), node("Cast", ["b"], to=TensorProto.FLOAT)]
    run(nodes, [("x", F32, [3, 4])], ["y"], 19)


@pytest.mark.parametrize("to", [TensorProto.STRING, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2,
                                TensorProto.INT4])
def test_cast_refuses_types_torch_lacks(to):
    refuses([node("Cast", ["x"], to=to)], [("x", F32, [2])], ["y"], 21, "to")


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
@pytest.mark.parametrize("source", [TensorProto.FLOAT8E4M3FN, TensorProto.INT4, TensorProto.FLOAT4E2M1,
                                    TensorProto.STRING])
def test_cast_refuses_sources_torch_lacks(op, source):
    # such a source is refused where it enters: as a graph input, naming it (an initializer: when it is read)
    inputs = ["x"] if op == "Cast" else ["x", "t"]
    model = make_model([node(op, inputs, to=TensorProto.FLOAT) if op == "Cast" else node(op, inputs)],
                       [("x", source, [2])], ["y"], {"t": np.zeros(1, F32)}, opset=21)
    with pytest.raises(UnsupportedTypeError, match="graph input 'x': ONNX element type"):
        onnx2torch_rnn.convert(model)


def test_cast_saturate_is_validated():
    # onnxruntime refuses saturate on casts to non-float8 types, so only the refusal is compared here.
    refuses([node("Cast", ["x"], to=TensorProto.INT32, saturate=2)], [("x", F32, [2])], ["y"], 19, "saturate")
    refuses([node("Cast", ["x"], to=TensorProto.INT32, round_mode="sideways")], [("x", F32, [2])], ["y"], 24,
            "round_mode")


@pytest.mark.parametrize("opset", [15, 19, 25])
@pytest.mark.parametrize("target", [F32, I64, np.int32, np.bool_, np.float16])
@pytest.mark.parametrize("static", [True, False])
def test_cast_like(opset, target, static):
    x = np.array([-1.7, 0.0, 2.5, 3.9], F32)
    if static:
        gm = run([node("CastLike", ["x", "t"])], [("x", F32, [4])], ["y"], opset, {"t": np.zeros(1, target)},
                 feeds={"x": x})
        assert not list(gm.buffers()) and not list(gm.parameters())  # the target's dtype was baked
    else:
        run([node("CastLike", ["x", "t"])], [("x", F32, [4]), ("t", target, [1])], ["y"], opset, feeds={"x": x})


def test_cast_like_module_reads_the_target_dtype_at_run_time():
    """Used when the target's dtype is unknown at conversion time."""
    out = m.CastLike()(torch.tensor([1.9, -2.5]), torch.zeros(1, dtype=torch.int32))
    assert out.dtype == torch.int32 and out.tolist() == [1, -2]


# ---- ReverseSequence, TopK, ArgMax/ArgMin, CumSum -------------------------------------------------------------------


@pytest.mark.parametrize("opset", [10, 28])
@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("runtime", [False, True])
def test_reverse_sequence(opset, batch_axis, time_axis, runtime):
    shape = [5, 4, 2] if time_axis == 0 else [4, 5, 2]
    lens = np.array([5, 1, 3, 0 if opset > 99 else 2], I64)
    run([node("ReverseSequence", ["x", "lens"], batch_axis=batch_axis, time_axis=time_axis)],
        [("x", F32, shape)], ["y"], opset, {"lens": lens}, runtime)


def topk_input(shape):
    return RNG.integers(0, 4, shape).astype(F32)  # many ties


@pytest.mark.parametrize("opset, largest, runtime", [
    (7, 1, False), (10, 1, False), (10, 1, True), (11, 0, False), (11, 1, True), (24, 0, True), (24, 1, False),
    (25, 0, False),
])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_top_k(opset, axis, largest, runtime):
    x = topk_input([4, 6, 5])
    attrs = {"axis": axis} | ({"largest": largest} if opset >= 11 else {})
    if opset < 10:  # k is an attribute: nothing to compute at run time
        nodes, consts = [node("TopK", ["x"], ["v", "i"], k=3, **attrs)], None
    else:
        nodes, consts = [node("TopK", ["x", "k"], ["v", "i"], **attrs)], {"k": np.array([3], I64)}
    run(nodes, [("x", F32, [4, 6, 5])], ["v", "i"], opset, consts, runtime, feeds={"x": x})


@pytest.mark.parametrize("dtype", [I64, np.int32, np.float64])
def test_top_k_types(dtype):
    x = RNG.integers(-3, 3, (3, 7)).astype(dtype)
    run([node("TopK", ["x", "k"], ["v", "i"], largest=0)], [("x", dtype, [3, 7])], ["v", "i"], 11,
        {"k": np.array([7], I64)}, feeds={"x": x})


def test_top_k_unsorted_returns_the_same_set():
    """sorted=0 leaves the order open; onnxruntime returns another order, so compare as sets."""
    x = RNG.permutation(20).astype(F32).reshape(2, 10)
    model = make_model([node("TopK", ["x", "k"], ["v", "i"], sorted=0)], [("x", F32, [2, 10])], ["v", "i"],
                       {"k": np.array([4], I64)}, opset=11)
    expected = run_onnxruntime(model, {"x": x})
    actual = run_torch(onnx2torch_rnn.convert(model), model, {"x": x})
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_array_equal(np.sort(got, axis=-1), np.sort(want, axis=-1))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset, select_last_index", [(7, 0), (11, 0), (12, 1), (13, 0), (13, 1), (25, 1)])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_extreme(op, opset, axis, keepdims, select_last_index):
    if opset < 11 and axis < 0:
        axis += 3
    attrs = {"axis": axis, "keepdims": keepdims} | ({"select_last_index": 1} if select_last_index else {})
    x = RNG.integers(0, 3, (3, 4, 5)).astype(F32)  # ties everywhere
    run([node(op, ["x"], **attrs)], [("x", F32, [3, 4, 5])], ["y"], opset, feeds={"x": x})


@pytest.mark.parametrize("dtype", [I64, np.int32, np.uint8, np.float64])
def test_arg_extreme_types(dtype):
    run([node("ArgMax", ["x"], ["a"], axis=1), node("ArgMin", ["x"], ["b"], axis=0)], [("x", dtype, [3, 4])],
        ["a", "b"], 13)


@pytest.mark.parametrize("opset", [11, 14, 25])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("runtime", [False, True])
def test_cum_sum(opset, exclusive, reverse, axis, runtime):
    run([node("CumSum", ["x", "axis"], exclusive=exclusive, reverse=reverse)], [("x", F32, [3, 4])], ["y"], opset,
        {"axis": np.array(axis, I64)}, runtime)


@pytest.mark.parametrize("dtype", [np.int32, I64, np.float64, np.float16])
@pytest.mark.parametrize("axis_type", [I64, np.int32])
def test_cum_sum_types(dtype, axis_type):
    # float16: onnxruntime accumulates in float16 too, but rounding order differs; values here are exact.
    run([node("CumSum", ["x", "axis"], exclusive=1)], [("x", dtype, [2, 5])], ["y"], 14,
        {"axis": np.array([1], axis_type)})

