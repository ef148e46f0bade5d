"""Stacked recurrent layers: per-layer LSTM / GRU / RNN nodes joined by an exporter's glue become one module.

torch.onnx writes an L-layer nn.LSTM as L LSTM nodes and glue: a Transpose to time-major in front (batch_first),
initial states that are zeros built from the input's shape (Shape -> Gather -> Unsqueeze -> Concat ->
ConstantOfShape, then one Slice per layer) or slices of the given h0 / c0, between layers Y [T, D, N, H] ->
Transpose(0, 2, 1, 3) -> Reshape(0, 0, -1) (two directions) or Squeeze(1) (one), after the last layer the same and a
Transpose back, and Concat of the layers' Y_h / Y_c. Other exporters vary it: dynamo computes the Reshape's target
from the Transpose's shape and Expands a zero scalar; tf2onnx Unsqueezes zeros [N, H] (Concat of two for two
directions), casts shapes to int32 and back, merges directions with a Slice and Squeeze each and a Concat, and turns
time-major and back between layers; MXNet and paddle compute the weights from initializers, and paddle2onnx's
final states are the last layer's alone (the other layers' are read by nothing); PackedSequence sorts the rows by
length around the layers (TopK, Gathers by the permutation and its inverse). All of it becomes one StackedRecurrent
(or, for one layer without glue, the layer's own module without its zero states).

What is proven before anything fires: every layer (of any cell: Keras's LSTM -> GRU) has constant weights (folded
when the graph is built), layout 0 and the same lengths; each glue node has the attributes (or a target shape traced
symbolically) that make it exactly the merge of directions; a value the fusion drops is read only inside it; a
dropped initial state is all zeros of exactly [D, N, H], N proven equal to the batch dim of the first layer's input
(dims compared in a canonical form, ``_dim``); a sort is undone by its own inverse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from ..node import Converted, read_names
from ..recurrent import StackedRecurrent
from . import Fusion, GraphView, attribute, register_pattern

RECURRENT = ("LSTM", "GRU", "RNN")
_INT32, _INT64 = onnx.TensorProto.INT32, onnx.TensorProto.INT64
_NORMAL = ("", "ai.onnx")
_QUANTIZED_LSTM = "DynamicQuantizeLSTM"  # com.microsoft (quantize_dynamic's LSTM): a layer of its own stacks


@dataclass
class _Layer:
    node: onnx.NodeProto | None  # None: a layer recognised from other nodes (unrolled.py), built by ``build``
    directions: int
    hidden: int
    lengths: str  # sequence_lens ('' without)
    # initial_h (5) / initial_c (6) -> None (absent or zeros) or (k, start, end): rows of the stack's k-th source
    states: dict[int, tuple[int, int | None, int | None] | None] = field(default_factory=dict)
    build: Callable | None = None  # outputs (Y, Y_h, Y_c wanted) -> the layer's module, where ``node`` is None


@dataclass
class _Stack:
    op_type: str
    layers: list[_Layer]
    nodes: list[onnx.NodeProto]  # glue and state slices besides the layers
    x: str
    batch_first: bool = False
    batch_first_output: bool = False
    merge_output: bool = False
    lengths: str = ""  # the run-time sequence_lens every layer reads ('' without, or when it is a constant)
    final_states: str = ""  # what h_n / c_n hold: "all" layers' (Concat), "last" layer's only (paddle2onnx)
    sources: list[str] = field(default_factory=list)  # run-time values that initial states are taken from
    outputs: list[str | None] = field(default_factory=list)
    squeeze_states: bool = False  # h_n / c_n as [N, H]: one direction's, read so (Keras's return_state)
    window: tuple | None = None  # the steps of x each direction of the first layer reads (unrolled.py), None: all

    def source(self, name: str) -> int:
        if name not in self.sources:
            self.sources.append(name)
        return self.sources.index(name)


def _op(node: onnx.NodeProto | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in _NORMAL


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _recurrent(node: onnx.NodeProto | None) -> bool:
    """An ONNX LSTM / GRU / RNN, or com.microsoft's DynamicQuantizeLSTM (the same inputs and outputs, int8 W [D, I,
    4H] and R [D, H, 4H] with their scales and zero points as inputs 8-11)."""
    return node is not None and ((node.op_type in RECURRENT and node.domain in _NORMAL) or (
        node.op_type == _QUANTIZED_LSTM and node.domain == "com.microsoft"))


def _layer(view: GraphView, node: onnx.NodeProto) -> _Layer | None:
    """A recurrent node that can be a layer: constant weights (initializers, or computed from them: folded when the
    graph is built; a DynamicQuantizeLSTM's scales and zero points too), layout 0, a known hidden size."""
    if not _recurrent(node) or not _input(node, 0):
        return None
    if not (view.is_constant(_input(node, 1)) and view.is_constant(_input(node, 2))):
        return None
    if any(_input(node, k) and not view.is_constant(_input(node, k)) for k in (3, 7, 8, 9, 10, 11)):
        return None
    if attribute(node, "layout", 0) != 0:
        return None
    axis = -2 if node.op_type == _QUANTIZED_LSTM else -1  # R [D, H, 4H], not [D, 4H, H]
    hidden = attribute(node, "hidden_size") or (view.shape(_input(node, 2)) or [None, None])[axis]
    directions = 2 if attribute(node, "direction", "forward") == "bidirectional" else 1
    return _Layer(node, directions, hidden, _input(node, 4)) if isinstance(hidden, int) and hidden > 0 else None


def _axes(view: GraphView, node: onnx.NodeProto, index: int) -> list[int] | None:
    """Squeeze / Unsqueeze axes: an attribute before opset 13, an input since."""
    if view.opset(node) < 13:
        return attribute(node, "axes")
    return view.ints(_input(node, index))


def _merge(view: GraphView, layer: _Layer) -> tuple[str, list[onnx.NodeProto]] | None:
    """The glue that turns a layer's Y [T, D, N, H] into [T, N, D*H]: its output value and its nodes."""
    first = view.only_consumer(layer.node.output[0]) if layer.node.output else None
    if layer.directions == 1 and _op(first, "Squeeze") and _axes(view, first, 1) in ([1], [-3]):
        return first.output[0], [first]
    if layer.directions == 2 and first is None:
        return _merge_directions(view, layer)
    if not (_op(first, "Transpose") and attribute(first, "perm") == [0, 2, 1, 3]):
        return None
    readers = view.consumers.get(first.output[0], [])
    second = next((r for r in readers if _op(r, "Reshape") and r.input[0] == first.output[0]), None)
    if second is None:
        return None
    target = view.ints(_input(second, 1))
    if target == [0, 0, -1] and not attribute(second, "allowzero", 0) and len(readers) == 1:  # TorchScript exporter
        return second.output[0], [first, second]
    # dynamo computes the target from the Transpose's own shape: proven [T, N, D*H], its nodes go with the glue
    x = layer.node.input[0]
    merged = [_dim(view, x, 0), _dim(view, x, 1), layer.directions * layer.hidden]
    shape_nodes = _computing(view, second.input[1], first.output[0], _SHAPE_OPS)
    if (target is None and shape_nodes is not None and None not in merged
            and _shape_vector(view, second.input[1]) == merged):
        return second.output[0], [first, second, *shape_nodes]
    return None


def _merge_directions(view: GraphView, layer: _Layer) -> tuple[str, list[onnx.NodeProto]] | None:
    """tf2onnx's merge of two directions: Y sliced to [T, 1, N, H] per direction along axis 1, each Squeezed, then
    Concat(forward, reverse) on the last axis: [T, N, 2H], the same as Transpose(0, 2, 1, 3) + Reshape(0, 0, -1)."""
    squeezed = {}
    nodes = []
    for reader in view.consumers.get(layer.node.output[0], []):
        step = view.opset(reader) >= 10 and _input(reader, 3) and view.ints(_input(reader, 3)) == [1] and (
            not _input(reader, 4) or view.ints(_input(reader, 4)) == [1])
        starts, ends = view.ints(_input(reader, 1)), view.ints(_input(reader, 2))
        if not (_op(reader, "Slice") and step and starts and ends and [starts[0], min(ends[0], 2)] in ([0, 1], [1, 2])):
            return None
        squeeze = view.only_consumer(reader.output[0])
        if not (_op(squeeze, "Squeeze") and _axes(view, squeeze, 1) in ([1], [-3])):
            return None
        squeezed[starts[0]] = squeeze.output[0]
        nodes += [reader, squeeze]
    concat = view.only_consumer(squeezed.get(0, "")) if len(squeezed) == 2 else None
    if not (_op(concat, "Concat") and attribute(concat, "axis") in (2, -1) and list(concat.input) == [
            squeezed[0], squeezed[1]] and view.only_consumer(squeezed[1]) is concat):
        return None
    return concat.output[0], [*nodes, concat]


def _cancelled_transposes(view: GraphView, value: str) -> tuple[str, list[onnx.NodeProto]]:
    """Transposes that undo each other (tf2onnx between layers: to batch-major and straight back): the value after
    such pairs (only Shapes may read the middle one: zero states, absorbed with them) and their nodes."""
    nodes = []
    while True:
        there = view.only_consumer(value)
        perm = attribute(there, "perm") if _op(there, "Transpose") else None
        if perm is None:
            return value, nodes
        readers = view.consumers.get(there.output[0], [])
        back = next((r for r in readers if _op(r, "Transpose") and r.input[0] == there.output[0]
                     and _undoes(attribute(r, "perm"), perm)), None)
        if back is None or there.output[0] in view.graph_outputs or not all(
                r is back or _op(r, "Shape") for r in readers):
            return value, nodes
        nodes += [there, back]
        value = back.output[0]


def _undoes(perm: list[int] | None, first: list[int]) -> bool:
    """Whether Transpose(perm) of Transpose(first) is the identity: output axis i is input axis first[perm[i]]."""
    identity = list(range(len(first)))
    return perm is not None and sorted(perm) == identity and [first[k] for k in perm] == identity


def reversal(view: GraphView, node: onnx.NodeProto | None, value: str) -> bool:
    """A ReverseSequence of ``value`` [T, N, ...] along axis 0 that reverses all of it: every row's length T (tf2onnx's
    ReverseV2: an Expand of dim 0 to [N])."""
    if not (_op(node, "ReverseSequence") and node.input[0] == value and attribute(node, "time_axis", 0) == 0
            and attribute(node, "batch_axis", 1) == 1):
        return False
    lengths = view.producer.get(node.input[1])
    return _op(lengths, "Expand") and _shape_vector(view, lengths.input[0]) == [_dim(view, value, 0)] and (
        _shape_vector(view, lengths.input[1]) == [_dim(view, value, 1)])


_SHAPE_OPS = ("Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Mul", "Constant")


def _computing(view: GraphView, name: str, source: str, ops=_SHAPE_OPS) -> list[onnx.NodeProto] | None:
    """The nodes that compute value ``name`` from value ``source`` and constants, if only ``ops`` do."""
    found: dict[int, onnx.NodeProto] = {}
    pending = [name]
    while pending:
        value = pending.pop()
        node = view.producer.get(value)
        if value == source or view.is_weight(value) or (node is not None and id(node) in found):
            continue
        if node is None or not any(_op(node, op) for op in ops):
            return None
        found[id(node)] = node
        pending += [v for v in node.input if v]
    return list(found.values())


def _slice(view: GraphView, node: onnx.NodeProto) -> tuple[int, int] | None:
    """(start, end) of a Slice along axis 0 with step 1, else None."""
    if view.opset(node) < 10:
        starts, ends, axes, steps = (attribute(node, "starts"), attribute(node, "ends"), attribute(node, "axes"),
                                     None)
    else:
        starts, ends = view.ints(_input(node, 1)), view.ints(_input(node, 2))
        axes = view.ints(_input(node, 3)) if _input(node, 3) else None
        steps = view.ints(_input(node, 4)) if _input(node, 4) else None
        if (_input(node, 3) and axes is None) or (_input(node, 4) and steps is None):
            return None
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
        return None
    if (axes or [0]) != [0] or (steps or [1]) != [1]:
        return None
    return starts[0], ends[0]


# ops whose first output has their first input's shape
_SAME_SHAPE = ("Cast", "Identity", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Elu", "Gelu", "Abs", "Neg", "Exp", "Log",
               "Sqrt", "Softmax", "LogSoftmax", "LayerNormalization", "Dropout", "ReverseSequence", "QuantizeLinear",
               "DequantizeLinear")


def _rank(view: GraphView, name: str) -> int | None:
    node = view.producer.get(name)
    while any(_op(node, op) for op in _SAME_SHAPE) and node.output[0] == name:
        name = node.input[0]
        node = view.producer.get(name)
    if _op(node, "Transpose") and attribute(node, "perm") is not None:
        return len(attribute(node, "perm"))
    if _recurrent(node) and node.output[0] == name:
        return 4
    shape = view.shape(name)
    return None if shape is None else len(shape)


def _dim(view: GraphView, name: str, axis: int):
    """Dim ``axis`` of value ``name`` in canonical form: an int where the graph fixes it, else (value, axis) of the
    earliest value with that same dim, through shape-keeping ops (Cast, activations, LayerNormalization, ...),
    Transposes, Reshapes to a proven shape, Gathers on axis 0 (their indices' dims come first) and recurrent nodes
    (Y [T, D, N, H] of X [T, N, I]), so two dims are provably equal when their canonical forms are."""
    node = view.producer.get(name)
    while True:
        if any(_op(node, op) for op in _SAME_SHAPE) and node.output[0] == name:
            name = node.input[0]
        elif _op(node, "Reshape") and view.opset(node) >= 5:
            target = _shape_vector(view, node.input[1])
            wanted = None if target is None or axis >= len(target) else target[axis]
            if wanted == 0 and not attribute(node, "allowzero", 0):  # 0 copies the input's dim
                name = node.input[0]
            else:
                return wanted if isinstance(wanted, tuple) or (isinstance(wanted, int) and wanted > 0) else None
        elif _op(node, "Transpose") and attribute(node, "perm") is not None and axis < len(attribute(node, "perm")):
            name, axis = node.input[0], attribute(node, "perm")[axis]
        elif _op(node, "Squeeze") and (squeezed := _squeezed(view, node)) is not None:
            kept = [k for k in range(_rank(view, node.input[0])) if k not in squeezed]
            if axis >= len(kept):
                return None
            name, axis = node.input[0], kept[axis]
        elif _op(node, "Gather") and attribute(node, "axis", 0) == 0 and axis < (_rank(view, node.input[1]) or 0):
            name = node.input[1]  # an embedding lookup: out[n, t, :] = data[indices[n, t]], indices' dims first
        elif _recurrent(node) and node.output[0] == name and attribute(node, "layout", 0) == 0:
            layer = _layer(view, node)
            if layer is None or axis not in (0, 2):
                return {1: layer.directions, 3: layer.hidden}.get(axis) if layer is not None else None
            name, axis = node.input[0], axis // 2
        else:
            return name, axis
        node = view.producer.get(name)


def _squeezed(view: GraphView, node: onnx.NodeProto) -> set[int] | None:
    """The input axes a Squeeze removes, when its axes and its input's rank are known."""
    axes, rank = _axes(view, node, 1), _rank(view, node.input[0])
    if not axes or rank is None or not all(-rank <= a < rank for a in axes):
        return None
    return {a % rank for a in axes}


def _shape_vector(view: GraphView, name: str) -> list | None:
    """A 1-D shape value as a list of canonical dims (``_dim``), when it is built from constants, Shape, Gather,
    Slice, Unsqueeze, Concat, Reshape and Mul of such values (what exporters compute shapes with)."""
    constant = view.ints(name)
    if constant is not None:
        return constant
    node = view.producer.get(name)
    if _op(node, "Shape"):
        rank = _rank(view, node.input[0])
        start, end = attribute(node, "start", 0), attribute(node, "end")
        if rank is None or (end is None and start < 0):
            return None
        return [_dim(view, node.input[0], k) for k in range(rank)[start:end]]
    if _op(node, "Concat") and attribute(node, "axis") in (0, -1):
        parts = [_shape_vector(view, part) or _unknown(view, part) for part in node.input]
        return None if any(p is None for p in parts) else [d for p in parts for d in p]
    if _op(node, "Gather") and attribute(node, "axis", 0) == 0:
        vector, index = _shape_vector(view, node.input[0]), view.ints(_input(node, 1))
        if vector is None or index is None or len(index) != 1 or not -len(vector) <= index[0] < len(vector):
            return None
        return [vector[index[0]]]  # a scalar when the index is one: the caller's Unsqueeze makes it 1-D again
    if _op(node, "Slice") and view.opset(node) >= 10:
        vector, rows = _shape_vector(view, node.input[0]), _slice(view, node)
        return None if vector is None or rows is None else vector[rows[0]:rows[1]]
    if (_op(node, "Unsqueeze") and _axes(view, node, 1) == [0]) or (
            _op(node, "Reshape") and view.ints(_input(node, 1)) in ([-1], [1])):
        vector = _shape_vector(view, node.input[0])
        return vector if vector is not None and len(vector) == 1 else None
    if _op(node, "Cast") and attribute(node, "to") in (_INT32, _INT64):  # tf2onnx: shapes cast to int32 and back
        return _shape_vector(view, node.input[0])
    if _op(node, "Mul"):
        a, b = (_shape_vector(view, part) for part in node.input)
        if a and b and len(a) == len(b) == 1 and isinstance(a[0], int) and isinstance(b[0], int):
            return [a[0] * b[0]]
    return None


def _unknown(view: GraphView, name: str) -> list | None:
    """A 1-D value of statically known length whose elements are not known: as many Nones (never equal to a dim)."""
    shape = view.shape(name)
    return [None] * shape[0] if shape is not None and len(shape) == 1 and isinstance(shape[0], int) else None


def _zeros(view: GraphView, name: str, layer: _Layer, batch) -> bool:
    """Whether ``name`` is all zeros of shape [D, N, H] in the weights' type, N the ``batch`` dim."""
    return _zero_rows(view, name, layer, batch) == layer.directions


def _zero_rows(view: GraphView, name: str, layer: _Layer, batch) -> int | None:
    """How many rows of [rows, N, H] zeros ``name`` is proven to be: ConstantOfShape, or a zero constant Expanded to
    a shape, maybe sliced along the first axis or Unsqueezed from [N, H]; or a Concat of such along the first axis
    (tf2onnx's bidirectional layers). None when not proven."""
    node, rows, prefix = view.producer.get(name), None, []
    if _op(node, "Concat") and attribute(node, "axis") in (0, -3):
        parts = [_zero_rows(view, part, layer, batch) for part in node.input]
        return None if None in parts else sum(parts)
    if _op(node, "Slice"):
        rows = _slice(view, node)
        node = view.producer.get(node.input[0]) if rows is not None else None
    elif _op(node, "Unsqueeze") and _axes(view, node, 1) == [0]:  # tf2onnx: zeros [N, H] made [1, N, H]
        node, prefix = view.producer.get(node.input[0]), [1]
    if _op(node, "ConstantOfShape"):
        value = attribute(node, "value")
        dtype = value.data_type if value is not None else onnx.TensorProto.FLOAT
        zero = value is None or (not onnx.numpy_helper.to_array(value).any() and list(value.dims) in ([], [1]))
    elif _op(node, "Expand") and view.is_weight(node.input[0]):  # broadcast of a [] or [1] zero: the shape given
        value = view.constant(node.input[0])
        dtype = view.elem_type(node.input[0])
        zero = value is not None and value.size == 1 and value.ndim <= 1 and not value.any()
    else:
        return None
    if not zero or dtype != _state_type(view, layer):
        return None
    shape = _shape_vector(view, node.input[1] if node.op_type == "Expand" else node.input[0])
    shape = None if shape is None else prefix + shape
    if shape is None or len(shape) != 3 or not isinstance(shape[0], int) or shape[2] != layer.hidden:
        return None
    if batch is None or shape[1] != batch:
        return None
    return shape[0] if rows is None else len(range(shape[0])[rows[0]:rows[1]])


def _state_type(view: GraphView, layer: _Layer) -> int | None:
    """The element type of the layer's states: its weights' (float for DynamicQuantizeLSTM, whose weights are int8)."""
    return onnx.TensorProto.FLOAT if layer.node.op_type == _QUANTIZED_LSTM else view.elem_type(layer.node.input[1])


def _states(view: GraphView, stack: _Stack, layer: _Layer, batch) -> None:
    """Where each initial state of ``layer`` comes from: None for absent or proven zeros, else rows of a source."""
    for index in (5, 6) if layer.node.op_type in ("LSTM", _QUANTIZED_LSTM) else (5,):
        name = _input(layer.node, index)
        if not name or _zeros(view, name, layer, batch):
            layer.states[index] = None
            continue
        node = view.producer.get(name)
        rows = _slice(view, node) if _op(node, "Slice") and view.only_consumer(name) is layer.node else None
        if rows is not None:
            layer.states[index] = (stack.source(node.input[0]), *rows)
            stack.nodes.append(node)
        else:
            layer.states[index] = (stack.source(name), None, None)


def _final_states(view: GraphView, stack: _Stack, index: int) -> str | bool | None:
    """The fused node's h_n (index 1) or c_n (2): a layer's own output for one layer, else the Concat of all
    layers' in order, or the last layer's where nothing reads the others' (paddle2onnx's State outputs; h_n and c_n
    alike, ``stack.final_states``); None when nothing reads them; False when they are read some other way."""
    names = [_input_out(layer.node, index) for layer in stack.layers]
    read = [bool(n and (view.consumers.get(n) or n in view.graph_outputs)) for n in names]
    if not any(read):
        return None
    if len(names) == 1:
        return names[0]
    held = "all" if any(read[:-1]) else "last"
    if stack.final_states not in ("", held):
        return False
    stack.final_states = held
    if held == "last":
        return names[-1]
    concat = view.only_consumer(names[0]) if all(names) else None
    if not _op(concat, "Concat") or attribute(concat, "axis") not in (0, -3) or list(concat.input) != names:
        return False
    if any(view.only_consumer(n) is not concat for n in names):
        return False
    stack.nodes.append(concat)
    return concat.output[0]


def squeezed_states(view: GraphView, stack: _Stack, finals: list[str | None]) -> list[str | None]:
    """The stack's h_n / c_n (``finals``, None where not read), or, where they hold one direction's states and each is
    read only by a Squeeze of axis 0 (tf2onnx's Keras return_state), those Squeezes' outputs: the stack gives them as
    [N, H] (``squeeze_states``) and the Squeezes join it."""
    one = stack.layers[-1].directions == 1 and (len(stack.layers) == 1 or stack.final_states == "last")
    squeezes = [view.only_consumer(f) for f in finals if f]
    if not one or not squeezes or not all(_op(s, "Squeeze") and _axes(view, s, 1) in ([0], [-3]) for s in squeezes):
        return finals
    stack.squeeze_states = True
    stack.nodes += squeezes
    found = iter(squeezes)
    return [next(found).output[0] if f else None for f in finals]


def _input_out(node: onnx.NodeProto, index: int) -> str:
    return node.output[index] if index < len(node.output) else ""


def _find(view: GraphView, first: _Layer) -> _Stack | None:
    stack = _Stack(first.node.op_type, [first], [], first.node.input[0])
    value = None  # the last merged output
    while True:
        merge = _merge(view, stack.layers[-1])
        if merge is None:
            break
        value, glue = merge
        stack.nodes += glue
        between, cancelled = _cancelled_transposes(view, value)
        following = view.only_consumer(between)
        layer = _layer(view, following) if following is not None else None
        if layer is None or list(following.input).count(between) != 1 or following.input[0] != between \
                or layer.lengths != first.lengths or (  # any cell: Keras's LSTM -> GRU; quantized with quantized
                    (following.op_type == _QUANTIZED_LSTM) != (first.node.op_type == _QUANTIZED_LSTM)):
            stack.merge_output = True
            break
        stack.nodes += cancelled
        stack.layers.append(layer)
    stack.op_type = "+".join(dict.fromkeys(layer.node.op_type for layer in stack.layers))

    y = value if stack.merge_output else _input_out(stack.layers[-1].node, 0)
    batch = _dim(view, stack.x, 1)  # the batch of every layer: the glue keeps it
    if list(read_names(first.node)).count(stack.x) == 1:
        batch_first(view, stack, {id(first.node)})
    if stack.merge_output:
        y = batch_first_output(view, stack, y)

    for layer in stack.layers:
        _states(view, stack, layer, batch)
    lstm = any(layer.node.op_type in ("LSTM", _QUANTIZED_LSTM) for layer in stack.layers)
    finals = [_final_states(view, stack, index) for index in ((1, 2) if lstm else (1,))]
    if any(f is False for f in finals):
        return None
    finals = squeezed_states(view, stack, finals)
    stack.outputs = [y if y and (view.consumers.get(y) or y in view.graph_outputs) else None, *finals]
    while len(stack.outputs) > 1 and stack.outputs[-1] is None:
        stack.outputs.pop()
    dropped_states = any(_input(layer.node, k) and layer.states[k] is None
                         for layer in stack.layers for k in layer.states)
    if len(stack.layers) == 1 and not stack.nodes and not dropped_states:
        return None  # nothing to gain: the node converts as it is
    if first.lengths and not view.is_constant(first.lengths):
        stack.lengths = first.lengths
        _unpack(view, stack)
    return stack


def batch_first(view: GraphView, stack: _Stack, first: set[int]) -> None:
    """A Transpose to time-major in front of the first layer (its nodes by id: ``first``) joins the stack, which then
    reads x batch-major, when nothing else reads the transposed value but Shapes (zero states, absorbed with them)."""
    transpose = view.producer.get(stack.x)
    others = [r for r in view.consumers.get(stack.x, []) if id(r) not in first]
    if (_op(transpose, "Transpose") and attribute(transpose, "perm") == [1, 0, 2]
            and stack.x not in view.graph_outputs and all(_op(r, "Shape") for r in others)):
        stack.x, stack.batch_first = transpose.input[0], True
        stack.nodes.append(transpose)


def batch_first_output(view: GraphView, stack: _Stack, y: str | None) -> str | None:
    """The stack's output: ``y`` [T, N, D*H], or the Transpose to batch-major that alone reads it (it joins)."""
    after = view.only_consumer(y) if y else None
    if _op(after, "Transpose") and attribute(after, "perm") == [1, 0, 2]:
        stack.batch_first_output = True
        stack.nodes.append(after)
        return after.output[0]
    return y


def _cast_of(view: GraphView, name: str, to: int) -> str | None:
    """The input of a Cast to ``to`` that produces ``name``, or ``name`` itself when it already has that type."""
    node = view.producer.get(name)
    if _op(node, "Cast") and attribute(node, "to") == to:
        return node.input[0]
    return name if view.elem_type(name) == to else None


def _unpack(view: GraphView, stack: _Stack) -> None:
    """torch.onnx's PackedSequence around the layers: rows sorted by length (TopK of the lengths, Gather of x), the
    outputs put back in the caller's order (Gather by the inverse permutation, built with ScatterElements of a
    Range). The runtime takes unsorted lengths: the stack then reads x and the lengths as given, and outputs in the
    caller's order. Proven: TopK of all n lengths (a permutation P), the layers' lengths are its sorted values, x is
    gathered by P along the batch, and every output is read only through a Gather by Q with Q[P[i]] = i."""
    lengths = _cast_of(view, stack.lengths, _INT32)
    topk = view.producer.get(lengths) if lengths else None
    if not (_op(topk, "TopK") and lengths == topk.output[0] and attribute(topk, "largest", 1) == 1
            and attribute(topk, "axis", -1) in (0, -1) and len(topk.output) == 2) or stack.sources:
        return
    given = _cast_of(view, topk.input[0], _INT64)
    if given is None or _rank(view, topk.input[0]) != 1:
        return
    k_nodes = _computing(view, topk.input[1], topk.input[0], _SHAPE_OPS)
    if k_nodes is None or _shape_vector(view, topk.input[1]) != [_dim(view, topk.input[0], 0)]:
        return
    gather = view.producer.get(stack.x)
    if not (stack.batch_first and _op(gather, "Gather") and attribute(gather, "axis", 0) == 0
            and _cast_of(view, gather.input[1], _INT64) == topk.output[1]):
        return
    order = gather.input[1]  # P: TopK's indices (maybe through a Cast to their own type)
    inverse, inverse_nodes = _inverse(view, order)
    if inverse is None:
        return
    outputs = []
    for index, value in enumerate(stack.outputs):
        axis = 0 if index == 0 and stack.batch_first_output else 1
        reader = view.only_consumer(value) if value else None
        if value and not (_op(reader, "Gather") and reader.input == [value, inverse]
                          and attribute(reader, "axis", 0) == axis):
            return
        outputs.append(reader.output[0] if value else None)
        stack.nodes += [reader] if value else []
    stack.nodes += [topk, gather, *k_nodes, *inverse_nodes,
                    *(view.producer[n] for n in {stack.lengths, order, topk.input[0]} - {lengths, topk.output[1],
                                                                                           given})]
    stack.x, stack.lengths, stack.outputs = gather.input[0], given, outputs


def _inverse(view: GraphView, order: str) -> tuple[str | None, list[onnx.NodeProto]]:
    """The inverse permutation of ``order`` as torch.onnx builds it: ScatterElements(zeros like order, order,
    Range(0, len(order), 1)) along axis 0. Returns its value and nodes (None when some reader of ``order`` is not
    that)."""
    for scatter in view.consumers.get(order, []):
        if not (_op(scatter, "ScatterElements") and scatter.input[1] == order and attribute(scatter, "axis", 0) == 0
                and attribute(scatter, "reduction", "none") == "none"):
            continue
        zeros, steps = view.producer.get(scatter.input[0]), view.producer.get(scatter.input[2])
        if not (_op(zeros, "ConstantOfShape") and _shape_vector(view, zeros.input[0]) == [_dim(view, order, 0)]
                and _op(steps, "Range") and view.ints(steps.input[0]) == [0] and view.ints(steps.input[2]) == [1]):
            continue
        limit = view.producer.get(_cast_of(view, steps.input[1], _INT64) or "")
        if not (_op(limit, "ReduceProd") and attribute(limit, "keepdims", 1) == 0 and len(limit.input) == 1
                and attribute(limit, "axes", [0]) in ([0], [-1]) and not attribute(limit, "noop_with_empty_axes", 0)
                and _shape_vector(view, limit.input[0]) == [_dim(view, order, 0)]):
            continue
        nodes = _computing(view, scatter.output[0], order, (*_SHAPE_OPS, "ScatterElements", "ConstantOfShape",
                                                            "Range", "ReduceProd", "Cast"))
        if nodes is not None:
            return scatter.output[0], nodes
    return None, []


@register_pattern("stacked_layers")
def stacked_layers(view: GraphView):
    """torch.onnx's multi-layer (and single-layer) LSTM / GRU / RNN with its glue and zero initial states."""
    claimed: set[int] = set()
    for node in view.nodes:
        first = _layer(view, node) if id(node) not in claimed else None
        stack = _find(view, first) if first is not None else None
        if stack is None:
            continue
        claimed.update(id(layer.node) for layer in stack.layers)
        yield Fusion("stacked_layers", f"{len(stack.layers)}-layer {stack.op_type}" if len(stack.layers) > 1
                     else stack.op_type, [layer.node for layer in stack.layers] + stack.nodes,
                     [stack.x, *stack.sources, *[stack.lengths][:bool(stack.lengths)], *_weights(stack)], stack.outputs,
                     lambda ctx, stack=stack: convert(ctx, stack))


def _weights(stack: _Stack) -> list[str]:
    """The layers' W, R, B, P (and a DynamicQuantizeLSTM's scales and zero points): inputs of the fusion (the builder
    folds those computed from initializers first)."""
    return [name for layer in stack.layers for k, name in enumerate(layer.node.input) if k not in (0, 4, 5, 6) and name]


def convert(ctx, stack: _Stack) -> Converted:
    """The StackedRecurrent of ``stack`` (or, for one layer that only lost its zero states, the layer's module)."""
    wanted = [o is not None for o in stack.outputs] + [False] * (3 - len(stack.outputs))
    modules = []
    for index, layer in enumerate(stack.layers):
        last = index == len(stack.layers) - 1
        states = last or stack.final_states != "last"  # the layer's h_n / c_n are outputs
        flags = [not last or wanted[0], wanted[1] and states, wanted[2] and states]  # a GRU / RNN drops the c
        modules.append(layer.build(flags) if layer.node is None else _converted_layer(ctx, layer, flags))
    lengths = [stack.lengths] if stack.lengths else []
    if len(modules) == 1 and not stack.batch_first and not stack.merge_output and not stack.sources and (
            not stack.squeeze_states) and (
            not lengths or lengths[0] == stack.layers[0].lengths):  # one layer that only lost its zero states
        return Converted(modules[0], [stack.x, None, None, None, *lengths])
    module = StackedRecurrent(modules, batch_first=stack.batch_first, batch_first_output=stack.batch_first_output,
                              merge_output=stack.merge_output,
                              initial_h=[layer.states[5] for layer in stack.layers],
                              initial_c=[layer.states.get(6) for layer in stack.layers],
                              outputs=wanted[: len(stack.outputs)], lengths=bool(lengths),
                              last_states=stack.final_states == "last", window=stack.window,
                              squeeze_states=stack.squeeze_states)
    return Converted(module, [stack.x, *stack.sources, *lengths])


def _converted_layer(ctx, layer: _Layer, flags: list[bool]):
    """The module of a layer's own node, which the stack gives its input and initial states."""
    proto = onnx.NodeProto()
    proto.CopyFrom(layer.node)
    inputs = [*layer.node.input, *[""] * (8 - len(layer.node.input))]
    inputs[5] = inputs[6] = ""  # the stack passes the initial states
    while not inputs[-1]:
        inputs.pop()
    proto.input[:] = inputs
    while len(flags) > 1 and not flags[-1]:
        flags = flags[:-1]
    proto.output[:] = [f"{layer.node.name}:{k}" if f else "" for k, f in enumerate(flags)]
    converted = ctx.convert(proto)
    inputs = [*converted.inputs, *[None] * 5]  # a converter may leave out trailing absent inputs
    if any(name is not None for k, name in enumerate(converted.inputs[1:], 1) if k != 4) or (
            inputs[4] not in (None, layer.lengths)):
        raise AssertionError("a recognised layer must take only X and its lengths at run time")
    return converted.module
