"""The recurrence of one node as one torch op, ``onnx2torch_rnn::recurrent``: what inference, torch.compile and
torch.export all run.

Schema::

    recurrent(Tensor X, Tensor[] weights, str config, Tensor? sequence_lens, Tensor? initial_h, Tensor? initial_c,
              Tensor? mask) -> (Tensor Y, Tensor Y_h, Tensor Y_c)

- X, initial_h, initial_c, mask and the outputs are in the node's ONNX layout (``layout`` in config): X [T, N, I] or
  [N, T, I]; states [D, N, H] or [N, D, H]; mask (bool) X.shape[:2]; Y [T, D, N, H] or [N, T, D, H]. Y and the states
  have X's dtype; an output the config does not ask for is an empty tensor (shape [0]). Outputs never alias inputs.
- sequence_lens: integer [N] (int32 or int64) with values in [0, T] (checked: out of range raises).
- weights: ``weights=torch`` in config: the flat weights of the nn.LSTM/GRU/RNN, per direction w_ih [gH, I], w_hh
  [gH, H] and, with bias, b_ih, b_hh [gH], in torch's gate order (cells.py: ``torch_gates``). Otherwise the ONNX
  weights whose letters config lists, in that order: W [D, gH, I], R [D, gH, H], B [D, 2gH], P [D, 3H].
- config: ``key=value`` pairs joined by ``;``, every key always present, in this order (``hidden_size`` may be
  absent in programs exported before it was added):
  ``cell`` LSTM|GRU|RNN; ``hidden_size`` the attribute or empty (then R's last dim; shapes are checked against it);
  ``direction`` forward|reverse|bidirectional; ``layout`` 0|1; ``activations`` one entry per function in ONNX
  attribute order (per direction: LSTM f,g,h; GRU f,g; RNN f), comma-separated, each ``Name[:alpha[:beta]]``
  with exactly the parameters that function consumes, already resolved to onnxruntime's values (Python float repr);
  ``clip`` a float or empty; ``input_forget`` 0|1; ``linear_before_reset`` 0|1;
  ``outputs`` three digits for Y, Y_h, Y_c (1: compute it); ``weights`` torch or a subset of the letters WRBP;
  ``mask_output`` empty (no mask input), zero or hold (a masked step's Y: zeros, or the row's previous output in
  processing order, zero before its first unmasked step); then, only where set, ``state_dtype`` float16|bfloat16
  (the states rounded to it after every step, as onnxruntime carries a float16 Loop's: such a config runs on the
  Python implementation, the native kernel never sees it). Written by ``cells.encode``, read by ``cells.decode``.

Implementations: on CPU, the native kernel (kernel/) once it is loaded, through two ops of its own:
``recurrent_pack`` packs a node's weights for it (``PACKS`` caches them per weight version) and
``recurrent_packed`` runs the node on them; the Python one below (``runtime.recurrent``) serves every other device
and CPU when the kernel is not available. The fake
implementation derives the output shapes from the input shapes (symbolic sizes welcome), so batch and sequence
length stay dynamic under torch.compile / torch.export.

``recurrent_differentiable`` is the same computation with an autograd formula, for compiled or exported training
(eager training calls ``runtime.recurrent`` directly, so eager autograd is torch's own): ``recurrent_backward``, a
third op, recomputes the forward with torch.func.vjp over the cell loop
and returns the input gradients: one extra forward in the backward, no activations saved, the whole recurrence still
one opaque node.

``recurrent_stack`` runs a StackedRecurrent's layers (module.py) in one call, for eager inference on the native
kernel only (CPU; no fake or Python implementation: everywhere else the stack calls its layers).

``onnx_translation_table`` turns the op back into the ONNX node it came from for torch.onnx.export(dynamo=True).
"""
from __future__ import annotations

import functools
import operator
import weakref

import torch
from torch import Tensor

from ..threads import caller_threads
from . import kernel
from .cells import decode
from .runtime import onnx_weights, recurrent

