"""Scan bodies of one cell step (tf2onnx's TF1 ``dynamic_rnn`` cells) become one recurrent node.

tf2onnx writes a tf.compat.v1 ``dynamic_rnn`` over a cell it cannot map to an ONNX op as a Scan over the time-major
input: its states are time counters (a zero that adds 1 each step) and the cell's states, its one scan input is x
(the body reads x_t as a body input), its scan output is the new h. The body is evaluated symbolically as
passes/loops.py does for Keras Loops (passes/cells.py: the evaluator, cell equations and weight read-off): TF1 cells
MatMul the concatenation ``[x, h]`` by one kernel (``Joined``), GRUCell resets before the product
(linear_before_reset=0) and LSTMCell's peepholes become ONNX's P. With ``sequence_length`` the body compares a counter
with the lengths (``t >= length``) and keeps every state and zeroes the output where it holds: the fused layer masks
those steps (``LoopedRecurrent(lengths=True)``), exact for every length, where ONNX's sequence_lens is not (it
rejects lengths above T and zeroes the states of an empty row). A Scan reading x and writing y backwards is ONNX's
reverse direction; one reading only x backwards, or writing only y backwards, or both with sequence_length, is a
forward recurrence over x flipped in time and / or with its y flipped (``LoopedRecurrent(x_backwards,
y_backwards)``). A MultiRNNCell runs several cells per step, each reading the previous one's new h: one
LoopedRecurrent per cell, in turn (``LoopedStack``). Refused (the Scan stays): opset 8's Scan (batch axis, its own
sequence_lens), scan axes other than 0, cell_clip (clips the cell state, not ONNX's gate pre-activations) and
num_proj. A projected LSTMCell's h is (o * tanh(c)) @ P, narrower than c: nn.LSTM(proj_size)'s cell, but no ONNX
LSTM's, and the recurrent runtime (ONNX-shaped W/R/B/P, the native kernel, the op's output shapes and its ONNX
translation) has no projection. It is an ONNX LSTM over m = o * tanh(c) with recurrence weight P R followed by
y @ P and h_n @ P, but P would then be two parameters where the graph has one (training the fused module would not
train the graph's model) unless P R were recomputed from both at every call: not done.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import onnx

from ..node import Converted
from . import Fusion, GraphView, attribute, register_pattern
from .cells import (
    Atom,
    Form,
    Mask,
    Outer,
    Step,
    _atom,
    _Evaluator,
    _gru,
    _leaf,
    _lstm,
    _rnn,
    _weights,
)
from .loops import (
    _cell_match,
    _finish,
    _Match,
    _new_and_old,
    _zero,
    fusion,
    looped,
)
from .stacked import _op, _rank


def _backwards(scan: onnx.NodeProto) -> tuple[bool, bool] | None:
    """Whether a Scan on axis 0 of its input and output reads x, and writes y, from the last step to the first; None
    for other axes or values."""
    if any(any(attribute(scan, name) or []) for name in ("scan_input_axes", "scan_output_axes")):
        return None
    reads, writes = (list(attribute(scan, name) or [0]) for name in ("scan_input_directions", "scan_output_directions"))
    if len(reads) != 1 or len(writes) != 1 or not {reads[0], writes[0]} <= {0, 1}:
        return None
    return bool(reads[0]), bool(writes[0])


@dataclass(frozen=True)
class _Past:
    """``step >= lengths`` [N]: where a row's steps are over, the negated mask once reshaped to [N, 1]."""


