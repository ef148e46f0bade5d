"""Unrolled cells: T copies of one cell step in the main graph, chained through their states, become one node.

Exporters that cannot emit a recurrent op unroll it: dynamo writes nn.RNN as a MatMul of the whole input, a
SplitToSequence over time and, per step, MatMul / Add / Tanh (or Relu) of the previous state; hand-written or
streaming models spell an LSTM / GRU step with Gemm / MatMul, Split / Slice of the gates, activations, Mul / Add, and
so does torch.onnx for nn.LSTMCell / GRUCell / RNNCell (GRUCell's new h as n + z * (h - n)), called once per step by
a streaming model or in a Python loop over ``x[t]`` or ``x[:, t]`` whose hs torch.stack joins.

Found from the per-step slices of one time-major value S [T, N, F] (SequenceAt of SplitToSequence, Split, Slice,
Gather along axis 0, maybe Squeezed; a Squeeze of a [1, N, F] value is one step) or of a batch-first one [N, T, F]
(Split, Slice, Gather along axis 1, Squeezed: ``x[:, t]``), S being an affine map of x (MatMul by a constant, Add of
a constant row, maybe a time flip) read in x's order forwards or backwards; or from a value [N, F] read by a MatMul
or Gemm by a constant, one step without a time axis (``_bare``), which is a recurrence only as a streaming model
runs it: its states graph inputs, its new states graph outputs, or rows of one (silero's [2, N, H]: ``_streaming``;
else any layer relu(a W + b R) would pass for an RNN step; of two cells in turn, a decoder's step, each is one), and
a cell whose h is not read (R all zero) is none. Every node downstream of the slices through the evaluator's ops is
in the step of the latest slice it depends on, and a step also takes what it computes from its states alone (the
previous h times R: ``_pull_back``), so that each step starts at the states (``_chains``, ``_steps``; the nodes that
read the same slices split into chains: the two directions of a layer). Each step is evaluated symbolically
(passes/cells.py's ``_Evaluator``: affine forms over atoms) with fresh atoms for the states it reads from the
previous step (or the initial states) and must satisfy the same cell equations with the same weights (``_lstm`` /
``_gru`` / ``_rnn`` / ``_weights``); the evaluator here also tracks ranks (a state may carry leading 1s, [1, N, H]:
its batch axis stays aligned), understands Gemm and Squeeze / Unsqueeze of axis 0, and a Cast only to the type it
has. What else is proven: the values a fusion drops are read only inside it, except the reassembled outputs (the
node's Y: a Concat over axis 0 of every step's h [1, N, H] in x's order or in the opposite one, as Keras's
go_backwards writes it (``y_backwards``), or a ConcatFromSequence of their SequenceConstruct; batch-first, a Concat
over axis 1 of h Unsqueezed at axis 1; none without a time axis) and the final h and c as [N, H]; an initial state
is a given [N, H] (maybe Unsqueezed) or zeros of exactly [N, H], N proven to be x's batch (axis 1 of a time-major x,
else axis 0), and one value may be both an LSTM's h and c (Keras's zeros: each read of it in the first step is one
or the other, ``_bindings``); the float weights (the projection of x's too) are read by nothing else, nor are they
graph outputs (integers such as split sizes may be shared: the two directions of a Keras Bidirectional). Where the
steps read only some of S's steps (dynamo specialises to the export's length), the fused layer reads that window of
x (``LoopedRecurrent(window=...)``) and fails, as the graph does, where x is shorter. Each chain (a layer and a
direction) becomes one ``LoopedRecurrent`` (``time_axis`` 1 for a batch-first x and Y, None for a step without a
time axis, whose Y is its h), unless dynamo's glue joins the chains into layers and the layers into a stack
(``_layers``, ``_stacks``, ``_stack``): then the whole stack is one StackedRecurrent (passes/stacked.py's layer
description and module). Proven for that: a forward and a reverse chain of the same x and cell whose Ys only one
Concat over the features reads, in that order; a layer's Y read only by the next layer's chains (any cell, of the
same float type), which read all of it, maybe through Transposes that cancel (tf2onnx's around each Keras layer);
initial states zeros of [N, H] (N the first layer's batch, or the layer's own x's) or, in every direction of a
layer, consecutive rows of one value (a Squeeze of a one-row Slice along axis 0); every chain's final state read
only by an Unsqueeze of axis 0, those (for several) by one Concat over axis 0 in the chains' order, or only the last
layer's (of one direction) read, Unsqueezed or as it is ([N, H], Keras's return_state: ``squeeze_states``); the
slicing that two directions share read by them alone. tf2onnx's Keras layers with unroll=True transpose the
batch-major x to time-major before splitting it and Y back after the Concat: a StackedRecurrent absorbs them, around
a LoopedRecurrent (a Y in processing order) they stay. A chain's Y goes past Transposes that cancel (their perms
compose to the identity; Shapes alone read the middle value) and, where it is in processing order (go_backwards), a
ReverseSequence that reverses all of it (every row's length proven T: a Keras Bidirectional's backward layer), which
puts it in x's order (loops.settled): the glue joins the chain where all it reads only feeds it. A chain whose Y
stays in processing order joins no stack (the stack writes Y in x's order); nor does a chain that is not time-major.
Not recognised: a time axis other than 0 or 1 (or a batch-first step kept as [N, 1, F]), a Y written otherwise, a
streaming step whose states the caller does not pass. """

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations, permutations, product

import numpy as np
import onnx

from ..node import read_names
from . import Fusion, GraphView, attribute, register_pattern
from .cells import (
    _ACTIVATIONS,
    _FLOATS,
    Atom,
    Form,
    _add,
    _constant_form,
    _Evaluator,
    _gru,
    _leaf,
    _lstm,
    _rnn,
    _same,
    _scale,
    _single,
    _weights,
)
from .loops import (
    _convert,
    _Match,
    _private,
    _runtime,
    _zero,
    recurrent_layer,
    settled,
)
from .stacked import (
    _axes,
    _cancelled_transposes,
    _dim,
    _Layer,
    _op,
    _rank,
    _slice,
    _Stack,
    batch_first,
    batch_first_output,
    convert,
)

_BIG = 2 ** 31 - 1  # a Slice end at least this large runs to the end of the axis
_STREAMING_NODES = 200  # the most nodes a streaming step with what follows it may have (a cell step is a dozen)
_STREAMING_RETURNED = 6  # the most values it returns whose subsets are tried as one cell's (a two-cell LSTM step's 4)
# The widest step input whose projection is proven: the proof tracks x as a width x width identity (float64), so
# 4096 costs 128 MiB; a wider input stays as written (a [262145, 4] MatMul asked for 512 GiB)
_WIDEST_INPUT = 4096
# ops whose value is (a form of) the step's: the dependency on the slices goes through them
_FORM_OPS = frozenset({"MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Identity", "Cast", "Squeeze", "Unsqueeze",
                       "Split", "Slice", "Clip", "Min", "Max", "Concat", *_ACTIVATIONS})