_SIGNATURE = ("Tensor X, Tensor[] weights, str config, Tensor? sequence_lens, Tensor? initial_h, Tensor? initial_c, "
              "Tensor? mask")
OP_NAME = "onnx2torch_rnn::recurrent"
DIFFERENTIABLE_OP_NAME = "onnx2torch_rnn::recurrent_differentiable"

_LIBRARY = torch.library.Library("onnx2torch_rnn", "DEF")  # the ops live as long as this object
_LIBRARY.define(f"recurrent({_SIGNATURE}) -> (Tensor, Tensor, Tensor)")
# The same computation with an autograd formula, for compiled/exported training: autograd support costs every call a
# few microseconds of Python even without grad, which inference should not pay.
_LIBRARY.define(f"recurrent_differentiable({_SIGNATURE}) -> (Tensor, Tensor, Tensor)")


def weights_by_name(config: str, weights) -> dict:
    """The op's weight list as keyword arguments of ``runtime.recurrent``."""
    fmt = decode(config)[2]
    if fmt == "torch":
        return {"torch_weights": list(weights), "W": None, "R": None}
    given = dict(zip(fmt, weights, strict=True))
    return {letter: given.get(letter) for letter in "WRBP"}


def _owned(outputs, inputs) -> list[Tensor]:
    """Op outputs must be fresh tensors: no output may alias an input or another output (with zero steps Y_h could
    be initial_h itself; the gradients of an LSTM's two biases are one tensor)."""
    storages = {t.untyped_storage().data_ptr() for t in inputs if t is not None and t.numel()}
    result = []
    for out in outputs:
        if out.numel() and out.untyped_storage().data_ptr() in storages:
            out = out.clone()
        out = out.contiguous()
        storages.add(out.untyped_storage().data_ptr())
        result.append(out)
    return result


def _python_impl(X, weights, config, sequence_lens, initial_h, initial_c, mask):
    cell, cfg = decode(config)[:2]
    outputs = recurrent(cell, cfg, X, sequence_lens=sequence_lens, initial_h=initial_h, initial_c=initial_c,
                        mask=mask, **weights_by_name(config, weights))
    outputs = [X.new_empty(0) if o is None else o for o in outputs]
    return tuple(_owned(outputs, [X, *weights, sequence_lens, initial_h, initial_c]))


_LIBRARY.impl("recurrent", _python_impl, "CompositeExplicitAutograd")

# The native kernel's ops (kernel/recurrent.cpp; CPU only, no fake or Python implementation): a config's number (a
# string crossing PyTorch's stable ABI, which the kernel is built against, is copied twice a call), a node's weights
# packed for it into one tensor (float64's, else float32's; checked first: the weights' errors are the op's) with its
# hidden and input sizes, and the node run on them, given the config's number and those sizes as one int64 tensor
# (``pack_node``'s numbers: each boxed argument costs a batch-1 call some tenths of a microsecond).
_LIBRARY.define("recurrent_config(str config) -> int")
_LIBRARY.define("recurrent_pack(Tensor[] weights, int config, bool float64) -> (Tensor, int, int)")
_LIBRARY.define("recurrent_packed(Tensor X, Tensor packed, Tensor numbers, Tensor? sequence_lens, Tensor? initial_h, "
                "Tensor? initial_c, Tensor? mask) -> (Tensor, Tensor, Tensor)")


@functools.cache  # the kernel's numbers live as long as the process
def config_number(config: str) -> int:
    return torch.ops.onnx2torch_rnn.recurrent_config.default(config)


def pack_node(weights: list[Tensor], config: str, float64: bool) -> tuple[Tensor, Tensor]:
    """recurrent_packed's packed weights and numbers for a node's weights (checked by recurrent_pack)."""
    number = config_number(config)
    tensor, hidden, input_size = _PACK(weights, number, float64)
    return tensor, torch.tensor([number, hidden, input_size], dtype=torch.int64)


