"""The three recurrent cells as data, and the static configuration of one node.

A ``Cell`` is everything that differs between LSTM, GRU and RNN: gate letters in ONNX's and torch's order, whether
there is a cell state, the default activations, the per-step equations (one functional ``step``, which autograd
differentiates and the Python inference path runs as is) and when a torch kernel (nn.LSTM / nn.GRU / nn.RNN)
computes the same numbers. The native kernel has its own fused gate loops (kernel/), dispatched on ``op_type``.

``RecurrentConfig`` is the static description of one node, built once from its ONNX attributes (and refused there
with ``InvalidAttribute`` when a value cannot be honoured). ``encode`` writes it, together with the cell and the
weights' format, as the one string the recurrent op carries (see op.py for the format); ``decode`` reads it back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import Tensor

DIRECTIONS = ("forward", "reverse", "bidirectional")
OUTPUT_NAMES = ("Y", "Y_h", "Y_c")
MASK_OUTPUTS = ("zero", "hold")  # a masked step's Y: zeros, or the row's previous output (Keras' two modes)
STATE_DTYPES = MappingProxyType({"float16": torch.float16, "bfloat16": torch.bfloat16})


class InvalidAttribute(ValueError):
    """An attribute value the module refuses; the converter turns it into UnsupportedAttributeError for the node."""

    def __init__(self, attribute: str, value, reason: str):
        super().__init__(f"{attribute}={value!r}: {reason}")
        self.attribute, self.value, self.reason = attribute, value, reason


# name -> (onnxruntime's defaults for the parameters it consumes: none, alpha, or alpha and beta; function).
# The defaults are onnxruntime's (rnn_helpers.cc): LeakyRelu 0.01, HardSigmoid 0.2/0.5, Elu 1.0, others 0 (the spec
# says "as the ONNX operator", which would give Affine and ThresholdedRelu alpha 1.0; onnxruntime uses 0).
ACTIVATIONS: Mapping[str, tuple[tuple[float, ...], Callable[[Tensor, float, float], Tensor]]] = MappingProxyType({
    "Relu": ((), lambda x, a, b: torch.relu(x)),
    "Tanh": ((), lambda x, a, b: torch.tanh(x)),
    "Sigmoid": ((), lambda x, a, b: torch.sigmoid(x)),
    "Affine": ((0.0, 0.0), lambda x, a, b: a * x + b),
    "LeakyRelu": ((0.01,), lambda x, a, b: F.leaky_relu(x, a)),
    "ThresholdedRelu": ((0.0,), lambda x, a, b: F.threshold(x, a, 0.0)),  # x if x > alpha else 0
    "ScaledTanh": ((0.0, 0.0), lambda x, a, b: a * torch.tanh(b * x)),
    "HardSigmoid": ((0.2, 0.5), lambda x, a, b: torch.clamp(a * x + b, 0.0, 1.0)),  # free slope: not F.hardsigmoid
    "Elu": ((1.0,), lambda x, a, b: F.elu(x, a)),
    "Softsign": ((), lambda x, a, b: F.softsign(x)),
    # The literal formula, as onnxruntime computes it: inf where exp overflows (x > 88.7 in float32), where
    # F.softplus would return x.
    "Softplus": ((), lambda x, a, b: torch.log(torch.exp(x) + 1)),
})


@dataclass(frozen=True)
class Activation:
    name: str
    alpha: float | None = None
    beta: float | None = None

    def __call__(self, x: Tensor) -> Tensor:
        return ACTIVATIONS[self.name][1](x, self.alpha, self.beta)

    def __repr__(self) -> str:
        params = [f"{p:g}" for p in (self.alpha, self.beta) if p is not None]
        return self.name + (f"({', '.join(params)})" if params else "")


def parse_activations(names: Sequence[str], alpha: Sequence[float], beta: Sequence[float],
                      case_sensitive: bool) -> tuple[Activation, ...]:
    """Resolve activation names; alpha/beta are consumed in list order, across directions, only by the functions
    that take them, and missing values take onnxruntime's defaults."""
    canonical = {name if case_sensitive else name.lower(): name for name in ACTIVATIONS}
    alpha, beta = list(alpha), list(beta)
    result = []
    for given in names:
        name = canonical.get(given if case_sensitive else given.lower())
        if name is None:
            case = " (case-sensitive for RNN, like onnxruntime)" if case_sensitive else ""
            raise InvalidAttribute("activations", list(names),
                                   f"unknown activation {given!r}; expected one of {', '.join(ACTIVATIONS)}{case}")
        defaults = ACTIVATIONS[name][0]
        values = [(alpha, beta)[k].pop(0) if (alpha, beta)[k] else default for k, default in enumerate(defaults)]
        result.append(Activation(name, *values))
    return tuple(result)


