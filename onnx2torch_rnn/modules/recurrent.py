"""ONNX LSTM, GRU and RNN as torch modules: one recurrent skeleton, three small cell descriptions.

The skeleton (``recurrent``) does everything the three ops share: layout, dtype, sequence_lens, initial states,
directions and the ONNX output shapes. A ``Cell`` says what differs: gate count and order, whether there is a cell
state, the default activations, the per-step function and when ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` compute the
same numbers.

Two numeric cores, both functions of explicit tensors and a static ``RecurrentConfig``:
- ``_torch_core``: torch's kernels on the weights of a real ``nn.LSTM``/``nn.GRU``/``nn.RNN`` submodule, reordered
  once at conversion. LSTM in float32 on CPU calls nn.LSTM's oneDNN kernel directly, per direction, without packing;
  otherwise ``torch.lstm``/``torch.gru``/``torch.rnn_*``, where ``pack_padded_sequence`` stops each row at its length
  and runs the reverse direction over each row's own length, exactly as onnxruntime does; one direction without Y_c
  runs padded instead (exact there, and faster).
- ``_exact_core``: an own cell loop for everything else. X·Wᵀ + Wb for all steps is one matmul per direction; only
  H·Rᵀ runs per step, both directions at once. Without autograd it runs ``_inference_core`` (preallocated buffers,
  views made once, ops writing in place: about twice as fast), with autograd the functional ``_*_step`` functions.
  sequence_lens: the inference loop runs rows padded to T and reads each row's final state at its own last step,
  the functional loop freezes the state of finished rows.

onnxruntime is the reference throughout; where it departs from the written spec we follow it (see ``ACTIVATIONS``,
the clip notes and ``recurrent``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .recurrent_op import FastWeights, config_key, traced_recurrent

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


_IN_PLACE = {"Relu": Tensor.relu_, "Tanh": Tensor.tanh_, "Sigmoid": Tensor.sigmoid_}
_WITH_OUT = {"Tanh": torch.tanh, "Sigmoid": torch.sigmoid}


@dataclass(frozen=True)
class Activation:
    name: str
    alpha: float | None = None
    beta: float | None = None

    def __call__(self, x: Tensor) -> Tensor:
        return ACTIVATIONS[self.name][1](x, self.alpha, self.beta)

    def apply_(self, x: Tensor) -> Tensor:
        """The activation written into x itself (a scratch buffer of the inference loops)."""
        in_place = _IN_PLACE.get(self.name)
        return in_place(x) if in_place is not None else x.copy_(self(x))

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


# ---------------------------------------------------------------------------------------------------------------
# Inference loops: the same cells without autograd, written for speed. At small sizes a torch op costs more than
# its arithmetic (about a microsecond of dispatch, and as much for every view), so: every buffer is allocated once
# per call, every per-step view is made in one unbind before the loop, ops write into their buffers, adjacent gates
# sharing an activation take one op, and one direction drops the direction axis (addmm rather than baddbmm).
# Rows run padded to T: finished rows compute values nobody reads (rows are independent); the final states are read
# at each row's last step.

def _in_place(acts: tuple[Activation, ...], clip: float | None = None) -> Callable[[Tensor], Tensor]:
    """A function that clips (if ``clip``) and then activates a scratch tensor in place, one activation per
    direction, made once per call: for the defaults it is ``Tensor.sigmoid_`` itself."""
    if all(a == acts[0] for a in acts):
        activate = _IN_PLACE.get(acts[0].name) or acts[0].apply_
    else:
        def activate(x: Tensor) -> Tensor:
            for d, act in enumerate(acts):
                act.apply_(x[d])
            return x
    if clip is None:
        return activate
    return lambda x: activate(x.clamp_(-clip, clip))


def _into(acts: tuple[Activation, ...]) -> Callable[[Tensor, Tensor], Tensor]:
    """A function (x, out) -> the activation of x, written into out."""
    with_out = _WITH_OUT.get(acts[0].name) if all(a == acts[0] for a in acts) else None
    if with_out is not None:
        return lambda x, out: with_out(x, out=out)
    activate = _in_place(acts)
    return lambda x, out: activate(out.copy_(x))


@dataclass
class _Run:
    """What the inference loops read. State tensors are [N, ...] for one direction, [D, N, ...] for two."""

    cfg: RecurrentConfig
    order: str  # gate order of the weights, e.g. "iofc" (ONNX LSTM)
    hidden: int
    lead: tuple[int, ...]  # (N,) or (D, N)
    proj: Tensor  # X·Wᵀ + the biases that can be folded in: [T, *lead, gH]
    rt: Tensor  # Rᵀ: [H, gH] or [D, H, gH]
    inner: Tensor | None  # recurrent bias kept inside the step (GRU, linear_before_reset=1): [gH] or [D, 1, gH]
    p: Tensor | None  # peepholes (i, o, f): [1, 3H] or [D, 1, 3H]
    ys: Sequence[Tensor]  # H of step t: views of Y
    prev: list[Tensor]  # H before step t: initial_h, then ys

    def gates(self, block: Tensor, letters: str) -> Tensor:
        """The view of ``block`` [..., gH] holding the gates ``letters`` (adjacent in the gate order)."""
        start = self.order.index(letters[0]) * self.hidden
        return block[..., start:start + len(letters) * self.hidden]

    def runs(self, letters: str) -> list[str]:
        """``letters`` grouped into runs adjacent in the gate order, so that one op covers each run."""
        groups: list[str] = []
        for k in sorted(self.order.index(g) for g in letters):
            if groups and self.order.index(groups[-1][-1]) == k - 1:
                groups[-1] += self.order[k]
            else:
                groups.append(self.order[k])
        return groups

    def steps(self, letters: str | None = None) -> Sequence[Tensor]:
        """Per-step views of the projection (of the gates ``letters`` only, if given)."""
        return (self.proj if letters is None else self.gates(self.proj, letters)).unbind(0)

    def new(self, size: int) -> Tensor:
        return self.proj.new_empty(*self.lead, size)

    def matmul(self, bias: Tensor | None, h: Tensor, rt: Tensor, out: Tensor) -> Tensor:
        if len(self.lead) == 1:
            return torch.mm(h, rt, out=out) if bias is None else torch.addmm(bias, h, rt, out=out)
        return torch.bmm(h, rt, out=out) if bias is None else torch.baddbmm(bias, h, rt, out=out)


def _lstm_loop(run: _Run, c0: Tensor, keep_c: bool) -> tuple[Tensor, Tensor | None]:
    """Returns the last C and, with ``keep_c``, C after every step [T, *lead, H]."""
    cfg = run.cfg
    f_act, g_act = (_in_place(acts, cfg.clip) for acts in cfg.activations[:2])
    h_act = _into(cfg.activations[2])
    gates, squashed = run.new(4 * run.hidden), run.new(run.hidden)
    i, o, f, g = (run.gates(gates, k) for k in "iofc")
    peep = None if run.p is None else run.p.chunk(3, -1)  # i, o, f
    # the gates that f activates before C(t) is known: i, f (unless input_forget), o (unless a peephole reads C(t))
    early = [run.gates(gates, r) for r in run.runs("i" + "f" * (not cfg.input_forget) + "o" * (peep is None))]
    cells = c0.new_empty(len(run.ys) if keep_c else 2, *c0.shape)
    cell_steps = cells.unbind(0)
    c = c0
    for t, x in enumerate(run.steps()):
        run.matmul(x, run.prev[t], run.rt, gates)
        if peep is not None:  # onnxruntime clips after adding the peephole term
            i.addcmul_(peep[0], c)
            f.addcmul_(peep[2], c)
        for view in early:
            f_act(view)
        forget = torch.rsub(i, 1) if cfg.input_forget else f
        c = torch.mul(forget, c, out=cell_steps[t if keep_c else t % 2]).addcmul_(i, g_act(g))
        if peep is not None:
            f_act(o.addcmul_(peep[1], c))
        torch.mul(o, h_act(c, squashed), out=run.ys[t])  # C itself is not clipped
    return c, cells if keep_c else None


def _gru_loop(run: _Run, c0: None, keep_c: bool) -> tuple[None, None]:
    cfg, hidden = run.cfg, run.hidden
    f_act, g_act = (_in_place(acts, cfg.clip) for acts in cfg.activations)
    zr, candidate = run.new(2 * hidden), run.new(hidden)  # z and r are adjacent in both gate orders
    z, r = (run.gates(zr, k) for k in "zr")
    x_zr, x_h = run.steps(run.order[:2]), run.steps(run.order[2])
    if cfg.linear_before_reset:  # h~ = g(XWh + Wbh + r * (H·Rhᵀ + Rbh)); Rb is `inner`
        recurrent = run.new(3 * hidden)
        r_zr, r_h = recurrent[..., : 2 * hidden], recurrent[..., 2 * hidden:]
        for t, h in enumerate(run.ys):
            run.matmul(run.inner, run.prev[t], run.rt, recurrent)
            f_act(torch.add(x_zr[t], r_zr, out=zr))
            g_act(torch.addcmul(x_h[t], r, r_h, out=candidate))
            torch.lerp(candidate, run.prev[t], z, out=h)  # (1 - z) * h~ + z * H
    else:  # h~ = g(XWh + Wbh + Rbh + (r * H)·Rhᵀ)
        r_zr, reset_h = run.new(2 * hidden), run.new(hidden)
        rt_zr, rt_h = run.rt[..., : 2 * hidden], run.rt[..., 2 * hidden:]
        for t, h in enumerate(run.ys):
            run.matmul(None, run.prev[t], rt_zr, r_zr)
            f_act(torch.add(x_zr[t], r_zr, out=zr))
            run.matmul(x_h[t], torch.mul(r, run.prev[t], out=reset_h), rt_h, candidate)
            torch.lerp(g_act(candidate), run.prev[t], z, out=h)
    return None, None


def _rnn_loop(run: _Run, c0: None, keep_c: bool) -> tuple[None, None]:
    activate = _in_place(run.cfg.activations[0], run.cfg.clip)
    for t, x in enumerate(run.steps()):
        activate(run.matmul(x, run.prev[t], run.rt, run.ys[t]))
    return None, None


def _inference_core(cell, cfg, x, W, R, B, P, lens, h0, c0):
    """The cell loop without autograd, on ONNX-layout weights. Returns Y [T, D, N, H] (None if not asked for), Y_h,
    Y_c."""
    steps, batch, input_size = x.shape
    directions, hidden = W.shape[0], R.shape[-1]
    gh, one = cell.gates * hidden, directions == 1
    inside = cell.op_type == "GRU" and cfg.linear_before_reset  # Rb is multiplied by r: it stays in the step
    wb, rb = (None, None) if B is None else B.chunk(2, -1)
    bias = None if B is None else wb if inside else wb + rb
    proj = x.new_empty(directions, steps * batch, gh)
    for d, rev in enumerate(cfg.reversed_directions):
        xd = (_reverse(x, lens) if rev else x).reshape(steps * batch, input_size)
        if bias is None:
            torch.mm(xd, W[d].t(), out=proj[d])
        else:
            torch.addmm(bias[d], xd, W[d].t(), out=proj[d])
    proj = proj.view(directions, steps, batch, gh).transpose(0, 1)  # [T, D, N, gH]
    # Rᵀ as a view: a transposed copy costs more than the strided matmuls lose, except for a small R with one
    # direction, where the copy is cheap and MKL saves a few microseconds per step on a contiguous operand.
    rt = R.transpose(1, 2)
    rt = (rt[0].contiguous() if hidden <= 128 else rt[0]) if one else rt
    inner = None if not inside or rb is None else rb[0] if one else rb.unsqueeze(1)
    p = None if P is None else P[0:1] if one else P.unsqueeze(1)  # [1, 3H] or [D, 1, 3H]
    h0 = x.new_zeros(directions, batch, hidden) if h0 is None else h0
    if cell.has_cell_state and c0 is None:
        c0 = x.new_zeros(directions, batch, hidden)
    y = x.new_empty(steps, directions, batch, hidden)
    ys = (y[:, 0] if one else y).unbind(0)
    run = _Run(cfg, cell.onnx_gates, hidden, (batch,) if one else (directions, batch), proj[:, 0] if one else proj,
               rt, inner, p, ys, [h0[0] if one else h0, *ys])
    keep_c = lens is not None and cfg.outputs[2]
    c_last, c_history = cell.loop(run, None if c0 is None else c0[0] if one else c0, keep_c)
    if steps == 0:
        y_h, y_c = h0, c0
    elif lens is None:
        y_h, y_c = y[-1].clone(), None if c_last is None else c_last.view(directions, batch, hidden)
    else:  # each row's state after its own last step (reverse directions ran on per-row reversed input)
        last = (lens - 1).clamp(min=0).view(1, 1, batch, 1).expand(1, directions, batch, hidden)
        y_h = y.gather(0, last)[0]
        y_c = None if c_history is None else c_history.view(steps, directions, batch, hidden).gather(0, last)[0]
    return (_unreverse(cfg, y, lens) if cfg.outputs[0] else None), y_h, y_c


def _unreverse(cfg: RecurrentConfig, y: Tensor, lens: Tensor | None) -> Tensor:
    """Y [T, D, N, H] of kernels that ran the reverse direction on per-row reversed input, back in time order: one
    row copy (index_select) for all directions."""
    if not any(cfg.reversed_directions):
        return y
    steps, directions, batch, hidden = y.shape
    if lens is None and directions == 1:
        return y.flip(0)
    t = torch.arange(steps, device=y.device)[:, None, None]  # [T, 1, 1] against [D, N] below
    ends = torch.full((batch,), steps, device=y.device) if lens is None else lens
    reverse = torch.tensor(cfg.reversed_directions, device=y.device)[:, None]
    source = torch.where(reverse & (t < ends), ends - 1 - t, t)
    index = (source * directions + torch.arange(directions, device=y.device)[:, None]) * batch \
        + torch.arange(batch, device=y.device)
    return y.reshape(-1, hidden).index_select(0, index.view(-1)).view(y.shape)


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
    loop: Callable | None = None  # the inference loop

    @property
    def gates(self) -> int:
        return len(self.onnx_gates)

    def torch_order(self) -> list[int]:
        return [self.onnx_gates.index(g) for g in self.torch_gates]


LSTM_CELL = Cell("LSTM", "iofc", "ifco", True, ("Sigmoid", "Tanh", "Tanh"), _lstm_step, _lstm_mode,
                 loop=_lstm_loop)
GRU_CELL = Cell("GRU", "zrh", "rzh", False, ("Sigmoid", "Tanh"), _gru_step, _gru_mode,
                lambda cfg: "h" if cfg.linear_before_reset else "", loop=_gru_loop)
RNN_CELL = Cell("RNN", "h", "h", False, ("Tanh",), _rnn_step, _rnn_mode, loop=_rnn_loop)

_TORCH_KERNELS = {"LSTM": torch.lstm, "GRU": torch.gru, "RNN_TANH": torch.rnn_tanh, "RNN_RELU": torch.rnn_relu}


@functools.cache
def _torch_mode(cell: Cell, cfg: RecurrentConfig) -> str | None:
    return cell.torch_mode(cfg)


_ONEDNN_BUILT = torch.backends.mkldnn.is_available()


def _onednn_usable(x: Tensor) -> bool:
    """Whether torch.lstm itself would run oneDNN here (float32 on CPU, oneDNN built and enabled). Not while
    torch.jit traces (torch.onnx.export with dynamo=False): it exports torch.lstm as ONNX LSTM but cannot export
    oneDNN's layer op."""
    return (_ONEDNN_BUILT and x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() > 0
            and torch.backends.mkldnn.enabled and not torch.jit.is_tracing())


