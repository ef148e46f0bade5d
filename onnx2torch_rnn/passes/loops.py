"""Loop bodies of one cell step (tf2onnx's Keras LSTM / GRU / SimpleRNN layers) become one recurrent node.

tf2onnx writes a Keras recurrent layer it cannot map to an ONNX op (masking, hard_sigmoid spelled as Clip, GRU with
reset_after=False, SimpleRNN) as a Loop over time: carried values are a time counter, the states, the step count and
the weights (passed through), the body Gathers step ``t`` of the time-major input (and of the mask), computes one
cell step and writes the output as a scan output. The step count is read from the input's Shape.

The body is evaluated symbolically (``_Evaluator``): every value of the step is an affine form ``sum(atom @ M) + b``
over atoms (the step's input, the states, and each non-linear value: an activation, a product of two forms, a form
selected by the mask), with the weights' values folded into the matrices. A cell is recognised when the states'
new values have exactly the LSTM, GRU (either reset placement) or RNN equations over such forms (``_cell_match``); its
ONNX weights are then read off the matrices. What is proven before anything fires: the loop runs exactly T = dim 0
of the gathered input times (trip count and conditions); every carried value is a counter, a pass-through, or a state
whose update is the cell's (or, with a mask, the cell's where the mask is true and the old value where it is false);
the scan output is the new h (masked: the new h or the previous output / zero); initial states are zeros of [N, H] or
given; weights are read by nothing else. Where the body selects by the mask with Mul and Add (``m * new + (1 - m) *
old``, tf2onnx's SelectV2) the recurrent node selects exactly: they differ only where a state is inf or NaN. The
evaluator and the cell equations are passes/cells.py's (scans.py and unrolled.py use them too).

A Keras backward layer (go_backwards, a Bidirectional's second half) loops forwards over x reversed by a
ReverseSequence of all of it (every row's length proven dim 0): that is the reverse direction over x with Y in
processing order, and the reversal goes with the loop (``_reversed_x``; not with a mask). A Y in processing order
that a ReverseSequence of all of it reverses back (through Transposes that cancel) is Y in x's order: that glue goes
with it too (``settled``, unrolled.py's chains use it as well).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx

from ..node import Converted, read_names
from . import Fusion, GraphView, attribute, register_pattern
from .cells import (
    Atom,
    Form,
    Less,
    Outer,
    Step,
    _atom,
    _Cell,
    _Evaluator,
    _gru,
    _leaf,
    _lstm,
    _rnn,
    _same,
    _weights,
)
from .stacked import _cancelled_transposes, _dim, _op, _rank, _shape_vector, reversal

_NARROW = MappingProxyType({onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"})

# ---------------------------------------------------------------------------------------------------------------
# The loop: carried values, trip count, mask, outputs


@dataclass
class _Match:
    loop: onnx.NodeProto
    cell: _Cell
    weights: tuple  # W, R, B (float64 arrays), hidden, P (float64 or None)
    dtype: np.dtype  # the weights' type in the graph
    x: str  # the time-major input [T, N, I]
    mask: str | None = None  # the time-major mask [T, N, 1]
    mask_output: str | None = None  # what a masked step's Y is: "hold" (the previous output) or "zero"
    initial: dict[str, str] = field(default_factory=dict)  # "h" / "c" -> a given initial state [N, H]
    outputs: list[str | None] = field(default_factory=list)  # y [T, N, H], h_n, c_n, the last output
    lengths: bool = False  # the mask is per-row lengths [N] (step t runs where t < length: scans.py)
    direction: str = "forward"  # "reverse": a Scan reading x and writing y from the last step to the first
    x_backwards: bool = False  # a forward recurrence over x from its last step to its first (scans.py)
    y_backwards: bool = False  # ... writing y from its last step to its first
    window: tuple[int, int | None] | None = None  # the steps of x it reads (unrolled.py), None: all
    time_axis: int | None = 0  # x's and y's time axis: 1 batch-first, None one step without it (unrolled.py)
    # "float16" / "bfloat16": a Loop that carries its states in it (onnxruntime computes the body in float32 and
    # rounds them after every step: the layer's state_dtype)
    state_dtype: str | None = None


def _select(f: Form) -> tuple[Form, Form | None] | None:
    """f as where(mask, new, old): (new, old); old None where it is zero."""
    if np.any(f.bias) or not all(a.kind == "gate" and m == 1.0 for a, m in f.terms.items()):
        return None
    kept = [a.args[1] for a in f.terms if not a.args[0]]
    dropped = [a.args[1] for a in f.terms if a.args[0]]
    if len(kept) != 1 or len(dropped) > 1:
        return None
    return kept[0], dropped[0] if dropped else None


def _scalar(view: GraphView, name: str):
    """The canonical dim (stacked._dim) that a scalar value equals, through Casts and a Squeeze of a shape slice."""
    node = view.producer.get(name)
    while _op(node, "Cast") or _op(node, "Identity"):
        name, node = node.input[0], view.producer.get(node.input[0])
    if _op(node, "Squeeze"):
        name = node.input[0]
    vector = _shape_vector(view, name)
    return vector[0] if vector is not None and len(vector) == 1 else None


def _zero(view: GraphView, name: str) -> list | None:
    """The shape (canonical dims) of an all-zeros value: ConstantOfShape of zero, or a zero scalar Expanded."""
    node = view.producer.get(name)
    if _op(node, "ConstantOfShape"):
        value = attribute(node, "value")
        if value is not None and onnx.numpy_helper.to_array(value).any():
            return None
        return _shape_vector(view, node.input[0]) or []
    if _op(node, "Expand"):
        value = view.constant(node.input[0])
        if value is not None and value.size == 1 and not value.any():
            return _shape_vector(view, node.input[1]) or []
    return None


def _outer_terms(view: GraphView, name: str) -> list[Less] | None:
    """The loop's initial condition as Less terms (an And of them)."""
    node = view.producer.get(name)
    while _op(node, "Cast") or _op(node, "Identity"):
        node = view.producer.get(node.input[0])
    if _op(node, "And"):
        parts = [_outer_terms(view, v) for v in node.input]
        return None if None in parts else [t for p in parts for t in p]
    if _op(node, "Less"):
        return [Less(*node.input)]
    return None