class PackCache:
    """The kernel's packed weights of the nodes run lately (the recurrent ones' here, the int8 ones' in
    modules/quantized.py), by their weight tensors' identity and version counters: packed once per weight version
    (an in-place update bumps the version; a new tensor is a new identity). The tensors are held weakly, and an entry
    leaves when one of its tensors dies (a freed tensor's id may be reused). Inference tensors have no version
    counter: packed at every call. One per process (``PACKS``), as the kernel."""

    CAPACITY = 64  # nodes

    def __init__(self):
        self._entries = {}  # (*key, ids) -> (versions, packed, weak references), oldest first

    def get(self, weights: list[Tensor], config: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(packed weights, numbers): recurrent_packed's arguments (``pack_node``)."""
        float64 = dtype == torch.float64
        return self.made(weights, (config, float64), lambda: pack_node(weights, config, float64))

    def made(self, tensors: list[Tensor], key: tuple, make):
        """``make()``, kept for these tensors (each one's identity and version) and ``key`` (what else it depends
        on: which optional tensors are absent, attributes)."""
        key = (*key, *map(id, tensors))
        entry = self._entries.get(key)
        if entry is not None and tuple(map(_VERSION, tensors)) == entry[0]:
            return entry[1]
        packed = make()
        if not any(t.is_inference() for t in tensors):
            def forget(_, entries=self._entries):  # dict operations are atomic: no lock (this may run in any thread)
                entries.pop(key, None)

            self._entries[key] = (tuple(map(_VERSION, tensors)), packed, [weakref.ref(t, forget) for t in tensors])
            for old in list(self._entries)[:-self.CAPACITY]:
                self._entries.pop(old, None)
        return packed


class Kept:
    """What one module makes from its weight tensors (their packed form), held by that module: made again when a
    tensor is another object or was changed in place (its version counter), or ``key`` (what else it depends on)
    differs. For a module at batch 1, cheaper than PACKS: no ids to hash, and the module holds its tensors anyway.
    Inference tensors have no version counter: made at every call; so is a None (nothing made). A copy of the module
    (deepcopy, pickle) starts empty."""

    __slots__ = ("entry",)

    def __init__(self):
        self.entry = None  # (key, tensors, versions, value): replaced whole, so a reader in another thread sees one

    def __reduce__(self):
        return Kept, ()

    @property
    def made(self) -> bool:
        return self.entry is not None

    def get(self, tensors: list, key, make):
        """``make()``, or what it made last for these tensors (None entries allowed) and ``key``."""
        entry = self.entry
        if (entry is not None and key == entry[0] and len(tensors) == len(entry[1])
                and all(map(operator.is_, tensors, entry[1])) and _versions(tensors) == entry[2]):
            return entry[3]
        value = make()
        if value is not None and not any(t.is_inference() for t in tensors if t is not None):
            self.entry = (key, tuple(tensors), _versions(tensors), value)
        return value


def _versions(tensors) -> list[int]:
    return [t._version for t in tensors if t is not None]


def native(X, weights, config, sequence_lens, initial_h, initial_c, mask, kept: Kept | None = None):
    """The op on the native kernel (loaded, X on CPU); ``kept``: where the calling module holds its packed weights
    (else PACKS)."""
    try:
        if kept is None:
            packed = PACKS.get(weights, config, X.dtype)
        else:
            float64 = X.dtype == torch.float64
            packed = kept.get(weights, (config, float64), lambda: pack_node(weights, config, float64))
        return _PACKED(X, *packed, sequence_lens, initial_h, initial_c, mask)
    except RuntimeError as error:
        raise _checked(error) from None


VALUE_ERROR = "[ValueError] "  # kernel/config.h: kValueError


def _checked(error: RuntimeError) -> Exception:
    """A failed check of the kernel's as the ValueError it is (PyTorch's stable ABI, which the kernel is built
    against, raises RuntimeError only: kernel/config.h, CHECK_VALUE); any other error as it is."""
    marked, message = str(error).partition(VALUE_ERROR)[1:]
    return ValueError(message) if marked else error


def _cpu_impl(*args):
    native_config = kernel.loaded() and not decode(args[2])[1].state_dtype  # the kernel keeps float32 states
    return native(*args) if native_config else _python_impl(*args)


_LIBRARY.impl("recurrent", _cpu_impl, "CPU")
_LIBRARY.impl("recurrent_differentiable", lambda *args: torch.ops.onnx2torch_rnn.recurrent.default(*args),
              "CompositeExplicitAutograd")


# StackedRecurrent's eager inference on the native kernel (module.py): the whole stack of layout-0 layers without
# masks in one call, on what ``pack_stack`` makes once per version of the weights (kernel/recurrent.cpp says what the
# arguments hold): few arguments, as each boxed one costs a batch-1 call about a microsecond. ``states``: the stack's
# state inputs (empty without initial states), whose rows each layer reads as ``numbers`` say (``state_numbers``).
# Returns y, h_n, c_n (None where the layers do not compute them).
_LIBRARY.define("recurrent_stack(Tensor X, Tensor packed, Tensor numbers, Tensor? sequence_lens, Tensor?[] states) "
                "-> (Tensor, Tensor, Tensor)")


NO_BOUND = -(2**63)  # kernel/empty.h: kNoBound, a slice bound of None


def state_numbers(initial_h: tuple, initial_c: tuple) -> list[list[int]]:
    """Per layer, where the stack ops read its initial states (kernel/empty.h: stack_states): for initial_h, then
    initial_c, StackedRecurrent's (k, start, end) as three numbers (None bounds as NO_BOUND), or -1, 0, 0 for none."""
    def three(where):
        return [-1, 0, 0] if where is None else [where[0], *(NO_BOUND if b is None else b for b in where[1:])]

    return [three(h) + three(c) for h, c in zip(initial_h, initial_c, strict=True)]


def pack_stack(weights: list[Tensor], counts: tuple[int, ...], configs: tuple[str, ...], float64: bool,
               flags: tuple[bool, ...], states: list[list[int]]) -> tuple[Tensor, Tensor]:
    """The stack op's ``packed`` and ``numbers``: ``weights`` every layer's in turn, ``counts`` how many each layer
    takes, ``configs`` the layers' configs, ``flags`` StackedRecurrent's batch_first, batch_first_output,
    merge_output and last_states, ``states`` ``state_numbers``'. Checks the weights as recurrent_pack does (their
    errors are the op's)."""
    packs, numbers, offset, start = [], [*map(int, flags)], 0, 0
    try:
        for config, count, rows in zip(configs, counts, states, strict=True):
            number = config_number(config)
            tensor, hidden, input_size = _PACK(weights[start:start + count], number, float64)
            packs.append(tensor)
            numbers += (number, hidden, input_size, offset, *rows)
            offset += tensor.numel()
            start += count
    except RuntimeError as error:
        raise _checked(error) from None
    return torch.cat(packs), torch.tensor(numbers, dtype=torch.int64)


def run_stack(X, packed: Tensor, numbers: Tensor, sequence_lens, states: list):
    """The stack op on ``pack_stack``'s tensors, with the caller's threads."""
    try:
        return caller_threads(_STACK, X, packed, numbers, sequence_lens, states)
    except RuntimeError as error:
        raise _checked(error) from None


def output_shapes(config: str, X, weights) -> list[tuple]:
    """Shapes of (Y, Y_h, Y_c) from the input shapes alone (symbolic sizes welcome); (0,) for an output not asked
    for."""
    cfg = decode(config)[1]
    hidden = weights[1].shape[-1]  # w_hh [gH, H] or R [D, gH, H]
    directions = cfg.num_directions
    if cfg.layout:
        batch, steps = X.shape[0], X.shape[1]
        shapes = [(batch, steps, directions, hidden), (batch, directions, hidden), (batch, directions, hidden)]
    else:
        steps, batch = X.shape[0], X.shape[1]
        shapes = [(steps, directions, batch, hidden), (directions, batch, hidden), (directions, batch, hidden)]
    return [shape if wanted else (0,) for shape, wanted in zip(shapes, cfg.outputs, strict=True)]


def _fake(X, weights, config, sequence_lens, initial_h, initial_c, mask):
    return tuple(X.new_empty(shape) for shape in output_shapes(config, X, weights))


torch.library.register_fake(OP_NAME, _fake)
torch.library.register_fake(DIFFERENTIABLE_OP_NAME, _fake)


_RECURRENT = torch.ops.onnx2torch_rnn.recurrent.default
_DIFFERENTIABLE = torch.ops.onnx2torch_rnn.recurrent_differentiable.default
_STACK = torch.ops.onnx2torch_rnn.recurrent_stack.default
_PACK = torch.ops.onnx2torch_rnn.recurrent_pack.default
_PACKED = torch.ops.onnx2torch_rnn.recurrent_packed.default
_VERSION = operator.attrgetter("_version")
PACKS = PackCache()


def run(X, weights, config, sequence_lens=None, initial_h=None, initial_c=None, mask=None, differentiable=False,
        outputs=None, eager_native=False, kept: Kept | None = None):
    """The op (or its differentiable variant), with the outputs the config does not ask for as None (``outputs``:
    the config's, when the caller has them at hand). ``eager_native``: the caller knows this is eager inference on
    the native kernel, which then runs without the op's own dispatch (a few microseconds a call), on the packed
    weights the caller holds in ``kept`` (if given)."""
    args = (X, weights, config, sequence_lens, initial_h, initial_c, mask)
    y, y_h, y_c = (caller_threads(native, *args, kept) if eager_native else
                   caller_threads(_DIFFERENTIABLE if differentiable else _RECURRENT, *args))
    wanted = decode(config)[1].outputs if outputs is None else outputs
    return y if wanted[0] else None, y_h if wanted[1] else None, y_c if wanted[2] else None


# ---- autograd ---------------------------------------------------------------------------------------------------

@torch.library.custom_op("onnx2torch_rnn::recurrent_backward", mutates_args=(),
                         schema=f"(Tensor?[] grads, {_SIGNATURE}, bool[] needs) -> Tensor[]")
def recurrent_backward(grads, X, weights, config, sequence_lens, initial_h, initial_c, mask, needs):
    """Gradients of the differentiable inputs [X, *weights, initial_h, initial_c] flagged in ``needs``: the forward
    recomputed under torch.func.vjp (the public way to differentiate inside an op's kernel, where autograd is off).
    The cell loop runs the recomputation, fast-path weights included: torch's packed-sequence kernels cannot run
    under functorch transforms."""
    cell, cfg, fmt = decode(config)
    differentiable = [X, *weights, initial_h, initial_c]
    chosen = [k for k, need in enumerate(needs) if need]

    def forward(*values):
        args = list(differentiable)
        for k, value in zip(chosen, values, strict=True):
            args[k] = value
        named = weights_by_name(config, args[1:-2])
        if fmt == "torch":
            named["W"], named["R"], named["B"] = onnx_weights(cell, named.pop("torch_weights"), cfg.num_directions)
        outputs = recurrent(cell, cfg, args[0], sequence_lens=sequence_lens, initial_h=args[-2], initial_c=args[-1],
                            mask=mask, **named)
        return tuple(X.new_zeros(()) if o is None else o for o in outputs)

    outputs, vjp = torch.func.vjp(forward, *(differentiable[k] for k in chosen))
    cotangents = tuple(torch.zeros_like(o) if g is None or g.numel() == 0 or not wanted else g.to(o.dtype)
                       for o, g, wanted in zip(outputs, grads, cfg.outputs, strict=True))
    found = vjp(cotangents)
    return _owned(list(found), [X, *weights, sequence_lens, initial_h, initial_c, *grads])


@recurrent_backward.register_fake
def _(grads, X, weights, config, sequence_lens, initial_h, initial_c, mask, needs):
    differentiable = [X, *weights, initial_h, initial_c]
    return [torch.empty_like(t, memory_format=torch.contiguous_format)
            for t, need in zip(differentiable, needs, strict=True) if need]


def _setup_context(ctx, inputs, output):
    X, weights, config, sequence_lens, initial_h, initial_c, mask = inputs
    ctx.config = config
    ctx.needs = [t is not None and t.requires_grad for t in (X, *weights, initial_h, initial_c)]
    ctx.save_for_backward(X, *weights, sequence_lens, initial_h, initial_c, mask)


def _backward(ctx, grad_y, grad_h, grad_c):
    X, *weights, sequence_lens, initial_h, initial_c, mask = ctx.saved_tensors
    grads = iter(recurrent_backward([grad_y, grad_h, grad_c], X, weights, ctx.config, sequence_lens, initial_h,
                                    initial_c, mask, ctx.needs) if any(ctx.needs) else ())
    flat = [next(grads) if need else None for need in ctx.needs]
    return flat[0], flat[1:-2], None, None, flat[-2], flat[-1], None


torch.library.register_autograd(DIFFERENTIABLE_OP_NAME, _backward, setup_context=_setup_context)


# ---- torch.onnx.export(dynamo=True) ---------------------------------------------------------------------------------

def onnx_translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``: the op becomes the ONNX LSTM, GRU
    or RNN node it came from (every attribute restored; fast-path weights reordered back to the ONNX gate order,
    which the exporter's optimiser folds into the initializers; a masked one: masked_onnx's placeholder, which
    to_onnx expands into a Loop). Also the stable sort of converted TopK nodes, which
    the exporter lacks: ONNX TopK over the whole axis is one (equal values keep index order)."""
    ops = torch.ops.onnx2torch_rnn
    return {ops.recurrent.default: _to_onnx, ops.recurrent_differentiable.default: _to_onnx,
            torch.ops.aten.sort.stable: _stable_sort_to_onnx}


def _stable_sort_to_onnx(data, *, stable=None, dim=-1, descending=False):
    from onnxscript import opset18 as op

    size = op.Gather(op.Shape(data), op.Constant(value_ints=[dim]), axis=0)
    return op.TopK(data, size, axis=dim, largest=int(descending), sorted=1)


def _onnx_weights(op, cell, cfg, fmt: str, weights):
    """W, R, B, P as ONNX values (fast-path weights: rows reordered to ONNX's gate order, stacked per direction)."""
    if fmt != "torch":
        given = dict(zip(fmt, weights, strict=True))
        return [given.get(letter) for letter in "WRBP"]
    directions = cfg.num_directions
    per, hidden = len(weights) // directions, weights[1].shape[-1]
    rows = op.Constant(value_ints=[cell.torch_gates.index(g) * hidden + j for g in cell.onnx_gates
                                   for j in range(hidden)])

    def onnx_layout(k: int):  # the k-th weight of each direction, rows in ONNX gate order, stacked: [D, gH, ...]
        return op.Concat(*(op.Unsqueeze(op.Gather(w, rows, axis=0), [0]) for w in weights[k::per]), axis=0)

    B = op.Concat(onnx_layout(2), onnx_layout(3), axis=1) if per == 4 else None
    return [onnx_layout(0), onnx_layout(1), B, None]


def _onnx_attributes(cell, cfg, hidden) -> dict:
    acts = cfg.onnx_activations()
    attributes = {"hidden_size": hidden, "direction": cfg.direction, "activations": [a.name for a in acts]}
    for key, values in (("activation_alpha", [a.alpha for a in acts]), ("activation_beta", [a.beta for a in acts])):
        if any(v is not None for v in values):
            attributes[key] = [v for v in values if v is not None]
    if cfg.clip is not None:
        attributes["clip"] = cfg.clip
    if cell.op_type == "LSTM":
        attributes["input_forget"] = int(cfg.input_forget)
    if cell.op_type == "GRU":
        attributes["linear_before_reset"] = int(cfg.linear_before_reset)
    return attributes


def _masked(cell, cfg, inputs, mask, hidden):
    """The placeholder node of a masked recurrence (one direction, no P): masked_onnx.SCHEMA."""
    from onnxscript import values

    from .masked_onnx import DOMAIN, SCHEMA

    if len(inputs) > 7 and inputs[7] is not None:
        raise NotImplementedError(f"a masked {cell.op_type} with peepholes has no ONNX Loop here")
    acts = cfg.onnx_activations()
    node = values.Op(values.Opset(DOMAIN, 1), SCHEMA.name, SCHEMA)
    outputs = node(*inputs[:4], *inputs[5:7], *([None] if cell.op_type != "LSTM" else []), mask,
                   cell=cell.op_type, hidden_size=hidden, activations=[a.name for a in acts],
                   activation_alpha=[a.alpha or 0.0 for a in acts], activation_beta=[a.beta or 0.0 for a in acts],
                   linear_before_reset=int(cfg.linear_before_reset), mask_output=cfg.mask_output)
    return outputs if cell.has_cell_state else outputs[:2]


def _to_onnx(X, weights, config, sequence_lens, initial_h, initial_c, mask):
    from onnx import TensorProto
    from onnxscript import opset18 as op  # the exporter's opset; LSTM/GRU/RNN are unchanged from 14 to 22

    cell, cfg, fmt = decode(config)
    if mask is not None and (cfg.direction != "forward" or cfg.clip is not None or cfg.input_forget):
        raise NotImplementedError(f"a masked {cell.op_type} with direction={cfg.direction}, clip={cfg.clip} or "
                                  f"input_forget has no ONNX Loop here")
    float32 = X.dtype == TensorProto.FLOAT

    def as_float(t):  # onnxruntime's LSTM/GRU run float32 only; other dtypes are computed in it and cast back
        return t if t is None or t.dtype == TensorProto.FLOAT else op.Cast(t, to=TensorProto.FLOAT)

    def batch_major(t):  # layout 1 -> 0 (onnxruntime rejects layout=1)
        t = as_float(t)
        return t if t is None or not cfg.layout else op.Transpose(t, perm=[1, 0, 2])

    W, R, B, P = (as_float(t) for t in _onnx_weights(op, cell, cfg, fmt, weights))
    lens = None if sequence_lens is None else op.Cast(sequence_lens, to=TensorProto.INT32)
    inputs = [batch_major(X), W, R, B, lens, batch_major(initial_h)]
    if cell.op_type == "LSTM":
        inputs += [batch_major(initial_c), P]
    if mask is not None:  # no ONNX op: a Loop over the cell's step (masked_onnx.expand writes it after export)
        outputs = _masked(cell, cfg, inputs, op.Transpose(mask, perm=[1, 0]) if cfg.layout else mask,
                          weights[1].shape[-1])
    else:
        outputs = getattr(op, cell.op_type)(*inputs, **_onnx_attributes(cell, cfg, weights[1].shape[-1]))
    if not cell.has_cell_state:
        outputs = (*outputs, None)
    results = []
    for out, perm in zip(outputs, ([2, 0, 1, 3], [1, 0, 2], [1, 0, 2]), strict=True):
        if out is None:
            results.append(op.Constant(value_floats=[]) if float32 else op.CastLike(op.Constant(value_floats=[]), X))
            continue
        out = op.Transpose(out, perm=perm) if cfg.layout else out
        results.append(out if float32 else op.CastLike(out, X))
    return tuple(results)
