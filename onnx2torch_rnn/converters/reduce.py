"""Reductions: every Reduce* op through one converter and one module, driven by a table.

The table gives each op's ONNX versions and the version from which ``axes`` is an input instead of an attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..modules.shape import Reduce
from ..node import Converted, OnnxNode, refuse_uint64
from ..registry import register_converter
from .shape import converted

# op -> (ONNX versions, version from which axes is an input and noop_with_empty_axes exists)
REDUCE_OPS: Mapping[str, tuple[tuple[int, ...], int]] = MappingProxyType({
    "ReduceSum": ((1, 11, 13), 13),
    "ReduceMean": ((1, 11, 13, 18), 18),
    "ReduceMax": ((1, 11, 12, 13, 18, 20), 18),
    "ReduceMin": ((1, 11, 12, 13, 18, 20), 18),
    "ReduceProd": ((1, 11, 13, 18), 18),
    "ReduceL1": ((1, 11, 13, 18), 18),
    "ReduceL2": ((1, 11, 13, 18), 18),
    "ReduceLogSum": ((1, 11, 13, 18, 28), 18),
    "ReduceLogSumExp": ((1, 11, 13, 18, 28), 18),
    "ReduceSumSquare": ((1, 11, 13, 18), 18),
})


def reduce(node: OnnxNode, ctx) -> Converted:
    """Axes as attribute or input (constant or run-time), keepdims; absent or empty axes reduce all axes, or with
    noop_with_empty_axes=1 none (the element-wise steps still apply: ReduceSumSquare squares). Integer inputs
    compute in their own type as onnxruntime does (mean truncates, sqrt/log/exp results truncate toward zero).
    ReduceMax / ReduceMin over an empty axis give the spec's identity: -inf / +inf (an integer type's lowest /
    highest value, as onnxruntime; bool False / True, which onnxruntime refuses)."""
    refuse_uint64(node, ctx)
    axes = ctx.static(node, 1, "axes")
    noop = node.attr("noop_with_empty_axes", 0)
    module = Reduce(node.op_type, axes.ints(), node.attr("keepdims"), noop)
    return converted(module, [node.input(0), axes.run_time])


for _op, (_versions, _) in REDUCE_OPS.items():
    register_converter(_op, _versions, static=(1,))(reduce)
