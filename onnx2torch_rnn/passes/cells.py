"""Cells as affine forms: the symbolic evaluator and the cell equations that the recognition patterns share.

Every value of one cell step is an affine form ``sum(atom @ M) + b`` over atoms (the step's input x, the states, and
each non-linear value: an activation, a product of two forms, a form selected by a mask, a Clip), with the weights'
values folded into the matrices (``_Evaluator``, one handler per ONNX op it understands; a ConstantOfShape of a
form's Shape is a scalar that broadcasts to it: tf_keras's dropout masks at inference). A cell is recognised when
the states' new values have exactly the LSTM, GRU (either reset placement) or RNN equations over such forms
(``_lstm``, ``_gru``, ``_rnn``); ``_weights`` reads its ONNX W, R, B (and P) off the matrices. Used by
passes/loops.py (tf2onnx's Loop bodies), passes/scans.py (TF1 Scan bodies) and passes/unrolled.py (cells unrolled
in the main graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from . import GraphView, _run_node, attribute
from .stacked import _dim

_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)
_NARROW = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
# activation ops and the ONNX recurrent activation they are, with the attributes they take and their defaults
_ACTIVATIONS = MappingProxyType({"Sigmoid": (), "Tanh": (), "Relu": (), "Softsign": (), "Softplus": (),
                                 "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)), "LeakyRelu": (("alpha", 0.01),),
                                 "Elu": (("alpha", 1.0),), "ThresholdedRelu": (("alpha", 1.0),)})


@dataclass(eq=False)
class Atom:
    """A value of the step [N, width] that is not affine in the others, compared by identity: the step's input x, a
    state, an activation of a form, the product of two forms, a form kept where the mask is (not) set, a Clip."""

    kind: str  # "x", "state", "act", "mul", "gate", "clip"
    # state: (k,); act: (name, alpha, beta, form); mul: (a, b); gate: (negated, form); clip: (low, high, form)
    args: tuple = ()


@dataclass
class Form:
    """sum(atom @ matrix) + bias, a value [N, width]. A matrix is an array [in, width] or a float s meaning s * I."""

    terms: dict[Atom, np.ndarray | float]
    bias: np.ndarray | float = 0.0


@dataclass(frozen=True)
class Step:
    """The step index plus ``offset`` (the loop's iteration number, a counter that starts at 0 and adds 1)."""

    offset: int


@dataclass(frozen=True)
class Outer:
    """A value of the outer graph read by the body (directly or passed through), not otherwise understood."""

    name: str


@dataclass(frozen=True)
class Mask:
    """The mask's row for this step ([N, 1]); ``negated`` after a Not; ``numeric`` after a Cast to a float."""

    negated: bool = False
    numeric: bool = False


@dataclass(frozen=True)
class Less:
    a: object
    b: object


@dataclass(frozen=True)
class ShapeOf:
    """The Shape of a form's value: read only by ConstantOfShape (tf_keras's ``ones_like(h)``, the recurrent dropout
    mask at inference)."""


@dataclass(eq=False)
class Joined:
    """Forms concatenated along the features: understood only as MatMul's left operand (TF1 cells MatMul
    ``[x, h]`` by one kernel)."""

    parts: tuple


_ELEMENTWISE = ("act", "clip")  # atoms of one form, column by column


def _leaf(atom: Atom) -> Form:
    return Form({atom: 1.0})


def _width(m: np.ndarray | float) -> int | None:
    return m.shape[1] if isinstance(m, np.ndarray) else None


def _dense(m: np.ndarray | float, width: int) -> np.ndarray:
    return m if isinstance(m, np.ndarray) else m * np.eye(width)


def _form_width(f: Form) -> int | None:
    atom = _atom(f)
    if atom is not None and atom.kind in _ELEMENTWISE:
        return _form_width(atom.args[-1])
    widths = {_width(m) for m in f.terms.values()} | ({f.bias.shape[-1]} if np.ndim(f.bias) else set())
    widths |= {_product_width(a) for a, m in f.terms.items() if a.kind == "mul" and isinstance(m, float)}
    widths.discard(None)
    return widths.pop() if len(widths) == 1 else None


def _product_width(atom: Atom) -> int | None:
    """The width of a product: its factors' where one is known and above 1 (a width-1 factor broadcasts)."""
    widths = {_form_width(f) for f in atom.args} - {None, 1}
    return widths.pop() if len(widths) == 1 else None


def _add(a: Form, b: Form, sign: float = 1.0) -> Form | None:
    terms = dict(a.terms)
    for atom, m in b.terms.items():
        if atom not in terms:
            terms[atom] = sign * m
        elif isinstance(terms[atom], float) and isinstance(m, float):
            terms[atom] = terms[atom] + sign * m
        else:
            width = _width(terms[atom]) or _width(m)
            left, right = _dense(terms[atom], width), _dense(m, width)
            if left.shape != right.shape:
                return None
            terms[atom] = left + sign * right
    if np.ndim(a.bias) and np.ndim(b.bias) and np.shape(a.bias) != np.shape(b.bias):
        return None
    return Form(terms, a.bias + sign * b.bias)


def _scale(f: Form, s: np.ndarray | float) -> Form | None:
    """f * s with s a scalar or a vector [width] (a column scale)."""
    s = np.asarray(s, dtype=np.float64)
    if s.ndim > 1 and s.shape[:-1] != (1,) * (s.ndim - 1):
        return None
    s = s.reshape(-1) if s.size > 1 else float(s.reshape(()))
    if isinstance(s, float):
        return Form({a: m * s for a, m in f.terms.items()}, f.bias * s)
    width = len(s)
    if any(_width(m) not in (None, width) for m in f.terms.values()):
        return None
    return Form({a: _dense(m, width) * s for a, m in f.terms.items()}, f.bias * s)


def _columns(f: Form, start: int, end: int) -> Form | None:
    atom = _atom(f)
    if atom is not None and atom.kind in _ELEMENTWISE:  # elementwise: the columns of act(g) are act(g's columns)
        inner = _columns(atom.args[-1], start, end)
        return None if inner is None else _leaf(Atom(atom.kind, (*atom.args[:-1], inner)))
    width = _form_width(f)
    if width is None:
        return None
    start, end = (max(0, min(width, v if v >= 0 else v + width)) for v in (start, end))
    bias = f.bias[start:end] if np.ndim(f.bias) else f.bias
    return Form({a: _dense(m, width)[:, start:end] for a, m in f.terms.items()}, bias)


def _constant_form(value: np.ndarray) -> Form | None:
    """A constant broadcast against [N, width]: a scalar or a row."""
    value = np.asarray(value, dtype=np.float64)
    if value.ndim > 2 or (value.ndim == 2 and value.shape[0] != 1):
        return None
    return Form({}, value.reshape(-1) if value.size > 1 else float(value.reshape(())))


class _Evaluator:
    """The body's values as forms, masks, step indices and outer values (None: not understood)."""

    def __init__(self, view: GraphView, body: onnx.GraphProto, env: dict, x: tuple[str, str] | None = None):
        self.view, self.env = view, env
        self.x: str | None = None  # the outer value whose step is x
        self.mask: str | None = None  # the outer value whose step is the mask
        self.dtype: np.dtype | None = None  # the weights' type
        self.unrounded: dict[int, np.ndarray] = {}  # id of a constant cast to float16 -> its float32 original
        self.x_atom = Atom("x")  # one atom for every read of the step's input
        if x is not None:  # a Scan's step input: (the outer input, the body input that is its step)
            self.x, env[x[1]] = x[0], _leaf(self.x_atom)
        self.constants = {t.name: onnx.numpy_helper.to_array(t) for t in body.initializer}
        for node in body.node:
            outputs = self.node(node, [self.value(v) if v else None for v in node.input])
            for name, value in zip(node.output, outputs or [None] * len(node.output), strict=False):
                self.env[name] = value

    def value(self, name: str):
        if name in self.env:
            return self.env[name]
        if name in self.constants:
            return self.constants[name]
        constant = self.view.folded(name)
        return constant if constant is not None else Outer(name)

    def node(self, node: onnx.NodeProto, args: list) -> list | None:
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type != "Constant" and all(isinstance(a, np.ndarray) or a is None for a in args) and any(
                a is not None for a in args):
            folded = self._fold(node, args)
            if folded and node.op_type == "Cast" and attribute(node, "to") in _NARROW and args[0].dtype.kind == "f":
                self.unrounded[id(folded[0])] = args[0]
            return folded
        handler = getattr(self, f"_{node.op_type}", None)
        # onnxruntime has no float16 kernels for the cell's arithmetic (MatMul, Add, ...) on CPU: it computes them
        # in float32 and drops a Cast pair between, so they read a constant cast to float16 (mixed_float16's weights)
        # as the float32 original (read through Split or Squeeze, whose float16 kernels run, it is rounded)
        args = [self.unrounded.get(id(a), a) if isinstance(a, np.ndarray) else a for a in args]
        return None if handler is None else handler(node, *args)

    @staticmethod
    def _fold(node, args):
        try:
            return _run_node(node, args)
        except Exception:  # a constant the reference cannot compute: the body is not understood
            return None

    def _Constant(self, node):
        return [onnx.numpy_helper.to_array(attribute(node, "value"))] if attribute(node, "value") is not None else None

    def _Identity(self, node, a):
        return [a]

    def _Cast(self, node, a):
        if isinstance(a, Mask):
            return [Mask(a.negated, attribute(node, "to") in _FLOATS)]
        if isinstance(a, Form) and attribute(node, "to") not in _FLOATS:
            return None
        return [a]  # steps and outer scalars compare the same after casts (below 2**24 in float32)

    def _Not(self, node, a):
        return [Mask(not a.negated, a.numeric)] if isinstance(a, Mask) and not a.numeric else None

    def _Gather(self, node, data, index):
        if not isinstance(data, Outer) or index != Step(0) or attribute(node, "axis", 0) != 0:
            return None
        if self.view.elem_type(data.name) == onnx.TensorProto.BOOL:
            if self.mask not in (None, data.name):
                return None
            self.mask = data.name
            return [Mask()]
        if self.x not in (None, data.name):
            return None
        self.x = data.name
        return [_leaf(self.x_atom)]

    @staticmethod
    def atom(kind: str, *args) -> Atom:
        return Atom(kind, args)

    def _Shape(self, node, a):
        return [ShapeOf()] if isinstance(a, Form) and not node.attribute else None

    def _ConstantOfShape(self, node, shape):
        """A constant of a form's shape: a scalar that broadcasts to it (ones_like(h) * h is h)."""
        value = attribute(node, "value")
        value = onnx.numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
        return [value.reshape(())] if isinstance(shape, ShapeOf) and value.dtype.kind == "f" else None

    def _Concat(self, node, *parts):
        if attribute(node, "axis") not in (1, -1) or not all(isinstance(p, Form) for p in parts):
            return None
        return [Joined(parts)]

    def _joined_matmul(self, node, joined: Joined, w: np.ndarray):
        """[a, b, ...] @ w = a @ w[rows of a] + b @ w[rows of b] + ...: the parts' widths from their matrices or
        the input's static width, one unknown width taken from what is left of w's rows."""
        x_width = _dim(self.view, self.x, 2) if self.x is not None else None
        if not isinstance(x_width, int) and self.x is not None:  # the declared width where no op fixes it
            shape = self.view.shape(self.x)
            x_width = shape[2] if shape is not None and len(shape) == 3 else None
        widths = [_form_width(p) or (x_width if _atom(p) is self.x_atom and isinstance(x_width, int) else None)
                  for p in joined.parts]
        if widths.count(None) > 1 or not isinstance(w, np.ndarray) or w.ndim != 2:
            return None
        if None in widths:
            widths[widths.index(None)] = w.shape[0] - sum(v for v in widths if v is not None)
        if min(widths) < 1 or sum(widths) != w.shape[0]:
            return None
        starts, total = np.cumsum([0, *widths]), Form({})
        for k, part in enumerate(joined.parts):
            product = self._MatMul(node, part, w[starts[k]:starts[k + 1]])
            if product is None or product[0] is None or (total := _add(total, product[0])) is None:
                return None
        return [total]

    def _MatMul(self, node, a, w):
        if isinstance(a, Joined):
            return self._joined_matmul(node, a, w)
        if not isinstance(a, Form) or not isinstance(w, np.ndarray) or w.ndim != 2:
            return None
        if self.dtype not in (None, w.dtype) or w.dtype.kind != "f":
            return None
        self.dtype, w = w.dtype, w.astype(np.float64)
        if any(_width(m) not in (None, w.shape[0]) for m in a.terms.values()) or (
                np.ndim(a.bias) and len(a.bias) != w.shape[0]):
            return None
        bias = a.bias @ w if np.ndim(a.bias) else a.bias * w.sum(0)
        return [Form({atom: m @ w if isinstance(m, np.ndarray) else m * w for atom, m in a.terms.items()}, bias)]

    def _Add(self, node, a, b, sign=1.0):
        if isinstance(a, Step) and isinstance(b, np.ndarray) and b.size == 1 and sign == 1.0:
            return [Step(a.offset + int(b.reshape(())))]
        a, b = (_constant_form(v) if isinstance(v, np.ndarray) else v for v in (a, b))
        if not isinstance(a, Form) or not isinstance(b, Form):
            return None
        return [_add(a, b, sign)]

    def _Sub(self, node, a, b):
        return self._Add(node, a, b, -1.0)

    def _Mul(self, node, a, b):
        if isinstance(b, Mask | np.ndarray):
            a, b = b, a
        if isinstance(a, Mask) and a.numeric and isinstance(b, Form):
            return [Form({}) if not b.terms and not np.any(b.bias) else _leaf(self.atom("gate", a.negated, b))]
        if isinstance(a, np.ndarray) and isinstance(b, Form):
            return [_scale(b, a)]
        if isinstance(a, Form) and isinstance(b, Form):
            return [_leaf(self.atom("mul", a, b))]
        return None

    def _Div(self, node, a, b):
        if isinstance(a, Form) and isinstance(b, np.ndarray) and b.size == 1 and float(b.reshape(())) != 0:
            return [_scale(a, 1.0 / float(b.reshape(())))]
        return None

    def _Where(self, node, condition, a, b):
        if not isinstance(condition, Mask) or condition.numeric:
            return None
        a, b = (_constant_form(v) if isinstance(v, np.ndarray) else v for v in (a, b))
        if not isinstance(a, Form) or not isinstance(b, Form):
            return None
        kept, other = self.atom("gate", condition.negated, a), self.atom("gate", not condition.negated, b)
        return [Form({kept: 1.0, other: 1.0})]

    def _Split(self, node, a, split=None):
        axis = attribute(node, "axis", 0)
        if not isinstance(a, Form) or axis not in (1, -1) or (width := _form_width(a)) is None:
            return None
        sizes = [int(s) for s in split] if split is not None else attribute(node, "split")
        count = len(node.output)
        if sizes is None:
            if width % count:
                return None
            sizes = [width // count] * count
        starts = np.cumsum([0, *sizes])
        return [_columns(a, int(starts[k]), int(starts[k + 1])) for k in range(count)]

    def _Slice(self, node, a, starts=None, ends=None, axes=None, steps=None):
        if not isinstance(a, Form) or any(v is not None and not isinstance(v, np.ndarray)
                                          for v in (starts, ends, axes, steps)):
            return None
        if starts is None:  # opset < 10: attributes
            starts, ends, axes = attribute(node, "starts"), attribute(node, "ends"), attribute(node, "axes")
        starts, ends = list(np.reshape(starts, -1)), list(np.reshape(ends, -1))
        axes = list(range(len(starts))) if axes is None else [int(v) % 2 for v in np.reshape(axes, -1)]
        if steps is not None and any(int(v) != 1 for v in np.reshape(steps, -1)):
            return None
        span = (0, np.iinfo(np.int64).max)
        for axis, start, end in zip(axes, starts, ends, strict=True):
            if axis == 1:
                span = (int(start), int(min(end, np.iinfo(np.int64).max)))
            elif int(start) != 0 or int(end) < 2 ** 31 - 1:  # rows: all of them
                return None
        return [_columns(a, *span)]

    def _Clip(self, node, a, low=None, high=None):
        if not isinstance(a, Form):
            return None
        low = attribute(node, "min") if low is None and node.input[1:2] in ([], [""]) else low
        high = attribute(node, "max") if high is None and node.input[2:3] in ([], [""]) else high
        if low is None or high is None:
            return None
        return [_leaf(self.atom("clip", float(np.reshape(low, ())), float(np.reshape(high, ())), a))]

    def _Min(self, node, a, b, bound=1):
        """Min / Max of a form and a scalar: a Clip with one bound (tf_keras' hard_sigmoid is Max(Min(., 1), 0))."""
        if isinstance(a, np.ndarray):
            a, b = b, a
        if len(node.input) != 2 or not isinstance(a, Form) or not isinstance(b, np.ndarray) or b.size != 1:
            return None
        limits, value = [-np.inf, np.inf], float(b.reshape(()))
        atom = _atom(a)
        if atom is not None and atom.kind == "clip":  # the second bound of a clip
            limits, a = [atom.args[0], atom.args[1]], atom.args[2]
        limits[bound] = value if np.isinf(limits[bound]) else (min, max)[1 - bound](limits[bound], value)
        return [_leaf(self.atom("clip", *limits, a))]

    def _Max(self, node, a, b):
        return self._Min(node, a, b, bound=0)

    def _Less(self, node, a, b):
        return [Less(a, b)]

    def _And(self, node, a, b):
        terms = [t for v in (a, b) for t in (v if isinstance(v, tuple) else (v,))]
        return [tuple(terms)] if all(isinstance(t, Less) for t in terms) else None

    def activation(self, node, a):
        if not isinstance(a, Form):
            return None
        params = [float(attribute(node, name, default)) for name, default in _ACTIVATIONS[node.op_type]]
        return [_leaf(self.atom("act", node.op_type, *[*params, 0.0, 0.0][:2], a))]


for _name in _ACTIVATIONS:
    setattr(_Evaluator, f"_{_name}", _Evaluator.activation)


# ---------------------------------------------------------------------------------------------------------------
# The cell equations over forms


def _single(f: Form) -> tuple[Atom, np.ndarray | float] | None:
    """The atom and matrix of a form with one term and no bias."""
    if len(f.terms) != 1 or np.any(f.bias):
        return None
    return next(iter(f.terms.items()))


def _atom(f: Form) -> Atom | None:
    single = _single(f)
    return single[0] if single is not None and isinstance(single[1], float) and single[1] == 1.0 else None


def _activated(f: Form) -> tuple[tuple, Form] | None:
    """f as activation(form): ((ONNX name, alpha, beta), form). s * Clip(form, 0, 1 / s) is HardSigmoid(s, 0)
    (Keras 3 writes hard_sigmoid as relu6(x + 3) / 6)."""
    single = _single(f)
    if single is None or not isinstance(single[1], float):
        return None
    atom, s = single
    if atom.kind == "act" and s == 1.0:
        return atom.args[:3], atom.args[3]
    if atom.kind == "clip" and atom.args[0] == 0.0 and s > 0 and abs(s * atom.args[1] - 1.0) < 1e-6:
        return ("HardSigmoid", s, 0.0), atom.args[2]
    return None


def _same(a: Form, b: Form) -> bool:
    if a is b:
        return True
    if a.terms.keys() != b.terms.keys() or not np.array_equal(np.asarray(a.bias), np.asarray(b.bias)):
        return False
    return all(type(m) is type(b.terms[k]) and np.array_equal(m, b.terms[k]) for k, m in a.terms.items())


def _products(f: Form) -> list[tuple[Form, Form]] | None:
    """f as a sum of products of two forms (each with matrix 1, no bias)."""
    if np.any(f.bias) or not all(isinstance(m, float) and m == 1.0 for m in f.terms.values()):
        return None
    if not all(atom.kind == "mul" for atom in f.terms):
        return None
    return [atom.args for atom in f.terms]


def _factor(product: tuple[Form, Form], atom: Atom) -> Form | None:
    """The other factor of a product one of whose factors is exactly ``atom``."""
    a, b = product
    return b if _atom(a) is atom else a if _atom(b) is atom else None


@dataclass
class _Cell:
    op_type: str  # LSTM, GRU, RNN
    gates: list[Form]  # affine in x and h, in ONNX gate order (LSTM iofc, GRU zrh, RNN one)
    activations: list[tuple]  # ONNX (name, alpha, beta): f, g, h
    h: int  # the state index of h (and of c for LSTM)
    c: int | None = None
    linear_before_reset: int = 0
    recurrent_bias: np.ndarray | None = None  # GRU with linear_before_reset: Rb of the h gate
    reset_h: Form | None = None  # GRU with linear_before_reset: the h gate's recurrent form
    c_new: Form | None = None  # LSTM: c's new value (the o gate's peephole reads it)


def _lstm(states: dict[int, Atom], new: dict[int, Form]) -> _Cell | None:
    for h, c in ((a, b) for a in states for b in states if a != b):
        products = _products(new[c])
        if products is None or len(products) != 2:
            continue
        forget = [(p, _factor(p, states[c])) for p in products if _factor(p, states[c]) is not None]
        if len(forget) != 1:
            continue
        f, (i, g) = forget[0][1], next(p for p in products if p is not forget[0][0])
        out = _products(new[h])
        if out is None or len(out) != 1:
            continue
        parts = [_activated(v) for v in (f, i, g, *out[0])]
        if any(p is None for p in parts):
            continue
        f_act, i_act, g_act, o_act, h_act = parts
        if i_act[0] != f_act[0] and g_act[0] == f_act[0]:
            i_act, g_act = g_act, i_act  # i * g: the gate is the factor with the gates' activation
        if not _same(h_act[1], new[c]):
            o_act, h_act = h_act, o_act
        if not _same(h_act[1], new[c]) or not f_act[0] == i_act[0] == o_act[0]:
            continue
        return _Cell("LSTM", [i_act[1], o_act[1], f_act[1], g_act[1]], [f_act[0], g_act[0], h_act[0]], h, c,
                     c_new=new[c])
    return None


def _one_state(states: dict[int, Atom]) -> tuple[int, Atom] | None:
    """(index, atom) of the only state (a GRU's or an RNN's h), else None."""
    return next(iter(states.items())) if len(states) == 1 else None


def _gru(states: dict[int, Atom], new: dict[int, Form]) -> _Cell | None:
    if _one_state(states) is None:
        return None
    h, state = _one_state(states)
    for z_form, candidate in _interpolations(new[h], state):
        update, hidden = _activated(z_form), _activated(candidate)
        if update is None or hidden is None:
            continue
        cell = _reset(state, update, hidden)
        if cell is not None:
            cell.h = h
            return cell
    return None


def _interpolations(f: Form, state: Atom) -> list[tuple[Form, Form]]:
    """(z, candidate) for each way ``f`` is a GRU's new h between them: (1 - z) * n + z * h, or n + z * (h - n) as
    torch's GRUCell writes it (the same value up to rounding, as any two spellings of the cell are)."""
    products = _products(f)
    if products is not None and len(products) == 2:
        kept = [p for p in products if _factor(p, state) is not None]
        if len(kept) != 1:
            return []
        z_form = _factor(kept[0], state)
        z = _single(z_form)
        if z is None or not isinstance(z[1], float):
            return []
        a, b = next(p for p in products if p is not kept[0])
        return [(z_form, candidate) for one_minus_z, candidate in ((a, b), (b, a))
                if one_minus_z.terms == {z[0]: -z[1]} and isinstance(one_minus_z.bias, float)
                and one_minus_z.bias == 1.0]
    if np.any(f.bias) or len(f.terms) != 2 or not all(isinstance(m, float) and m == 1.0 for m in f.terms.values()):
        return []
    found = []
    for product, n in ((a, b) for a in f.terms for b in f.terms if a is not b and a.kind == "mul"):
        difference = Form({state: 1.0, n: -1.0})  # h - n
        found += [(z_form, _leaf(n)) for z_form, other in (product.args, product.args[::-1])
                  if _same(other, difference)]
    return found


def _reset(state: Atom, update: tuple, hidden: tuple) -> _Cell | None:
    """The h gate of a GRU: g(x Wh + (r * h) Rh + b) or, linear before reset, g(x Wh + bw + r * (h Rh + br))."""
    # the reset is the product with a factor in h alone; other products are inputs (a MultiRNNCell's previous cell's
    # o * tanh(c)), which _weights accepts only as the cell's x
    (g_act, form), resets = hidden, [a for a in hidden[1].terms if a.kind == "mul" and any(
        f.terms and all(t is state for t in f.terms) for f in a.args)]
    if len(resets) != 1:
        return None
    product = resets[0].args
    rest = Form({a: m for a, m in form.terms.items() if a is not resets[0]}, form.bias)
    if state in rest.terms:  # h read outside the reset: not a GRU
        return None
    other = _factor(product, state)
    if other is not None and _activated(other) is not None:  # (r * h) Rh: reset before the product
        r_act, r_form = _activated(other)
        h_gate = _add(rest, Form({state: form.terms[resets[0]]}))
        return _Cell("GRU", [update[1], r_form, h_gate], [update[0], g_act], 0) if r_act == update[0] else None
    if not (isinstance(form.terms[resets[0]], float) and form.terms[resets[0]] == 1.0):  # r * (h Rh + br) as is
        return None
    for r, linear in (product, product[::-1]):
        reset = _activated(r)
        if reset is not None and reset[0] == update[0] and all(a is state for a in linear.terms):
            return _Cell("GRU", [update[1], reset[1], rest], [update[0], g_act], 0, linear_before_reset=1,
                         recurrent_bias=np.asarray(linear.bias), reset_h=linear)
    return None


def _rnn(states: dict[int, Atom], new: dict[int, Form]) -> _Cell | None:
    if _one_state(states) is None:
        return None
    h, _ = _one_state(states)
    activated = _activated(new[h])
    if activated is None:  # no activation (Keras activation=None): Affine(1, 0)
        return _Cell("RNN", [new[h]], [("Affine", 1.0, 0.0)], h)
    return _Cell("RNN", [activated[1]], [activated[0]], h)


def _diagonal(m: np.ndarray | float, hidden: int) -> np.ndarray | None:
    m = _dense(m, hidden)
    return np.diag(m).copy() if m.shape == (hidden, hidden) and not np.any(m - np.diag(np.diag(m))) else None


def _peepholes(cell: _Cell, states: dict[int, Atom], hidden: int) -> tuple[list[Form], np.ndarray | None] | None:
    """An LSTM's peephole terms (ONNX P [1, 3H], gates i, o, f): i and f read the old c, o the new c, each through a
    diagonal matrix. Returns the gates without those terms, and P (None where every peephole is zero)."""
    if cell.op_type != "LSTM":
        return cell.gates, None
    reads = ([states[cell.c]], list(cell.c_new.terms), [states[cell.c]], [])  # what gate i, o, f, c may read
    gates, p = [], []
    for gate, atoms in zip(cell.gates, reads, strict=True):
        present = [a for a in atoms if a in gate.terms]
        if present and len(present) != len(atoms):  # the o gate reads all of the new c or none of it
            return None
        diagonals = [_diagonal(gate.terms[a], hidden) for a in present]
        if any(d is None or not np.array_equal(d, diagonals[0]) for d in diagonals):
            return None
        p.append(diagonals[0] if diagonals else np.zeros(hidden))
        gates.append(Form({a: m for a, m in gate.terms.items() if a not in present}, gate.bias))
    P = np.concatenate(p[:3])[None]
    return gates, P if P.any() else None


def _weights(cell: _Cell, x: Atom, states: dict[int, Atom]) -> tuple | None:
    """W [1, gH, I], R [1, gH, H], B [1, 2gH], hidden and P [1, 3H] (LSTM peepholes, else None) of the cell, when
    every gate is affine in x and h (and an LSTM's in c through diagonal peepholes)."""
    h_atom = states[cell.h]
    hidden = {_form_width(g) for g in cell.gates + ([cell.reset_h] if cell.reset_h is not None else [])} - {None}
    if len(hidden) != 1:
        return None
    hidden = hidden.pop()
    peepholes = _peepholes(cell, states, hidden)
    if peepholes is None:
        return None
    gate_forms, P = peepholes
    gates = gate_forms + ([cell.reset_h] if cell.reset_h is not None else [])
    if any(set(g.terms) - {x, h_atom} for g in gates):
        return None
    inputs = {m.shape[0] for g in gates for a, m in g.terms.items() if a is x and isinstance(m, np.ndarray)}
    if len(inputs) != 1:
        return None
    size = inputs.pop()

    def matrix(gate: Form, atom: Atom, rows: int) -> np.ndarray:
        m = gate.terms.get(atom, np.zeros((rows, hidden)))
        m = _dense(m, hidden)
        return m if m.shape == (rows, hidden) else None

    ws = [matrix(g, x, size) for g in gate_forms]
    rs = [matrix(g, h_atom, hidden) for g in gate_forms]
    if cell.reset_h is not None:
        rs[-1] = matrix(cell.reset_h, h_atom, hidden)
    if any(m is None for m in ws + rs):
        return None
    biases = [np.broadcast_to(np.asarray(g.bias, dtype=np.float64), (hidden,)) for g in gate_forms]
    recurrent = [np.zeros(hidden)] * len(gate_forms)
    if cell.reset_h is not None:
        recurrent[-1] = np.broadcast_to(cell.recurrent_bias, (hidden,))
    W = np.concatenate([m.T for m in ws])[None]
    R = np.concatenate([m.T for m in rs])[None]
    B = np.concatenate(biases + recurrent)[None]
    return W, R, B, hidden, P
