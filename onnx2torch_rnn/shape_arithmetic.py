"""Shape arithmetic computed at run time, as fx integer nodes.

Exporters compute sizes at run time (Shape -> Gather -> Unsqueeze -> Concat -> Reshape/Expand/ConstantOfShape, with
Slice, Mul, Div, ReduceProd, Equal/Where in between). Read as int64 tensors, those sizes become unbacked symbols under
torch.compile / torch.export and the first size check fails. Traced back through the ONNX graph to the tensors' sizes,
they are written the way fx itself writes sizes: ``x.size(0)``, ``operator.mul``, ``operator.floordiv``, ... on
Python ints, symbolic sizes tied to the inputs under tracing. A module whose input is such a value receives the ints
(``Converted.ints``); arithmetic on ints known at conversion is done here. Anything outside this small integer
language keeps the tensor path.

A traced value is an int (an ONNX 0-d value) or a list of ints (1-d) whose length conversion knows; each int is a
Python int or bool, or an fx node computing one. The producers are read as converters read them (``OnnxNode``: schema
defaults, and a node with an attribute the tracing does not read is not traced). Where sizes come from, and where
arithmetic on ints unknown at conversion goes, is the ``sizes`` object's: ``FxSizes`` reads them at run time (the
builder's graph), ``DeclaredSizes`` takes the dims graph inputs declare and refuses arithmetic on the others
(``derive``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from onnx import NodeProto, TensorProto
from torch import fx

from .modules import elementwise as ew
from .modules.common import trunc_div
from .node import OnnxNode
from .registry import resolve, schema_for, static_inputs

Int = int | bool | fx.Node
Value = Int | list[Int]


class _NotShape(Exception):
    """The value is not (only) integer arithmetic on tensor sizes and constants."""


_INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                            TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})

# ONNX's element-wise ops on ints: the meaning of modules/elementwise.py's ops on Python ints and symbolic sizes
ARITHMETIC: Mapping[str, Callable] = MappingProxyType({
    "Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Div": trunc_div, "Max": torch.sym_max,
    "Min": torch.sym_min, "Mod": operator.mod, "Equal": operator.eq, "Where": ew.where})
_KEEPS_SIGN = (operator.add, operator.mul, operator.floordiv, operator.mod, torch.sym_max, torch.sym_min)


def _nonnegative(x: Int) -> bool:
    """Whether ``x`` is known to be >= 0: a size, a non-negative int, or sums, products, quotients, max and min of
    them."""
    if isinstance(x, fx.Node):
        return (x.op == "call_method" and x.target in ("size", "numel")) or (
            x.op == "call_function" and x.target in _KEEPS_SIGN and all(_nonnegative(a) for a in x.args))
    return isinstance(x, int) and x >= 0


class FxSizes:
    """Sizes read at run time: fx nodes appended to ``graph``. ``tensor(name)``: the fx node of a tensor value."""

    def __init__(self, ctx, graph: fx.Graph, tensor: Callable[[str], fx.Node]):
        self.ctx, self.graph, self.tensor = ctx, graph, tensor
        self._dims: dict[str, list[fx.Node]] = {}

    def dims(self, name: str) -> list[Int]:
        shape = self.ctx.shape(name)
        if shape is None:  # the rank is the length of the list
            raise _NotShape
        if name not in self._dims:  # those no one reads are dead code
            self._dims[name] = [self.graph.call_method("size", (self.tensor(name), i)) for i in range(len(shape))]
        return self._dims[name]

    def numel(self, name: str) -> Int:
        return self.graph.call_method("numel", (self.tensor(name),))

    def dim(self, name: str, index: int) -> Int:
        return self.graph.call_method("size", (self.tensor(name), index))

    def call(self, fn: Callable, *args: Int) -> fx.Node:
        return self.graph.call_function(fn, args)


_UNDECLARED = object()  # a dim a graph input leaves symbolic


class DeclaredSizes:
    """The dims graph inputs declare, known at conversion; arithmetic on a symbolic dim is refused."""

    def __init__(self, declared: dict[str, list[int | None]]):
        self.declared = declared

    def dims(self, name: str) -> list[Int]:
        if name not in self.declared:
            raise _NotShape
        return [_UNDECLARED if d is None else d for d in self.declared[name]]

    def numel(self, name: str) -> Int:
        dims = self.dims(name)
        if any(d is _UNDECLARED for d in dims):
            raise _NotShape
        return math.prod(dims)

    def dim(self, name: str, index: int) -> Int:
        return self.dims(name)[index]

    def call(self, fn: Callable, *args: Int) -> Int:
        raise _NotShape


class ShapeArithmetic:
    """Traces values of one graph (the main graph or a body: outer values are leaves) back to tensor sizes; each
    value is traced once."""

    def __init__(self, ctx, sizes: FxSizes | DeclaredSizes):
        self.ctx, self.sizes = ctx, sizes
        self._producers: dict[str, NodeProto] | None = None
        self._computed: set[str] | None = None  # the values the converted graph computes (_sized)
        self._memo: dict[str, Value | None] = {}
        self._reads: dict[str, dict[str, None]] = {}  # value -> the tensors whose sizes it reads
        self._reading: list[dict[str, None]] = []  # those of the values being traced, innermost last

    def trace(self, name: str) -> Value | None:
        """The value ``name`` as ints (see the module docstring), or None when it is not shape arithmetic."""
        if self._producers is None:
            self._producers = {o: node for node in self.ctx.plan.graph.node for o in node.output if o}
        try:
            return self.value(name)
        except _NotShape:
            return None

    def reads(self, name: str) -> list[str]:
        """The tensors whose sizes a traced value reads."""
        return list(self._reads.get(name, ()))

    def value(self, name: str | None) -> Value:
        if name not in self._memo:
            self._memo[name] = None  # also while tracing: a cycle is no shape arithmetic
            self._reading.append({})
            try:  # IndexError: an index past a list's end; ZeroDivisionError: left to the tensor path, as it is
                with contextlib.suppress(_NotShape, IndexError, ZeroDivisionError):
                    self._memo[name] = self._trace(name)
            finally:
                self._reads[name] = self._reading.pop()
        if self._memo[name] is None:
            raise _NotShape
        if self._reading:
            self._reading[-1].update(self._reads[name])
        return self._memo[name]

    def dims(self, name: str) -> list[Int]:
        """The sizes of tensor ``name``, as many as its rank."""
        name = self._sized(name)
        self._reading[-1][name] = None
        return self.sizes.dims(name)

    def numel(self, name: str) -> Int:
        name = self._sized(name)
        self._reading[-1][name] = None
        return self.sizes.numel(name)

    def dim(self, name: str, index: int) -> Int:
        """Size ``index`` of tensor ``name``, whose rank conversion need not know."""
        name = self._sized(name)
        self._reading[-1][name] = None
        return self.sizes.dim(name, index)

    def _sized(self, name: str) -> str:
        """The tensor whose sizes are ``name``'s, read instead: the input of a QuantizeLinear / DequantizeLinear (its
        output has its shape) where the converted graph computes it (not inside a fused node), so that one read only
        for its sizes (a QDQ model's Shape) need not run."""
        if self._computed is None:
            self._computed = {o for step in self.ctx.plan.steps for o in step.proto.output} | {
                value.name for value in self.ctx.plan.graph.input}
        while (node := self._producers.get(name)) is not None and node.domain in ("", "ai.onnx") and (
                node.op_type in ("QuantizeLinear", "DequantizeLinear")) and node.input[0] in self._computed:
            name = node.input[0]
        return name

    def producer(self, name: str) -> NodeProto | None:
        return self._producers.get(name)

    def elements(self, name: str | None) -> list[Int]:
        value = self.value(name)
        if not isinstance(value, list):
            raise _NotShape
        return value

    def apply(self, fn: Callable, *args: Int) -> Int:
        """``fn`` on ints: computed now when they are known, else at run time by operators that fx traces (so a
        GraphModule pickles: it is traced again when loaded)."""
        if all(isinstance(a, int) for a in args):
            return fn(*args)
        if fn is ew.where:  # a known condition selects; an unknown one would be control flow
            if not isinstance(args[0], int):
                raise _NotShape
            return args[1] if args[0] else args[2]
        if fn is operator.eq and any(isinstance(a, int) and a < 0 for a in args) and any(map(_nonnegative, args)):
            return False  # a size is no negative number (torch.onnx's "-1 means keep" test)
        if fn is trunc_div:
            return self._divide(*args)
        return self.sizes.call(fn, *args)

    def _divide(self, a: Int, b: Int) -> Int:
        """ONNX's integer division, truncating toward zero: floor division on sizes; else, by a divisor known to be
        positive, floor(max(a, 0) / b) - floor(-min(a, 0) / b)."""
        if _nonnegative(a) and _nonnegative(b):
            return self.sizes.call(operator.floordiv, a, b)
        if isinstance(b, int) and b < 0:
            return self.apply(operator.neg, self._divide(a, -b))
        if not _nonnegative(b):
            raise _NotShape
        up = self.apply(operator.floordiv, self.apply(torch.sym_max, a, 0), b)
        down = self.apply(operator.floordiv, self.apply(operator.neg, self.apply(torch.sym_min, a, 0)), b)
        return self.apply(operator.sub, up, down)

    def _trace(self, value: str) -> Value:
        ctx = self.ctx
        constant = ctx.constant(value, derive=False)  # deriving is what DeclaredSizes serves
        if constant is not None:
            if constant.dim() > 1 or constant.is_floating_point() or constant.is_complex():
                raise _NotShape
            return constant.tolist()
        proto = self._producers.get(value)
        if proto is None or proto.domain not in ("", "ai.onnx") or proto.op_type not in _EXPRESSIONS:
            raise _NotShape
        opset = ctx.opsets.get("", 0)
        resolved = resolve("", proto.op_type, opset)  # read as its converter reads it
        if resolved is None:
            raise _NotShape
        version = resolved[1]
        node = OnnxNode(proto, proto.name, version, schema_for("", proto.op_type, opset),
                        static_inputs("", proto.op_type, version))
        result = _EXPRESSIONS[proto.op_type](self, node, list(proto.output).index(value))
        if node.unread_attributes():  # an attribute this tracing would ignore: not traced
            raise _NotShape
        return result


def derive(ctx, declared: ShapeArithmetic, name: str) -> torch.Tensor | None:
    """The value of shape arithmetic that reads only dims the graph inputs declare static (e.g. MXNet's input size
    from Split(Shape(data))[2], which slices the weights out of one blob), computed once at conversion so what it
    feeds folds; the inputs it reads are then checked at run time against those dims, as onnxruntime does.
    ``declared``: the context's tracer on ``DeclaredSizes``."""
    value = declared.trace(name)
    if value is None or not declared.reads(name):
        return None
    if not all(isinstance(v, int) for v in (value if isinstance(value, list) else [value])):
        return None  # e.g. an undeclared dim passed through untouched
    for source in declared.reads(name):
        ctx.assume_declared_dims(source)
    return torch.tensor(value, dtype=ctx.dtype(name) or torch.int64)


def _nodes(value: Value) -> list[fx.Node]:
    return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, fx.Node)]