@dataclass(frozen=True)
class RecurrentConfig:
    """Static description of one node: everything the numeric paths need besides tensors."""

    hidden_size: int | None
    direction: str
    layout: int
    activations: tuple[tuple[Activation, ...], ...]  # [role][direction], e.g. LSTM roles f, g, h
    clip: float | None
    input_forget: bool = False
    linear_before_reset: bool = False
    outputs: tuple[bool, bool, bool] = (True, True, True)  # which of Y, Y_h, Y_c to compute
    mask_output: str | None = None  # None: the node takes no mask; else what a masked step outputs (MASK_OUTPUTS)
    # None: the states stay in the compute dtype (float32 for float16 X: onnxruntime's LSTM/GRU/RNN); else
    # (STATE_DTYPES) they are rounded to it after every step, as a Loop carries them in onnxruntime (runtime.py)
    state_dtype: str | None = None

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def reversed_directions(self) -> tuple[bool, ...]:
        return {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}[self.direction]

    def onnx_activations(self) -> list[Activation]:
        """The activations in ONNX's attribute order: per direction, one per role."""
        return [role[d] for d in range(self.num_directions) for role in self.activations]


def make_config(cell: Cell, *, hidden_size: int | None = None, direction: str = "forward", layout: int = 0,
                activations: Sequence[str] | None = None, activation_alpha: Sequence[float] | None = None,
                activation_beta: Sequence[float] | None = None, clip: float | None = None, input_forget: int = 0,
                linear_before_reset: int = 0, outputs: Sequence[bool] | None = None,
                mask_output: str | None = None, state_dtype: str | None = None) -> RecurrentConfig:
    """The config of a node from its ONNX attributes, with onnxruntime's rules; InvalidAttribute for what cannot be
    honoured. ``outputs``: which of the node's outputs to compute (default: all of them)."""
    if direction not in DIRECTIONS:
        raise InvalidAttribute("direction", direction, f"must be one of {', '.join(DIRECTIONS)}")
    if layout not in (0, 1):
        raise InvalidAttribute("layout", layout, "must be 0 or 1")
    directions = 2 if direction == "bidirectional" else 1
    per_direction = len(cell.default_activations)
    names = list(activations or cell.default_activations * directions)
    if cell.op_type == "RNN" and directions == 1 and len(names) == 2:
        names = names[:1]  # the schema default is [Tanh, Tanh] for either direction: onnxruntime uses the first
    if len(names) != per_direction * directions:
        raise InvalidAttribute("activations", names, f"{cell.op_type} with direction={direction} needs "
                               f"{per_direction * directions} activation functions")
    # onnxruntime: LSTM/GRU names are case-insensitive, RNN names case-sensitive.
    acts = parse_activations(names, activation_alpha or [], activation_beta or [], case_sensitive=cell.op_type == "RNN")
    roles = tuple(tuple(acts[d * per_direction + k] for d in range(directions)) for k in range(per_direction))
    if clip is not None and clip <= 0:
        if cell.op_type != "RNN":
            raise InvalidAttribute("clip", clip, "must be > 0 (onnxruntime rejects it too)")
        if clip < 0:  # onnxruntime's RNN kernel treats a negative clip as "no clip" (and clip=0 as clamp to 0)
            clip = None
    if (input_forget and cell.op_type != "LSTM") or (linear_before_reset and cell.op_type != "GRU"):
        raise InvalidAttribute("input_forget" if input_forget else "linear_before_reset", 1,
                               f"not an attribute of {cell.op_type}")
    outputs = [True] * cell.num_outputs if outputs is None else outputs
    if len(outputs) > cell.num_outputs:
        raise ValueError(f"{cell.op_type} has at most {cell.num_outputs} outputs")
    if mask_output is not None and mask_output not in MASK_OUTPUTS:
        raise InvalidAttribute("mask_output", mask_output, f"must be one of {', '.join(MASK_OUTPUTS)}")
    if state_dtype is not None and state_dtype not in STATE_DTYPES:
        raise InvalidAttribute("state_dtype", state_dtype, f"must be one of {', '.join(STATE_DTYPES)}")
    outputs = tuple(bool(o) for o in outputs) + (False,) * (3 - len(outputs))
    return RecurrentConfig(hidden_size, direction, int(layout), roles, None if clip is None else float(clip),
                           bool(input_forget), bool(linear_before_reset), outputs, mask_output, state_dtype)


