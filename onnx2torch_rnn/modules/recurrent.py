"""ONNX LSTM, GRU and RNN as torch modules: one recurrent skeleton, three small cell descriptions.

The skeleton (``recurrent``) does everything the three ops share: layout, dtype, sequence_lens, initial states,
directions and the ONNX output shapes. A ``Cell`` says what differs: gate count and order, whether there is a cell
state, the default activations, the per-step function and when ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` compute the
same numbers.

Two numeric cores, both functions of explicit tensors and a static ``RecurrentConfig``:
- ``_torch_core``: torch's fused kernels (``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``, ``torch.rnn_relu``) on the
  weights of a real ``nn.LSTM``/``nn.GRU``/``nn.RNN`` submodule, reordered once at conversion. With sequence_lens,
  ``pack_padded_sequence`` stops each row at its length and runs the reverse direction over each row's own length,
  exactly as onnxruntime does; one direction without Y_c runs padded instead (exact there, and faster).
- ``_exact_core``: an own cell loop for everything else. X·Wᵀ + Wb for all steps and both directions is one batched
  matmul; only H·Rᵀ runs per step, both directions at once. sequence_lens freezes the state of finished rows.

onnxruntime is the reference throughout; where it departs from the written spec we follow it (see ``ACTIVATIONS``,
the clip notes and ``recurrent``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

DIRECTIONS = ("forward", "reverse", "bidirectional")
OUTPUT_NAMES = ("Y", "Y_h", "Y_c")


class InvalidAttribute(ValueError):
    """An attribute value the module refuses; the converter turns it into UnsupportedAttributeError for the node."""

    def __init__(self, attribute: str, value, reason: str):
        super().__init__(f"{attribute}={value!r}: {reason}")
        self.attribute, self.value, self.reason = attribute, value, reason


# name -> (onnxruntime's defaults for the parameters it consumes: none, alpha, or alpha and beta; function).
# The defaults are onnxruntime's (rnn_helpers.cc): LeakyRelu 0.01, HardSigmoid 0.2/0.5, Elu 1.0, others 0 (the spec
# says "as the ONNX operator", which would give Affine and ThresholdedRelu alpha 1.0; onnxruntime uses 0).
ACTIVATIONS: dict[str, tuple[tuple[float, ...], Callable[[Tensor, float, float], Tensor]]] = {
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
}


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
    """Static description of one node: everything the numeric cores need besides tensors."""

    hidden_size: int | None
    direction: str
    layout: int
    activations: tuple[tuple[Activation, ...], ...]  # [role][direction], e.g. LSTM roles f, g, h
    clip: float | None
    input_forget: bool = False
    linear_before_reset: bool = False
    outputs: tuple[bool, bool, bool] = (True, True, True)  # which of Y, Y_h, Y_c to compute

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def reversed_directions(self) -> tuple[bool, ...]:
        return {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}[self.direction]


# ---------------------------------------------------------------------------------------------------------------
# Cells: the per-step functions. x: X·Wᵀ + biases for this step [D, N, gH] in ONNX gate order; h, c: [D, N, H];
# rt: Rᵀ [D, H, gH]; inner: recurrent bias kept inside the step [D, 1, gH] or None; p: peepholes [D, 1, 3H] or None.

def _activate(acts: tuple[Activation, ...], x: Tensor) -> Tensor:
    """Apply one activation per direction (x is [D, ...])."""
    if all(a == acts[0] for a in acts):
        return acts[0](x)
    return torch.stack([act(x[d]) for d, act in enumerate(acts)])


def _clip(cfg: RecurrentConfig, x: Tensor) -> Tensor:
    return x if cfg.clip is None else x.clamp(-cfg.clip, cfg.clip)


def _lstm_step(cfg, x, h, c, rt, inner, p):
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


def _gru_step(cfg, x, h, c, rt, inner, p):
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
    return torch.lerp(candidate, h, z), None  # (1 - z) * h~ + z * H


def _rnn_step(cfg, x, h, c, rt, inner, p):
    return _activate(cfg.activations[0], _clip(cfg, torch.baddbmm(x, h, rt))), None


def _lstm_mode(cfg: RecurrentConfig) -> str | None:
    default = tuple((Activation(n),) * cfg.num_directions for n in ("Sigmoid", "Tanh", "Tanh"))
    return "LSTM" if cfg.activations == default and cfg.clip is None and not cfg.input_forget else None


def _gru_mode(cfg: RecurrentConfig) -> str | None:
    default = tuple((Activation(n),) * cfg.num_directions for n in ("Sigmoid", "Tanh"))
    return "GRU" if cfg.activations == default and cfg.clip is None and cfg.linear_before_reset else None


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

    def torch_order(self) -> list[int]:
        return [self.onnx_gates.index(g) for g in self.torch_gates]


LSTM_CELL = Cell("LSTM", "iofc", "ifco", True, ("Sigmoid", "Tanh", "Tanh"), _lstm_step, _lstm_mode)
GRU_CELL = Cell("GRU", "zrh", "rzh", False, ("Sigmoid", "Tanh"), _gru_step, _gru_mode,
                lambda cfg: "h" if cfg.linear_before_reset else "")
RNN_CELL = Cell("RNN", "h", "h", False, ("Tanh",), _rnn_step, _rnn_mode)

_TORCH_KERNELS = {"LSTM": torch.lstm, "GRU": torch.gru, "RNN_TANH": torch.rnn_tanh, "RNN_RELU": torch.rnn_relu}


# ---------------------------------------------------------------------------------------------------------------
# The skeleton.

def _reverse(x: Tensor, lens: Tensor | None) -> Tensor:
    """Reverse time (dim 0) of x [T, N, ...], each row over its own length; padding stays in place."""
    if lens is None:
        return x.flip(0)
    steps = torch.arange(x.shape[0], device=x.device)[:, None]
    index = torch.where(steps < lens, lens - 1 - steps, steps)  # [T, N]; its own inverse
    return x.gather(0, index.view(*index.shape, *(1,) * (x.dim() - 2)).expand_as(x))


def _lengths(sequence_lens: Tensor | Sequence[int] | None, steps: int, batch: int, device) -> Tensor | None:
    """sequence_lens as int64 on X's device, after onnxruntime's range check; None when every row is full."""
    if sequence_lens is None:
        return None
    if isinstance(sequence_lens, Tensor):
        lens = sequence_lens.to(device=device, dtype=torch.int64)
        bad = bool(((lens < 0) | (lens > steps)).any())  # the one data-dependent check
    else:  # static lengths baked in at conversion
        if all(length == steps for length in sequence_lens) and len(sequence_lens) == batch:
            return None
        lens = torch.tensor(sequence_lens, dtype=torch.int64, device=device)
        bad = any(length < 0 or length > steps for length in sequence_lens)
    if lens.shape != (batch,):
        raise ValueError(f"sequence_lens must have shape [{batch}] (the batch size), got {list(lens.shape)}")
    if bad:
        raise ValueError(f"sequence_lens values must lie in [0, {steps}] (the sequence length of X), "
                         f"got {lens.tolist()}")
    return lens


def _check_shape(name: str, tensor: Tensor | None, expected: tuple[int, ...]) -> None:
    if tensor is not None and tuple(tensor.shape) != expected:
        raise ValueError(f"{name} must have shape {list(expected)}, got {list(tensor.shape)}")


def recurrent(cell: Cell, cfg: RecurrentConfig, X: Tensor, W: Tensor | None, R: Tensor | None, B: Tensor | None = None,
              sequence_lens: Tensor | Sequence[int] | None = None, initial_h: Tensor | None = None,
              initial_c: Tensor | None = None, P: Tensor | None = None,
              torch_weights: Sequence[Tensor] | None = None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """One recurrent node: (Y, Y_h, Y_c) in the ONNX layout and X's dtype; outputs not asked for are None.

    With ``torch_weights`` (the flat weights of an nn.LSTM/GRU/RNN, already reordered) the torch kernel computes the
    recurrence, else the exact cell loop on the ONNX-layout W, R, B, P. float16/bfloat16 are computed in float32 and
    cast back, as onnxruntime would; float64 stays float64.
    """
    compute = torch.float64 if X.dtype == torch.float64 else torch.float32

    def prepare(t: Tensor | None, batch_major: bool = False) -> Tensor | None:
        if t is None:
            return None
        return (t.transpose(0, 1) if batch_major and cfg.layout else t).to(compute)

    x = prepare(X, batch_major=True)  # layout 0 from here on: [T, N, I]
    h0, c0 = prepare(initial_h, True), prepare(initial_c, True)
    steps, batch, input_size = x.shape
    directions = cfg.num_directions
    hidden = R.shape[-1] if torch_weights is None else torch_weights[1].shape[-1]
    if cfg.hidden_size is not None and hidden != cfg.hidden_size:
        raise ValueError(f"R has hidden size {hidden}, the hidden_size attribute says {cfg.hidden_size}")
    gh = cell.gates * hidden
    _check_shape("W", W, (directions, gh, input_size))
    _check_shape("R", R, (directions, gh, hidden))
    _check_shape("B", B, (directions, 2 * gh))
    _check_shape("P", P, (directions, 3 * hidden))
    for name, state in (("initial_h", h0), ("initial_c", c0)):
        _check_shape(name + " (as [num_directions, batch, hidden])", state, (directions, batch, hidden))
    lens = _lengths(sequence_lens, steps, batch, x.device)

    if torch_weights is not None:
        weights = [w.to(compute) for w in torch_weights]
        y, y_h, y_c = _torch_core(cell, cfg, x, weights, lens, h0, c0)
    else:
        y, y_h, y_c = _exact_core(cell, cfg, x, *(prepare(t) for t in (W, R, B, P)), lens, h0, c0)

    if lens is not None:  # Y is zero past each row's length; a row of length 0 ends in zero states (onnxruntime)
        if y is not None:
            valid = torch.arange(steps, device=x.device)[:, None] < lens
            y = torch.where(valid[:, None, :, None], y, 0.0)
        started = (lens > 0)[:, None]
        y_h, y_c = (None if s is None else torch.where(started, s, 0.0) for s in (y_h, y_c))
    if cfg.layout:  # [T, D, N, H] -> [N, T, D, H]; [D, N, H] -> [N, D, H]
        y = None if y is None else y.permute(2, 0, 1, 3)
        y_h, y_c = (None if s is None else s.transpose(0, 1) for s in (y_h, y_c))
    outputs = (y, y_h, y_c)
    return tuple(o.to(X.dtype) if o is not None and wanted else None
                 for o, wanted in zip(outputs, cfg.outputs, strict=True))


def _torch_core(cell, cfg, x, weights, lens, h0, c0):
    """torch's fused kernel; reverse-only runs forward on per-row reversed input. Returns Y [T, D, N, H], Y_h, Y_c.

    With sequence_lens, one direction and no Y_c wanted, the padded run is exact where it matters (rows are
    independent, Y past a row's length is zeroed by the caller, Y_h is read at the row's last step) and about twice
    as fast as packing on small shapes; otherwise pack_padded_sequence stops every row at its length.
    """
    mode = cell.torch_mode(cfg)
    steps, batch, _ = x.shape
    directions, hidden = cfg.num_directions, weights[1].shape[-1]
    bidirectional, reverse = directions == 2, cfg.direction == "reverse"
    has_bias = len(weights) == 4 * directions
    zeros = x.new_zeros(directions, batch, hidden)
    hx = [zeros if h0 is None else h0] + ([zeros if c0 is None else c0] if cell.has_cell_state else [])
    if reverse:
        x = _reverse(x, lens)
    kernel = _TORCH_KERNELS[mode]
    pack = lens is not None and (bidirectional or (cell.has_cell_state and cfg.outputs[2]))
    if not pack:
        y, *states = kernel(x, hx if cell.has_cell_state else hx[0], weights, has_bias, 1, 0.0, False,
                            bidirectional, False)
        if lens is not None:  # length 0 reads step 0 and is zeroed by the caller
            last = (lens - 1).clamp(min=0).view(1, batch, 1).expand(1, batch, hidden)
            states = [y.gather(0, last), None]
    else:  # length 0 is run as 1 and zeroed by the caller
        packed = pack_padded_sequence(x, lens.clamp(min=1).cpu(), enforce_sorted=False)
        hx = [s.index_select(1, packed.sorted_indices) for s in hx]
        data, *states = kernel(packed.data, packed.batch_sizes, hx if cell.has_cell_state else hx[0], weights,
                               has_bias, 1, 0.0, False, bidirectional)
        y = pad_packed_sequence(PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                                               packed.unsorted_indices), total_length=steps)[0]
        states = [s.index_select(1, packed.unsorted_indices) for s in states]
    y = y.view(steps, batch, directions, hidden).transpose(1, 2)
    if reverse:
        y = _reverse(y[:, 0], lens).unsqueeze(1)
    return y, states[0], states[1] if cell.has_cell_state else None


def _exact_core(cell, cfg, x, W, R, B, P, lens, h0, c0):
    """The own cell loop, both directions batched. Returns Y [T, D, N, H] (None if not asked for), Y_h, Y_c."""
    steps, batch, input_size = x.shape
    directions, hidden = W.shape[0], R.shape[-1]
    reversed_dirs = cfg.reversed_directions
    inputs = [_reverse(x, lens) if rev else x for rev in reversed_dirs]
    xs = inputs[0].unsqueeze(0) if directions == 1 else torch.stack(inputs)  # [D, T, N, I]
    xs = xs.reshape(directions, steps * batch, input_size)
    wt = W.transpose(1, 2)
    inner = None
    if B is None:
        projection = torch.bmm(xs, wt)
    else:  # fold Wb and Rb into the one big matmul, except the Rb blocks that must stay inside the step
        wb, rb = B.unsqueeze(1).chunk(2, -1)
        keep = cell.inner_bias_gates(cfg)
        if keep:
            inside = torch.tensor([g in keep for g in cell.onnx_gates], device=x.device).repeat_interleave(hidden)
            inner, rb = rb * inside, rb * ~inside
        projection = torch.baddbmm(wb + rb, xs, wt)
    projection = projection.view(directions, steps, batch, -1)

    rt = R.transpose(1, 2)
    p = None if P is None else P.unsqueeze(1)
    h = x.new_zeros(directions, batch, hidden) if h0 is None else h0
    c = (x.new_zeros(directions, batch, hidden) if c0 is None else c0) if cell.has_cell_state else None
    valid = None if lens is None else (torch.arange(steps, device=x.device)[:, None] < lens)[:, None, :, None]
    want_y = cfg.outputs[0]
    ys = []
    for t in range(steps):
        h_new, c_new = cell.step(cfg, projection[:, t], h, c, rt, inner, p)
        if valid is None:
            h, c = h_new, c_new
        else:  # finished rows keep their state (their Y is zeroed by the caller)
            h = torch.where(valid[t], h_new, h)
            c = None if c is None else torch.where(valid[t], c_new, c)
        if want_y:
            ys.append(h)
    y = None
    if want_y:
        y = torch.stack(ys) if ys else x.new_zeros(0, directions, batch, hidden)
        if any(reversed_dirs):
            y = torch.stack([_reverse(y[:, d], lens) if rev else y[:, d] for d, rev in enumerate(reversed_dirs)], 1)
    return y, h, c


# ---------------------------------------------------------------------------------------------------------------
# The modules.

class Recurrent(nn.Module):
    """Shared module for ONNX LSTM/GRU/RNN; subclasses only name their cell.

    ``__init__`` takes the ONNX attributes, the constant inputs (W, R, B, P as tensors; sequence_lens as ints) and
    which outputs to compute. Constant weights become parameters: of an ``nn.LSTM``/``nn.GRU``/``nn.RNN`` submodule
    (``rnn``) on the fast path, else ONNX-layout ``W``, ``R``, ``B``, ``P``. ``forward`` takes the node's inputs in
    ONNX order; a weight given at run time replaces the absent parameter.
    """

    cell: ClassVar[Cell]

    def __init__(self, *, hidden_size: int | None = None, direction: str = "forward", layout: int = 0,
                 activations: Sequence[str] | None = None, activation_alpha: Sequence[float] | None = None,
                 activation_beta: Sequence[float] | None = None, clip: float | None = None, input_forget: int = 0,
                 linear_before_reset: int = 0, outputs: Sequence[bool] = (True, True, True),
                 W: Tensor | None = None, R: Tensor | None = None, B: Tensor | None = None, P: Tensor | None = None,
                 sequence_lens: Sequence[int] | None = None, runtime_weights: Sequence[str] = (),
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = self._config(hidden_size, direction, layout, activations, activation_alpha, activation_beta,
                                   clip, input_forget, linear_before_reset, outputs)
        self.num_outputs = len(outputs)
        self.sequence_lens = None if sequence_lens is None else tuple(int(v) for v in sequence_lens)
        self.runtime_weights = tuple(runtime_weights)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        mode = self.cell.torch_mode(self.config)
        constant_weights = W is not None and R is not None and not {"B", "P"} & set(self.runtime_weights)
        self.fast = mode is not None and constant_weights and (P is None or not bool(P.any()))
        if self.fast:
            self.rnn = self._torch_module(mode, W.to(compute), R.to(compute), None if B is None else B.to(compute))
            W = R = B = P = None  # an all-zero P adds nothing
        for name, value in (("W", W), ("R", R), ("B", B), ("P", P)):
            self.register_parameter(name, None if value is None else nn.Parameter(value.to(compute)))

    def _config(self, hidden_size, direction, layout, activations, alpha, beta, clip, input_forget,
                linear_before_reset, outputs) -> RecurrentConfig:
        cell = self.cell
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
        acts = parse_activations(names, alpha or [], beta or [], case_sensitive=cell.op_type == "RNN")
        roles = tuple(tuple(acts[d * per_direction + k] for d in range(directions)) for k in range(per_direction))
        if clip is not None and clip <= 0:
            if cell.op_type != "RNN":
                raise InvalidAttribute("clip", clip, "must be > 0 (onnxruntime rejects it too)")
            if clip < 0:  # onnxruntime's RNN kernel treats a negative clip as "no clip" (and clip=0 as clamp to 0)
                clip = None
        if (input_forget and cell.op_type != "LSTM") or (linear_before_reset and cell.op_type != "GRU"):
            raise InvalidAttribute("input_forget" if input_forget else "linear_before_reset", 1,
                                   f"not an attribute of {cell.op_type}")
        if len(outputs) > (3 if cell.has_cell_state else 2):
            raise ValueError(f"{cell.op_type} has at most {3 if cell.has_cell_state else 2} outputs")
        outputs = tuple(bool(o) for o in outputs) + (False,) * (3 - len(outputs))
        return RecurrentConfig(hidden_size, direction, int(layout), roles, None if clip is None else float(clip),
                               bool(input_forget), bool(linear_before_reset), outputs)

    def _torch_module(self, mode: str, W: Tensor, R: Tensor, B: Tensor | None) -> nn.RNNBase:
        """The equivalent torch module, its weights taken from W, R, B reordered to torch's gate order once."""
        directions, _, input_size = W.shape
        hidden = R.shape[-1]
        kwargs = {"bias": B is not None, "bidirectional": directions == 2, "dtype": W.dtype}
        if mode == "LSTM":
            module = nn.LSTM(input_size, hidden, **kwargs)
        elif mode == "GRU":
            module = nn.GRU(input_size, hidden, **kwargs)
        else:
            module = nn.RNN(input_size, hidden, nonlinearity=mode.removeprefix("RNN_").lower(), **kwargs)
        order = self.cell.torch_order()

        def reorder(t: Tensor) -> Tensor:  # [gH, ...] in ONNX gate order -> torch gate order
            return t.unflatten(0, (len(order), hidden))[order].flatten(0, 1)

        with torch.no_grad():
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                getattr(module, f"weight_ih_l0{suffix}").copy_(reorder(W[d]))
                getattr(module, f"weight_hh_l0{suffix}").copy_(reorder(R[d]))
                if B is not None:
                    wb, rb = B[d].chunk(2)
                    getattr(module, f"bias_ih_l0{suffix}").copy_(reorder(wb))
                    getattr(module, f"bias_hh_l0{suffix}").copy_(reorder(rb))
        return module

    def forward(self, X: Tensor, W: Tensor | None = None, R: Tensor | None = None, B: Tensor | None = None,
                sequence_lens: Tensor | None = None, initial_h: Tensor | None = None,
                initial_c: Tensor | None = None, P: Tensor | None = None):
        lens = self.sequence_lens if sequence_lens is None else sequence_lens
        if self.fast:
            weights = [w for layer in self.rnn.all_weights for w in layer]
            outputs = recurrent(self.cell, self.config, X, None, None, None, lens, initial_h, initial_c, None,
                                torch_weights=weights)
        else:
            W, R, B, P = (given if own is None else own for own, given in
                          ((self.W, W), (self.R, R), (self.B, B), (self.P, P)))
            outputs = recurrent(self.cell, self.config, X, W, R, B, lens, initial_h, initial_c, P)
        outputs = outputs[: self.num_outputs]
        return outputs[0] if self.num_outputs == 1 else outputs

    def extra_repr(self) -> str:
        cfg = self.config
        per_direction = [", ".join(repr(role[d]) for role in cfg.activations) for d in range(cfg.num_directions)]
        parts = [f"hidden_size={cfg.hidden_size}", f"direction={cfg.direction!r}", f"layout={cfg.layout}",
                 f"activations=[{' | '.join(per_direction)}]"]
        if cfg.clip is not None:
            parts.append(f"clip={cfg.clip:g}")
        if self.cell.op_type == "LSTM":
            parts.append(f"input_forget={int(cfg.input_forget)}")
        if self.cell.op_type == "GRU":
            parts.append(f"linear_before_reset={int(cfg.linear_before_reset)}")
        if self.sequence_lens is not None:
            parts.append(f"sequence_lens={list(self.sequence_lens)}")
        if self.runtime_weights:
            parts.append(f"weights from inputs: {', '.join(self.runtime_weights)}")
        parts.append(f"outputs={[n for n, o in zip(OUTPUT_NAMES, cfg.outputs, strict=True) if o]}")
        parts.append(f"path={'fast' if self.fast else 'exact'}")
        return ", ".join(parts)


class OnnxLSTM(Recurrent):
    cell = LSTM_CELL


class OnnxGRU(Recurrent):
    cell = GRU_CELL


class OnnxRNN(Recurrent):
    cell = RNN_CELL