def _onednn_lstm(cfg, x, weights, lens, h0, c0):
    """nn.LSTM's CPU kernel for float32 (oneDNN's LSTM, ``torch.mkldnn_rnn_layer``: what torch.lstm runs), called
    once per direction like torch.lstm does, minus its per-call bookkeeping; with sequence_lens the reverse direction
    runs on per-row reversed input, so that no packing is needed: rows run padded and Y_h is read at each row's last
    step.
    Returns Y [T, D, N, H], Y_h, Y_c (Y_c only without sequence_lens: the kernel returns C at step T)."""
    batch, directions, hidden = x.shape[1], cfg.num_directions, weights[1].shape[-1]
    per = len(weights) // directions
    zeros = x.new_zeros(batch, hidden)
    bias = [x.new_zeros(4 * hidden)] * 2 if per == 2 else None
    ys, hs, cs = [], [], []
    for d, rev in enumerate(cfg.reversed_directions):
        w = weights[d * per:(d + 1) * per]
        states = [zeros if s is None else s[d].contiguous() for s in (h0, c0)]
        xd = (_reverse(x, lens) if rev and lens is not None else x).contiguous()
        y, h, c, _ = torch.mkldnn_rnn_layer(xd, w[0], w[1], *(bias or w[2:]), *states, rev and lens is None, [], 2,
                                            hidden, 1, bias is None, False, False, False)  # 2: ideep's LSTM kind
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y = ys[0].unsqueeze(1) if directions == 1 else torch.stack(ys, 1)
    if lens is None:
        y_h, y_c = (s[0].unsqueeze(0) if directions == 1 else torch.stack(s) for s in (hs, cs))
    else:
        last = (lens - 1).clamp(min=0).view(1, 1, batch, 1).expand(1, directions, batch, hidden)
        y_h, y_c = y.gather(0, last)[0], None
    return y if lens is None else _unreverse(cfg, y, lens), y_h, y_c