def _runs_t_times(view: GraphView, loop: onnx.NodeProto, cond, steps) -> bool:
    """Whether the loop runs exactly ``steps`` (a canonical dim) iterations: its trip count is T or absent, and every
    condition term is ``index < T`` with index at most the next iteration's; without a trip count one term of the
    body's condition is ``next index < T`` and the initial one is ``0 < T``."""
    def is_steps(value) -> bool:
        return isinstance(value, Outer) and _scalar(view, value.name) == steps

    terms = cond if isinstance(cond, tuple) else (cond,)
    if not all(isinstance(t, Less) and isinstance(t.a, Step) and t.a.offset <= 1 and is_steps(t.b) for t in terms):
        return False
    initial = _outer_terms(view, loop.input[1]) if loop.input[1] else []
    if initial is None or not all(view.constant(t.a) is not None and not view.constant(t.a).any()
                                  and _scalar(view, t.b) == steps for t in initial):
        return False
    if loop.input[0]:
        return _scalar(view, loop.input[0]) == steps
    return bool(initial) and any(t.a == Step(1) for t in terms)


def _private(view: GraphView, name: str, region: dict[int, onnx.NodeProto], *, dropped: bool = False) -> bool:
    """Whether every reader of ``name`` is in the region (the nodes a fusion replaces, by id) or only feeds it (the
    fusion absorbs those): a weight the fused module copies must not be shared with anything else. ``dropped``: a
    value the fusion drops, which no reader feeding nothing may read (recognition absorbs only what feeds it)."""
    if name in view.graph_outputs:  # the graph gives it as it is
        return False
    pending, seen = list(view.consumers.get(name, [])), set()
    while pending:
        node = pending.pop()
        if id(node) in region or id(node) in seen:
            continue
        seen.add(id(node))
        outputs = [o for o in node.output if o]
        readers = [c for o in outputs for c in view.consumers.get(o, [])]
        if not outputs or any(o in view.graph_outputs for o in outputs) or (dropped and not readers):
            return False
        pending += readers
    return True


