"""The recurrent computation as one opaque torch op, for torch.compile, torch.export and torch.onnx.export.

Why a custom op (``torch.library``) rather than letting Dynamo trace ``recurrent``:
- Dynamo refuses to wrap ``nn.LSTM``/``nn.GRU``/``nn.RNN`` unless the global ``torch._dynamo.config.allow_rnn`` is
  set, ``pack_padded_sequence`` and the data-dependent range check on ``sequence_lens`` break the graph, and a Python
  loop over time unrolls and specialises on the sequence length: no single graph, no dynamic length.
- As an opaque op the whole recurrence is one graph node. Its fake implementation derives the output shapes from the
  input shapes (symbolic sizes welcome), so batch size and sequence length stay dynamic; its real implementation is
  the eager ``recurrent`` function, so compiled code runs the recurrence exactly as fast (and with exactly the same
  numbers) as eager, and the ``sequence_lens`` check runs inside the op.
- A higher-order scan (``torch._higher_order_ops.scan``, private and experimental in torch 2.13) would put the cell
  into the graph, but it cannot use torch's fused LSTM/GRU kernels (our fast path), and the per-row reversal and
  packing for sequence_lens would have to be rebuilt around it.

Autograd: a second custom op (``recurrent_backward``) recomputes the forward with eager autograd and returns the
input gradients of torch.autograd.grad: one extra forward in the backward, no activations saved. Eager mode never
sees the op: ``Recurrent.forward`` calls it only while ``torch.compiler.is_compiling()`` (Dynamo tracing and
torch.export), so eager speed and eager autograd are untouched.

Static configuration travels as primitive op arguments: ``config`` is a JSON encoding of the cell type, the
``RecurrentConfig`` and the path (decoded once per distinct string, so an exported program needs no registry, only
``import onnx2torch_rnn``), and ``static_lens`` holds sequence_lens baked in at conversion. ``onnx_translation_table``
turns the op back into the ONNX node for ``torch.onnx.export(dynamo=True)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import operator

import torch
from torch import Tensor

# The op takes the weights as one list: the flat nn.LSTM/GRU/RNN weights (fast path) or those of W, R, B, P that are
# present (exact path; ``present`` says which: a None inside a Tensor?[] would hide the list from custom-op autograd).
# Outputs are always (Y, Y_h, Y_c): an output the node does not ask for is an empty tensor.
_SIGNATURE = ("Tensor X, Tensor[] weights, bool[] present, Tensor? sequence_lens, Tensor? initial_h, "
              "Tensor? initial_c, str config, int[]? static_lens")
OP_NAME = "onnx2torch_rnn::recurrent"


def config_key(cell, cfg, fast: bool) -> str:
    """The static description of a node as a string the op can carry (and decode without any registry)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    fields["activations"] = [[[a.name, a.alpha, a.beta] for a in role] for role in cfg.activations]
    return json.dumps({"cell": cell.op_type, "fast": fast, "config": fields}, sort_keys=True)


@functools.cache
def _decode(key: str):
    from .recurrent import GRU_CELL, LSTM_CELL, RNN_CELL, Activation, RecurrentConfig

    data = json.loads(key)
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()}
    fields["activations"] = tuple(tuple(Activation(*a) for a in role) for role in data["config"]["activations"])
    cell = {c.op_type: c for c in (LSTM_CELL, GRU_CELL, RNN_CELL)}[data["cell"]]
    return cell, RecurrentConfig(**fields), data["fast"]


def _all_weights(weights, present) -> list:
    """The weights with None where absent (``present`` is all True on the fast path)."""
    given = iter(weights)
    return [next(given) if p else None for p in present]


def _run(key: str, X, weights, present, sequence_lens, initial_h, initial_c, static_lens):
    """The eager computation: ``recurrent`` with the op's arguments; outputs not asked for are None."""
    from .recurrent import recurrent

    cell, cfg, fast = _decode(key)
    lens = sequence_lens if sequence_lens is not None else None if static_lens is None else tuple(static_lens)
    if fast:
        return recurrent(cell, cfg, X, None, None, None, lens, initial_h, initial_c, None, torch_weights=weights)
    W, R, B, P = _all_weights(weights, present)
    return recurrent(cell, cfg, X, W, R, B, lens, initial_h, initial_c, P)


def _owned(outputs, inputs) -> list[Tensor]:
    """Custom-op outputs must be fresh, contiguous tensors: the fake implementation promises contiguous strides,
    and no output may alias an input or another output (with zero steps Y_h could be initial_h itself; the
    gradients of an LSTM's two biases are one tensor)."""
    storages = {t.untyped_storage().data_ptr() for t in inputs if t is not None and t.numel()}
    result = []
    for out in outputs:
        if out.numel() and out.untyped_storage().data_ptr() in storages:
            out = out.clone()
        out = out.contiguous()
        storages.add(out.untyped_storage().data_ptr())
        result.append(out)
    return result


