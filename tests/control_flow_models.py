"""ONNX models with If, Loop and Scan that reach outer values, shared by tests/converters/test_control_flow.py and
tests/test_control_flow_compile.py."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.helpers import make_model

F = TensorProto.FLOAT


def info(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def graph(nodes, inputs, outputs, name="body", initializers=()):
    return helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))


def if_model(opset):
    # then: y = x * w (w is an outer initializer); else: y = x - bias (bias an outer graph input)
    then_branch = graph([helper.make_node("Mul", ["x", "w"], ["then_y"])], [], [info("then_y", F, [3])], "then")
    else_branch = graph([helper.make_node("Sub", ["x", "bias"], ["else_y"])], [], [info("else_y", F, [3])], "else")
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    init = {"w": np.float32([1.5, -2.0, 0.5]), "zero": np.float32(0.0)}
    return make_model(nodes, [("x", np.float32, [3]), ("bias", np.float32, [3])], ["y"], init, opset=opset)


def loop_model(opset, trip_count, cond, scan_output=True):
    """h <- tanh(h @ W + x_i) for i < M while sum(h) < limit; scan output collects h; W and limit are outer."""
    body_nodes = [
        helper.make_node("Mod", ["i", "six"], ["i_mod"]),
        helper.make_node("Gather", ["xs", "i_mod"], ["x_i"], axis=0),
        helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
        helper.make_node("Add", ["hw", "x_i"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
        helper.make_node("ReduceSum", ["h_out"], ["s"], keepdims=0),
        helper.make_node("Less", ["s", "limit"], ["below"]),
        helper.make_node("Less", ["i", "nine"], ["early"]),  # bounds the condition-only loop
        helper.make_node("And", ["below", "early"], ["cond_out"]),
        helper.make_node("Identity", ["h_out"], ["h_scan"]),
    ]
    outputs = [info("cond_out", TensorProto.BOOL, []), info("h_out", F, [2, 3])]
    if scan_output:
        outputs.append(info("h_scan", F, [2, 3]))
    body = graph(body_nodes, [info("i", TensorProto.INT64, []), info("cond_in", TensorProto.BOOL, []),
                               info("h_in", F, [2, 3])], outputs)
    loop_outputs = ["h_final", "h_all"] if scan_output else ["h_final"]
    nodes = [helper.make_node("Loop", [trip_count, cond, "h0"], loop_outputs, body=body)]
    inputs = [("xs", np.float32, [6, 2, 3]), ("h0", np.float32, [2, 3])]
    if trip_count:
        inputs.append(("M", np.int64, []))
    if cond:
        inputs.append(("c", np.bool_, []))
    init = {"W": np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32), "limit": np.float32(1.0),
            "six": np.array(6, np.int64), "nine": np.array(9, np.int64)}
    output_types = [("h_final", np.float32, [2, 3]), ("h_all", np.float32, ["trips", 2, 3])][: len(loop_outputs)]
    return make_model(nodes, inputs, output_types, init, opset=opset)


def scan_model(opset, input_axis, input_direction, output_axis, output_direction):
    body = graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                   helper.make_node("Mul", ["s_out", "scale"], ["y_t"])],
                  [info("s_in", F, [2]), info("x_t", F, [2])], [info("s_out", F, [2]), info("y_t", F, [2])])
    attrs = {"num_scan_inputs": 1, "scan_input_axes": [input_axis], "scan_input_directions": [input_direction],
             "scan_output_axes": [output_axis], "scan_output_directions": [output_direction]}
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=body, **attrs)]
    xs_shape = [4, 2] if input_axis in (0, -2) else [2, 4]
    return make_model(nodes, [("s0", np.float32, [2]), ("xs", np.float32, xs_shape)], ["s_final", "ys"],
                      {"scale": np.float32([2.0, -1.0])}, opset=opset)
