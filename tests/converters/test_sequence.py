"""Sequence ops against onnxruntime: SplitToSequence (every split form, keepdims, constant or run-time split),
SequenceAt (constant or run-time position, negative, out of range), SequenceConstruct, SequenceInsert, SequenceErase,
SequenceLength, ConcatFromSequence and SequenceEmpty; optionals (Optional, OptionalHasElement, OptionalGetElement)
in If branches and Loop bodies."""

from __future__ import annotations

import numpy as np
import onnx
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


FLOAT_SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None))


@pytest.mark.parametrize("opset", [16, 18])  # Loop carries optionals since 16
@pytest.mark.parametrize("trips", [0, 1, 4])
def test_loop_carries_an_optional_sequence(trips, opset):
    """conformance's test_loop16_seq_none, from an empty Optional: the body starts the sequence when the optional is
    empty (If), else takes it out (OptionalGetElement), appends, and carries it on as an optional."""
    then_branch = helper.make_graph([helper.make_node("SequenceEmpty", [], ["empty"], dtype=onnx.TensorProto.FLOAT)],
                                    "then", [], [helper.make_value_info("empty", FLOAT_SEQ)])
    else_branch = helper.make_graph([helper.make_node("OptionalGetElement", ["opt_in"], ["held"])],
                                    "else", [], [helper.make_value_info("held", FLOAT_SEQ)])
    body = helper.make_graph([
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("OptionalHasElement", ["opt_in"], ["has"]),
        helper.make_node("Not", ["has"], ["none"]),
        helper.make_node("If", ["none"], ["seq"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Cast", ["i"], ["i_float"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Add", ["x", "i_float"], ["step"]),
        helper.make_node("SequenceInsert", ["seq", "step"], ["longer"]),
        helper.make_node("Optional", ["longer"], ["opt_out"]),
    ], "body", [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
                helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
                helper.make_value_info("opt_in", helper.make_optional_type_proto(FLOAT_SEQ))],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         helper.make_value_info("opt_out", helper.make_optional_type_proto(FLOAT_SEQ))])
    nodes = [helper.make_node("Optional", [], ["nothing"], type=FLOAT_SEQ),
             helper.make_node("Loop", ["trips", "", "nothing"], ["final"], body=body),
             helper.make_node("OptionalHasElement", ["final"], ["has"]),
             helper.make_node("Optional", ["x"], ["x_opt"]),
             helper.make_node("OptionalGetElement", ["x_opt"], ["x_back"])]
    outputs = [("has", np.bool_, []), ("x_back", np.float32, [3])]
    if trips:  # an empty optional's element is an error in both
        nodes += [helper.make_node("OptionalGetElement", ["final"], ["seq"]),
                  helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)]
        outputs.append(("y", np.float32, [None]))
    model = make_model(nodes, [("x", np.float32, [3])], outputs, {"trips": np.array(trips, np.int64)}, opset=opset)
    check(model, {"x": RNG.standard_normal(3).astype(np.float32)})


@pytest.mark.parametrize("cond", [False, True])
def test_if_returns_an_optional_tensor(cond):
    """One branch an empty optional, the other a full one: OptionalHasElement tells them apart after the If."""
    optional_tensor = helper.make_optional_type_proto(helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [2]))
    then_branch = helper.make_graph([helper.make_node("Optional", ["x"], ["full"])], "then", [],
                                    [helper.make_value_info("full", optional_tensor)])
    else_branch = helper.make_graph([helper.make_node("Optional", [], ["empty"], type=optional_tensor.optional_type
                                                      .elem_type)], "else", [],
                                    [helper.make_value_info("empty", optional_tensor)])
    nodes = [helper.make_node("If", ["c"], ["opt"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("OptionalHasElement", ["opt"], ["has"])]
    model = make_model(nodes, [("c", np.bool_, []), ("x", np.float32, [2])], [("has", np.bool_, [])], opset=18)
    module = check(model, {"c": np.array(cond), "x": np.ones(2, np.float32)})
    assert any(type(m).__name__ == "If" for m in module.modules())


def test_get_element_of_an_empty_optional_raises():
    nodes = [helper.make_node("Optional", [], ["nothing"], type=helper.make_tensor_type_proto(1, [2])),
             helper.make_node("OptionalGetElement", ["nothing"], ["y"])]
    module = onnx2torch_rnn.convert(make_model(nodes, [], [("y", np.float32, [2])], opset=18))
    with pytest.raises(ValueError, match="empty optional"):
        module()
