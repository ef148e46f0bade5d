"""Sequence ops: SplitToSequence, SequenceAt (an ONNX sequence is a tuple of tensors in the GraphModule).

The dynamo exporter writes them for an unrolled nn.RNN: SplitToSequence over time, then one SequenceAt per step.
"""

from __future__ import annotations

from ..modules import sequence as m
from ..node import Converted, OnnxNode
from ..registry import register_converter
from .shape import constant_ints, converted, run_time


@register_converter("SplitToSequence", (11, 24))
def split_to_sequence(node: OnnxNode, ctx) -> Converted:
    """`split` absent (parts of 1, squeezed when keepdims=0), a scalar (the last part may be smaller) or 1-D sizes
    (zeros allowed, as onnxruntime), constant or computed at run time. keepdims applies without `split` and, as in
    onnxruntime, to a scalar split of 1."""
    name = node.input(1)
    sizes = constant_ints(ctx, name)
    if sizes is not None and ctx.constant(name).dim() == 0:
        sizes = sizes[0]
    module = m.SplitToSequence(node.attr("axis"), node.attr("keepdims"), sizes)
    return converted(module, [node.input(0), run_time(ctx, name)])


@register_converter("SequenceAt", (11,))
def sequence_at(node: OnnxNode, ctx) -> Converted:
    """Position constant or computed at run time, in [-n, n - 1]; out of range raises."""
    position = constant_ints(ctx, node.input(1))
    return converted(m.SequenceAt(None if position is None else position[0]),
                     [node.input(0), run_time(ctx, node.input(1))])