def _output_shapes(key: str, X, weights) -> list[tuple]:
    """Shapes of (Y, Y_h, Y_c) from the input shapes alone (symbolic sizes welcome); (0,) for an output not asked
    for."""
    cfg = _decode(key)[1]
    hidden = weights[1].shape[-1]  # weight_hh_l0 [gH, H] on the fast path, R [D, gH, H] on the exact path
    directions = cfg.num_directions
    if cfg.layout:
        batch, steps = X.shape[0], X.shape[1]
        shapes = [(batch, steps, directions, hidden), (batch, directions, hidden), (batch, directions, hidden)]
    else:
        steps, batch = X.shape[0], X.shape[1]
        shapes = [(steps, directions, batch, hidden), (directions, batch, hidden), (directions, batch, hidden)]
    return [shape if wanted else (0,) for shape, wanted in zip(shapes, cfg.outputs, strict=True)]


@torch.library.custom_op(OP_NAME, mutates_args=(), schema=f"({_SIGNATURE}) -> (Tensor, Tensor, Tensor)")
def recurrent_op(X, weights, present, sequence_lens, initial_h, initial_c, config, static_lens):
    outputs = _run(config, X, weights, present, sequence_lens, initial_h, initial_c, static_lens)
    outputs = [X.new_empty(0) if o is None else o for o in outputs]
    return tuple(_owned(outputs, [X, *weights, sequence_lens, initial_h, initial_c]))


@recurrent_op.register_fake
def _(X, weights, present, sequence_lens, initial_h, initial_c, config, static_lens):
    return tuple(X.new_empty(shape) for shape in _output_shapes(config, X, weights))


# ---- autograd ---------------------------------------------------------------------------------------------------


_AUTOGRAD_KEYS = functools.reduce(operator.or_, (torch._C.DispatchKeySet(key) for key in (
    torch._C.DispatchKey.ADInplaceOrView, torch._C.DispatchKey.AutogradFunctionality,
    torch._C.DispatchKey.AutogradOther, torch._C.DispatchKey.AutogradNestedTensor)))


@contextlib.contextmanager
def _autograd_in_kernel():
    """A custom op's kernel runs below the autograd dispatch keys, so ops in it record no graph: re-enable exactly
    those keys (and grad mode: compiled backward graphs run without it, and torch's CPU LSTM kernel then takes an
    inference-only path). torch.func.vjp would need no private guard, but it cannot run pack_padded_sequence (its
    batch_sizes become functorch wrappers without storage); this way the backward is eager autograd itself."""
    exclude = torch._C._dispatch_tls_local_exclude_set() - _AUTOGRAD_KEYS
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


@torch.library.custom_op("onnx2torch_rnn::recurrent_backward", mutates_args=(),
                         schema=f"(Tensor?[] grads, {_SIGNATURE}, bool[] needs) -> Tensor[]")
def recurrent_backward(grads, X, weights, present, sequence_lens, initial_h, initial_c, config, static_lens, needs):
    """Gradients of the differentiable inputs [X, *weights, initial_h, initial_c] flagged in ``needs``: the forward
    recomputed with autograd, then torch.autograd.grad."""
    with _autograd_in_kernel():
        args = [t if t is None or not need else t.detach().requires_grad_()
                for t, need in zip([X, *weights, initial_h, initial_c], needs, strict=True)]
        outputs = _run(config, args[0], args[1:-2], present, sequence_lens, args[-2], args[-1], static_lens)
        pairs = [(out, grad) for out, grad in zip(outputs, grads, strict=True)
                 if out is not None and grad is not None and out.requires_grad]
        chosen = [t for t, need in zip(args, needs, strict=True) if need]
        found = torch.autograd.grad([o for o, _ in pairs], chosen, [g.to(o.dtype) for o, g in pairs],
                                    allow_unused=True) if pairs else [None] * len(chosen)
    result = [torch.zeros_like(t) if g is None else g for t, g in zip(chosen, found, strict=True)]
    return _owned(result, [X, *weights, sequence_lens, initial_h, initial_c, *grads])


@recurrent_backward.register_fake
def _(grads, X, weights, present, sequence_lens, initial_h, initial_c, config, static_lens, needs):
    differentiable = [X, *weights, initial_h, initial_c]
    return [torch.empty_like(t, memory_format=torch.contiguous_format)
            for t, need in zip(differentiable, needs, strict=True) if need]


def _setup_context(ctx, inputs, output):
    X, weights, present, sequence_lens, initial_h, initial_c, config, static_lens = inputs
    ctx.config, ctx.static_lens, ctx.present = config, static_lens, present
    ctx.needs = [t is not None and t.requires_grad for t in (X, *weights, initial_h, initial_c)]
    ctx.save_for_backward(X, *weights, sequence_lens, initial_h, initial_c)