def is_symbolic(value: Value) -> bool:
    """Whether a traced value is computed at run time (from sizes), not known at conversion."""
    return bool(_nodes(value))


# ---- the ops: each reads its inputs through the tracer (t.value, t.elements) -----------------------------------------


def _static_list(t: ShapeArithmetic, node: OnnxNode, attribute: str, index: int) -> list[int] | None:
    """A static input (or the attribute that held it before) as ints; None when absent; refused if run-time."""
    value = t.ctx.static(node, index, attribute)
    if value.run_time is not None:
        raise _NotShape
    return value.ints()


def _axis_zero(axes: list[int] | None) -> bool:
    return axes is None or axes in ([0], [-1])


def _one(value: Value) -> Int:
    """The element of a 0-d value or of a one-element list."""
    if not isinstance(value, list):
        return value
    if len(value) != 1:
        raise _NotShape
    return value[0]


def _shape(t, node, output):
    start, end = node.attr("start", 0), node.attr("end", None)  # slicing clamps as ONNX does
    with contextlib.suppress(_NotShape):  # the shape of a shape value (torch.onnx's repeat: Shape of its repeats)
        value = t.value(node.input(0))
        return ([len(value)] if isinstance(value, list) else [])[start:end]
    return t.dims(node.input(0))[start:end]