class _ScanEvaluator(_Evaluator):
    """The Loop evaluator plus what TF1's ``dynamic_rnn`` bodies read: the outer zeros the output is zeroed with, and
    the step compared with per-row lengths (the mask, whose outer value is then the lengths [N])."""

    def value(self, name: str):
        value = super().value(name)
        if isinstance(value, Outer) and (shape := _zero(self.view, name)) is not None and len(shape) <= 2:
            return Form({})  # zeros broadcast against the [N, H] it meets
        return value

    def _Gather(self, node, data, index):
        return None  # a Scan's step input is its body input; an outer value gathered by the step is not understood

    def _GreaterOrEqual(self, node, a, b):
        if not isinstance(a, Step) or a.offset != 0 or not isinstance(b, Outer) or self.mask not in (None, b.name):
            return None
        if _rank(self.view, b.name) != 1 or self.view.elem_type(b.name) not in (onnx.TensorProto.INT32,
                                                                               onnx.TensorProto.INT64):
            return None
        self.mask = b.name
        return [_Past()]

    def _Reshape(self, node, a, shape):
        if isinstance(a, _Past) and isinstance(shape, np.ndarray) and shape.tolist() == [-1, 1]:
            return [Mask(negated=True)]
        return None


def _match(view: GraphView, scan: onnx.NodeProto) -> list[_Match] | None:
    """The cells of a Scan's body, one match per cell (layer) in the order they run."""
    body, scans = attribute(scan, "body"), attribute(scan, "num_scan_inputs")
    if view.opset(scan) < 9 or body is None or scans != 1:  # opset 8: a batch axis and its own sequence_lens
        return None
    backwards = _backwards(scan)
    if backwards is None:
        return None
    carried = len(scan.input) - scans
    inits, x = list(scan.input[:carried]), scan.input[carried]
    if len(body.input) != carried + 1 or len(body.output) < carried or not all(inits) or _rank(view, x) != 3:
        return None
    env: dict = {}
    states: dict[int, Atom] = {}
    counters = []
    for k, (init, inner) in enumerate(zip(inits, body.input, strict=False)):
        value = view.folded(init)
        if value is not None and value.size == 1 and value.dtype.kind in "iu" and not value.any():
            env[inner.name] = Step(0)  # a counter, proven below
            counters.append(k)
        else:
            states[k] = Atom("state", (k,))
            env[inner.name] = _leaf(states[k])
    evaluator = _ScanEvaluator(view, body, env, (x, body.input[carried].name))
    values = [None, *(env.get(o.name) for o in body.output)]  # no condition: a Scan runs every step
    if not states or not all(isinstance(values[1 + k], Step) and values[1 + k].offset == 1 for k in counters):
        return None
    outer_outputs = list(scan.output) + [""] * (len(body.output) - len(scan.output))
    matches = _chain(view, scan, evaluator, states, values, outer_outputs, inits)
    if matches is None:
        single = _cell_match(view, scan, evaluator, states, values, outer_outputs, inits)
        matches = None if single is None else [single]
    if matches is None:
        return None
    for match in matches:
        match.lengths = match.mask is not None
    if backwards == (True, True) and not matches[0].lengths:  # ONNX's reverse direction: its Y is in x's order
        for match in matches:
            match.direction = "reverse"
    else:  # a forward recurrence over x read backwards, writing y backwards (the lengths count the scan's steps)
        matches[0].x_backwards, matches[-1].y_backwards = backwards
    return matches


# ---------------------------------------------------------------------------------------------------------------
# MultiRNNCell: several cells per step, each reading the previous one's new h


def _reading(f: Form, previous: Form, atom: Atom) -> Form | None:
    """``f`` with the previous layer's output read as ``atom``: where f = previous @ W + rest, rest + atom @ W. The
    output is a sum of atoms, each times a number (an LSTM's o * tanh(c), a GRU's z * h + (1 - z) * g); None where f
    reads its atoms in any other combination."""
    if np.any(previous.bias) or not all(isinstance(s, float) and s != 0 for s in previous.terms.values()):
        return None
    if not any(a in f.terms for a in previous.terms):
        return f
    first = next(iter(previous.terms))
    if first not in f.terms:
        return None
    W = f.terms[first] / previous.terms[first]
    if not all(a in f.terms and type(f.terms[a]) is type(W) and np.array_equal(f.terms[a], s * W)
               for a, s in previous.terms.items()):
        return None
    rest = {a: m for a, m in f.terms.items() if a not in previous.terms}
    return Form({**rest, atom: W}, f.bias)


