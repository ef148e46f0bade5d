"""ONNX models of the shape arithmetic exporters emit around recurrent layers (sizes computed at run time from
Shape), shared by tests/test_export.py and tests/test_roundtrip.py. Input x [N, M, 6], output y (and order)."""

from __future__ import annotations

import numpy as np
import torch
from onnx import helper

from tests.helpers import make_model

F32, I64 = np.float32, np.int64
RNG = np.random.default_rng(0)


def node(op, inputs, outputs, **attributes):
    return helper.make_node(op, inputs, outputs, **attributes)


def _dims(first: int, last: int, name: str) -> list:
    """Nodes for Shape(x)[first:last] named ``name``."""
    return [node("Shape", ["x"], [name], start=first, end=last)]


PATTERNS = {
    # x.view(x.size(0), -1), as torch.onnx exports it
    "reshape": ([node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0),
                 node("Unsqueeze", ["n", "axes0"], ["n1"]), node("Concat", ["n1", "minus1"], ["target"], axis=0),
                 node("Reshape", ["x", "target"], ["y"])], ["N", "K"]),
    # Expand to a run-time shape with torch.onnx's "-1 means keep" Equal/Where
    "expand": ([*_dims(0, 2, "nm"), node("Concat", ["nm", "six"], ["target"], axis=0),
                node("Equal", ["target", "minus_ones"], ["keep"]), node("Where", ["keep", "ones", "target"], ["t2"]),
                node("Expand", ["row", "t2"], ["e"]), node("Add", ["x", "e"], ["y"])], ["N", "M", 6]),
    # zeros [1, N, 5] as an initial state, then a GRU over x read as [T=M, N, 6]
    "zeros_state": ([node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]), *_dims(0, 1, "n1"),
                     node("Concat", ["one", "n1", "five"], ["hshape"], axis=0),
                     node("ConstantOfShape", ["hshape"], ["h0"]),
                     node("GRU", ["xt", "W", "R", "", "", "h0"], ["", "y"], hidden_size=5, linear_before_reset=1)],
                    [1, "N", 5]),
    # positions 0..M-1 added along time (Range of a size)
    "range": ([node("Shape", ["x"], ["s"]), node("Gather", ["s", "one_index"], ["m"], axis=0),
               node("Range", ["zero", "m", "one_scalar"], ["positions"]),
               node("Cast", ["positions"], ["p"], to=1), node("Unsqueeze", ["p", "axes1"], ["p1"]),
               node("Add", ["x", "p1"], ["y"])], ["N", "M", 6]),
    # the CRNN pattern: merge the last two dims with Slice / Mul / Div on the shape
    "merge_dims": ([node("Shape", ["x"], ["s"]), node("Slice", ["s", "zero1", "two1"], ["nm"]),
                    node("Slice", ["s", "two1", "three1"], ["c"]), node("Mul", ["c", "two1"], ["c2"]),
                    node("Div", ["c2", "two1"], ["c3"]), node("Concat", ["nm", "c3", "one1"], ["target"], axis=0),
                    node("Reshape", ["x", "target"], ["y"])], ["N", "M", 6, 1]),
    # k = the batch size, as torch.onnx sorts sequence lengths
    "topk": ([node("ReduceSum", ["x", "axes12"], ["score"], keepdims=0), node("Shape", ["score"], ["s"]),
              node("Gather", ["s", "zero1"], ["k"], axis=0), node("TopK", ["score", "k"], ["y", "order"])],
             ["N"]),
}
CONSTANTS = {"zero": np.array(0, I64), "one_index": np.array(1, I64), "one_scalar": np.array(1, I64),
             "axes0": np.array([0], I64), "axes1": np.array([1], I64), "axes12": np.array([1, 2], I64),
             "minus1": np.array([-1], I64), "six": np.array([6], I64), "minus_ones": np.full(3, -1, I64),
             "ones": np.ones(3, I64), "row": RNG.standard_normal((1, 1, 6)).astype(F32),
             "one": np.array([1], I64), "five": np.array([5], I64), "zero1": np.array([0], I64),
             "one1": np.array([1], I64), "two1": np.array([2], I64), "three1": np.array([3], I64),
             "W": (0.5 * RNG.standard_normal((1, 15, 6))).astype(F32),
             "R": (0.5 * RNG.standard_normal((1, 15, 5))).astype(F32)}


def pattern_model(name: str):
    nodes, y_shape = PATTERNS[name]
    used = {i for n in nodes for i in n.input}
    outputs = [("y", F32, y_shape)] + ([("order", I64, ["N"])] if name == "topk" else [])
    return make_model(nodes, [("x", F32, ["N", "M", 6])], outputs, {k: v for k, v in CONSTANTS.items() if k in used},
                      opset=17)


def x_of(batch: int, steps: int) -> torch.Tensor:
    return torch.from_numpy(RNG.standard_normal((batch, steps, 6)).astype(F32))