# ---------------------------------------------------------------------------------------------------------------
# The evaluator: loops' forms, with ranks


class _StepEvaluator(_Evaluator):
    """Forms of the main graph's values, each with its rank: [1, ..., 1, N, width] (leading 1s only, so that
    broadcasting keeps the batch axes aligned). Feature-axis ops (Split, Slice, Concat, Gemm) are understood on
    rank 2 only."""

    def __init__(self, view: GraphView):
        super().__init__(view, onnx.GraphProto(), {})
        self.ranks: dict[str, int] = {}
        self.uses: dict[tuple[int, int], tuple[Form, int]] = {}  # (id(node), input index) -> what that read sees

    def set(self, name: str, value: Form, rank: int) -> None:
        self.env[name], self.ranks[name] = value, rank

    def run(self, nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            uses = [self.uses.get((id(node), k)) for k in range(len(node.input))]
            args = [u[0] if u else self.value(v) if v else None for u, v in zip(uses, node.input, strict=True)]
            ranks = [u[1] if u else self.ranks.get(v) for u, v in zip(uses, node.input, strict=True)]
            outputs = self.node(node, args) or []
            rank = self._rank(node, args, ranks)
            for name, value in zip(node.output, [*outputs, *[None] * len(node.output)], strict=False):
                if isinstance(value, Form) and rank is not None:
                    self.set(name, value, rank)
                else:
                    self.env[name] = None if isinstance(value, Form) else value

    def _rank(self, node: onnx.NodeProto, args: list, ranks: list) -> int | None:
        known = [r if isinstance(a, Form) else np.ndim(a) if isinstance(a, np.ndarray) else None
                 for r, a in zip(ranks, args, strict=True) if a is not None]
        forms = [r for r, a in zip(ranks, args, strict=True) if isinstance(a, Form)]
        if not forms or None in forms:
            return None
        if node.op_type in ("Squeeze", "Unsqueeze"):
            return forms[0] + (1 if node.op_type == "Unsqueeze" else -1)
        if node.op_type in ("Split", "Slice", "Concat", "Gemm") and set(forms) != {2}:
            return None
        return None if None in known else max(known)

    def _Gather(self, node, data, index):
        return None  # a step is a leaf here, not a gather of the loop's counter

    def _Cast(self, node, a):  # only to the type it has: a cast to another float rounds
        return [a] if isinstance(a, Form) and self.view.elem_type(node.input[0]) == attribute(node, "to") else None

    def _Squeeze(self, node, a, axes=None):
        axes = attribute(node, "axes") if axes is None else np.reshape(axes, -1).tolist()
        rank = self.ranks.get(node.input[0])
        return [a] if isinstance(a, Form) and rank is not None and rank > 2 and axes in ([0], [-rank]) else None

    def _Unsqueeze(self, node, a, axes=None):
        axes = attribute(node, "axes") if axes is None else np.reshape(axes, -1).tolist()
        return [a] if isinstance(a, Form) and axes == [0] else None

    def _Gemm(self, node, a, b, c=None):
        if not isinstance(b, np.ndarray) or attribute(node, "transA", 0) or (c is not None and not isinstance(
                c, np.ndarray)):
            return None
        product = self._MatMul(node, a, b.T if attribute(node, "transB", 0) else b)
        if not product or product[0] is None:
            return None
        result = _scale(product[0], float(attribute(node, "alpha", 1.0)))
        if c is None or result is None:
            return [result]
        bias = _constant_form(np.asarray(c, np.float64) * float(attribute(node, "beta", 1.0)))
        return [None if bias is None else _add(result, bias)]


# ---------------------------------------------------------------------------------------------------------------
# Per-step slices of one value along time


@dataclass
class _Slices:
    source: str  # S, sliced along its time axis
    steps: dict[int, tuple[str, int]] = field(default_factory=dict)  # position in S -> (leaf value, its rank)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    exact: bool = False  # the slicing proves S's time axis is the number of steps (Split into ones, Squeeze)
    axis: int | None = 0  # S's time axis: 0 ([T, N, F]), 1 ([N, T, F]), None (S [N, F] is the one step itself)


def _slice_of(view: GraphView, node: onnx.NodeProto) -> tuple[str, int, int, str, list] | None:
    """(S, its time axis, position, the step's value, nodes) of one step sliced from S along axis 0 (or 1: a
    batch-first S, as torch's ``x[:, t]`` reads it) by ``node``."""
    if _op(node, "SequenceAt"):
        split = view.producer.get(node.input[0])
        index = view.ints(node.input[1])
        if not (_op(split, "SplitToSequence") and len(split.input) == 1 and attribute(split, "axis", 0) == 0
                and index is not None and len(index) == 1):
            return None
        return split.input[0], 0, index[0], node.output[0], [node, split]
    if _op(node, "Gather") and attribute(node, "axis", 0) in (0, 1) and view.ints(node.input[1]) is not None:
        index = view.constant(node.input[1])
        if index.size == 1 and index.ndim <= 1:
            return node.input[0], attribute(node, "axis", 0), int(index.reshape(())), node.output[0], [node]
    if _op(node, "Slice") and view.opset(node) >= 10:
        starts, ends = view.ints(node.input[1]), view.ints(node.input[2])
        axes = view.ints(node.input[3]) if len(node.input) > 3 and node.input[3] else [0]
        steps = view.ints(node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
        if starts is None or ends is None or len(starts) != 1 or axes not in ([0], [1]) or steps != [1]:
            return None
        start, end = starts[0], ends[0]
        if (end == start + 1 and (start >= 0 or end < 0)) or (start == -1 and end >= _BIG):
            return node.input[0], axes[0], start, node.output[0], [node]
    return None


def _slices(view: GraphView) -> list[_Slices]:
    """Every value sliced into steps along axis 0 or 1, with its steps (each Squeezed when the slice's only reader is
    a Squeeze of that axis), largest first; then each value that may be one step without a time axis (``_bare``)."""
    found: dict[tuple[str, int], _Slices] = {}
    for node in view.nodes:
        piece = _slice_of(view, node)
        if piece is not None:
            source, axis, position, value, nodes = piece
            slices = found.setdefault((source, axis), _Slices(source, axis=axis))
            if position in slices.steps:
                continue  # read twice: the step read first stands for it (the other stays as written)
            kept = node.op_type == "Slice" or (node.op_type == "Gather" and view.constant(node.input[1]).ndim == 1) \
                or (node.op_type == "SequenceAt" and attribute(nodes[1], "keepdims", 1))
            value, rank, squeeze = _squeezed(view, value, 3 if kept else 2, axis)  # S is [T, N, F] (_projection)
            if axis == 0 or rank == 2:  # a step [N, 1, F] is no form's (only leading 1s are)
                slices.steps[position] = (value, rank)
                slices.nodes += [*nodes, *squeeze]
        elif _op(node, "Split") and attribute(node, "axis", 0) in (0, 1):
            _split(view, node, found)
    used = {id(n) for s in found.values() for n in s.nodes}
    for node in view.nodes:  # a Squeeze of a [1, N, F] value that no slice made: one step
        if _op(node, "Squeeze") and id(node) not in used and (node.input[0], 0) not in found and _axes(
                view, node, 1) == [0] and _rank(view, node.input[0]) == 3:
            found[node.input[0], 0] = _Slices(node.input[0], {0: (node.output[0], 2)}, [node], exact=True)
    leaves = {leaf for s in found.values() for leaf, _ in s.steps.values()}
    return sorted(found.values(), key=lambda s: -len(s.steps)) + [s for s in _bare(view) if s.source not in leaves]


def _bare(view: GraphView) -> list[_Slices]:
    """Values [N, F] that may be one step's x without a time axis (torch's nn.LSTMCell called once: a streaming step):
    each read by a MatMul or Gemm by a constant, graph inputs first in their order (where x and h could swap roles,
    an LSTM or RNN with I == H, both readings compute the same), then the others in graph order."""
    order = [i.name for i in view.graph.input] + [o for n in view.nodes for o in n.output]
    return [_Slices(name, {0: (name, 2)}, exact=True, axis=None) for name in dict.fromkeys(order)
            if any((_op(r, "MatMul") or _op(r, "Gemm")) and r.input[0] == name and view.is_constant(r.input[1])
                   for r in view.consumers.get(name, []))  # first: _rank walks back through same-shape ops
            and _rank(view, name) == 2 and view.elem_type(name) in _FLOATS]


def _squeezed(view: GraphView, value: str, rank: int, axis: int) -> tuple[str, int, list]:
    squeeze = view.only_consumer(value)
    if rank == 3 and _op(squeeze, "Squeeze") and _axes(view, squeeze, 1) == [axis]:
        return squeeze.output[0], 2, [squeeze]
    return value, rank, []


def _split(view: GraphView, node: onnx.NodeProto, found: dict) -> None:
    """A Split of S along axis 0 or 1 into steps of one: sizes given as ones, or S's static dim there the outputs'
    count."""
    axis = attribute(node, "axis", 0)
    sizes = view.ints(node.input[1]) if len(node.input) > 1 and node.input[1] else attribute(node, "split")
    shape = view.shape(node.input[0]) or []
    count = len(node.output)
    if not (sizes == [1] * count or (sizes is None and len(shape) == 3 and shape[axis] == count)) or _rank(
            view, node.input[0]) != 3 or (node.input[0], axis) in found:
        return
    slices = _Slices(node.input[0], exact=True, axis=axis)
    slices.nodes.append(node)
    for position, value in enumerate(node.output):
        value, rank, squeeze = _squeezed(view, value, 3, axis)
        if axis == 1 and rank != 2:
            return
        slices.steps[position] = (value, rank)
        slices.nodes += squeeze
    found[node.input[0], axis] = slices


# ---------------------------------------------------------------------------------------------------------------
# What the steps read: x through an affine map (and maybe a flip), in x's order


def _flip(view: GraphView, node: onnx.NodeProto | None, axis: int) -> bool:
    """A Slice that reverses all of ``axis``."""
    if not _op(node, "Slice") or view.opset(node) < 10 or len(node.input) != 5:
        return False
    starts, ends, axes, steps = (view.ints(v) for v in node.input[1:])
    return starts == [-1] and ends is not None and ends[0] <= -_BIG and axes == [axis] and steps == [-1]


def _projection(view: GraphView, slices: _Slices) -> tuple[str, Form, bool, list] | None:
    """(x [T, N, I] (or as S's time axis has it), S's step as a form over the step of x, whether S is x flipped in
    time, the nodes between). A step without a time axis is x itself."""
    value, nodes, flipped, axis = slices.source, [], False, slices.axis
    readers = {id(n) for n in slices.nodes}
    while axis is not None and all(id(r) in readers for r in view.consumers.get(value, [])) and (
            value not in view.graph_outputs):
        node = view.producer.get(value)
        variable = [v for v in node.input if v and not view.is_constant(v)] if node is not None else []
        if _flip(view, node, axis) and not flipped:
            flipped = True
        elif not (any(_op(node, op) for op in ("MatMul", "Add", "Sub", "Mul", "Identity")) and len(variable) == 1
                  and (node.op_type != "MatMul" or node.input[0] == variable[0])):
            break
        nodes.append(node)
        readers = {id(node)}
        value = variable[0]
    width, rank = (view.shape(value) or [None])[-1], 2 if axis is None else 3
    if _rank(view, value) != rank or (isinstance(width, int) and width > _WIDEST_INPUT):
        return None
    evaluator = _StepEvaluator(view)
    evaluator.set(value, Form({evaluator.x_atom: np.eye(width) if isinstance(width, int) else 1.0}), rank)
    for node in reversed(nodes):
        if _flip(view, node, axis):
            evaluator.set(node.output[0], evaluator.env[node.input[0]], 3)
        else:
            evaluator.run([node])
    form = evaluator.env.get(slices.source)
    if not isinstance(form, Form) or set(form.terms) != {evaluator.x_atom} or not isinstance(
            form.terms[evaluator.x_atom], np.ndarray) or evaluator.ranks.get(slices.source) != rank:
        return None
    return value, form, flipped, nodes


def _window(view: GraphView, slices: _Slices, x: str, flipped: bool) -> tuple[list[str], tuple | None] | bool:
    """The steps' leaf values in x's order and the window of x they read (None: all of it); False when the
    positions are not one run of consecutive steps."""
    steps = {(-1 - p if flipped else p): leaf for p, leaf in slices.steps.items()}
    length = len(slices.steps) if slices.exact else (view.shape(x) or [None] * 3)[slices.axis]
    if isinstance(length, int):
        steps = {p + length if p < 0 else p: leaf for p, leaf in steps.items()}
    positions = sorted(steps)
    if positions != list(range(positions[0], positions[0] + len(positions))) or (positions[0] < 0 <= positions[-1]):
        return False
    start, stop = positions[0], positions[-1] + 1
    window = None if isinstance(length, int) and (start, stop) == (0, length) else (
        start, stop if stop != 0 else None)
    if isinstance(length, int) and stop > length:
        return False
    return [steps[p] for p in positions], window


def _chains(view: GraphView, leaves: list[str]) -> list[tuple[bool, list[list[onnx.NodeProto]]]]:
    """The chains that read the slices ``leaves`` (one per connected set of nodes that depend on them: the two
    directions of a layer read the same slices): whether each runs backwards and its nodes of each step in
    processing order."""
    masks = {leaf: 1 << k for k, leaf in enumerate(leaves)}
    depending, owner, parent = [], {}, []  # owner: value -> index of its node; parent: union-find of the chains

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]  # path halving
            k = parent[k]
        return k

    for node in view.nodes:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _FORM_OPS or (
                node.op_type == "Concat" and not _feature_concat(view, node)):
            continue
        mask = 0
        for name in node.input:
            mask |= masks.get(name, 0)
        if mask:
            masks.update(dict.fromkeys(node.output, mask))
            parent.append(len(depending))
            for name in node.input:
                if name in owner:
                    parent[root(owner[name])] = len(depending)
            owner.update(dict.fromkeys(node.output, len(depending)))
            depending.append((node, mask))
    groups: dict[int, list] = {}
    for k, (node, mask) in enumerate(depending):
        groups.setdefault(root(k), []).append((node, mask))
    stepped = {id(n) for n, _ in depending}
    return [chain for group in groups.values() if (chain := _steps(view, len(leaves), group, stepped))]


def _steps(view: GraphView, count: int, depending: list, stepped: set[int]):
    """Whether one chain runs backwards and its nodes of each step in processing order: a node is in the step of the
    latest slice (in that order) that it depends on through the evaluator's ops. Each node must depend on one step
    (its projection of x) or on a run of steps that starts at the first (a chain through the states)."""
    full = (1 << count) - 1
    single = [m & (m - 1) == 0 for _, m in depending]  # a step's own projection of x
    if all(s or m & (m + 1) == 0 for s, (_, m) in zip(single, depending, strict=True)) and (
            count == 1 or not all(single)):
        steps = [m.bit_length() - 1 for _, m in depending]
        reverse = False
    elif all(s or m == full ^ ((m & -m) - 1) for s, (_, m) in zip(single, depending, strict=True)) and not all(
            single):
        steps = [count - (m & -m).bit_length() for _, m in depending]
        reverse = True
    else:
        return None
    nodes: list[list[onnx.NodeProto]] = [[] for _ in range(count)]
    for (node, _), step in zip(depending, steps, strict=True):
        nodes[step].append(node)
    for j in range(count):
        _pull_back(view, nodes, j, stepped)
    return reverse, nodes


def _pull_back(view: GraphView, nodes: list[list[onnx.NodeProto]], j: int, stepped: set[int]) -> None:
    """Move into step ``j`` what it computes from its states alone (the projection of the previous h by R, its
    gates' split), which depends on no slice of its own: the step starts at the states, not after that projection.
    Moved: nodes of one non-constant input, whose every reader is in step j, of the previous step (or of no step)."""
    inside = {id(n) for n in nodes[j]}
    before = {id(n) for n in nodes[j - 1]} if j else None
    pending = [v for n in nodes[j] for v in n.input if v]
    while pending:
        node = view.producer.get(pending.pop())
        if node is None or id(node) in inside or not _state_op(view, node) or (
                id(node) not in before if j else id(node) in stepped):
            continue
        outputs = [o for o in node.output if o]
        if any(o in view.graph_outputs for o in outputs) or not all(
                id(r) in inside for o in outputs for r in view.consumers.get(o, [])):
            continue
        nodes[j].append(node)
        inside.add(id(node))
        if j:
            nodes[j - 1].remove(node)
        pending += [v for v in node.input if v]
    nodes[j].sort(key=lambda n: view.position[id(n)])


def _state_op(view: GraphView, node: onnx.NodeProto) -> bool:
    """An op of the cell that reads one non-constant value (its first input): a state's projection and split."""
    if not any(_op(node, op) for op in ("MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Split", "Slice")):
        return False
    variable = [v for v in node.input if v and not view.is_constant(v)]
    return variable == [node.input[0]] and (node.op_type in ("MatMul", "Add", "Sub", "Mul", "Div") or _rank(
        view, node.input[0]) == 2)


def _feature_concat(view: GraphView, node: onnx.NodeProto) -> bool:
    rank = len(view.shape(node.output[0]) or [])
    return attribute(node, "axis") in (-1, rank - 1) and rank >= 2


# ---------------------------------------------------------------------------------------------------------------
# Each step one cell step, all the same cell


@dataclass
class _Step:
    evaluator: _StepEvaluator
    states: dict[int, Atom]  # the states it reads: 0 h, 1 c
    options: list[dict[int, Form]]  # candidates for its new states
    new: dict[int, Form] = field(default_factory=dict)  # the new states, once matched
    outgoing: list[str] = field(default_factory=list)  # the values that carry them on (the last step: the first
    # value of each)


def _rebase(form: Form, atom: Atom) -> Form:
    """S's step (a form of x's one atom) over this step's atom of x."""
    (matrix,) = form.terms.values()
    return Form({atom: matrix}, form.bias)


def _initial_states(view: GraphView, nodes: list[onnx.NodeProto], leaf: str) -> list[str]:
    produced = {o for n in nodes for o in n.output}
    return list(dict.fromkeys(v for n in nodes for v in n.input
                              if v and v not in produced and v != leaf and not view.is_constant(v)))


def _state_rank(view: GraphView, name: str) -> int | None:
    """2 for [N, H]; 3 for [1, N, H] (an Unsqueeze of axis 0, or a static leading 1); else None."""
    rank, node = _rank(view, name), view.producer.get(name)
    if rank == 3 and ((_op(node, "Unsqueeze") and _axes(view, node, 1) == [0]) or (view.shape(name) or [0])[0] == 1):
        return 3
    return 2 if rank == 2 else None


def _chain(view: GraphView, x_form: Form, leaves: list[tuple[str, int]], steps: list[list[onnx.NodeProto]]):
    """(the steps, the cell, its weights, the initial states by key) when every step is the same cell step."""
    initial = _initial_states(view, steps[0], leaves[0][0])
    if not 1 <= len(initial) <= 2 or any(_state_rank(view, v) is None for v in initial):
        return None
    for inputs, order in _bindings(view, initial, steps[0]):
        found, template = [], None
        for j, nodes in enumerate(steps):
            step = _evaluate(view, x_form, leaves[j], nodes, inputs, steps[j + 1] if j + 1 < len(steps) else None)
            matched = step and _match_step(step, template)
            if not matched:
                break
            template = template or matched
            found.append(step)
            if None in step.outgoing:
                break
            inputs = {v: (k, step.evaluator.ranks[v]) for v in step.outgoing for k, f in step.new.items()
                      if _same(step.evaluator.env[v], f)}
            if len(inputs) != len(step.outgoing):
                break
        else:
            return found, template, order
    return None


def _bindings(view: GraphView, initial: list[str], nodes: list[onnx.NodeProto]):
    """(what the first step reads as each state: value or (id(node), input index) -> (key, rank), the initial value
    of each key) for each way to read the initial values as the states. One value may be both h and c (Keras
    passes one zeros tensor as both): then each of its reads is h's or c's."""
    ranks = [_state_rank(view, v) for v in initial]
    for order in permutations(range(len(initial))):
        yield {initial[k]: (key, ranks[k]) for key, k in enumerate(order)}, [initial[k] for k in order]
    uses = [(id(n), k) for n in nodes for k, v in enumerate(n.input) if v == initial[0]]
    if len(initial) == 1 and 2 <= len(uses) <= 4:  # a few reads: 2 ** reads - 2 ways
        for keys in product((0, 1), repeat=len(uses)):
            if len(set(keys)) == 2:
                yield {use: (key, ranks[0]) for use, key in zip(uses, keys, strict=True)}, initial * 2


def _evaluate(view, x_form, leaf, nodes, inputs, following) -> _Step | None:
    """Step ``nodes`` evaluated from its states ``inputs`` (value -> (key, rank)) and its slice ``leaf``; its
    new states are read off the values the ``following`` step reads (the last step: found among its values)."""
    evaluator = _StepEvaluator(view)
    states = {key: Atom("state", (key,)) for key, _ in inputs.values()}
    for name, (key, rank) in inputs.items():
        if isinstance(name, tuple):
            evaluator.uses[name] = (_leaf(states[key]), rank)
        else:
            evaluator.set(name, _leaf(states[key]), rank)
    evaluator.set(leaf[0], _rebase(x_form, evaluator.x_atom), leaf[1])
    evaluator.run(nodes)
    step = _Step(evaluator, states, [])
    if following is not None:
        produced = {o for n in nodes for o in n.output}
        step.outgoing = list(dict.fromkeys(v for n in following for v in n.input if v in produced))
        forms = _distinct(evaluator.env.get(v) for v in step.outgoing)
        if None in forms or len(forms) != len(states):
            return None
        step.options = [dict(enumerate(p)) for p in permutations(forms)]
    else:
        # latest first: the cell's own h rather than a partial sum that is a cell step too (with fewer ops)
        forms = [f for f in _distinct(evaluator.env.get(o) for n in reversed(nodes) for o in n.output)
                 if f is not None]
        step.options = [{0: f} for f in forms] if len(states) == 1 else [
            {0: f, 1: c} for f in forms for c in _implied_c(f)]
    return step


def _distinct(values) -> list:
    """Forms up to sameness (None for any value that is not one)."""
    found: list = []
    for value in values:
        value = value if isinstance(value, Form) else None
        if not any(value is f or (value is not None and f is not None and _same(value, f)) for f in found):
            found.append(value)
    return found


def _implied_c(h: Form) -> list[Form]:
    """An LSTM's new c as its new h = o * act(c) reads it: the form inside either activated factor."""
    single = _single(h)
    if single is None or single[0].kind != "mul" or not isinstance(single[1], float) or single[1] != 1.0:
        return []
    factors = [_single(f) for f in single[0].args]
    return [f[0].args[3] for f in factors if f is not None and f[0].kind == "act" and f[1] == 1.0]


def _match_step(step: _Step, template: tuple | None) -> tuple | None:
    """(cell, weights) of the step: the first option of new states that is a cell step with h at key 0 (and the
    template's cell, weights and type); ``step.new`` is set to it."""
    for new in step.options:
        for recognise in (_lstm, _gru, _rnn):
            cell = recognise(step.states, new)
            if cell is None or cell.h != 0:
                continue
            weights = _weights(cell, step.evaluator.x_atom, step.states)
            # a cell that does not read its h (R all zero) is no recurrence: its "state" could be any value, such as
            # a streaming step's x (then an affine map of h would pass for an RNN step)
            if weights and np.any(weights[1]) and (
                    template is None or _same_cell(template, (cell, weights, step.evaluator.dtype))):
                step.new = new
                step.outgoing = step.outgoing or _first_values(step, new)
                return cell, weights, step.evaluator.dtype
    return None


def _same_cell(a: tuple, b: tuple) -> bool:
    (cell_a, weights_a, dtype_a), (cell_b, weights_b, dtype_b) = a, b
    if (cell_a.op_type, cell_a.activations, cell_a.linear_before_reset, dtype_a) != (
            cell_b.op_type, cell_b.activations, cell_b.linear_before_reset, dtype_b):
        return False
    return all((u is None and v is None) or (u is not None and v is not None and np.array_equal(u, v))
               for u, v in zip(weights_a, weights_b, strict=True))


def _first_values(step: _Step, new: dict[int, Form]) -> list[str]:
    """The first value of the step whose form is each new state (the last step's h and c)."""
    env = step.evaluator.env
    names = list(step.evaluator.ranks)
    return [next((v for v in names if isinstance(env.get(v), Form) and _same(env[v], f)), None) for f in new.values()]


# ---------------------------------------------------------------------------------------------------------------
# The fused nodes and what they expose


def _closure(nodes: list[onnx.NodeProto], targets: list[str]) -> list[onnx.NodeProto]:
    """The nodes among ``nodes`` that compute ``targets``."""
    producer = {o: n for n in nodes for o in n.output}
    found: dict[int, onnx.NodeProto] = {}
    pending = list(targets)
    while pending:
        node = producer.get(pending.pop())
        if node is not None and id(node) not in found:
            found[id(node)] = node
            pending += list(node.input)
    return list(found.values())


def _reassembly(view: GraphView, steps: list[_Step], nodes: list[list[onnx.NodeProto]], reverse: bool, axis):
    """The node that writes every step's h over time (the layer's Y [T, N, H]: a Concat over axis 0 of [1, N, H]
    values, or a ConcatFromSequence over axis 0 of their SequenceConstruct, stacking [N, H] values with new_axis;
    [N, T, H] where x's time ``axis`` is 1: a Concat over axis 1 of h [N, H] Unsqueezed there), the nodes that spell
    each step's h so, and whether Y is in the order opposite to x's (Keras's go_backwards writes a reverse chain's h
    in processing order), or None."""
    if axis is None:
        return None  # one step without a time axis: its h is h_n
    last = steps[-1].evaluator
    spellings = [v for v in last.ranks if _same(last.env[v], steps[-1].new[0])]
    if axis == 1:  # [N, 1, H], which no form is
        spellings = [u.output[0] for v in spellings if last.ranks[v] == 2 for u in view.consumers.get(v, [])
                     if _op(u, "Unsqueeze") and _axes(view, u, 1) in ([1], [-2])]
    for reader in {id(r): r for v in spellings for r in view.consumers.get(v, [])}.values():
        joined = view.only_consumer(reader.output[0]) if _op(reader, "SequenceConstruct") else None
        if _op(reader, "Concat") and attribute(reader, "axis") in (axis, axis - 3):
            y, rank, extra = reader, 3, []
        elif _op(joined, "ConcatFromSequence") and attribute(joined, "axis") == 0 and axis == 0:
            y, rank, extra = joined, 2 if attribute(joined, "new_axis", 0) else 3, [reader]
        else:
            continue
        if len(reader.input) != len(steps):
            continue
        for backwards in (False, True):
            order = range(len(steps) - 1, -1, -1) if reverse != backwards else range(len(steps))
            spelled = [_spelled(view, steps[j], nodes[j], value, rank, axis)
                       for value, j in zip(reader.input, order, strict=True)]
            if None not in spelled:
                return y, extra + [n for s in spelled for n in s], backwards
    return None


def _spelled(view: GraphView, step: _Step, nodes: list[onnx.NodeProto], value: str, rank: int,
             axis: int) -> list[onnx.NodeProto] | None:
    """The step's nodes that compute ``value`` when it is the step's new h of ``rank`` (with a time ``axis`` 1: h
    Unsqueezed there)."""
    env, ranks = step.evaluator.env, step.evaluator.ranks
    unsqueeze = view.producer.get(value)
    if axis == 1 and _op(unsqueeze, "Unsqueeze") and _axes(view, unsqueeze, 1) in ([1], [-2]) and any(
            n is unsqueeze for n in nodes):
        inner = _spelled(view, step, nodes, unsqueeze.input[0], 2, 0)
        return None if inner is None else _closure(nodes, [value])
    if isinstance(env.get(value), Form) and _same(env[value], step.new[0]) and ranks[value] == rank:
        return _closure(nodes, [value])
    return None


def _exposed(view: GraphView, region: dict[int, onnx.NodeProto], last: _Step, y: str | None) -> list | None:
    """The fused node's outputs [Y, h_n, c_n]: every value the region computes that is read outside it must be Y or
    the final h or c as [N, H] (a Squeeze of axis 0 of a [1, N, H] one joins the region)."""
    env, ranks = last.evaluator.env, last.evaluator.ranks
    role = {v: k for v in ranks for k, f in last.new.items() if _same(env[v], f)}
    read = y is not None and (y in view.graph_outputs or any(id(r) not in region for r in view.consumers[y]))
    outputs: list[str | None] = [y if read else None, None, None]
    for node in list(region.values()):
        for value in node.output:
            readers = [r for r in view.consumers.get(value, []) if id(r) not in region]
            if value == y or not (readers or value in view.graph_outputs):
                continue
            if value not in role:
                return None  # a value of the chain that the fused node does not give
            if ranks[value] == 3 and value not in view.graph_outputs and len(readers) == 1 and _op(
                    readers[0], "Squeeze") and _axes(view, readers[0], 1) == [0]:
                region[id(readers[0])] = readers[0]
                value = readers[0].output[0]
                if value not in role:  # a Squeeze that the last step did not evaluate
                    return None
            elif ranks[value] != 2:
                return None
            if outputs[1 + role[value]] not in (None, value):
                return None
            outputs[1 + role[value]] = value
    return outputs


def _zero_state(view: GraphView, name: str) -> list | None:
    """The shape (canonical dims) of an all-zeros value, through Slices, Squeezes and Unsqueezes of axis 0."""
    node, ops = view.producer.get(name), []
    while any(_op(node, op) for op in ("Slice", "Squeeze", "Unsqueeze")):
        ops.append(node)
        node = view.producer.get(node.input[0])
    shape = _zero(view, node.output[0]) if node is not None else None
    for op in reversed(ops):
        if shape is None or not shape:
            return None
        if op.op_type == "Unsqueeze" and _axes(view, op, 1) == [0]:
            shape = [1, *shape]
        elif op.op_type == "Squeeze" and _axes(view, op, 1) == [0] and shape[0] == 1:
            shape = shape[1:]
        elif op.op_type == "Slice" and isinstance(shape[0], int) and _slice(view, op) is not None:
            start, end = _slice(view, op)
            shape = [len(range(shape[0])[start:end]), *shape[1:]]
        else:
            return None
    return shape


@dataclass
class _Chain:
    match: _Match
    nodes: list[onnx.NodeProto]  # in graph order
    shared: list[onnx.NodeProto]  # the slicing of x, where other chains read the same slices (else in ``nodes``)


def _matches(view: GraphView, slices: _Slices):
    """Each chain that reads the slices (their nodes go with the fusion unless two chains share them: then they
    stay, and the fused nodes read x)."""
    projection = _projection(view, slices)
    window = _window(view, slices, projection[0], projection[2]) if projection is not None else False
    if window is False:
        return
    leaves, window = window
    chains = _chains(view, [leaf for leaf, _ in leaves])
    if len(chains) > 1 and projection[3]:
        return  # a projection of x that two chains share: its weights would be copied into both
    reading = [*slices.nodes, *projection[3]] if len(chains) == 1 else []
    for reverse, nodes in chains:
        nodes = [[n for n in step if id(n) not in {id(m) for m in slices.nodes}] for step in nodes]
        for steps in _streaming(view, nodes[0], slices.source) if slices.axis is None else [nodes]:
            found = _chain(view, projection[1], leaves[::-1] if reverse else leaves, steps)
            match = found and _fuse(view, found, (steps, reverse, slices.axis), projection[0], window, reading)
            if match:
                yield _Chain(match[0], sorted(match[1], key=lambda n: view.position[id(n)]),
                             [] if reading else slices.nodes)
                break


def _streaming(view: GraphView, nodes: list[onnx.NodeProto], x: str) -> list[list[list[onnx.NodeProto]]]:
    """Candidates for the nodes of a step without a time axis as a streaming model runs it: the caller passes the
    states in (graph inputs, or rows of one) and takes the new ones back (graph outputs, or rows of one: ``_fuse``),
    which is what makes one step a recurrence (else any layer relu(a W + b R) would pass for an RNN step). Only what
    computes what the caller gets back: all of it, then each one or two of those values (a decoder step of two cells
    returns both cells' states; the first's new h is the second's x). Not where a state is not passed in, or where
    that is more than a cell and a head (``_STREAMING_NODES``: evaluating a deep network of two inputs as forms costs
    seconds)."""
    returned = [o for n in nodes for o in n.output if _returned(view, o)]
    groups = [returned]
    if 1 < len(returned) <= _STREAMING_RETURNED:
        groups += [[v] for v in returned] + [list(pair) for pair in combinations(returned, 2) if len(returned) > 2]
    candidates: dict[frozenset, list[list[onnx.NodeProto]]] = {}
    for group in groups:
        closure = sorted(_closure(nodes, group), key=lambda n: view.position[id(n)])
        if closure and len(closure) <= _STREAMING_NODES and all(
                _passed_in(view, v) for v in _initial_states(view, closure, x)):
            candidates.setdefault(frozenset(id(n) for n in closure), [closure])
    return list(candidates.values())


def _passed_in(view: GraphView, name: str) -> bool:
    """Whether the caller passes ``name`` in: a graph input, or a row of one (a Gather of one index along axis 0:
    silero's states stacked in one input [2, N, H])."""
    node = view.producer.get(name)
    if _op(node, "Gather") and attribute(node, "axis", 0) == 0:
        index = view.constant(node.input[1])
        name = node.input[0] if index is not None and index.size == 1 and index.ndim == 0 else name
    return name in view.graph_inputs


def _returned(view: GraphView, name: str) -> bool:
    """Whether the caller gets ``name`` back: a graph output, or a row of one (Unsqueezed at axis 0 into a Concat
    over axis 0 that is a graph output: silero's new states stacked in one output)."""
    rows = [u.output[0] for u in view.consumers.get(name, []) if _op(u, "Unsqueeze") and _axes(view, u, 1) == [0]]
    return name in view.graph_outputs or any(
        _op(c, "Concat") and attribute(c, "axis") == 0 and c.output[0] in view.graph_outputs
        for row in rows for c in view.consumers.get(row, []))


def _fuse(view: GraphView, found: tuple, chain: tuple, x: str, window, reading: list) -> tuple | None:
    """The match of a chain (its nodes per step, whether it runs backwards, x's time axis) whose steps are proven,
    and its nodes (with ``reading``: the slicing of x), when what it exposes is the fused node's."""
    steps, (cell, weights, dtype), initial = found
    nodes, reverse, axis = chain
    region = {id(n): n for n in reading}
    for j, step in enumerate(steps):
        region.update((id(n), n) for n in _closure(nodes[j], step.outgoing))
    reassembly = _reassembly(view, steps, nodes, reverse, axis)
    if reassembly is not None:
        region.update((id(n), n) for n in [reassembly[0], *reassembly[1]])
    outputs = _exposed(view, region, steps[-1], reassembly[0].output[0] if reassembly else None)
    if outputs is None or not any(outputs) or (axis is None and not all(
            o is None or _returned(view, o) for o in outputs)):
        return None
    read = [n for node in region.values() for n in read_names(node) if view.folded(n) is not None]
    # the weights the fused node copies (not the integers it reads: split sizes that both directions share)
    if not all(_private(view, n, region) for n in read if view.folded(n).size > 1 and view.folded(n).dtype.kind == "f"):
        return None
    first = min(region.values(), key=lambda n: view.position[id(n)])
    match = _Match(first, cell, weights, dtype, x, outputs=[*outputs, None],
                   direction="reverse" if reverse else "forward", window=window,
                   y_backwards=reassembly is not None and reassembly[2], time_axis=axis)
    batch = _dim(view, x, 1 if axis == 0 else 0)
    for role, name in zip(("h", "c"), initial, strict=False):
        if _zero_state(view, name) not in ([batch, weights[3]], [1, batch, weights[3]]):
            node = view.producer.get(name)
            match.initial[role] = node.input[0] if _state_rank(view, name) == 3 and _op(node, "Unsqueeze") else name
            if _state_rank(view, match.initial[role]) != 2:
                return None
    return match, list(region.values())


# ---------------------------------------------------------------------------------------------------------------
# Layers and stacks: chains joined by dynamo's glue

def _layers(view: GraphView, chains: list[_Chain]) -> list[list[_Chain]]:
    """The chains as layers: a forward and a reverse chain of the same x and cell whose Ys one Concat over the
    features joins, in that order; every other chain a layer of its own."""
    by_x: dict[str, list[_Chain]] = {}
    for chain in chains:
        by_x.setdefault(chain.match.x, []).append(chain)
    layers = []
    for group in by_x.values():
        pair = sorted(group, key=lambda c: c.match.direction == "reverse")
        layers += [pair] if _directions(view, pair) is not None else [[c] for c in group]
    return layers


def _kind(match: _Match) -> tuple:
    return match.cell.op_type, np.dtype(match.dtype)


def _directions(view: GraphView, layer: list[_Chain]) -> onnx.NodeProto | None:
    """The Concat over the last axis that joins a layer's two directions' Ys [T, N, H] (forward first), if one does
    and the two are the same cell."""
    matches = [c.match for c in layer]
    ys = [m.outputs[0] for m in matches]
    if len(layer) != 2 or not all(ys) or [m.direction for m in matches] != ["forward", "reverse"] or len(
            {(*_kind(m), m.cell.linear_before_reset, m.weights[3]) for m in matches}) != 1:
        return None
    concat = view.only_consumer(ys[0])
    if _op(concat, "Concat") and attribute(concat, "axis") in (2, -1) and list(concat.input) == ys and (
            view.only_consumer(ys[1]) is concat):
        return concat
    return None


def _layer_y(view: GraphView, layer: list[_Chain]) -> str | None:
    """A layer's Y [T, N, D*H]: its one direction's, or the Concat of both."""
    concat = _directions(view, layer)
    return concat.output[0] if concat is not None else layer[0].match.outputs[0]


def _region(layer: list[_Chain]) -> dict[int, onnx.NodeProto]:
    return {id(n): n for chain in layer for n in [*chain.nodes, *chain.shared]}


def _stacks(view: GraphView, layers: list[list[_Chain]]) -> list[tuple[list[list[_Chain]], list[onnx.NodeProto]]]:
    """Layers in turn, with the Transposes between them that cancel (tf2onnx's, around each Keras layer): each
    layer's Y read by the next layer alone (its x, of any cell of the same float type, read in full)."""
    by_x: dict[str, list] = {}
    for layer in layers:
        by_x.setdefault(layer[0].match.x, []).append(layer)
    following: dict[int, tuple[list[_Chain], list[onnx.NodeProto]]] = {}
    for layer in layers:
        y, glue = _cancelled_transposes(view, _layer_y(view, layer))
        after = by_x.get(y, []) if y not in view.graph_outputs else []
        if len(after) == 1 and np.dtype(after[0][0].match.dtype) == np.dtype(layer[0].match.dtype) and all(
                c.match.window is None for c in after[0]) and all(
                id(r) in _region(after[0]) for r in view.consumers.get(y, [])):
            following[id(layer)] = after[0], glue
    followers = {id(layer) for layer, _ in following.values()}
    stacks = []
    for layer in layers:
        if id(layer) not in followers:
            stacks.append(([layer], []))
            while id(stacks[-1][0][-1]) in following:
                after, glue = following[id(stacks[-1][0][-1])]
                stacks[-1][0].append(after)
                stacks[-1][1].extend(glue)
    return stacks


def _stack(view: GraphView, layers: list[list[_Chain]], glue: list[onnx.NodeProto]) -> _Stack | None:
    """The stack of ``layers`` with its glue: the directions' Concats, the Transposes between layers that cancel
    (``glue``), zero or sliced initial states, the final states (``_final_states``), Transposes to and from
    batch-major; None where some part is not that (or there is no glue: one chain stays as it is)."""
    matches = [c.match for layer in layers for c in layer]
    if any(m.y_backwards or m.time_axis != 0 for m in matches):
        return None  # a Y in processing order (Keras's go_backwards), or not time-major: each chain as it is
    first = matches[0]
    cells = list(dict.fromkeys(m.cell.op_type for m in matches))
    stack = _Stack("+".join(cells), [], [*(d for layer in layers if (d := _directions(view, layer))), *glue],
                   first.x, merge_output=True)
    batch = _dim(view, first.x, 1)  # every layer's: each keeps its x's batch (so does its own x's batch dim)
    for layer in layers:
        own = [c.match for c in layer]
        batches = (batch, _dim(view, own[0].x, 1))
        states = {k: _initial_rows(view, stack, own, role, batches)
                  for k, role in ((5, "h"), (6, "c"))[: 2 if own[0].cell.op_type == "LSTM" else 1]}
        if False in states.values() or not _shared_inside(view, layer):
            return None
        stack.layers.append(_Layer(None, len(own), own[0].weights[3], "", states,
                                   build=lambda outputs, own=own: recurrent_layer(own, outputs)))
    region = {k: n for layer in layers for k, n in [*_region(layer).items(), *((id(n), n) for n in glue)]}
    if not all(_private(view, n.input[0], region, dropped=True) for n in glue):
        return None  # a Shape of the value between two Transposes feeds something else
    finals = [_final_states(view, stack, [m.outputs[k] for m in matches], region, len(layers[-1]) == 1)
              for k in (1, 2)]
    modes = {f[1] for f in finals if f}
    if False in finals or len(modes) > 1:
        return None
    stack.final_states = "all" if modes <= {"all"} else "last"
    stack.squeeze_states = modes == {"squeezed"}
    finals = [f[0] if f else None for f in finals]
    windows = [c.match.window for c in layers[0]]
    stack.window = None if windows == [None] * len(windows) else tuple(w or (0, None) for w in windows)
    batch_first(view, stack, set(_region(layers[0])))
    y = batch_first_output(view, stack, _layer_y(view, layers[-1]))
    if len(matches) == 1 and not stack.nodes:
        return None  # nothing to gain: the chain's own LoopedRecurrent
    stack.outputs = [y if y and (view.consumers.get(y) or y in view.graph_outputs) else None, *finals]
    while len(stack.outputs) > 1 and stack.outputs[-1] is None:
        stack.outputs.pop()
    return stack


def _shared_inside(view: GraphView, layer: list[_Chain]) -> bool:
    """Whether the slicing of x that the layer's chains share is read by them alone."""
    region = _region(layer)
    return not any(o in view.graph_outputs or any(id(r) not in region for r in view.consumers.get(o, []))
                   for chain in layer for n in chain.shared for o in n.output)


def _initial_rows(view: GraphView, stack: _Stack, matches: list[_Match], role: str, batches: tuple):
    """Where a layer's initial h or c comes from (stacked._Layer.states): None for zeros of [N, H] in every
    direction (N one of ``batches``, canonical forms of the stack's batch), (k, start, end) where direction d's is
    row start + d of the stack's k-th source (Squeezed from a Slice of one row along axis 0), False otherwise."""
    names = [m.initial.get(role) for m in matches]
    hidden = matches[0].weights[3]
    if all(n is None or _zero_state(view, n) in ([b, hidden] for b in batches) for n in names):
        return None
    rows = [_row(view, n) if n else None for n in names]
    if None in rows or len({source for source, _ in rows}) != 1 or [r for _, r in rows] != list(
            range(rows[0][1], rows[0][1] + len(rows))):
        return False
    return stack.source(rows[0][0]), rows[0][1], rows[-1][1] + 1


def _row(view: GraphView, name: str) -> tuple[str, int] | None:
    """(source, k) where ``name`` is row k of source: a Squeeze of axis 0 of a Slice k:k+1 along axis 0."""
    squeeze = view.producer.get(name)
    piece = view.producer.get(squeeze.input[0]) if _op(squeeze, "Squeeze") and _axes(view, squeeze, 1) == [0] else None
    rows = _slice(view, piece) if _op(piece, "Slice") else None
    if rows is None or rows[0] < 0 or rows[1] != rows[0] + 1:
        return None
    return piece.input[0], rows[0]


def _final_states(view: GraphView, stack: _Stack, values: list[str | None], region: dict,
                  last_alone: bool) -> tuple[str, str] | bool | None:
    """The stack's h_n or c_n and what it holds: every chain's final state [N, H] Unsqueezed (its one reader outside
    the chains' ``region``) and, for more than one, those concatenated in the chains' order ("all"); or, where only
    the last chain's is read and it is the last layer's one direction (``last_alone``), its Unsqueeze ("last") or
    the state itself, read by anything ("squeezed": Keras's return_state). None where no chain's is read, False
    where they are read otherwise."""
    if not any(values):
        return None
    outside = [[r for r in view.consumers.get(v, []) if id(r) not in region] if v else [] for v in values]
    unsqueezes = [r[0] if len(r) == 1 and _op(r[0], "Unsqueeze") and _axes(view, r[0], 1) == [0]
                  and v not in view.graph_outputs else None for r, v in zip(outside, values, strict=True)]
    if last_alone and not any(values[:-1]):
        if unsqueezes[-1] is None:
            return values[-1], "squeezed"
        stack.nodes.append(unsqueezes[-1])
        return unsqueezes[-1].output[0], "last"
    if None in unsqueezes:
        return False
    joined = [u.output[0] for u in unsqueezes]
    concat = view.only_consumer(joined[0])
    if not (_op(concat, "Concat") and attribute(concat, "axis") in (0, -3) and list(concat.input) == joined
            and all(view.only_consumer(v) is concat for v in joined)):
        return False
    stack.nodes += [*unsqueezes, concat]
    return concat.output[0], "all"


@register_pattern("unrolled_cells")
def unrolled_cells(view: GraphView):
    """T copies of one LSTM / GRU / RNN cell step chained through their states (dynamo's unrolled nn.RNN,
    hand-unrolled and single-step streaming cells); a stack of such layers joined by dynamo's glue becomes one
    StackedRecurrent."""
    taken: set[int] = set()
    chains: list[_Chain] = []
    for slices in _slices(view):
        if {id(n) for n in slices.nodes} & taken or (slices.axis is None and any(
                id(r) in taken for r in view.consumers[slices.source])):
            continue  # a bare step's x read inside a chain found before (a middle h, the next step's MatMul's)
        for chain in _matches(view, slices):
            if {id(n) for n in chain.nodes} & taken:
                continue
            taken |= {id(n) for n in chain.nodes}
            if chain.match.time_axis == 0:  # the glue it looks for is time-major
                settled(view, chain.match, chain.nodes)
            chains.append(chain)
    for layers, glue in _stacks(view, _layers(view, chains)):
        stack = _stack(view, layers, glue)
        if stack is not None:
            # the first chain's nodes first: the fused node is named after its first node, as a chain's is
            nodes = [*(n for layer in layers for n in _region(layer).values()), *stack.nodes]
            op_type = f"{len(layers)}-layer {stack.op_type}" if len(layers) > 1 else stack.op_type
            yield Fusion("unrolled_cells", f"{op_type} unrolled", nodes, [stack.x, *stack.sources], stack.outputs,
                         lambda ctx, stack=stack: convert(ctx, stack))
            continue
        for chain in (chain for layer in layers for chain in layer):  # each chain as it is
            match = chain.match
            yield Fusion("unrolled_cells", f"{match.cell.op_type} unrolled", chain.nodes, _runtime(match),
                         match.outputs, lambda ctx, match=match: _convert(ctx, match))