# ---------------------------------------------------------------------------------------------------------------
# The skeleton.

def _reverse(x: Tensor, lens: Tensor | None) -> Tensor:
    """Reverse time (dim 0) of x [T, N, ...], each row over its own length; padding stays in place."""
    if lens is None:
        return x.flip(0)
    steps, batch = x.shape[:2]
    t = torch.arange(steps, device=x.device)[:, None]
    source = torch.where(t < lens, lens - 1 - t, t) * batch + torch.arange(batch, device=x.device)  # [T, N]
    # index_select on the rows of x as [T * N, ...] copies whole rows: far faster than a gather of every element
    return x.reshape(steps * batch, *x.shape[2:]).index_select(0, source.view(-1)).view(x.shape)


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
              torch_weights: Sequence[Tensor] | None = None,
              products=None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """One recurrent node: (Y, Y_h, Y_c) in the ONNX layout and X's dtype; outputs not asked for are None.

    With ``torch_weights`` (the flat weights of an nn.LSTM/GRU/RNN, already reordered) the torch kernel computes the
    recurrence, else the exact cell loop on the ONNX-layout W, R, B, P. float16/bfloat16 are computed in float32 and
    cast back, as onnxruntime would; float64 stays float64. ``products`` computes the loop's two matrix products
    instead of torch (see ``_exact_core``; DynamicQuantizeLSTM's integer products).
    """
    compute = torch.float64 if X.dtype == torch.float64 else torch.float32

    def prepare(t: Tensor | None, batch_major: bool = False) -> Tensor | None:
        if t is None:
            return None
        t = t.transpose(0, 1) if batch_major and cfg.layout else t
        return t if t.dtype == compute else t.to(compute)

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
        weights = [prepare(w) for w in torch_weights]
        y, y_h, y_c = _torch_core(cell, cfg, x, weights, lens, h0, c0)
    else:
        # Without autograd the inference loop runs (buffers written in place); with it, or while torch.jit traces
        # (which must record functional ops), the step functions.
        inference = products is None and not torch.jit.is_tracing() and (not torch.is_grad_enabled() or not any(
            t is not None and t.requires_grad for t in (X, W, R, B, initial_h, initial_c, P)))
        y, y_h, y_c = _exact_core(cell, cfg, x, *(prepare(t) for t in (W, R, B, P)), lens, h0, c0, inference,
                                  products)

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
    return tuple(None if o is None or not wanted else o if o.dtype == X.dtype else o.to(X.dtype)
                 for o, wanted in zip(outputs, cfg.outputs, strict=True))