def _gather(t, node, output):
    indices = t.ctx.constant(node.input(1))
    if node.attr("axis") not in (0, -1) or indices is None or indices.dim() > 1:
        raise _NotShape
    shape = t.producer(node.input(0))
    if (shape is not None and shape.op_type == "Shape" and not shape.attribute
            and t.ctx.shape(shape.input[0]) is None):  # dims of a tensor of unknown rank (after an If, say)
        dims = [t.dim(shape.input[0], i) for i in indices.reshape(-1).tolist()]
        return dims if indices.dim() else dims[0]
    data = t.elements(node.input(0))
    return [data[i] for i in indices.tolist()] if indices.dim() else data[int(indices)]


def _unsqueeze(t, node, output):
    if _static_list(t, node, "axes", 1) not in ([0], [-1]) or isinstance(value := t.value(node.input(0)), list):
        raise _NotShape
    return [value]


def _squeeze(t, node, output):
    if not _axis_zero(_static_list(t, node, "axes", 1)):
        raise _NotShape
    return _one(t.elements(node.input(0)))


def _concat(t, node, output):
    if node.attr("axis") not in (0, -1):
        raise _NotShape
    return [x for i in range(len(node.inputs)) for x in t.elements(node.input(i))]


def _slice(t, node, output):
    starts, ends = _static_list(t, node, "starts", 1), _static_list(t, node, "ends", 2)
    axes, steps = _static_list(t, node, "axes", 3), _static_list(t, node, "steps", 4)
    if starts is None or len(starts) != 1 or not _axis_zero(axes) or steps not in (None, [1]):
        raise _NotShape
    return t.elements(node.input(0))[starts[0]:ends[0]]  # slicing clamps as ONNX's Slice does (step 1)


