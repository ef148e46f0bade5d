"""MatMul by a constant matrix, then Add of a constant vector: one nn.Linear with a bias.

Exporters write a linear layer on a 3-D input (a tagger's classifier over [N, T, H]) as MatMul + Add, since Gemm is
2-D only; as written that is two modules and two ops per call, as one nn.Linear it is one addmm. Exact: the vector
has the matrix's column count, so it broadcasts along the last axis only and never changes the output's rank.
Registered last: a MatMul + Add inside a recurrence that another pattern recognises belongs to that recurrence.
"""

from __future__ import annotations

import onnx

from ..converters.linalg import linear
from ..node import Converted
from . import Fusion, GraphView, register_pattern

# float16 stays two ops: one addmm rounds once where MatMul then Add round twice, a visible step in half precision
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def _owned_constant(view: GraphView, name: str, reader: onnx.NodeProto) -> list | None:
    """The shape of ``name`` if it is a floating constant that only ``reader`` reads (a weight read elsewhere stays
    one tied parameter), else None."""
    if not view.is_constant(name) or view.only_consumer(name) is not reader or view.elem_type(name) not in _FLOATS:
        return None
    shape = view.shape(name)
    return shape if shape is not None and all(isinstance(d, int) for d in shape) else None


@register_pattern("linear_bias")
def linear_bias(view: GraphView):
    for matmul in view.nodes:
        if matmul.op_type != "MatMul" or matmul.domain not in ("", "ai.onnx"):
            continue
        add = view.only_consumer(matmul.output[0])
        if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
            continue
        bias = add.input[1] if add.input[0] == matmul.output[0] else add.input[0]
        weight_shape, bias_shape = _owned_constant(view, matmul.input[1], matmul), _owned_constant(view, bias, add)
        if (weight_shape is None or bias_shape is None or len(weight_shape) != 2 or bias_shape != weight_shape[1:]
                or view.elem_type(bias) != view.elem_type(matmul.input[1])):
            continue
        yield Fusion("linear_bias", "Linear", [matmul, add], [matmul.input[0], matmul.input[1], bias],
                     [add.output[0]], lambda ctx, x=matmul.input[0], w=matmul.input[1], b=bias: _convert(ctx, x, w, b))


def _convert(ctx, x: str, weight: str, bias: str) -> Converted:
    return Converted(linear(ctx.constant(weight).t(), ctx.constant(bias)), [x])