def _layer(x: Atom, previous: Form | None, states: dict[int, Atom], new: dict) -> tuple | None:
    """(cell, weights, its states) of the one cell among ``states`` whose gates read only ``x`` (the previous
    layer's output ``previous`` where there is one) and its own states."""
    for size in (1, 2):
        for keys in itertools.combinations(states, size):
            own = {k: states[k] for k in keys}
            for recognise in (_lstm, _gru, _rnn):
                cell = recognise(own, new)
                if cell is not None and previous is not None:
                    gates = [_reading(g, previous, x) for g in cell.gates]
                    cell = None if None in gates else replace(cell, gates=gates)
                weights = cell and _weights(cell, x, own)
                if weights:
                    return cell, weights, own
    return None


def _layers(x: Atom, states: dict[int, Atom], new: dict) -> list[tuple] | None:
    """The cells of a step, in order: the first reads x, each next one the previous one's new h (and nothing else of
    it); every state belongs to one cell. [(cell, weights)], None where that is not what the step computes."""
    layers, previous, remaining = [], None, dict(states)
    while remaining:
        found = _layer(x, previous, remaining, new)
        if found is None:
            return None
        cell, weights, own = found
        if layers and weights[0].shape[2] != layers[-1][1][3]:  # reads a width other than the previous hidden size
            return None
        layers.append((cell, weights))
        remaining = {k: a for k, a in remaining.items() if k not in own}
        previous, x = new[cell.h], Atom("x")  # the next layer's input: this one's output
    return layers


def _chain(view, scan, evaluator, states, values, outer_outputs, inits) -> list[_Match] | None:
    """Two or more cells per step (MultiRNNCell): one match per cell, only the last one writing y. With lengths
    every layer masks its steps: a later layer reads zeros where the body reads a masked step's unmasked output, but
    that step's results are dropped either way."""
    selected = _new_and_old(evaluator, states, values)
    if selected is None:
        return None
    new, old = selected
    if evaluator.mask is not None and any(old[k] is None or _atom(old[k]) is not states[k] for k in states):
        return None  # a masked step keeps every state
    layers = _layers(evaluator.x_atom, states, new)
    if layers is None or len(layers) < 2:
        return None
    matches = []
    for index, (cell, weights) in enumerate(layers):
        body_values = values if index == len(layers) - 1 else values[:1 + len(inits)]  # no y before the last
        match = _finish(view, scan, evaluator, cell, weights, (None, states, new, old), body_values, outer_outputs,
                        inits)
        if match is None:
            return None
        matches.append(match)
    return matches


def _chain_fusion(node: onnx.NodeProto, matches: list[_Match]) -> Fusion:
    """One LoopedStack for the layers of ``matches``: x, each layer's given initial states, the lengths; y, then
    each layer's final h and c."""
    states = [m.initial[r] for m in matches for r in ("h", "c") if r in m.initial]
    inputs = [matches[0].x, *states, *([matches[0].mask] if matches[0].mask else [])]
    outputs = [matches[-1].outputs[0], *(o for m in matches for o in m.outputs[1:3])]

    def convert(ctx) -> Converted:
        from ..recurrent import LoopedStack

        last = len(matches) - 1
        return Converted(LoopedStack([looped(m, feeds_next=k < last) for k, m in enumerate(matches)]), inputs)

    op_type = "-".join(m.cell.op_type for m in matches) + " scan"
    return Fusion("scan_cells", op_type, [node], inputs, outputs, convert)


@register_pattern("scan_cells")
def scan_cells(view: GraphView):
    """tf2onnx's Scans over time of TF1 RNN / GRU / LSTM cell steps (dynamic_rnn, with sequence_length or not; one
    cell or a MultiRNNCell's cells in turn)."""
    for node in view.nodes:
        matches = _match(view, node) if _op(node, "Scan") else None
        if matches is not None and len(matches) == 1:
            yield fusion("scan_cells", f"{matches[0].cell.op_type} scan", node, matches[0])
        elif matches is not None:
            yield _chain_fusion(node, matches)
