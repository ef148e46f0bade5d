"""Sequence ops: SplitToSequence, SequenceAt, SequenceConstruct, SequenceEmpty, SequenceInsert, SequenceErase,
SequenceLength, ConcatFromSequence (an ONNX sequence is a tuple of tensors in the GraphModule), and optionals:
Optional, OptionalHasElement, OptionalGetElement (an ONNX optional is None when empty, else the value it holds).

The dynamo exporter writes them for an unrolled nn.RNN: SplitToSequence over time, then one SequenceAt per step.
"""

from __future__ import annotations

from ..modules import sequence as m
from ..node import Converted, OnnxNode
from ..registry import register_converter
from .shape import converted


@register_converter("SplitToSequence", (11, 24), static=(1,))
def split_to_sequence(node: OnnxNode, ctx) -> Converted:
    """`split` absent (parts of 1, squeezed when keepdims=0), a scalar (the last part may be smaller) or 1-D sizes
    (zeros allowed, as onnxruntime), constant or computed at run time. keepdims applies without `split` and, as in
    onnxruntime, to a scalar split of 1."""
    split = ctx.static(node, 1)
    sizes = split.ints()
    if sizes is not None and split.value.dim() == 0:
        sizes = sizes[0]
    module = m.SplitToSequence(node.attr("axis"), node.attr("keepdims"), sizes)
    return converted(module, [node.input(0), split.run_time])


@register_converter("SequenceAt", (11,), static=(1,))
def sequence_at(node: OnnxNode, ctx) -> Converted:
    """Position constant or computed at run time, in [-n, n - 1]; out of range raises."""
    position = ctx.static(node, 1)
    return converted(m.SequenceAt(position.integer()), [node.input(0), position.run_time])


@register_converter("SequenceConstruct", (11,))
def sequence_construct(node: OnnxNode, ctx) -> Converted:
    """A tuple of the inputs."""
    return Converted(m.SequenceConstruct(), node.inputs)


@register_converter("SequenceLength", (11,))
def sequence_length(node: OnnxNode, ctx) -> Converted:
    """An int64 scalar."""
    return Converted(m.SequenceLength(), node.inputs)


@register_converter("SequenceInsert", (11,), static=(2,))
def sequence_insert(node: OnnxNode, ctx) -> Converted:
    """Position constant or computed at run time, in [-n, n]; absent: at the back; out of range raises."""
    position = ctx.static(node, 2)
    return converted(m.SequenceInsert(position.integer()), [node.input(0), node.input(1), position.run_time])


@register_converter("SequenceErase", (11,), static=(1,))
def sequence_erase(node: OnnxNode, ctx) -> Converted:
    """Position constant or computed at run time, in [-n, n - 1]; absent: the last; out of range raises."""
    position = ctx.static(node, 1)
    return converted(m.SequenceErase(position.integer()), [node.input(0), position.run_time])


@register_converter("ConcatFromSequence", (11,))
def concat_from_sequence(node: OnnxNode, ctx) -> Converted:
    """torch.cat along ``axis``, or torch.stack when ``new_axis`` is 1 (``axis`` may then be the new last one)."""
    new_axis = node.attr("new_axis", 0)
    if new_axis not in (0, 1):
        raise node.unsupported("new_axis", new_axis, "must be 0 or 1")
    return Converted(m.ConcatFromSequence(node.attr("axis"), new_axis), node.inputs)


@register_converter("SequenceEmpty", (11,))
def sequence_empty(node: OnnxNode, ctx) -> Converted:
    """An empty tuple (folded at conversion); ``dtype`` only types the graph."""
    node.attr("dtype")
    return Converted(m.SequenceEmpty(), [])


@register_converter("Optional", (15, 28))
def optional(node: OnnxNode, ctx) -> Converted:
    """The input itself, or None (an empty optional) without one; ``type`` only types the graph. Passes through
    If branches and Loop bodies as any value does."""
    node.attr("type")
    return converted(m.Optional(), [node.input(0)])


@register_converter("OptionalHasElement", (15, 18, 28))
def optional_has_element(node: OnnxNode, ctx) -> Converted:
    """True unless the input is an empty optional (None) or, since 18, absent."""
    return converted(m.OptionalHasElement(), [node.input(0)])


@register_converter("OptionalGetElement", (15, 18, 28))
def optional_get_element(node: OnnxNode, ctx) -> Converted:
    """The value held (since 18 a plain tensor or sequence passes through); an empty optional raises ValueError at
    run time, as onnxruntime fails."""
    return Converted(m.OptionalGetElement(), [node.input(0)])