# ---------------------------------------------------------------------------------------------------------------
# The per-step equations. x: X·Wᵀ + the biases folded into the projection, for this step, [D, N, gH] in ONNX gate
# order; h, c: [D, N, H]; rt: Rᵀ [D, H, gH]; inner: recurrent bias kept
# inside the step [D, 1, gH] or None; p: peepholes [D, 1, 3H] (i, o, f) or None.

def _activate(acts: tuple[Activation, ...], x: Tensor) -> Tensor:
    """Apply one activation per direction (x is [D, ...])."""
    if all(a == acts[0] for a in acts):
        return acts[0](x)
    return torch.stack([act(x[d]) for d, act in enumerate(acts)])


def _clip(cfg: RecurrentConfig, x: Tensor) -> Tensor:
    return x if cfg.clip is None else x.clamp(-cfg.clip, cfg.clip)


def lstm_step(cfg, x, h, c, rt, inner, p):
    f_act, g_act, h_act = cfg.activations
    i, o, f, g = torch.baddbmm(x, h, rt).chunk(4, -1)
    if p is not None:  # onnxruntime clips after adding the peephole term
        p_i, p_o, p_f = p.chunk(3, -1)
        i, f = i + p_i * c, f + p_f * c
    i = _activate(f_act, _clip(cfg, i))
    f = 1 - i if cfg.input_forget else _activate(f_act, _clip(cfg, f))
    c = f * c + i * _activate(g_act, _clip(cfg, g))  # C itself is not clipped
    if p is not None:
        o = o + p_o * c
    return _activate(f_act, _clip(cfg, o)) * _activate(h_act, c), c


def gru_step(cfg, x, h, c, rt, inner, p):
    f_act, g_act = cfg.activations
    x_z, x_r, x_h = x.chunk(3, -1)
    size = h.shape[-1]
    if cfg.linear_before_reset:  # h~ = g(XWh + r * (H·Rhᵀ + Rbh) + Wbh); Rbh is in `inner`
        h_z, h_r, h_h = (torch.bmm(h, rt) if inner is None else torch.baddbmm(inner, h, rt)).chunk(3, -1)
        z = _activate(f_act, _clip(cfg, x_z + h_z))
        r = _activate(f_act, _clip(cfg, x_r + h_r))
        candidate = x_h + r * h_h
    else:  # h~ = g(XWh + (r * H)·Rhᵀ + Rbh + Wbh)
        h_z, h_r = torch.bmm(h, rt[..., : 2 * size]).chunk(2, -1)
        z = _activate(f_act, _clip(cfg, x_z + h_z))
        r = _activate(f_act, _clip(cfg, x_r + h_r))
        candidate = torch.baddbmm(x_h, r * h, rt[..., 2 * size:])
    candidate = _activate(g_act, _clip(cfg, candidate))
    if candidate.dtype != h.dtype:  # autocast: h~ and z come from low-precision products, H stays float32
        candidate, z = candidate.to(h.dtype), z.to(h.dtype)
    return torch.lerp(candidate, h, z), None  # (1 - z) * h~ + z * H


def rnn_step(cfg, x, h, c, rt, inner, p):
    return _activate(cfg.activations[0], _clip(cfg, torch.baddbmm(x, h, rt))), None


# ---------------------------------------------------------------------------------------------------------------
# When torch's own kernels compute exactly the ONNX numbers (the fast path).

def _defaults(cfg: RecurrentConfig, names: Sequence[str]) -> bool:
    return cfg.activations == tuple((Activation(n),) * cfg.num_directions for n in names)


def _lstm_mode(cfg: RecurrentConfig) -> str | None:
    exact = _defaults(cfg, ("Sigmoid", "Tanh", "Tanh")) and cfg.clip is None and not cfg.input_forget
    return "LSTM" if exact else None