def _match(view: GraphView, loop: onnx.NodeProto) -> _Match | None:
    body = attribute(loop, "body")
    inits = list(loop.input[2:])
    carried = len(inits)
    if body is None or len(body.input) != carried + 2 or len(body.output) > carried + 2:
        return None
    inner = [i.name for i in body.input]
    outer_outputs = list(loop.output) + [""] * (len(body.output) - 1 - len(loop.output))
    produced = {o: n for n in body.node for o in n.output}

    def source(name: str) -> str:
        while name in produced and produced[name].op_type == "Identity":
            name = produced[name].input[0]
        return name

    env: dict = {inner[0]: Step(0), inner[1]: None}
    states: dict[int, Atom] = {}
    counters = []
    for k, init in enumerate(inits):
        value = view.folded(init) if init else None
        if source(body.output[1 + k].name) == inner[2 + k]:  # passed through
            zero = value is None and _zero(view, init) is not None  # zeros for masked outputs (any shape)
            env[inner[2 + k]] = Form({}) if zero else value if value is not None else Outer(init)
        elif value is not None and value.size == 1 and value.dtype.kind in "iu" and not value.any():
            env[inner[2 + k]] = Step(0)  # a counter, proven below
            counters.append(k)
        else:
            states[k] = Atom("state", (k,))
            env[inner[2 + k]] = _leaf(states[k])
    evaluator = _Evaluator(view, body, env)
    if evaluator.x is None or any(env.get(body.output[1 + k].name) != Step(1) for k in counters) or not states:
        return None
    steps = _dim(view, evaluator.x, 0)
    if _rank(view, evaluator.x) != 3 or not _runs_t_times(view, loop, env.get(body.output[0].name), steps):
        return None
    if evaluator.mask is not None and _rank(view, evaluator.mask) != 3:
        return None
    return _cell_match(view, loop, evaluator, states, [env.get(o.name) for o in body.output], outer_outputs, inits)


def _new_and_old(evaluator, states, body_values) -> tuple[dict, dict] | None:
    """Each state's new value and, with a mask, the value a masked step keeps (None: zero)."""
    new, old = {}, {}
    for k in states:
        value = body_values[1 + k]
        selected = (_select(value) if evaluator.mask is not None else (value, None)) if isinstance(value, Form) \
            else None
        if selected is None:
            return None
        new[k], old[k] = selected
    return new, old


def _cell_match(view, loop, evaluator, states, body_values, outer_outputs, inits) -> _Match | None:
    """The match of a body whose values are ``body_values`` (a Loop's: condition, carried values, scan outputs)
    with carried values ``states`` (their initial values ``inits``) into the node's ``outer_outputs``."""
    selected = _new_and_old(evaluator, states, body_values)
    if selected is None:
        return None
    new, old = selected
    # a state that only holds the output (masking keeps the previous output): its new value is another state's
    holders = [k for k in states if any(j != k and _same(new[k], new[j]) for j in states)]
    for holder in [None, *holders]:
        cell_states = {k: a for k, a in states.items() if k != holder}
        if evaluator.mask is not None and any(old[k] is None or _atom(old[k]) is not states[k] for k in cell_states):
            continue  # a masked step keeps every state of the cell
        for recognise in (_lstm, _gru, _rnn):
            cell = recognise(cell_states, new)
            weights = cell and _weights(cell, evaluator.x_atom, cell_states)
            if weights:
                return _finish(view, loop, evaluator, cell, weights, (holder, states, new, old), body_values,
                               outer_outputs, inits)
    return None


def _mode(old: Form | None, holder: Atom | None) -> str | None:
    """What a masked step outputs when the body keeps ``old``: zeros, or the held previous output."""
    return "zero" if old is None else "hold" if holder is not None and _atom(old) is holder else None


