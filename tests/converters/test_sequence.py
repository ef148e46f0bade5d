"""Sequence ops against onnxruntime: SplitToSequence (every split form, keepdims, constant or run-time split),
SequenceAt (constant or run-time position, negative, out of range), SequenceConstruct, SequenceInsert, SequenceErase,
SequenceLength and ConcatFromSequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import onnx2torch_rnn
from tests.helpers import check, helper, make_model, run_torch

RNG = np.random.default_rng(0)


def split_model(split, keepdims, axis, positions, opset, runtime=False):
    """x -> SplitToSequence -> one SequenceAt output per position."""
    attrs = {"axis": axis} if axis is not None else {}
    if keepdims is not None:
        attrs["keepdims"] = keepdims
    values = {f"p{i}": np.array(p, np.int64) for i, p in enumerate(positions)}
    if split is not None:
        values["split"] = np.array(split, np.int64)
    nodes = [helper.make_node("SplitToSequence", ["x", "split"][: 1 + (split is not None)], ["seq"], **attrs)]
    nodes += [helper.make_node("SequenceAt", ["seq", f"p{i}"], [f"y{i}"]) for i in range(len(positions))]
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    # run-time values are graph inputs from the start: shape inference would refuse invalid constant splits
    inputs = [("x", np.float32, [2, 5, 3])] + [(k, np.int64, list(v.shape)) for k, v in values.items() if runtime]
    model = make_model(nodes, inputs, [f"y{i}" for i in range(len(positions))], {} if runtime else values,
                       opset=opset)
    return model, {"x": x, **(values if runtime else {})}


@pytest.mark.parametrize("opset", [11, 24])
@pytest.mark.parametrize("runtime", [False, True], ids=["constant", "runtime"])
@pytest.mark.parametrize(("split", "keepdims", "axis", "positions"), [
    (None, None, None, [0, -1]),  # parts of 1 along axis 0, kept
    (None, 0, 1, [0, 4, -5]),  # squeezed: the dynamo exporter's unbind over time
    (1, 0, 1, [2]),  # a scalar 1 is squeezed as well (onnxruntime)
    (2, 1, 1, [0, -1]),  # scalar 2: parts 2, 2, 1 (with keepdims=0 onnxruntime fails; we keep the axis)
    (2, None, -1, [1]),
    ([2, 3], 0, 1, [0, 1]),  # sizes: keepdims ignored
    ([0, 5], 1, 1, [0, -1]),  # an empty part (onnxruntime accepts 0)
])
def test_split_to_sequence_and_sequence_at(split, keepdims, axis, positions, runtime, opset):
    check(*split_model(split, keepdims, axis, positions, opset, runtime))


def test_dynamo_unbind_becomes_one_module_per_step_with_static_positions():
    model, feeds = split_model(None, 0, 1, [0, 1, 2], 20)
    module = check(model, feeds)
    assert [n.position for n in module.modules() if type(n).__name__ == "SequenceAt"] == [0, 1, 2]


def test_gradients_flow_through_the_sequence():
    model, feeds = split_model(None, 0, 1, [1, -1], 17)
    module = onnx2torch_rnn.convert(model)
    x = torch.from_numpy(feeds["x"]).requires_grad_()
    sum(module(x)).sum().backward()
    expected = torch.zeros(2, 5, 3)
    expected[:, [1, 4]] = 1
    torch.testing.assert_close(x.grad, expected)


@pytest.mark.parametrize(("split", "position", "error"), [
    (None, 5, IndexError), (None, -6, IndexError), (0, 0, ValueError), ([6, -1], 0, ValueError),
    ([2, 2], 0, RuntimeError),  # sizes do not sum to the axis size (torch.split refuses)
])
def test_invalid_split_or_position_raises_like_onnxruntime(split, position, error):
    model, feeds = split_model(split, 0, 1, [position], 17, runtime=True)
    with pytest.raises(error):
        run_torch(onnx2torch_rnn.convert(model), model, feeds)


@pytest.mark.parametrize("runtime", [False, True], ids=["constant", "runtime"])
@pytest.mark.parametrize(("insert_at", "erase_at"), [(None, None), (0, 0), (-1, 2), (3, -4), (-3, 1)])
@pytest.mark.parametrize(("axis", "new_axis"), [(0, 0), (-1, 0), (1, 1), (3, 1), (-4, 1)])
def test_construct_insert_erase_length_concat(insert_at, erase_at, axis, new_axis, runtime):
    """(x, y, x) -> insert z -> erase -> its length, and its tensors concatenated or stacked."""
    positions = {name: np.array(value, np.int64) for name, value in (("i", insert_at), ("e", erase_at))
                 if value is not None}
    nodes = [helper.make_node("SequenceConstruct", ["x", "y", "x"], ["s0"]),
             helper.make_node("SequenceInsert", ["s0", "z", "i" if insert_at is not None else ""], ["s1"]),
             helper.make_node("SequenceErase", ["s1", "e" if erase_at is not None else ""], ["s2"]),
             helper.make_node("SequenceLength", ["s2"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["c"], axis=axis, new_axis=new_axis)]
    inputs = [(name, np.float32, [2, 3, 4]) for name in "xyz"]
    inputs += [(name, np.int64, []) for name in positions if runtime]
    model = make_model(nodes, inputs, ["n", "c"], {} if runtime else positions, opset=17)
    feeds = {name: RNG.standard_normal((2, 3, 4)).astype(np.float32) for name in "xyz"}
    check(model, {**feeds, **(positions if runtime else {})})


@pytest.mark.parametrize(("op", "position"), [("SequenceInsert", 4), ("SequenceInsert", -4), ("SequenceErase", 3),
                                              ("SequenceErase", -4)])
def test_insert_and_erase_refuse_positions_out_of_range(op, position):
    """onnxruntime fails on these too; the module raises IndexError rather than clamping."""
    inputs = ["s", "x", "p"] if op == "SequenceInsert" else ["s", "p"]
    nodes = [helper.make_node("SequenceConstruct", ["x", "x", "x"], ["s"]), helper.make_node(op, inputs, ["t"]),
             helper.make_node("SequenceLength", ["t"], ["n"])]
    model = make_model(nodes, [("x", np.float32, [2]), ("p", np.int64, [])], ["n"], opset=17)
    module = onnx2torch_rnn.convert(model)
    with pytest.raises(IndexError, match="out of range"):
        module(torch.zeros(2), torch.tensor(position))
