"""If, Loop and Scan against onnxruntime: outer-scope reads, run-time trip counts and conditions, gradients."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from tests.control_flow_models import F, graph, if_model, info, loop_model, scan_model
from tests.helpers import check, make_model

OPSETS = [10, 11, 13, 16, 19, 21, 25]  # covers every If/Loop since_version from 1 (opsets 7-10) to 25


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_reads_outer_values(opset, sign):
    x = np.float32([1.0, 2.0, 3.0]) * sign
    check(if_model(opset), {"x": x, "bias": np.float32([0.5, 0.25, -1.0])})


def test_if_gradient_reaches_outer_parameter():
    gm = onnx2torch_rnn.convert(if_model(17))
    gm(torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3)).sum().backward()
    assert torch.equal(gm.w.grad, torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("trip_count, cond, feeds", [
    ("M", "", {"M": np.array(4, np.int64)}),
    ("M", "c", {"M": np.array(6, np.int64), "c": np.array(True)}),
    ("M", "c", {"M": np.array(3, np.int64), "c": np.array(False)}),
    ("", "c", {"c": np.array(True)}),
])
def test_loop_trip_count_and_condition(opset, trip_count, cond, feeds):
    model = loop_model(opset, trip_count, cond, scan_output=not (cond and not feeds["c"].item()))
    rng = np.random.default_rng(0)
    base = {"xs": rng.standard_normal((6, 2, 3)).astype(np.float32) * 0.3,
            "h0": rng.standard_normal((2, 3)).astype(np.float32) * 0.3}
    check(model, base | feeds)


def test_loop_gradient_reaches_outer_weight():
    gm = onnx2torch_rnn.convert(loop_model(17, "M", ""))
    h_final, h_all = gm(torch.randn(6, 2, 3) * 0.3, torch.randn(2, 3) * 0.3, torch.tensor(4))
    assert h_all.shape == (4, 2, 3)
    (h_final.sum() + h_all.sum()).backward()
    weights = [p for p in gm.parameters() if p.shape == (3, 3)]  # W, possibly owned by the body's MatMul module
    assert len(weights) == 1 and weights[0].grad is not None and weights[0].grad.abs().sum() > 0


def test_nested_loop_in_if_reads_both_scopes():
    inner = graph([helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
                    helper.make_node("Identity", ["c_in"], ["c_out"])],
                   [info("j", TensorProto.INT64, []), info("c_in", TensorProto.BOOL, []), info("acc_in", F, [2])],
                   [info("c_out", TensorProto.BOOL, []), info("acc_out", F, [2])], "inner")
    then_branch = graph([helper.make_node("Loop", ["n", "", "x"], ["looped"], body=inner)], [],
                         [info("looped", F, [2])], "then")
    else_branch = graph([helper.make_node("Neg", ["x"], ["negated"])], [], [info("negated", F, [2])], "else")
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    model = make_model(nodes, [("flag", np.bool_, []), ("x", np.float32, [2]), ("n", np.int64, [])], ["y"],
                       {"step": np.float32([0.5, -1.0])})
    for flag in (True, False):
        check(model, {"flag": np.array(flag), "x": np.float32([1.0, 2.0]), "n": np.array(3, np.int64)})


@pytest.mark.parametrize("opset", [9, 11, 16, 19, 21, 25])
@pytest.mark.parametrize("input_axis, input_direction, output_axis, output_direction",
                         [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 1), (-2, 1, -1, 0)])
def test_scan(opset, input_axis, input_direction, output_axis, output_direction):
    check(scan_model(opset, input_axis, input_direction, output_axis, output_direction))


@pytest.mark.parametrize("with_lengths", [False, True])
def test_scan_8_batch_and_sequence_lens(with_lengths):
    body = graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                   helper.make_node("Identity", ["s_out"], ["y_t"])],
                  [info("s_in", F, [2]), info("x_t", F, [2])], [info("s_out", F, [2]), info("y_t", F, [2])])
    node = helper.make_node("Scan", ["lens" if with_lengths else "", "s0", "xs"], ["s_final", "ys"], body=body,
                            num_scan_inputs=1, directions=[0])
    inputs = [("s0", np.float32, [3, 2]), ("xs", np.float32, [3, 4, 2])]
    feeds = {"s0": np.ones((3, 2), np.float32), "xs": np.arange(24, dtype=np.float32).reshape(3, 4, 2)}
    if with_lengths:
        inputs.insert(0, ("lens", np.int64, [3]))
        feeds["lens"] = np.int64([4, 2, 3])
    check(make_model([node], inputs, ["s_final", "ys"], opset=8), feeds)


def _zero_trip_model(h_shape, body_output_shape, reshape):
    """Loop(M) carrying h of shape h_shape, whose scan output has the given declared shape in the body; with
    `reshape`, the scan output is Reshape(h, target) with a run-time target of unknown length, so neither ONNX nor
    onnxruntime knows its rank."""
    nodes = [helper.make_node("Add", ["h_in", "step"], ["h_out"])]
    if reshape:
        nodes.append(helper.make_node("Reshape", ["h_out", "target"], ["h_scan"]))
    else:
        nodes.append(helper.make_node("Identity", ["h_out"], ["h_scan"]))
    body = graph(nodes,
                  [info("i", TensorProto.INT64, []), info("c", TensorProto.BOOL, []), info("h_in", F, h_shape)],
                  [info("c", TensorProto.BOOL, []), info("h_out", F, h_shape), info("h_scan", F, body_output_shape)])
    body.node.insert(0, helper.make_node("Identity", ["c"], ["c_copy"]))  # keep the body's cond input used
    inputs = [("h0", np.float32, h_shape), ("M", np.int64, []), ("target", np.int64, [None])]
    loop = helper.make_node("Loop", ["M", "", "h0"], ["h_final", "h_all"], body=body)
    # an output of unknown rank cannot be declared: rank 3 is what it has after some iterations
    return make_model([loop], inputs, [("h_final", np.float32, h_shape), ("h_all", np.float32, [None] * 3) if reshape
                                       else "h_all"],
                      {"step": np.float32(0.5)})


@pytest.mark.parametrize("h_shape, body_output_shape, reshape", [
    ([2, 3], [2, 3], False), ([2, 3], ["batch", 3], False), ([2, 3], None, False), (["batch", 3], None, False),
    ([2, 3], None, True)])
@pytest.mark.parametrize("trips", [0, 2])
def test_loop_zero_iterations_gives_empty_scan_outputs(h_shape, body_output_shape, reshape, trips):
    """As onnxruntime: the initial carried values and scan outputs of shape [0, *the body output's static shape]
    (0 for unknown or symbolic dims, [0] for an unknown rank)."""
    model = _zero_trip_model(h_shape, body_output_shape, reshape)
    feeds = {"h0": np.ones((2, 3), np.float32), "M": np.array(trips, np.int64), "target": np.int64([3, 2])}
    module = check(model, feeds)
    if trips == 0:
        h0 = torch.ones(2, 3, requires_grad=True)
        h_final, h_all = module(h0, torch.tensor(0), torch.tensor([3, 2]))
        h_final.sum().backward()  # the initial value passes through with its gradient
        assert torch.equal(h0.grad, torch.ones(2, 3)) and h_all.shape[0] == 0