def _finish(view, loop, evaluator, cell, weights, analysis, body_values, outer_outputs, inits) -> _Match | None:
    holder, states, new, old = analysis
    carried = len(inits)
    scans = body_values[1 + carried:]
    if len(scans) > 1 or (holder is not None and not _same(new[holder], new[cell.h])):
        return None
    held = None if holder is None else states[holder]
    modes = {_mode(old[holder], held)} if holder is not None else set()
    for y in scans:
        selected = (_select(y) if evaluator.mask is not None else (y, None)) if isinstance(y, Form) else None
        if selected is None or not _same(selected[0], new[cell.h]):
            return None
        modes.add(_mode(selected[1], held))
    if len(modes) > 1 or None in modes:
        return None
    mask_output = (modes.pop() if modes else "zero") if evaluator.mask is not None else None
    if holder is not None and _zero(view, inits[holder]) is None:
        return None  # the runtime's held output starts at zeros
    read = [n for n in read_names(loop) if view.folded(n) is not None and view.folded(n).size > 1]
    if not all(_private(view, n, {id(loop): loop}) for n in read):
        return None
    batch = _dim(view, evaluator.x, 1)
    match = _Match(loop, cell, weights, evaluator.dtype, evaluator.x, evaluator.mask, mask_output)
    if loop.op_type == "Loop":
        match.state_dtype = _NARROW.get(view.elem_type(inits[cell.h]))
    for role, k in (("h", cell.h), ("c", cell.c)):
        if k is not None and _zero(view, inits[k]) != [batch, weights[3]]:
            match.initial[role] = inits[k]
    at = {"h": cell.h, "c": cell.c, "last": holder}
    match.outputs = [outer_outputs[carried] if scans else ""] + [
        outer_outputs[at[r]] if at[r] is not None else "" for r in ("h", "c", "last")]
    match.outputs = [o or None for o in match.outputs]
    return match


def settled(view: GraphView, match: _Match, nodes: list[onnx.NodeProto]) -> None:
    """Move a layer's Y past the glue that only moves it back: Transpose pairs that cancel and, for a Y in processing
    order (y_backwards, a Keras backward layer), a ReverseSequence of all of it, which puts it in x's order again.
    The glue joins the fusion's ``nodes`` where its values only feed them (the Shapes that compute the reversal's
    lengths)."""
    value, glue, backwards = match.outputs[0], [], match.y_backwards
    while value is not None:
        value, pairs = _cancelled_transposes(view, value)
        glue += pairs
        readers = view.consumers.get(value, [])
        reverse = next((r for r in readers if reversal(view, r, value)), None)
        if not backwards or reverse is None or value in view.graph_outputs or not all(
                r is reverse or _op(r, "Shape") for r in readers):
            break
        value, backwards = reverse.output[0], False
        glue.append(reverse)
    region = {id(n): n for n in [*nodes, *glue]}
    if glue and all(_private(view, n.input[0], region, dropped=True) for n in glue):
        nodes += glue
        match.outputs[0], match.y_backwards = value, backwards


def _reversed_x(view: GraphView, match: _Match, nodes: list[onnx.NodeProto]) -> None:
    """A forward loop over x reversed by a ReverseSequence of all of it (a Keras backward layer, go_backwards) is the
    reverse direction over x writing Y in processing order: the match reads x itself and the reversal joins ``nodes``
    where what the loop reads of it only feeds them (not with a mask, which the loop reads in its own order, nor with
    the last output, the last step processed)."""
    reverse = view.producer.get(match.x)
    forward = match.direction == "forward" and not match.y_backwards
    if match.mask is not None or match.outputs[3] is not None or not forward or reverse is None or not reversal(
            view, reverse, reverse.input[0]):
        return
    if _private(view, match.x, {id(n): n for n in [*nodes, reverse]}, dropped=True):
        nodes.append(reverse)
        match.x, match.direction, match.y_backwards = reverse.input[0], "reverse", True