def _gru_mode(cfg: RecurrentConfig) -> str | None:
    exact = _defaults(cfg, ("Sigmoid", "Tanh")) and cfg.clip is None and cfg.linear_before_reset
    return "GRU" if exact else None


def _rnn_mode(cfg: RecurrentConfig) -> str | None:
    acts = set(cfg.activations[0])
    if cfg.clip is not None or len(acts) != 1 or acts.pop().name not in ("Tanh", "Relu"):
        return None
    return "RNN_TANH" if cfg.activations[0][0].name == "Tanh" else "RNN_RELU"


@dataclass(frozen=True)
class Cell:
    op_type: str
    onnx_gates: str  # gate order of W, R and B in ONNX
    torch_gates: str  # gate order of the torch module's weights (same letters)
    has_cell_state: bool
    default_activations: tuple[str, ...]  # per direction
    step: Callable
    torch_mode: Callable[[RecurrentConfig], str | None]  # the torch kernel that is exact for a config, if any
    inner_bias_gates: Callable[[RecurrentConfig], str] = lambda cfg: ""  # gates whose Rb stays inside the step

    @property
    def gates(self) -> int:
        return len(self.onnx_gates)

    @property
    def num_outputs(self) -> int:
        return 3 if self.has_cell_state else 2

    def torch_order(self) -> list[int]:
        """For each torch gate, the index of its block in the ONNX order."""
        return [self.onnx_gates.index(g) for g in self.torch_gates]


LSTM_CELL = Cell("LSTM", "iofc", "ifco", True, ("Sigmoid", "Tanh", "Tanh"), lstm_step, _lstm_mode)
GRU_CELL = Cell("GRU", "zrh", "rzh", False, ("Sigmoid", "Tanh"), gru_step, _gru_mode,
                lambda cfg: "h" if cfg.linear_before_reset else "")
RNN_CELL = Cell("RNN", "h", "h", False, ("Tanh",), rnn_step, _rnn_mode)
CELLS = MappingProxyType({cell.op_type: cell for cell in (LSTM_CELL, GRU_CELL, RNN_CELL)})


# ---------------------------------------------------------------------------------------------------------------
# The op's config string (format documented in op.py).

def encode(cell: Cell, cfg: RecurrentConfig, weights: str) -> str:
    """``weights``: "torch" (flat nn.LSTM/GRU/RNN weights) or the letters of the ONNX weights present ("WRBP")."""
    acts = ",".join(":".join([a.name, *(repr(v) for v in (a.alpha, a.beta) if v is not None)])
                    for a in cfg.onnx_activations())
    fields = {"cell": cell.op_type, "hidden_size": cfg.hidden_size or "", "direction": cfg.direction,
              "layout": cfg.layout, "activations": acts,
              "clip": "" if cfg.clip is None else repr(cfg.clip), "input_forget": int(cfg.input_forget),
              "linear_before_reset": int(cfg.linear_before_reset),
              "outputs": "".join(str(int(o)) for o in cfg.outputs), "weights": weights,
              "mask_output": cfg.mask_output or ""}
    if cfg.state_dtype:  # only then: the native kernel, which never runs such a config, keeps its format
        fields["state_dtype"] = cfg.state_dtype
    return ";".join(f"{key}={value}" for key, value in fields.items())


@functools.cache
def decode(key: str) -> tuple[Cell, RecurrentConfig, str]:
    """(cell, config, weights format) of an op config string; one parse per distinct string."""
    fields = dict(item.split("=", 1) for item in key.split(";"))
    cell = CELLS[fields["cell"]]
    acts = [Activation(name, *(float(v) for v in params))
            for name, *params in (a.split(":") for a in fields["activations"].split(","))]
    per = len(cell.default_activations)
    directions = len(acts) // per
    roles = tuple(tuple(acts[d * per + k] for d in range(directions)) for k in range(per))
    hidden = int(fields["hidden_size"]) if fields.get("hidden_size") else None  # absent in older saved programs
    cfg = RecurrentConfig(hidden, fields["direction"], int(fields["layout"]), roles,
                          float(fields["clip"]) if fields["clip"] else None, fields["input_forget"] == "1",
                          fields["linear_before_reset"] == "1", tuple(o == "1" for o in fields["outputs"]),
                          fields["mask_output"] or None, fields.get("state_dtype"))
    return cell, cfg, fields["weights"]