def _backward(ctx, grad_y, grad_h, grad_c):
    X, *weights, sequence_lens, initial_h, initial_c = ctx.saved_tensors
    grads = iter(recurrent_backward([grad_y, grad_h, grad_c], X, weights, ctx.present, sequence_lens, initial_h,
                                    initial_c, ctx.config, ctx.static_lens, ctx.needs) if any(ctx.needs) else ())
    flat = [next(grads) if need else None for need in ctx.needs]
    return flat[0], flat[1:-2], None, None, flat[-2], flat[-1], None, None


recurrent_op.register_autograd(_backward, setup_context=_setup_context)


class FastWeights:
    """The flat weights of a Recurrent module's nn.LSTM/GRU/RNN, for traced code: Dynamo refuses to wrap those
    modules (unless the global torch._dynamo.config.allow_rnn is set), so traced code reads the module's own
    parameter dict through this object instead. Not a dict attribute: torch.export snapshots and restores module
    attributes, which would replace a dict with a copy; this object is a pytree leaf and stays itself."""

    def __init__(self, rnn: torch.nn.RNNBase):
        self.parameters, self.names = rnn._parameters, tuple(rnn._flat_weights_names)

    def __call__(self) -> list[Tensor]:
        return [self.parameters[name] for name in self.names]


def traced_recurrent(module, X, weights, sequence_lens, initial_h, initial_c):
    """What ``Recurrent.forward`` calls while compiling/exporting: the op, its empty outputs mapped back to None."""
    static = None if module.sequence_lens is None or sequence_lens is not None else list(module.sequence_lens)
    present = [w is not None for w in weights]
    outputs = recurrent_op(X, [w for w in weights if w is not None], present, sequence_lens, initial_h, initial_c,
                           module.op_key, static)
    return tuple(o if wanted else None for o, wanted in zip(outputs, module.config.outputs, strict=True))


# ---- torch.onnx.export(dynamo=True) ---------------------------------------------------------------------------------


def onnx_translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``: the op becomes the ONNX LSTM, GRU
    or RNN node it came from (every attribute restored; fast-path weights reordered back to the ONNX gate order,
    which the exporter's optimiser folds into the initializers). Also the stable sort of converted TopK nodes, which
    the exporter lacks: ONNX TopK over the whole axis is one (equal values keep index order)."""
    return {torch.ops.onnx2torch_rnn.recurrent.default: _to_onnx, torch.ops.aten.sort.stable: _stable_sort_to_onnx}


def _stable_sort_to_onnx(data, *, stable=None, dim=-1, descending=False):
    from onnxscript import opset18 as op

    size = op.Gather(op.Shape(data), op.Constant(value_ints=[dim]), axis=0)
    return op.TopK(data, size, axis=dim, largest=int(descending), sorted=1)


def _to_onnx(X, weights, present, sequence_lens, initial_h, initial_c, config, static_lens):
    from onnx import TensorProto
    from onnxscript import opset18 as op  # the exporter's opset; LSTM/GRU/RNN are unchanged from 14 to 22

    cell, cfg, fast = _decode(config)
    directions = cfg.num_directions
    if fast:  # per direction [w_ih, w_hh, (b_ih, b_hh)] in torch's gate order -> W, R, B in ONNX's
        per, hidden = len(weights) // directions, weights[1].shape[-1]
        rows = op.Constant(value_ints=[cell.torch_gates.index(g) * hidden + j for g in cell.onnx_gates
                                       for j in range(hidden)])

        def onnx_layout(k: int):  # the k-th weight of each direction, rows in ONNX gate order, stacked: [D, gH, ...]
            return op.Concat(*(op.Unsqueeze(op.Gather(w, rows, axis=0), [0]) for w in weights[k::per]), axis=0)

        W, R = onnx_layout(0), onnx_layout(1)
        B = op.Concat(onnx_layout(2), onnx_layout(3), axis=1) if per == 4 else None
        P = None
    else:
        W, R, B, P = _all_weights(weights, present)
        hidden = R.shape[-1]
    float32 = X.dtype == TensorProto.FLOAT

    def as_float(t):  # onnxruntime's LSTM/GRU run float32 only; other dtypes are computed in it and cast back
        return t if t is None or t.dtype == TensorProto.FLOAT else op.Cast(t, to=TensorProto.FLOAT)

    def batch_major(t):  # layout 1 -> 0 (onnxruntime rejects layout=1)
        t = as_float(t)
        return t if t is None or not cfg.layout else op.Transpose(t, perm=[1, 0, 2])

    W, R, B, P = (as_float(t) for t in (W, R, B, P))

    if sequence_lens is not None:
        lens = op.Cast(sequence_lens, to=TensorProto.INT32)
    elif static_lens is not None:
        lens = op.Cast(op.Constant(value_ints=list(static_lens)), to=TensorProto.INT32)
    else:
        lens = None
    acts = [role[d] for d in range(directions) for role in cfg.activations]
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
    inputs = [batch_major(X), W, R, B, lens, batch_major(initial_h)]
    if cell.op_type == "LSTM":
        inputs += [batch_major(initial_c), P]
    outputs = getattr(op, cell.op_type)(*inputs, **attributes)
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