def _torch_core(cell, cfg, x, weights, lens, h0, c0):
    """The recurrence on the weights of the nn.LSTM/GRU/RNN (torch gate order). Returns Y [T, D, N, H], Y_h, Y_c.

    LSTM in float32 on CPU, unless Y_c is wanted with sequence_lens: nn.LSTM's own oneDNN kernel, called per
    direction (``_onednn_lstm``). Otherwise torch's kernel; reverse-only runs forward on per-row reversed input.
    With sequence_lens, one direction and no Y_c wanted, the padded run is exact where it matters (rows are
    independent, Y past a row's length is zeroed by the caller, Y_h is read at the row's last step) and about twice
    as fast as packing on small shapes; otherwise pack_padded_sequence stops every row at its length (which also
    skips the finished rows' work: faster than the padded inference loop when lengths vary, as measured).
    """
    mode = _torch_mode(cell, cfg)
    pack = lens is not None and (cfg.num_directions == 2 or (cell.has_cell_state and cfg.outputs[2]))
    if mode == "LSTM" and _onednn_usable(x) and (lens is None or not cfg.outputs[2]):
        return _onednn_lstm(cfg, x, weights, lens, h0, c0)
    steps, batch, _ = x.shape
    directions, hidden = cfg.num_directions, weights[1].shape[-1]
    bidirectional, reverse = directions == 2, cfg.direction == "reverse"
    has_bias = len(weights) == 4 * directions
    zeros = x.new_zeros(directions, batch, hidden)
    hx = [zeros if h0 is None else h0] + ([zeros if c0 is None else c0] if cell.has_cell_state else [])
    if reverse:
        x = _reverse(x, lens)
    kernel = _TORCH_KERNELS[mode]
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


