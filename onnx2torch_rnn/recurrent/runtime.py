"""The recurrence of one node in Python: the skeleton shared by every cell, and its two numeric cores.

``recurrent`` does what the three ops share: layout, dtype, sequence_lens, the per-step mask, initial states,
directions and the ONNX output shapes. It is the reference of the native kernel, the path autograd differentiates
(training), and the inference path where the native kernel is not available. Its two cores:

- ``_torch_core``: torch's kernels (torch.lstm / torch.gru / torch.rnn_*) on the weights of a real nn.LSTM / nn.GRU /
  nn.RNN (the fast path: torch gate order, reordered once at conversion); ``pack_padded_sequence`` stops each row at
  its length and runs the reverse direction over each row's own length, exactly as onnxruntime does.
- ``_cell_loop``: the cell's own step function on ONNX-layout weights, for everything torch has no kernel for. X·Wᵀ
  + biases for all steps and both directions is one batched matmul; only the state's product runs per step.

onnxruntime is the reference throughout; where it departs from the written spec we follow it (see cells.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import MappingProxyType

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .cells import STATE_DTYPES, Cell, RecurrentConfig
from .validation import check_lengths_dtype, check_shape, check_shapes

_TORCH_KERNELS = MappingProxyType({"LSTM": torch.lstm, "GRU": torch.gru, "RNN_TANH": torch.rnn_tanh,
                                   "RNN_RELU": torch.rnn_relu})
# Whether the cell loop runs its step function compiled (``compiled_steps``): per thread and task, like autocast.
_COMPILED_STEPS = contextvars.ContextVar("onnx2torch_rnn_compiled_steps", default=False)


@contextlib.contextmanager
def compiled_steps(enabled: bool = True) -> Iterator[None]:
    """Within the block, the cell loop (the exact path: peepholes, clip, custom activations, GRU with
    linear_before_reset=0, masks; training, and inference where the native kernel does not run, as on a GPU) runs
    each step's gate arithmetic as one compiled kernel (torch.compile of the cell's step function) beside the
    state's product, instead of a dozen small ones. On a GPU that pays inside a CUDA graph, where the launches no
    longer cost host time (``torch.cuda.make_graphed_callables``, or ``torch.cuda.graph``); without one the step is
    still bound by the host. The numbers are torch.compile's (fused arithmetic: equal to eager within rounding).
    The first call of each cell configuration, dtype and grad mode compiles (seconds); torch.compile's recompile
    limit applies (past it, the step runs eagerly)."""
    token = _COMPILED_STEPS.set(enabled)
    try:
        yield
    finally:
        _COMPILED_STEPS.reset(token)


@functools.cache  # one compiled wrapper per step function (three cells): torch.compile keeps its own graphs
def _compiled(step: Callable) -> Callable:
    return torch.compile(step, dynamic=None)


def _step_function(cell: Cell, products) -> Callable:
    """The cell's step function, compiled within ``compiled_steps`` (never while torch.compile or torch.export is
    already tracing the whole loop, nor around the integer products of quantized cells)."""
    if _COMPILED_STEPS.get() and products is None and not torch.compiler.is_compiling():
        return _compiled(cell.step)
    return cell.step


def needs_grad(tensors: Iterable[Tensor | None]) -> bool:
    """Whether autograd must see the computation: grad mode is on and some tensor requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def recurrent(cell: Cell, cfg: RecurrentConfig, X: Tensor, W: Tensor | None, R: Tensor | None, B: Tensor | None = None,
              sequence_lens: Tensor | Sequence[int] | None = None, initial_h: Tensor | None = None,
              initial_c: Tensor | None = None, P: Tensor | None = None, mask: Tensor | None = None,
              torch_weights: Sequence[Tensor] | None = None,
              products=None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """One recurrent node: (Y, Y_h, Y_c) in the ONNX layout and X's dtype; outputs not asked for are None.

    With ``torch_weights`` (the flat weights of an nn.LSTM/GRU/RNN, already reordered) torch's kernel computes the
    recurrence, else the cell loop on the ONNX-layout W, R, B, P. ``mask`` (bool, X.shape[:2]): where a row's mask is
    false its states carry over and its Y is zero or its previous output (``cfg.mask_output``). float16/bfloat16
    are computed in float32 and cast back, as onnxruntime would; float64 stays float64. With ``cfg.state_dtype``
    the states are rounded to it after every step (a Loop's carried values). ``products`` replaces the
    loop's matrix products (see ``_cell_loop``; DynamicQuantizeLSTM's integer products).
    """
    compute = torch.float64 if X.dtype == torch.float64 else torch.float32

    def prepare(t: Tensor | None, batch_major: bool = False) -> Tensor | None:
        if t is None:
            return None
        t = t.transpose(0, 1) if batch_major and cfg.layout else t
        return t if t.dtype == compute or t.dtype == torch.bool else t.to(compute)

    given = {"X": X, "W": W, "R": R, "B": B, "P": P, "initial_h": initial_h, "initial_c": initial_c,
             "sequence_lens": sequence_lens}  # static lengths are a list
    shapes = {name: None if t is None else tuple(t.shape) if isinstance(t, Tensor) else (len(t),)
              for name, t in given.items()}
    if torch_weights is not None:  # the nn.LSTM/GRU/RNN's own weights, consistent among themselves: seen as W, R
        per = len(torch_weights) // cfg.num_directions  # w_ih, w_hh and maybe b_ih, b_hh per direction
        gh, input_size, hidden = *torch_weights[0].shape, torch_weights[1].shape[-1]
        expected = {0: ("weight_ih", (gh, input_size)), 1: ("weight_hh", (gh, hidden))}
        for k, w in enumerate(torch_weights):
            name, shape = expected.get(k % per, ("bias", (gh,)))
            check_shape(name, shape, tuple(w.shape))
        shapes["W"], shapes["R"] = (cfg.num_directions, gh, input_size), (cfg.num_directions, gh, hidden)
    check_shapes(cell.gates, cfg.num_directions, cfg.layout, cfg.hidden_size, shapes)
    if isinstance(sequence_lens, Tensor):
        check_lengths_dtype(sequence_lens.dtype)
    x = prepare(X, batch_major=True)  # layout 0 from here on: [T, N, I]
    h0, c0, mask = prepare(initial_h, True), prepare(initial_c, True), prepare(mask, True)
    steps, batch, _ = x.shape
    directions = cfg.num_directions
    lens = _lengths(sequence_lens, steps, x.device)
    _check_mask(cfg, mask, (steps, batch), lens)

    if torch_weights is not None and mask is None and steps:  # torch's kernels refuse zero steps: the loop runs none
        y, y_h, y_c = _torch_core(cell, cfg, x, [prepare(w) for w in torch_weights], lens, h0, c0)
    else:
        if torch_weights is not None:
            W, R, B = onnx_weights(cell, [prepare(w) for w in torch_weights], directions)
        weights = (W, R) if products is not None else (prepare(W), prepare(R))  # integer weights: the products'
        y, y_h, y_c = _cell_loop(cell, cfg, x, *weights, prepare(B), prepare(P), lens, h0, c0, mask, products)

    if lens is not None:  # Y is zero past each row's length; a row of length 0 ends in zero states (onnxruntime)
        if y is not None:
            valid = torch.arange(steps, device=x.device)[:, None] < lens
            y = torch.where(valid[:, None, :, None], y, 0.0)
        started = (lens > 0)[:, None]
        y_h, y_c = (None if s is None else torch.where(started, s, 0.0) for s in (y_h, y_c))
    elif steps == 0:  # so does a sequence of length 0, initial states or not (onnxruntime)
        y_h, y_c = (None if s is None else torch.zeros_like(s) for s in (y_h, y_c))
    if cfg.layout:  # [T, D, N, H] -> [N, T, D, H]; [D, N, H] -> [N, D, H]
        y = None if y is None else y.permute(2, 0, 1, 3)
        y_h, y_c = (None if s is None else s.transpose(0, 1) for s in (y_h, y_c))
    outputs = (y, y_h, y_c)
    return tuple(None if o is None or not wanted else o if o.dtype == X.dtype else o.to(X.dtype)
                 for o, wanted in zip(outputs, cfg.outputs, strict=True))


def onnx_weights(cell: Cell, torch_weights: Sequence[Tensor], directions: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """W, R, B in ONNX layout and gate order from the flat weights of an nn.LSTM/GRU/RNN (per direction w_ih, w_hh
    and, with bias, b_ih, b_hh in torch's gate order)."""
    per, hidden = len(torch_weights) // directions, torch_weights[1].shape[-1]
    order = [cell.torch_gates.index(g) for g in cell.onnx_gates]  # for each ONNX gate, its torch block

    def onnx_order(t: Tensor) -> Tensor:
        return torch.cat([t[k * hidden:(k + 1) * hidden] for k in order])

    def stacked(k: int) -> Tensor:  # the k-th weight of every direction, [D, gH, ...]
        return torch.stack([onnx_order(w) for w in torch_weights[k::per]])

    B = torch.cat([stacked(2), stacked(3)], -1) if per == 4 else None
    return stacked(0), stacked(1), B


# ---------------------------------------------------------------------------------------------------------------
# Checks and small helpers.

def _lengths(sequence_lens: Tensor | Sequence[int] | None, steps: int, device) -> Tensor | None:
    """sequence_lens (its shape already checked) as int64 on X's device, after onnxruntime's range check; None when
    every row is full."""
    if sequence_lens is None:
        return None
    if isinstance(sequence_lens, Tensor):
        lens = sequence_lens.to(device=device, dtype=torch.int64)
        out_of_range = ((lens < 0) | (lens > steps)).any()
        if lens.is_cuda and torch.cuda.is_current_stream_capturing():  # a CUDA graph cannot wait for the answer
            torch._assert_async(~out_of_range, f"sequence_lens values must lie in [0, {steps}]")
            return lens
        bad = bool(out_of_range)  # the one data-dependent check: once per call, before the recurrence
    else:  # static lengths baked in at conversion
        if all(length == steps for length in sequence_lens):
            return None
        lens = torch.tensor(sequence_lens, dtype=torch.int64, device=device)
        bad = any(length < 0 or length > steps for length in sequence_lens)
    if bad:
        raise ValueError(f"sequence_lens values must lie in [0, {steps}] (the sequence length of X), "
                         f"got {lens.tolist()}")
    return lens


def _check_mask(cfg: RecurrentConfig, mask: Tensor | None, shape: tuple[int, int], lens: Tensor | None) -> None:
    if (mask is None) != (cfg.mask_output is None):
        raise ValueError("this node takes a mask input" if mask is None else "this node takes no mask input")
    if mask is None:
        return
    if mask.dtype != torch.bool or tuple(mask.shape) != shape:
        raise ValueError(f"mask must be a bool tensor of X's first two dims (as [T, N]: {list(shape)}), got "
                         f"{mask.dtype} {list(mask.shape)}")
    if lens is not None:
        raise ValueError("a node takes either sequence_lens or a mask, not both")


def _reverse(x: Tensor, lens: Tensor | None) -> Tensor:
    """Reverse time (dim 0) of x [T, N, ...], each row over its own length; padding stays in place."""
    if lens is None:
        return x.flip(0)
    steps, batch = x.shape[:2]
    t = torch.arange(steps, device=x.device)[:, None]
    source = torch.where(t < lens, lens - 1 - t, t) * batch + torch.arange(batch, device=x.device)  # [T, N]
    # index_select on the rows of x as [T * N, ...] copies whole rows: far faster than a gather of every element
    return x.reshape(steps * batch, *x.shape[2:]).index_select(0, source.view(-1)).view(x.shape)


def _per_direction(cfg: RecurrentConfig, x: Tensor, lens: Tensor | None) -> Tensor:
    """x [T, N, ...] as each direction processes it (reversed rows for the reverse direction): [D, T, N, ...]."""
    return torch.stack([_reverse(x, lens) if rev else x for rev in cfg.reversed_directions])


# ---------------------------------------------------------------------------------------------------------------
# The two cores. Both take x [T, N, I] and states [D, N, H] and return Y [T, D, N, H] (None if not asked for), Y_h,
# Y_c in time order.

def _torch_core(cell, cfg, x, weights, lens, h0, c0):
    """The recurrence on the weights of the nn.LSTM/GRU/RNN (torch gate order). Reverse-only runs forward on
    per-row reversed input. With sequence_lens, one direction and no Y_c wanted, the padded run is exact where it
    matters (rows are independent, Y past a row's length is zeroed by the caller, Y_h is read at the row's last step)
    and about twice as fast as packing on small shapes; otherwise pack_padded_sequence stops every row at its
    length."""
    mode = cell.torch_mode(cfg)
    steps, batch, _ = x.shape
    lens = lens if batch else None  # an empty batch has no row to stop (and packing refuses it)
    pack = lens is not None and (cfg.num_directions == 2 or (cell.has_cell_state and cfg.outputs[2]))
    directions, hidden = cfg.num_directions, weights[1].shape[-1]
    bidirectional, reverse = directions == 2, cfg.direction == "reverse"
    has_bias = len(weights) == 4 * directions
    zeros = x.new_zeros(directions, batch, hidden)
    # cuDNN refuses a strided state (a slice or transposition of another value); .contiguous() copies only those
    hx = [zeros if h0 is None else h0.contiguous()] + (
        [zeros if c0 is None else c0.contiguous()] if cell.has_cell_state else [])
    if reverse:
        x = _reverse(x, lens)
    kernel = _TORCH_KERNELS[mode]
    # train: cuDNN keeps what its backward needs only in training mode (without dropout it computes the same)
    train = needs_grad((x, *hx, *weights))
    if not pack:
        y, *states = kernel(x, hx if cell.has_cell_state else hx[0], weights, has_bias, 1, 0.0, train,
                            bidirectional, False)
        if lens is not None:  # length 0 reads step 0 and is zeroed by the caller
            last = (lens - 1).clamp(min=0).view(1, batch, 1).expand(1, batch, hidden)
            states = [y.gather(0, last), None]
    else:  # length 0 is run as 1 and zeroed by the caller
        packed = pack_padded_sequence(x, lens.clamp(min=1).cpu(), enforce_sorted=False)
        hx = [s.index_select(1, packed.sorted_indices) for s in hx]
        data, *states = kernel(packed.data, packed.batch_sizes, hx if cell.has_cell_state else hx[0], weights,
                               has_bias, 1, 0.0, train, bidirectional)
        y = pad_packed_sequence(PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                                               packed.unsorted_indices), total_length=steps)[0]
        states = [s.index_select(1, packed.unsorted_indices) for s in states]
    y = y.view(steps, batch, directions, hidden).transpose(1, 2)
    if reverse:
        y = _reverse(y[:, 0], lens).unsqueeze(1)
    return y, states[0], states[1] if cell.has_cell_state else None


def torch_layers(mode: str, x: Tensor, weights: list[Tensor], num_layers: int, bidirectional: bool,
                 h0: Tensor, c0: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Several fast-path layers (one torch mode, hidden size and direction count, forward or bidirectional) as one
    call of torch's kernel with num_layers: y [T, N, D*H], h_n and c_n [L*D, N, H]. x [T, N, I] (T, N > 0),
    ``weights`` the layers' flat weights in turn, h0 and c0 every layer's initial states; all in one float dtype.
    What the layers compute one after the other, in one autograd node per layer and direction instead of a dozen
    small ops per layer."""
    has_bias = len(weights) == 4 * num_layers * (2 if bidirectional else 1)
    train = needs_grad((x, h0, c0, *weights))
    hx = h0 if c0 is None else [h0, c0]
    y, *states = _TORCH_KERNELS[mode](x, hx, weights, has_bias, num_layers, 0.0, train, bidirectional, False)
    return y, states[0], states[1] if c0 is not None else None


def _projection(cell, cfg, xs: Tensor, W: Tensor, B: Tensor | None, lens: Tensor | None,
                products) -> tuple[Tensor, Tensor | None]:
    """X·Wᵀ + biases for every step of every direction, [D, T·N, gH] (xs [D, T, N, I]), and the recurrent bias that
    must stay inside the step (GRU with linear_before_reset: r multiplies it), [D, 1, gH] or None."""
    if products is not None:  # biases after both products, as onnxruntime's quantized path adds them
        return products.project(xs, W, lens), None if B is None else torch.add(*B.unsqueeze(1).chunk(2, -1))
    xs = xs.flatten(1, 2)
    wt = W.transpose(1, 2)
    if B is None:
        return torch.bmm(xs, wt), None
    wb, rb = B.unsqueeze(1).chunk(2, -1)
    inner, keep = None, cell.inner_bias_gates(cfg)
    if keep:  # per gate, Rb either inside the step or in the projection (no host-to-device copy: CUDA graphs)
        blocks = rb.unflatten(-1, (cell.gates, -1))
        gate_inside = [g in keep for g in cell.onnx_gates]
        inner, rb = (torch.stack([b if inside == wanted else torch.zeros_like(b)
                                  for b, inside in zip(blocks.unbind(-2), gate_inside, strict=True)], -2).flatten(-2)
                     for wanted in (True, False))
    return torch.baddbmm(wb + rb, xs, wt), inner


def _cell_loop(cell, cfg, x, W, R, B, P, lens, h0, c0, mask, products=None):
    """The cell's step function over time, both directions batched, on ONNX-layout weights.

    Rows past their length keep their state (their Y is zeroed by the caller); masked steps keep the state and
    output zeros or the row's previous output. ``products`` replaces torch's matrix products (DynamicQuantizeLSTM's
    integer ones): ``project(xs [D, T, N, I], W, lens)`` gives the input projection of every step, ``bind(R)`` the
    state's product that the cell's step calls, ``state(h, t, valid)`` the state as that product sees it."""
    steps, batch, _ = x.shape
    directions, hidden = W.shape[0], R.shape[-1]
    projection, inner = _projection(cell, cfg, _per_direction(cfg, x, lens), W, B, lens, products)
    projection = projection.view(directions, steps, batch, W.shape[1])
    rt = R.transpose(1, 2) if products is None else products.bind(R)
    if products is None and torch.is_autocast_enabled(x.device.type):  # cast once, not by every step's product
        rt = rt.to(torch.get_autocast_dtype(x.device.type))
    p = None if P is None else P.unsqueeze(1)
    h = x.new_zeros(directions, batch, hidden) if h0 is None else h0
    c = (x.new_zeros(directions, batch, hidden) if c0 is None else c0) if cell.has_cell_state else None
    if lens is not None:
        keep = (torch.arange(steps, device=x.device)[:, None] < lens)[:, None, :, None]  # [T, 1, N, 1]
    else:
        keep = None if mask is None else _per_direction(cfg, mask, None).transpose(0, 1)[..., None]  # [T, D, N, 1]
    out = x.new_zeros(directions, batch, hidden) if mask is not None else None  # a masked step's output
    ys, step = [], _step_function(cell, products)
    carried = STATE_DTYPES.get(cfg.state_dtype)
    for t in range(steps):
        state = h if products is None else products.state(h, t, keep)
        h_new, c_new = step(cfg, projection[:, t], state, c, rt, inner, p)
        if carried is not None:  # onnxruntime computes a float16 Loop body in float32 but carries its states in it
            h_new, c_new = (None if s is None else s.to(carried).to(s.dtype) for s in (h_new, c_new))
        if keep is None:
            h, c = h_new, c_new
        else:
            h = torch.where(keep[t], h_new, h)
            c = None if c is None else torch.where(keep[t], c_new, c)
        if mask is not None:
            out = torch.where(keep[t], h_new, out if cfg.mask_output == "hold" else 0.0)
        if cfg.outputs[0]:
            ys.append(h if mask is None else out)
    y = None
    if cfg.outputs[0]:
        y = torch.stack(ys) if ys else x.new_zeros(0, directions, batch, hidden)
        if any(cfg.reversed_directions):
            y = torch.stack([_reverse(y[:, d], lens) if rev else y[:, d]
                             for d, rev in enumerate(cfg.reversed_directions)], 1)
    return y, h, c
