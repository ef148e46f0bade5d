"""Scan bodies of one cell step (tf2onnx's TF1 ``dynamic_rnn`` cells) become one recurrent node.

tf2onnx writes a tf.compat.v1 ``dynamic_rnn`` over a cell it cannot map to an ONNX op as a Scan over the time-major
input: its states are time counters (a zero that adds 1 each step) and the cell's states, its one scan input is x
(the body reads x_t as a body input), its scan output is the new h. The body is evaluated symbolically as
passes/loops.py does for Keras Loops (``_Evaluator``, its cell equations and weight read-off are shared): TF1 cells
MatMul the concatenation ``[x, h]`` by one kernel (``Joined``), GRUCell resets before the product
(linear_before_reset=0) and LSTMCell's peepholes become ONNX's P. With ``sequence_length`` the body compares a counter
with the lengths (``t >= length``) and keeps every state and zeroes the output where it holds: the fused layer masks
those steps (``LoopedRecurrent(lengths=True)``), exact for every length, where ONNX's sequence_lens is not (it
rejects lengths above T and zeroes the states of an empty row). A Scan reading x and writing y backwards is ONNX's
reverse direction. Refused (the Scan stays): opset 8's Scan (batch axis, its own sequence_lens), scan axes other than
0, only one of x and y reversed, a reversed scan with sequence_length, cell_clip (clips the cell state, not
ONNX's gate pre-activations), num_proj (a projection) and MultiRNNCell (two cells in one step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from . import GraphView, attribute, register_pattern
from .loops import Atom, Form, Mask, Outer, Step, _cell_match, _Evaluator, _leaf, _Match, _zero, fusion
from .stacked import _op, _rank


def _direction(scan: onnx.NodeProto) -> str | None:
    """The ONNX direction of a Scan on axis 0 of its input and output: forward, or reverse where it reads x and writes
    y both from the last step to the first (ONNX's reverse Y is in x's order); None otherwise (one of them reversed
    would need y flipped)."""
    if any(any(attribute(scan, name) or []) for name in ("scan_input_axes", "scan_output_axes")):
        return None
    reads, writes = (list(attribute(scan, name) or [0]) for name in ("scan_input_directions", "scan_output_directions"))
    return {0: "forward", 1: "reverse"}.get(reads[0]) if reads == writes and len(reads) == 1 else None


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


def _match(view: GraphView, scan: onnx.NodeProto) -> _Match | None:
    body, scans = attribute(scan, "body"), attribute(scan, "num_scan_inputs")
    if view.opset(scan) < 9 or body is None or scans != 1:  # opset 8: a batch axis and its own sequence_lens
        return None
    direction = _direction(scan)
    if direction is None:
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
    values = [env.get(o.name) for o in body.output]
    if not states or not all(isinstance(values[k], Step) and values[k].offset == 1 for k in counters):
        return None
    outer_outputs = list(scan.output) + [""] * (len(body.output) - len(scan.output))
    match = _cell_match(view, scan, evaluator, states, [None, *values], outer_outputs, inits)
    if match is None or (direction == "reverse" and match.mask is not None):  # lengths count the scan's steps
        return None
    match.lengths, match.direction = match.mask is not None, direction
    return match


@register_pattern("scan_cells")
def scan_cells(view: GraphView):
    """tf2onnx's Scans over time of one TF1 RNN / GRU / LSTM cell step (dynamic_rnn, with sequence_length or not)."""
    for node in view.nodes:
        match = _match(view, node) if _op(node, "Scan") else None
        if match is not None:
            yield fusion("scan_cells", f"{match.cell.op_type} scan", node, match)
