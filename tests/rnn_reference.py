"""A small numpy reference for ONNX LSTM, GRU and RNN, for the cases onnxruntime cannot run (layout=1, float64).

Written independently of the package, straight from the spec with onnxruntime's departures (checked against
onnxruntime in tests/converters/test_recurrent.py): alpha/beta consumed in list order by the functions that take
them with onnxruntime's defaults, clip after bias (and peephole) terms, a row of length 0 ends in zero states, RNN
names case-sensitive and a two-name list serving one direction. Each batch row runs on its own, in float64.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

# name -> (defaults of the parameters it consumes, function); onnxruntime's defaults
_ACTIVATIONS = {
    "Relu": ((), lambda x, a, b: np.maximum(x, 0)),
    "Tanh": ((), lambda x, a, b: np.tanh(x)),
    "Sigmoid": ((), lambda x, a, b: 1 / (1 + np.exp(-x))),
    "Affine": ((0.0, 0.0), lambda x, a, b: a * x + b),
    "LeakyRelu": ((0.01,), lambda x, a, b: np.where(x >= 0, x, a * x)),
    "ThresholdedRelu": ((0.0,), lambda x, a, b: np.where(x > a, x, 0)),
    "ScaledTanh": ((0.0, 0.0), lambda x, a, b: a * np.tanh(b * x)),
    "HardSigmoid": ((0.2, 0.5), lambda x, a, b: np.clip(a * x + b, 0, 1)),
    "Elu": ((1.0,), lambda x, a, b: np.where(x >= 0, x, a * (np.exp(np.minimum(x, 0)) - 1))),
    "Softsign": ((), lambda x, a, b: x / (1 + np.abs(x))),
    "Softplus": ((), lambda x, a, b: np.log(1 + np.exp(x))),
}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _functions(op, names, alphas, betas, directions):
    per_direction = len(_DEFAULTS[op])
    names = list(names) if names else _DEFAULTS[op] * directions
    if op == "RNN" and directions == 1 and len(names) == 2:
        names = names[:1]
    assert len(names) == per_direction * directions, names
    lookup = {n if op == "RNN" else n.lower(): n for n in _ACTIVATIONS}
    alphas, betas = list(alphas or []), list(betas or [])
    functions = []
    for given in names:
        defaults, fn = _ACTIVATIONS[lookup[given if op == "RNN" else given.lower()]]
        params = [(alphas, betas)[k].pop(0) if (alphas, betas)[k] else d for k, d in enumerate(defaults)]
        params += [0.0] * (2 - len(params))
        functions.append(lambda x, fn=fn, a=params[0], b=params[1]: fn(x, a, b))
    return [functions[d * per_direction:(d + 1) * per_direction] for d in range(directions)]


def reference(op, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *, hidden_size=None,
              direction="forward", activations=None, activation_alpha=None, activation_beta=None, clip=None,
              input_forget=0, layout=0, linear_before_reset=0, output_sequence=0, mask=None, mask_output="zero"):
    """(Y, Y_h, Y_c) of one node in the node's layout and X's dtype (Y_c None except for LSTM).

    ``mask`` (bool, X.shape[:2]; not an ONNX input) follows Keras' masking: at a masked step a row keeps its states
    and outputs zeros (``mask_output="zero"``) or its previous output in processing order, zero at first ("hold")."""
    del output_sequence  # v1: only says whether Y is optional
    dtype = X.dtype
    f64 = [None if a is None else np.asarray(a, np.float64) for a in (X, W, R, B, initial_h, initial_c, P)]
    X, W, R, B, h0, c0, P = f64
    if layout:
        X = X.transpose(1, 0, 2)
        h0, c0 = (None if s is None else s.transpose(1, 0, 2) for s in (h0, c0))
    steps, batch, _ = X.shape
    directions, hidden = W.shape[0], R.shape[-1]
    assert hidden_size is None or hidden_size == hidden
    gates = _GATES[op]
    B = np.zeros((directions, 2 * gates * hidden)) if B is None else B
    P = np.zeros((directions, 3 * hidden)) if P is None else P
    h0 = np.zeros((directions, batch, hidden)) if h0 is None else h0
    c0 = np.zeros((directions, batch, hidden)) if c0 is None else c0
    lens = np.full(batch, steps) if sequence_lens is None else np.asarray(sequence_lens)
    keep = np.ones((steps, batch), bool) if mask is None else np.asarray(mask).transpose(1, 0) if layout else mask
    functions = _functions(op, activations, activation_alpha, activation_beta, directions)
    cut = (lambda v: v) if clip is None or (op == "RNN" and clip < 0) else (lambda v: np.clip(v, -clip, clip))

    Y = np.zeros((steps, directions, batch, hidden))
    Y_h = np.zeros((directions, batch, hidden))
    Y_c = np.zeros((directions, batch, hidden))
    for d in range(directions):
        fns = functions[d]
        wb, rb = np.split(B[d], 2)
        reverse = direction == "reverse" or d == 1
        for n in range(batch):
            h, c = h0[d, n], c0[d, n]
            out = np.zeros(hidden)
            order = range(lens[n] - 1, -1, -1) if reverse else range(lens[n])
            for t in order:
                h_prev, c_prev = h, c
                x = X[t, n]
                if op == "LSTM":
                    i, o, f, g = np.split(W[d] @ x + wb + R[d] @ h + rb, 4)
                    p_i, p_o, p_f = np.split(P[d], 3)
                    i = fns[0](cut(i + p_i * c))
                    f = 1 - i if input_forget else fns[0](cut(f + p_f * c))
                    c = f * c + i * fns[1](cut(g))
                    h = fns[0](cut(o + p_o * c)) * fns[2](c)
                elif op == "GRU":
                    xz, xr, xh = np.split(W[d] @ x + wb, 3)
                    rz, rr, rh = np.split(rb, 3)
                    r_z, r_r, r_h = np.split(R[d], 3)
                    z = fns[0](cut(xz + r_z @ h + rz))
                    r = fns[0](cut(xr + r_r @ h + rr))
                    if linear_before_reset:
                        candidate = fns[1](cut(xh + r * (r_h @ h + rh)))
                    else:
                        candidate = fns[1](cut(xh + r_h @ (r * h) + rh))
                    h = (1 - z) * candidate + z * h
                else:
                    h = fns[0](cut(W[d] @ x + wb + R[d] @ h + rb))
                if keep[t, n]:
                    out = h
                else:
                    h, c = h_prev, c_prev
                    out = out if mask_output == "hold" else np.zeros(hidden)
                Y[t, d, n] = out
            if lens[n] > 0:
                Y_h[d, n], Y_c[d, n] = h, c
    if layout:
        Y, Y_h, Y_c = Y.transpose(2, 0, 1, 3), Y_h.transpose(1, 0, 2), Y_c.transpose(1, 0, 2)
    return Y.astype(dtype), Y_h.astype(dtype), Y_c.astype(dtype) if op == "LSTM" else None


def run_node(node: onnx.NodeProto, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The reference outputs of ``node`` for the named input values, one per non-empty output slot."""
    attributes = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        attributes[attribute.name] = value
    inputs = [values[name] if name else None for name in node.input]
    outputs = reference(node.op_type, *inputs, **attributes)
    return [out for name, out in zip(node.output, outputs, strict=False) if name]