def _exact_core(cell, cfg, x, W, R, B, P, lens, h0, c0, inference, products=None):
    """The own cell loop on ONNX-layout weights: without autograd the inference loop; with it the functional steps,
    both directions batched. Returns Y [T, D, N, H] (None if not asked for), Y_h, Y_c.

    ``products`` replaces torch's matrix products (DynamicQuantizeLSTM's integer ones): ``project(xs [D, T, N, I],
    W, lens)`` gives the input projection of every step, ``bind(R)`` the ``rt`` that the cell's step multiplies the
    state with, ``state(h, t, valid)`` the state as that product sees it. The biases are then added in the step,
    after both products (onnxruntime's order on that path)."""
    if inference:
        return _inference_core(cell, cfg, x, W, R, B, P, lens, h0, c0)
    steps, batch, input_size = x.shape
    directions, hidden = W.shape[0], R.shape[-1]
    reversed_dirs = cfg.reversed_directions
    inputs = [_reverse(x, lens) if rev else x for rev in reversed_dirs]
    xs = inputs[0].unsqueeze(0) if directions == 1 else torch.stack(inputs)  # [D, T, N, I]
    xs = xs.reshape(directions, steps * batch, input_size)
    wt = W.transpose(1, 2)
    inner = None
    if products is not None:
        projection = products.project(xs.view(directions, steps, batch, input_size), W, lens)
        inner = None if B is None else torch.add(*B.unsqueeze(1).chunk(2, -1))  # Wb + Rb
    elif B is None:
        projection = torch.bmm(xs, wt)
    else:  # fold Wb and Rb into the one big matmul, except the Rb blocks that must stay inside the step
        wb, rb = B.unsqueeze(1).chunk(2, -1)
        keep = cell.inner_bias_gates(cfg)
        if keep:
            inside = torch.tensor([g in keep for g in cell.onnx_gates], device=x.device).repeat_interleave(hidden)
            inner, rb = rb * inside, rb * ~inside
        projection = torch.baddbmm(wb + rb, xs, wt)
    projection = projection.view(directions, steps, batch, -1)

    rt = R.transpose(1, 2) if products is None else products.bind(R)
    p = None if P is None else P.unsqueeze(1)
    h = x.new_zeros(directions, batch, hidden) if h0 is None else h0
    c = (x.new_zeros(directions, batch, hidden) if c0 is None else c0) if cell.has_cell_state else None
    valid = None if lens is None else (torch.arange(steps, device=x.device)[:, None] < lens)[:, None, :, None]
    want_y = cfg.outputs[0]
    ys = []
    for t in range(steps):
        state = h if products is None else products.state(h, t, valid)
        h_new, c_new = cell.step(cfg, projection[:, t], state, c, rt, inner, p)
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
        # For torch.compile / torch.export (recurrent_op.py): the op's static key, and the weights of the nn.LSTM/
        # GRU/RNN reachable without touching that module (Dynamo refuses to wrap one).
        self.op_key = config_key(self.cell, self.config, self.fast)
        self._fast_weights = FastWeights(self.rnn) if self.fast else None

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
        """The equivalent torch module, its weights taken from W, R, B reordered to torch's gate order once. It is
        built on the meta device and then given the reordered tensors as its parameters: no random initialisation
        and no second copy of the weights (both cost as much as the rest of a large model's conversion)."""
        directions, _, input_size = W.shape
        hidden = R.shape[-1]
        kwargs = {"bias": B is not None, "bidirectional": directions == 2, "dtype": W.dtype, "device": "meta"}
        if mode == "LSTM":
            module = nn.LSTM(input_size, hidden, **kwargs)
        elif mode == "GRU":
            module = nn.GRU(input_size, hidden, **kwargs)
        else:
            module = nn.RNN(input_size, hidden, nonlinearity=mode.removeprefix("RNN_").lower(), **kwargs)
        order = self.cell.torch_order()

        def reorder(t: Tensor) -> nn.Parameter:  # [gH, ...] in ONNX gate order -> torch gate order (one copy)
            return nn.Parameter(torch.cat([t[k * hidden:(k + 1) * hidden] for k in order]).detach())

        for d, suffix in enumerate(("", "_reverse")[:directions]):
            weights = {"weight_ih": W[d], "weight_hh": R[d]}
            if B is not None:
                weights["bias_ih"], weights["bias_hh"] = B[d].chunk(2)
            for name, value in weights.items():
                setattr(module, f"{name}_l0{suffix}", reorder(value))  # nn.RNNBase keeps its flat weight list
        return module

    def forward(self, X: Tensor, W: Tensor | None = None, R: Tensor | None = None, B: Tensor | None = None,
                sequence_lens: Tensor | None = None, initial_h: Tensor | None = None,
                initial_c: Tensor | None = None, P: Tensor | None = None):
        lens = self.sequence_lens if sequence_lens is None else sequence_lens
        compiling = torch.compiler.is_compiling()  # Dynamo tracing or torch.export
        if not self.fast:
            weights = [given if own is None else own for own, given in
                       ((self.W, W), (self.R, R), (self.B, B), (self.P, P))]
        elif compiling:
            weights = self._fast_weights()
        else:
            weights = [w for layer in self.rnn.all_weights for w in layer]
        if compiling:  # one opaque op: one graph, dynamic batch and sequence length (see recurrent_op.py)
            outputs = traced_recurrent(self, X, weights, sequence_lens, initial_h, initial_c)
        else:
            W, R, B, P = (None,) * 4 if self.fast else weights
            outputs = recurrent(self.cell, self.config, X, W, R, B, lens, initial_h, initial_c, P,
                                torch_weights=weights if self.fast else None)
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
