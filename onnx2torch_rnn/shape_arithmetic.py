"""Shape arithmetic computed at run time, traced back to the tensors' shapes.

Exporters compute sizes at run time (Shape -> Gather -> Unsqueeze -> Concat -> Reshape/Expand/ConstantOfShape, with
Slice, Mul, Div, ReduceProd, Equal/Where in between). Read as int64 tensors, those sizes become unbacked symbols under
torch.compile / torch.export and the first size check fails; traced back through the ONNX graph to the source
tensors' shapes (modules.shape.ShapeExpr) they stay symbolic sizes tied to the inputs, and eager mode skips the
tensor round trip. Anything outside this small integer language keeps the tensor path.

The producers are read as converters read them (``OnnxNode``: schema defaults, and a node with an attribute the
tracing does not read is not traced); the ops' meaning is modules/shape.py's ``SHAPE_OPS``. One ``ShapeArithmetic``
per graph, owned by its ConversionContext, holds the memo.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from onnx import NodeProto, TensorProto

from .modules import shape as m
from .node import OnnxNode
from .registry import resolve, schema_for, static_inputs


class _NotShape(Exception):
    """The value is not (only) integer arithmetic on tensor shapes and constants."""


_INTEGER_TYPES = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
                  TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}


def _static_list(ctx, node: OnnxNode, attribute: str, index: int) -> list[int] | None:
    """A static input (or the attribute that held it before) as ints; None when absent; refused if run-time."""
    value = ctx.static(node, index, attribute)
    if value.run_time is not None:
        raise _NotShape
    return value.ints()


def _axis_zero(axes: list[int] | None) -> bool:
    return axes is None or axes in ([0], [-1])


def _rank(ctx, name: str, rank: int) -> None:
    shape = ctx.shape(name)
    if shape is None or len(shape) != rank:
        raise _NotShape


def _shape(ctx, node, sub):
    return m.ShapeExpr("shape", (), [node.input(0), node.attr("start", 0), node.attr("end", None)])


def _gather(ctx, node, sub):
    indices = ctx.constant(node.input(1))
    if node.attr("axis") not in (0, -1) or indices is None or indices.dim() > 1:
        raise _NotShape
    return m.ShapeExpr("gather", [sub(0)], [indices.tolist()])


def _unsqueeze(ctx, node, sub):
    _rank(ctx, node.input(0), 0)
    if _static_list(ctx, node, "axes", 1) not in ([0], [-1]):
        raise _NotShape
    return m.ShapeExpr("unsqueeze", [sub(0)])


def _squeeze(ctx, node, sub):
    _rank(ctx, node.input(0), 1)
    if not _axis_zero(_static_list(ctx, node, "axes", 1)):
        raise _NotShape
    return m.ShapeExpr("item", [sub(0)])


def _concat(ctx, node, sub):
    if node.attr("axis") not in (0, -1):
        raise _NotShape
    return m.ShapeExpr("concat", [sub(i) for i in range(len(node.inputs))])


def _slice(ctx, node, sub):
    starts, ends = _static_list(ctx, node, "starts", 1), _static_list(ctx, node, "ends", 2)
    axes, steps = _static_list(ctx, node, "axes", 3), _static_list(ctx, node, "steps", 4)
    if starts is None or len(starts) != 1 or not _axis_zero(axes) or steps not in (None, [1]):
        raise _NotShape
    return m.ShapeExpr("slice", [sub(0)], [starts[0], ends[0]])


def _reshape(ctx, node, sub):
    target = ctx.constant(node.input(1))
    if target is None or target.numel() > 1:  # to 0-d or 1-d only
        raise _NotShape
    if node.attr("allowzero", 0) and 0 in target.tolist():  # an empty tensor: no shape value
        raise _NotShape
    return m.ShapeExpr("flatten" if target.numel() else "item", [sub(0)])


def _prod(ctx, node, sub):
    if not _axis_zero(_static_list(ctx, node, "axes", 1)) or node.attr("noop_with_empty_axes", 0):
        raise _NotShape
    return m.ShapeExpr("prod", [sub(0)], [node.attr("keepdims")])


def _fill(ctx, node, sub):
    try:
        value = node.attr("value")
    except NotImplementedError:  # an element type torch has no dtype for
        raise _NotShape from None
    if value is None or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise _NotShape
    return m.ShapeExpr("fill", [sub(0)], [int(value.reshape(-1)[0])])


def _cast(ctx, node, sub):
    node.attr("saturate"), node.attr("round_mode")  # they change casts to float8 only
    if node.attr("to") not in _INTEGER_TYPES:
        raise _NotShape
    return sub(0)


def _elementwise(ctx, node, sub):
    if node.op_type == "Where":
        return m.ShapeExpr("Where", [sub(0), sub(1), sub(2)])
    expr = sub(0)
    for i in range(1, len(node.inputs)):  # Max and Min are variadic
        expr = m.ShapeExpr(node.op_type, [expr, sub(i)])
    return expr


def _split(ctx, node: OnnxNode, source: m.ShapeExpr, output: int) -> m.ShapeExpr:
    """Output ``output`` of a Split of a 1-d shape vector (e.g. MXNet's Split(Shape(data)) into single dims)."""
    length = ctx.shape(node.input(0))
    num_outputs = node.attr("num_outputs", None)
    if node.attr("axis") not in (0, -1) or length is None or len(length) != 1 or not isinstance(length[0], int):
        raise _NotShape
    if num_outputs not in (None, len(node.outputs)):
        raise _NotShape
    sizes = _static_list(ctx, node, "split", 1)
    if sizes is None:  # equal parts; from opset 18 (num_outputs) the last one may be smaller
        part = -(-length[0] // len(node.outputs))
        sizes = [min(part, length[0] - k * part) for k in range(len(node.outputs))]
    start = sum(sizes[:output])
    return m.ShapeExpr("slice", [source], [start, start + sizes[output]])


_EXPRESSIONS: dict[str, Callable] = {
    "Shape": _shape,
    "Size": lambda ctx, node, sub: m.ShapeExpr("size", (), [node.input(0)]),
    "Identity": lambda ctx, node, sub: sub(0),
    "Cast": _cast,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Reshape": _reshape,
    "ReduceProd": _prod,
    "ConstantOfShape": _fill,
    **{op: _elementwise for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Where")},
}


class ShapeArithmetic:
    """Traces values of one graph (the main graph or a body: outer values are leaves) back to tensor shapes; each
    value is traced once."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._producers: dict[str, NodeProto] | None = None
        self._memo: dict[str, m.ShapeExpr | None] = {}

    def expression(self, name: str) -> m.ShapeExpr | None:
        """The run-time value ``name`` as integer arithmetic on tensor shapes and constants, or None."""
        if self._producers is None:
            self._producers = {o: node for node in self.ctx.plan.graph.node for o in node.output if o}
        try:
            expr = self._build(name)
        except _NotShape:
            return None
        return expr if expr.sources() else None

    def _build(self, value: str) -> m.ShapeExpr:
        if value not in self._memo:
            self._memo[value] = None  # also while tracing: a cycle is no shape arithmetic
            with contextlib.suppress(_NotShape):
                self._memo[value] = self._trace(value)
        if self._memo[value] is None:
            raise _NotShape
        return self._memo[value]

    def _trace(self, value: str) -> m.ShapeExpr:
        ctx = self.ctx
        constant = ctx.constant(value, derive=False)  # deriving is what this serves
        if constant is not None:
            if constant.dim() > 1 or constant.is_floating_point() or constant.is_complex():
                raise _NotShape
            return m.ShapeExpr("const", (), [constant.tolist()])
        proto = self._producers.get(value)
        if proto is None or proto.domain not in ("", "ai.onnx") or proto.op_type not in (*_EXPRESSIONS, "Split"):
            raise _NotShape
        opset = ctx.opsets.get("", 0)
        resolved = resolve("", proto.op_type, opset)  # read as its converter reads it
        if resolved is None:
            raise _NotShape
        version = resolved[1]
        node = OnnxNode(proto, proto.name, version, schema_for("", proto.op_type, opset),
                        static_inputs("", proto.op_type, version))
        if proto.op_type == "Split":
            expr = _split(ctx, node, self._build(proto.input[0]), list(proto.output).index(value))
        else:
            expr = _EXPRESSIONS[proto.op_type](ctx, node, lambda i: self._build(node.input(i)))
        if node.unread_attributes():  # an attribute this tracing would ignore: not traced
            raise _NotShape
        return expr

    def derive(self, name: str) -> torch.Tensor | None:
        """The value of shape arithmetic that reads only dims the graph inputs declare static (e.g. MXNet's input
        size from Split(Shape(data))[2], which slices the weights out of one blob), computed once at conversion so
        what it feeds folds; the inputs it reads are then checked at run time against those dims, as onnxruntime
        does."""
        ctx = self.ctx
        expr = self.expression(name)
        if expr is None or not all(source in ctx.loaded.declared for source in expr.sources()):
            return None
        shapes = {source: [_Undeclared() if d is None else d for d in ctx.loaded.declared[source]]
                  for source in expr.sources()}
        try:
            value = expr(shapes)
        except _NotShape:
            return None
        if not all(isinstance(v, int) for v in (value if isinstance(value, list) else [value])):
            return None  # e.g. an undeclared dim passed through untouched
        for source in expr.sources():
            ctx.assume_declared_dims(source)
        return torch.tensor(value, dtype=ctx.dtype(name) or torch.int64)


class _Undeclared:
    """A dim a graph input leaves symbolic: an expression that computes with it has no value at conversion."""

    def _refuse(self, *args):
        raise _NotShape

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = __rfloordiv__ = _refuse
    __mod__ = __abs__ = __neg__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _refuse
    __bool__ = __index__ = __int__ = __float__ = _refuse
    __hash__ = None