def _reshape(t, node, output):
    target = t.ctx.constant(node.input(1))
    if target is None or target.numel() > 1:  # to 0-d or 1-d only
        raise _NotShape
    if node.attr("allowzero", 0) and 0 in target.tolist():  # an empty tensor: no shape value
        raise _NotShape
    value = t.value(node.input(0))
    if not target.numel():
        return _one(value)
    return value if isinstance(value, list) else [value]


def _prod(t, node, output):
    if not _axis_zero(_static_list(t, node, "axes", 1)) or node.attr("noop_with_empty_axes", 0):
        raise _NotShape
    factors = t.elements(node.input(0))
    product = functools.reduce(functools.partial(t.apply, operator.mul), factors) if factors else 1
    return [product] if node.attr("keepdims") else product


def _fill(t, node, output):
    try:
        value = node.attr("value")
    except NotImplementedError:  # an element type torch has no dtype for
        raise _NotShape from None
    if value is None or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise _NotShape
    count = _one(t.elements(node.input(0)))
    if not isinstance(count, int):  # the list's length must be known
        raise _NotShape
    return [int(value.reshape(-1)[0])] * count


def _cast(t, node, output):
    node.attr("saturate"), node.attr("round_mode")  # they change casts to float8 only
    to = node.attr("to")
    if to == TensorProto.BOOL:  # a condition (an If's, a Where's) from sizes
        return _broadcast(lambda v: t.apply(operator.ne, v, 0), [t.value(node.input(0))])
    if to not in _INTEGER_TYPES:
        raise _NotShape
    return t.value(node.input(0))


def _broadcast(fn: Callable, values: list[Value]) -> Value:
    """``fn`` element by element, with ONNX (numpy) broadcasting of 0-d and one-element values."""
    if not any(isinstance(v, list) for v in values):
        return fn(*values)
    lists = [v if isinstance(v, list) else [v] for v in values]
    n = max(len(v) for v in lists)
    if any(len(v) not in (1, n) for v in lists):
        raise _NotShape
    return [fn(*xs) for xs in zip(*(v * n if len(v) == 1 else v for v in lists), strict=True)]


def _elementwise(t, node, output):
    if node.op_type == "Mod" and node.attr("fmod"):  # C's fmod: the sign of the dividend, not Python's %
        raise _NotShape
    apply = functools.partial(t.apply, ARITHMETIC[node.op_type])
    values = [t.value(name) for name in node.inputs]
    if node.op_type in ("Max", "Min"):  # variadic
        return functools.reduce(lambda a, b: _broadcast(apply, [a, b]), values)
    return _broadcast(apply, values)


def _split(t, node, output):
    """One part of a Split of a 1-d value (e.g. MXNet's Split(Shape(data)) into single dims)."""
    source = t.elements(node.input(0))
    num_outputs = node.attr("num_outputs", None)
    if node.attr("axis") not in (0, -1) or num_outputs not in (None, len(node.outputs)):
        raise _NotShape
    sizes = _static_list(t, node, "split", 1)
    if sizes is None:  # equal parts; from opset 18 (num_outputs) the last one may be smaller
        part = -(-len(source) // len(node.outputs))
        sizes = [min(part, len(source) - k * part) for k in range(len(node.outputs))]
    start = sum(sizes[:output])
    return source[start:start + sizes[output]]


_EXPRESSIONS: Mapping[str, Callable] = MappingProxyType({
    "Shape": _shape,
    "Size": lambda t, node, output: t.numel(node.input(0)),
    "Not": lambda t, node, output: _broadcast(functools.partial(t.apply, operator.not_), [t.value(node.input(0))]),
    "Identity": lambda t, node, output: t.value(node.input(0)),
    "Cast": _cast,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Reshape": _reshape,
    "ReduceProd": _prod,
    "ConstantOfShape": _fill,
    "Split": _split,
    **dict.fromkeys(ARITHMETIC, _elementwise),
})