@register_pattern("loop_cells")
def loop_cells(view: GraphView):
    """tf2onnx's Loops over time of one LSTM / GRU / SimpleRNN cell step (Keras layers, masked or not)."""
    for node in view.nodes:
        match = _match(view, node) if _op(node, "Loop") else None
        if match is not None:
            nodes = [node]
            _reversed_x(view, match, nodes)
            settled(view, match, nodes)
            yield Fusion("loop_cells", f"{match.cell.op_type} loop", nodes, _runtime(match), match.outputs,
                         lambda ctx, match=match: _convert(ctx, match))


def fusion(pattern: str, op_type: str, node: onnx.NodeProto, match: _Match) -> Fusion:
    """The fusion of a loop (or scan) ``node`` whose body ``match`` proved one cell step."""
    return Fusion(pattern, op_type, [node], _runtime(match), match.outputs, lambda ctx: _convert(ctx, match))


def _runtime(match: _Match) -> list[str]:
    """What the fused module reads at run time: x, the initial states that are not zeros, the mask (or lengths)."""
    states = [match.initial[r] for r in ("h", "c") if r in match.initial]
    return [match.x, *states, *([match.mask] if match.mask else [])]


def _convert(ctx, match: _Match) -> Converted:
    return Converted(looped(match), _runtime(match))


def looped(match: _Match, *, feeds_next: bool = False):
    """The LoopedRecurrent module of ``match``; ``feeds_next``: its y is read by the next layer (scans.py's cell
    chains), whether or not the graph reads it."""
    from ..recurrent import LoopedRecurrent

    wanted = [o is not None for o in match.outputs]  # y, h_n, c_n, last output
    wanted[0] = wanted[0] or feeds_next
    layer = recurrent_layer([match], [wanted[0] or wanted[3], wanted[1], wanted[2]])
    return LoopedRecurrent(layer, initial_h="h" in match.initial, initial_c="c" in match.initial,
                           mask=match.mask is not None and not match.lengths, lengths=match.lengths, outputs=wanted,
                           x_backwards=match.x_backwards, y_backwards=match.y_backwards,
                           window=match.window, time_axis=match.time_axis)


def recurrent_layer(matches: list[_Match], outputs: list[bool]):
    """The OnnxLSTM / OnnxGRU / OnnxRNN of one direction's match, or of a forward and a reverse match of the same
    cell (one bidirectional layer: weights and activations forward first), computing ``outputs`` (Y, Y_h, Y_c)."""
    import torch

    from ..recurrent import OnnxGRU, OnnxLSTM, OnnxRNN
    from ..recurrent.cells import ACTIVATIONS

    first = matches[0]
    cell, hidden = first.cell, first.weights[3]
    dtype = torch.from_numpy(np.zeros(0, first.dtype)).dtype
    activations = [a for m in matches for a in m.cell.activations]  # per direction, as ONNX lists them
    takes = [len(ACTIVATIONS[name][0]) for name, _, _ in activations]  # none, alpha, or alpha and beta
    alpha = [a for (_, a, _), n in zip(activations, takes, strict=True) if n >= 1]
    beta = [b for (_, _, b), n in zip(activations, takes, strict=True) if n == 2]
    W, R, B = (torch.tensor(np.concatenate([m.weights[k] for m in matches]), dtype=dtype) for k in range(3))
    peepholes = [m.weights[4] for m in matches]
    P = None if all(p is None for p in peepholes) else torch.tensor(np.concatenate(
        [np.zeros((1, 3 * hidden)) if p is None else p for p in peepholes]), dtype=dtype)
    layer_class = {"LSTM": OnnxLSTM, "GRU": OnnxGRU, "RNN": OnnxRNN}[cell.op_type]
    return layer_class(hidden_size=hidden, direction="bidirectional" if len(matches) == 2 else first.direction,
                       activations=[a[0] for a in activations], activation_alpha=alpha, activation_beta=beta,
                       linear_before_reset=cell.linear_before_reset,
                       outputs=list(outputs)[:layer_class.cell.num_outputs], W=W, R=R, B=B, P=P, dtype=dtype,
                       mask_output=first.mask_output, state_dtype=first.state_dtype)
