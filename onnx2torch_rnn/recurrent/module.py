"""OnnxLSTM / OnnxGRU / OnnxRNN: the nn.Modules the converters create. Parameters, configuration, choice of path.

Constant weights become parameters: of a real nn.LSTM / nn.GRU / nn.RNN submodule (``rnn``, torch's gate order) on
the fast path, when torch's kernel computes exactly the ONNX numbers (cells.py: ``torch_mode``), else the ONNX-layout
``W``, ``R``, ``B``, ``P``. ``forward`` picks the path per call:

- inference on CPU with the native kernel built, torch.compile and torch.export: the ``onnx2torch_rnn::recurrent``
  op (op.py), run by the native kernel on CPU; while compiling, its differentiable variant when some input or
  weight requires grad;
- otherwise (eager training, torch.jit tracing, other devices, no kernel): ``runtime.recurrent``, which autograd
  differentiates (torch's own kernels on the fast path) and which the TorchScript exporter records op by op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..modules.common import Module
from ..torch_compat import buffer_dict, flat_weight_names, has_forward_hooks, parameter_dict
from . import kernel, op
from .cells import GRU_CELL, LSTM_CELL, OUTPUT_NAMES, RNN_CELL, STATE_DTYPES, Cell, encode, make_config
from .runtime import needs_grad, recurrent, torch_layers


class FastWeights:
    """The flat weights of a Recurrent module's nn.LSTM/GRU/RNN, for traced code: Dynamo refuses to wrap those
    modules (unless the global torch._dynamo.config.allow_rnn is set), so traced code reads the module's own
    parameter dict through this object instead. Not a dict attribute: torch.export snapshots and restores module
    attributes, which would replace a dict with a copy; this object is a pytree leaf and stays itself."""

    def __init__(self, rnn: nn.RNNBase):
        self.parameters, self.names = parameter_dict(rnn), flat_weight_names(rnn)

    def __call__(self) -> list[Tensor]:
        return [self.parameters[name] for name in self.names]


def native_inference(X: Tensor, tensors: Iterable[Tensor | None], kept: op.Kept | None = None) -> bool:
    """Whether an eager call runs the native kernel: nothing needs a gradient (neither X nor ``tensors``: the
    kernel's ops have no derivative), X is on CPU, the kernel is loaded (where ``kept``, the module's packed
    weights, holds some, it is: once loaded, it stays) and no torch.jit trace is recording (the TorchScript
    exporter records the Python path op by op)."""
    return (not (torch.is_grad_enabled() and needs_grad((X, *tensors))) and X.is_cpu
            and ((kept is not None and kept.made) or kernel.loaded()) and not torch.jit.is_tracing())


@dataclasses.dataclass(frozen=True)
class StackOps:
    """How one native stack op runs a StackedRecurrent's layers of one kind (``StackedRecurrent._native``):
    ``forward`` the layer forward it computes (a layer whose class overrides it runs on its own), ``pack(weights,
    counts, configs, key)`` its packed weights and numbers (``weights`` the layers' ``stack_sources`` in turn, None
    where absent; ``counts`` how many each layer has; ``key`` float64, the stack's four flags, its initial_h and
    initial_c; None where the kernel is not loaded), ``run(x, packed, numbers, lengths, states)`` the op: (y, h_n,
    c_n), ``states`` the stack's state inputs; ``dtypes`` the x dtypes it takes (None: any)."""

    forward: Callable
    pack: Callable
    run: Callable
    dtypes: tuple[torch.dtype, ...] | None = None


def _pack_float_stack(weights: list[Tensor | None], counts: list[int], configs: tuple[str, ...],
                      key: tuple) -> tuple[Tensor, Tensor]:
    present, kept, start = [], [], 0
    for count in counts:
        own = [w for w in weights[start:start + count] if w is not None]
        present += own
        kept.append(len(own))
        start += count
    return op.pack_stack(present, tuple(kept), configs, key[0], key[1:5], op.state_numbers(*key[5:]))


def _run_float_stack(*args):
    return op.run_stack(*args)  # looked up at each call (tests observe op.run_stack)


class Recurrent(Module):
    """Shared module for ONNX LSTM/GRU/RNN; subclasses only name their cell.

    ``__init__`` takes the ONNX attributes, the constant inputs (W, R, B, P as tensors; sequence_lens as ints), which
    outputs to compute and, for nodes that take a per-step mask (fused Keras layers), what a masked step outputs.
    ``forward`` takes the node's inputs in ONNX order, then the mask; a weight given at run time replaces the absent
    parameter.
    """

    cell: ClassVar[Cell]

    def __init__(self, *, hidden_size: int | None = None, direction: str = "forward", layout: int = 0,
                 activations: Sequence[str] | None = None, activation_alpha: Sequence[float] | None = None,
                 activation_beta: Sequence[float] | None = None, clip: float | None = None, input_forget: int = 0,
                 linear_before_reset: int = 0, outputs: Sequence[bool] | None = None,
                 W: Tensor | None = None, R: Tensor | None = None, B: Tensor | None = None, P: Tensor | None = None,
                 sequence_lens: Sequence[int] | None = None, runtime_weights: Sequence[str] = (),
                 dtype: torch.dtype = torch.float32, mask_output: str | None = None, state_dtype: str | None = None):
        super().__init__()
        self.config = make_config(self.cell, hidden_size=hidden_size, direction=direction, layout=layout,
                                  activations=activations, activation_alpha=activation_alpha,
                                  activation_beta=activation_beta, clip=clip, input_forget=input_forget,
                                  linear_before_reset=linear_before_reset, outputs=outputs, mask_output=mask_output,
                                  state_dtype=state_dtype)
        self.num_outputs = self.cell.num_outputs if outputs is None else len(outputs)
        self.sequence_lens = None if sequence_lens is None else tuple(int(v) for v in sequence_lens)
        # the op takes lengths as a tensor; not persistent: they are a constructor argument, not a weight
        self.register_buffer("static_lens", None if sequence_lens is None else
                             torch.tensor(self.sequence_lens, dtype=torch.int64), persistent=False)
        self.runtime_weights = tuple(runtime_weights)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        mode = None if state_dtype else self.cell.torch_mode(self.config)  # torch's kernels keep float32 states
        constant_weights = W is not None and R is not None and not {"B", "P"} & set(self.runtime_weights)
        self.fast = mode is not None and constant_weights and (P is None or not bool(P.any()))
        self.torch_mode = mode if self.fast else None  # the torch kernel the fast path runs
        if self.fast:
            self.rnn = self._torch_module(mode, W.to(compute), R.to(compute), None if B is None else B.to(compute))
            W = R = B = P = None  # an all-zero P adds nothing
        for name, value in (("W", W), ("R", R), ("B", B), ("P", P)):  # contiguous: FSDP2 shards no strided one
            self.register_parameter(name, None if value is None else nn.Parameter(value.to(compute).contiguous()))
        present = "torch" if self.fast else "".join(
            k for k in "WRBP" if getattr(self, k) is not None or k in self.runtime_weights)
        self.op_config = encode(self.cell, self.config, present)
        # a state_dtype layer's eager inference runs the kernel one step at a time on this config (states out)
        self._step_config = state_dtype and encode(self.cell, dataclasses.replace(
            self.config, state_dtype=None, outputs=(False, True, self.cell.has_cell_state)), present)
        # the nn.LSTM/GRU/RNN's weights, reachable without touching that module (Dynamo refuses to wrap one)
        self._fast_weights = FastWeights(self.rnn) if self.fast else None
        # the native kernel's packed weights (op.Kept; DynamicQuantizeLSTM's its own): PACKS' lookup costs a small node
        self._packed = op.Kept()
        kernel.load()  # built once per checkout (cached), loaded once per process; the Python path runs without it

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
                initial_c: Tensor | None = None, P: Tensor | None = None, mask: Tensor | None = None):
        weights = self.weights(W, R, B, P)
        compiling = torch.compiler.is_compiling()
        native = not compiling and native_inference(X, (*weights, initial_h, initial_c), self._packed)
        outputs = None
        if native and self.config.state_dtype:  # the kernel keeps float32 states: one step per call
            outputs = self._native_steps(X, weights, sequence_lens, initial_h, initial_c, mask)
        elif compiling or native:
            outputs = self.run_op(X, weights, sequence_lens, initial_h, initial_c, mask, eager_native=native)
        if outputs is None:
            named = ({"torch_weights": weights, "W": None, "R": None} if self.fast
                     else dict(zip("WRBP", weights, strict=True)))
            lens = self.sequence_lens if sequence_lens is None else sequence_lens
            outputs = recurrent(self.cell, self.config, X, sequence_lens=lens, initial_h=initial_h,
                                initial_c=initial_c, mask=mask, **named)
        outputs = outputs[: self.num_outputs]
        return outputs[0] if self.num_outputs == 1 else outputs

    STACK: ClassVar[StackOps] = StackOps(forward, _pack_float_stack, _run_float_stack)  # recurrent_stack (op.py)

    def stack_sources(self) -> list[tuple[dict, str]] | None:
        """Where the stack op reads this layer's weights: (dict, name) pairs, the dicts live (a replaced parameter
        is seen); None where it cannot run this layer."""
        if self.fast:
            return [(self._fast_weights.parameters, name) for name in self._fast_weights.names]
        return [(parameter_dict(self), name) for name in "WRBP"]

    def weights(self, W: Tensor | None = None, R: Tensor | None = None, B: Tensor | None = None,
                P: Tensor | None = None) -> list[Tensor | None]:
        """What the recurrence runs on: the nn.LSTM/GRU/RNN's flat weights on the fast path, else W, R, B, P, a
        weight given at run time replacing an absent parameter."""
        # Parameters are read from their dict: nn.Module's attribute lookup costs about half a microsecond each,
        # which a small recurrent node notices (onnxruntime runs one in 20-40 us).
        if self.fast:
            return self._fast_weights()
        own = parameter_dict(self)
        return [given if own[name] is None else own[name] for name, given in (("W", W), ("R", R), ("B", B), ("P", P))]

    def _native_steps(self, X: Tensor, weights: list[Tensor | None], sequence_lens, initial_h, initial_c, mask):
        """(Y, Y_h, Y_c) of a state_dtype layer in eager inference, by the native kernel one step at a time: each
        step's states come back in X's dtype, rounded as onnxruntime carries a Loop's. None (the Python loop runs)
        unless the layer has one direction and layout 0, X is in the states' dtype, and there is no mask or
        length."""
        cfg = self.config
        if (mask is not None or sequence_lens is not None or self.sequence_lens is not None or cfg.layout
                or cfg.num_directions != 1 or X.dtype != STATE_DTYPES[cfg.state_dtype] or not X.shape[0]):
            return None
        present, h, c, ys = [w for w in weights if w is not None], initial_h, initial_c, [None] * X.shape[0]
        for t in range(X.shape[0] - 1, -1, -1) if cfg.direction == "reverse" else range(X.shape[0]):
            _, h, c = op.run(X[t:t + 1], present, self._step_config, None, h, c, None,
                             outputs=(False, True, self.cell.has_cell_state), eager_native=True, kept=self._packed)
            ys[t] = h
        return (torch.stack(ys) if cfg.outputs[0] else None, h if cfg.outputs[1] else None,
                c if cfg.outputs[2] else None)

    def run_op(self, X: Tensor, weights: list[Tensor | None], sequence_lens: Tensor | None = None,
               initial_h: Tensor | None = None, initial_c: Tensor | None = None, mask: Tensor | None = None,
               eager_native: bool = False):
        """(Y, Y_h, Y_c) by the recurrent op (op.py): the native kernel on CPU, one graph node while compiling (its
        differentiable variant when something needs a gradient); None for an output not asked for. ``eager_native``:
        eager inference on the native kernel (``native_inference``)."""
        differentiable = not eager_native and needs_grad((X, *weights, initial_h, initial_c))
        lens = buffer_dict(self)["static_lens"] if sequence_lens is None else sequence_lens
        return op.run(X, [w for w in weights if w is not None], self.op_config, lens, initial_h, initial_c, mask,
                      differentiable, self.config.outputs, eager_native, self._packed)

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
        if cfg.mask_output is not None:
            parts.append(f"mask_output={cfg.mask_output!r}")
        if cfg.state_dtype is not None:
            parts.append(f"state_dtype={cfg.state_dtype!r}")
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


class StackedRecurrent(Module):
    """Recurrent layers run in turn, each reading the previous layer's output with its directions side by side
    (Y [T, D, N, H] -> [T, N, D*H]): the multi-layer network that exporters write as one node per layer with glue
    between them (``passes/stacked.py`` recognises it). Each layer is a Recurrent module with its own path choice;
    in eager inference on the native kernel the whole stack is one op instead (``_native``).

    ``forward(x, *states)``: x is [T, N, I] ([N, T, I] with ``batch_first``). Layer l's initial state is
    ``initial_h[l]`` / ``initial_c[l]``: None (zeros) or (k, start, end), rows start:end of ``states[k]`` (None, None:
    all of it). With ``lengths``, the last argument is every layer's sequence_lens. Returns, as ``outputs`` asks: y,
    the last layer's output ([T, N, D*H]; [N, T, D*H] with ``batch_first_output``; its Y as is, [T, D, N, H],
    without ``merge_output``), then h_n and c_n, the layers' Y_h and Y_c concatenated (the last layer's alone with
    ``last_states``, as paddle2onnx writes them; [N, H] with ``squeeze_states``, where they are one direction's, as
    Keras's return_state gives them).
    With ``window``, one (start, stop) per direction of the first layer, that direction reads ``x[start:stop]`` only
    (an unrolled layer, ``passes/unrolled.py``: dynamo's forward reads the first steps it unrolled, its reverse the
    last ones), and x must have those steps, as the unrolled graph requires.
    """

    def __init__(self, layers: Sequence[Recurrent], *, batch_first: bool = False, batch_first_output: bool = False,
                 merge_output: bool = True, initial_h: Sequence[tuple[int, int | None, int | None] | None] = (),
                 initial_c: Sequence[tuple[int, int | None, int | None] | None] = (),
                 outputs: Sequence[bool] = (True,), lengths: bool = False, last_states: bool = False,
                 window: Sequence[tuple[int, int | None]] | None = None, squeeze_states: bool = False):
        super().__init__()
        if window is not None and lengths:
            raise ValueError("a stack reads either a window of x or lengths, not both")
        if squeeze_states and ((len(layers) > 1 and not last_states) or layers[-1].config.direction == "bidirectional"):
            raise ValueError("squeeze_states needs the final states of one direction (last_states, or one layer)")
        self.lengths, self.last_states, self.squeeze_states = lengths, last_states, squeeze_states
        self.window = None if window is None else tuple(tuple(w) for w in window)
        self.layers = nn.ModuleList(layers)
        self.batch_first, self.batch_first_output, self.merge_output = batch_first, batch_first_output, merge_output
        self.initial_h = tuple(initial_h) or (None,) * len(layers)
        self.initial_c = tuple(initial_c) or (None,) * len(layers)
        self.outputs = tuple(outputs)

    def forward(self, x: Tensor, *states: Tensor):
        lengths = states[-1] if self.lengths else None
        sources = states[:-1] if self.lengths else states
        results = self._native(x, lengths, sources)
        if results is None:
            initial_h = [_rows(states, where) for where in self.initial_h]
            initial_c = [_rows(states, where) for where in self.initial_c]
            results = self._layer_by_layer(x, lengths, initial_h, initial_c)
        outputs = self.outputs
        if len(outputs) == 1:
            return results[0] if outputs[0] else None
        results = tuple(r if wanted else None for r, wanted in zip(results, outputs, strict=False))
        if self.squeeze_states:
            results = tuple(r[0] if k and r is not None else r for k, r in enumerate(results))
        return results

    def _layer_by_layer(self, x: Tensor, lengths: Tensor | None, initial_h: list, initial_c: list) -> tuple:
        """(y, h_n, c_n), each layer called as a module (its own path choice: training, compiling, no kernel), or
        all of them as one call of torch's multi-layer kernel where that is the same computation (``_one_call``)."""
        if self.batch_first:
            x = x.transpose(0, 1)
        layers = tuple(self._modules["layers"]._modules.values())  # not self.layers: nn.Module's lookup is slow
        plan = self.__dict__.get("_native_stack")  # not usable: some layer is no Recurrent, so no _one_call either
        if lengths is None and (plan is None or plan.usable) and self._one_call(x):
            return self._torch_layers(x, initial_h, initial_c)
        h_n, c_n, last = [], [], len(layers) - 1
        for index, layer in enumerate(layers):
            args = (lengths, initial_h[index], initial_c[index])
            if index == 0 and self.window is not None:
                y, y_h, y_c = _over_windows(self._layer_module, layer, x, self.window, *args)
            else:
                y, y_h, y_c = self._layer_module(layer, x, *args)
            h_n.append(y_h)
            c_n.append(y_c)
            x = _merged(y) if y is not None and (index < last or self.merge_output) else y
        if x is not None and self.batch_first_output:
            x = x.transpose(0, 1)
        if self.last_states:
            h_n, c_n = h_n[-1:], c_n[-1:]
        return x, _joined(h_n), _joined(c_n)

    def _one_call(self, x: Tensor) -> bool:
        """Whether the layers can run as one call of torch's multi-layer kernel (``runtime.torch_layers``), as
        nn.LSTM(num_layers=L) runs: eager on CPU (no trace, no compile: those record the layers' own ops; on CUDA
        the layers' weights are not one cuDNN buffer), every layer on the fast path with the same torch mode,
        directions (not reverse-only), hidden size, biases and dtype, x's dtype too (a float16 layer's output is
        rounded before the next layer reads it), without hooks or constant lengths; a whole merged Y; steps and rows
        (torch's kernels refuse zero steps); no window."""
        if type(next(iter(self.layers))).forward is not Recurrent.forward or not (
                x.is_cpu and x.numel() and self.window is None and self.merge_output
                and not torch.compiler.is_compiling() and not torch.jit.is_tracing()):
            return False
        kinds = {(layer.torch_mode, layer.config.direction, layer.rnn.hidden_size, layer.rnn.bias,
                  layer.rnn.weight_ih_l0.dtype)
                 if type(layer).forward is Recurrent.forward and layer.fast and not has_forward_hooks(layer)
                 and layer.sequence_lens is None else None for layer in self.layers}
        (kind, *others) = kinds
        return not others and kind is not None and kind[1] != "reverse" and kind[4] == x.dtype

    def _torch_layers(self, x: Tensor, initial_h: list, initial_c: list) -> tuple:
        """(y, h_n, c_n) by ``runtime.torch_layers``."""
        layers = list(self.layers)
        first = layers[0]
        directions, batch, hidden = first.config.num_directions, x.shape[1], first.rnn.hidden_size

        def states(given: list) -> Tensor:  # every layer's [D, N, H], zeros where a layer has none
            return torch.cat([x.new_zeros(directions, batch, hidden) if s is None else s for s in given])

        y, h_n, c_n = torch_layers(first.torch_mode, x,
                                   [w for layer in layers for w in layer.weights()], len(layers), directions == 2,
                                   states(initial_h), states(initial_c) if first.cell.has_cell_state else None)
        if self.last_states:
            h_n, c_n = h_n[-directions:], None if c_n is None else c_n[-directions:]
        return y.transpose(0, 1) if self.batch_first_output else y, h_n, c_n

    def _native(self, x: Tensor, lengths: Tensor | None, sources: tuple[Tensor, ...]) -> tuple | None:
        """(y, h_n, c_n) by the native stack op (op.py: recurrent_stack), the same computation as
        ``_layer_by_layer``, in eager inference on the native kernel, where the Python around each layer (its call,
        the transpositions between layers) costs as much as its kernel at batch 1. None (``_layer_by_layer`` runs)
        unless that is the same computation (``_NativeStack`` decides what it can once per set of layers): no layer
        with hooks (they still run), nothing that needs a gradient, the layers' own constant lengths (if any) all
        the same, the first layer's directions reading the same steps of x (its window). ``sources``: the stack's
        state inputs, whose rows the op reads itself (a slice in Python costs a microsecond)."""
        if torch.compiler.is_compiling() or not x.is_cpu or torch.jit.is_tracing():
            return None
        layers = tuple(self._modules["layers"]._modules.values())  # not self.layers: nn.Module's lookup is slow
        plan = self.__dict__.get("_native_stack")
        if plan is None or plan.layers != layers:
            if not kernel.loaded():
                return None
            plan = self.__dict__["_native_stack"] = _NativeStack(layers)
        if not plan.usable or any(map(has_forward_hooks, layers)):
            return None
        weights = [own[name] for own, name in plan.sources]
        if torch.is_grad_enabled() and needs_grad((x, *weights, *sources)):  # no tuple without grad
            return None
        ops = plan.ops
        if ops.dtypes is not None and x.dtype not in ops.dtypes:
            return None
        if lengths is None and plan.lengths_from is not None:
            if plan.lengths_differ:
                return None
            lengths = buffer_dict(plan.lengths_from)["static_lens"]
        batch_first = self.batch_first
        if self.window is not None:
            x = x.transpose(0, 1) if batch_first else x
            window = _one_window(x, self.window)
            if window is None:
                return None
            x, batch_first = x[window[0]:window[1]], False
        key = (x.dtype == torch.float64, batch_first, self.batch_first_output, self.merge_output, self.last_states,
               self.initial_h, self.initial_c)
        made = plan.kept.get(weights, key, lambda: ops.pack(weights, plan.counts, plan.configs, key))
        if made is None:
            return None
        return ops.run(x, *made, lengths, sources)

    @staticmethod
    def _layer_module(layer: Recurrent, x: Tensor, lengths, initial_h, initial_c) -> tuple:
        # without grad and hooks, the layer's forward itself: nn.Module.__call__ costs as much as a small layer's Python
        call = layer if torch.is_grad_enabled() or has_forward_hooks(layer) else layer.forward
        result = call(x, sequence_lens=lengths, initial_h=initial_h, initial_c=initial_c)
        return (*result, None, None)[:3] if isinstance(result, tuple) else (result, None, None)

    def extra_repr(self) -> str:
        parts = [f"layers={len(self.layers)}"]
        if self.batch_first:
            parts.append("batch_first=True")
        if self.batch_first_output:
            parts.append("batch_first_output=True")
        if not self.merge_output:
            parts.append("merge_output=False")
        if self.lengths:
            parts.append("lengths=True")
        if self.last_states:
            parts.append("last_states=True")
        if self.squeeze_states:
            parts.append("squeeze_states=True")
        if self.window is not None:
            parts.append(f"window={list(self.window)}")
        for name in ("initial_h", "initial_c"):
            if any(where is not None for where in getattr(self, name)):
                parts.append(f"{name}={list(getattr(self, name))}")
        return ", ".join(parts)


class _NativeStack:
    """What StackedRecurrent._native decides once for its layers, not at every call (a batch-1 call notices each
    check): whether a native stack op computes what they do (every layer a Recurrent of one ``STACK`` whose forward
    is that op's, as a converter may give a layer another module, without state_dtype), where each layer's weights
    are read (``stack_sources``), the layers' configs, which layer's constant lengths apply; and the packed weights
    (op.Kept). A copy of the module (deepcopy, pickle) starts without one."""

    __slots__ = ("configs", "counts", "kept", "layers", "lengths_differ", "lengths_from", "ops", "sources", "usable")

    def __init__(self, layers: tuple = ()):
        self.layers, self.usable, self.kept = layers, bool(layers), op.Kept()
        self.sources, self.counts, self.configs, self.lengths_from = [], [], (), None
        self.ops = getattr(layers[0], "STACK", None) if layers else None
        constant_lengths = set()
        for layer in layers:
            sources = (None if getattr(layer, "STACK", None) is not self.ops or type(layer).forward
                       is not self.ops.forward or layer.config.state_dtype else layer.stack_sources())
            if sources is None:
                self.usable = False
                return
            self.sources += sources
            self.counts.append(len(sources))
            self.configs += (layer.op_config,)
            constant_lengths.add(layer.sequence_lens)
            self.lengths_from = layer if layer.sequence_lens is not None else self.lengths_from
        self.lengths_differ = len(constant_lengths) > 1

    def __reduce__(self):
        return _NativeStack, ()


class LoopedRecurrent(Module):
    """One recurrent layer as a loop over time writes it (``passes/loops.py``: tf2onnx's Keras layers): x is
    time-major [T, N, I], the states have no direction axis ([N, H]), the mask is [T, N, 1]; with ``lengths`` the
    last argument is instead each row's length [N] (TF1 dynamic_rnn's sequence_length: step t of row n is masked
    where t >= lengths[n], any length being valid, unlike ONNX's sequence_lens).

    ``forward(x, [initial_h], [initial_c], [mask | lengths])`` returns, as ``outputs`` asks: y [T, N, H], h_n, c_n
    and the last output (y's last step). With zero steps the states are the initial ones (the loop does not run).
    ``x_backwards`` / ``y_backwards``: the loop reads x / writes y from the last step to the first (a Scan's
    directions; the mask or lengths count the loop's steps).
    With ``window`` (start, stop) the layer runs over ``x[start:stop]`` only (an unrolled cell, ``passes/unrolled.py``,
    reads the steps its exporter unrolled), and x must have those steps, as the unrolled graph requires.
    ``time_axis`` is x's and y's time axis: 0, 1 (batch-first: x [N, T, I], y [N, T, H], as torch's loops over
    ``x[:, t]`` stack them), or None: x is one step [N, I] without it (a streaming cell's call) and y is its h [N, H].
    """

    def __init__(self, layer: Recurrent, *, initial_h: bool = False, initial_c: bool = False, mask: bool = False,
                 lengths: bool = False, outputs: Sequence[bool] = (True, False, False, False),
                 x_backwards: bool = False, y_backwards: bool = False,
                 window: tuple[int, int | None] | None = None, time_axis: int | None = 0):
        super().__init__()
        if mask and lengths:
            raise ValueError("a looped layer takes either a mask or lengths, not both")
        self.layer = layer
        self.initial_h, self.initial_c, self.mask, self.lengths = initial_h, initial_c, mask, lengths
        self.outputs = tuple(outputs)
        self.x_backwards, self.y_backwards = x_backwards, y_backwards
        self.window = None if window is None else tuple(window)
        if time_axis not in (0, 1, None):
            raise ValueError(f"time_axis must be 0, 1 or None, got {time_axis!r}")
        self.time_axis = time_axis

    def forward(self, x: Tensor, *args: Tensor):
        x = x.unsqueeze(0) if self.time_axis is None else x.transpose(0, 1) if self.time_axis == 1 else x
        if self.window is not None:
            x = _window(x, self.window)
        args = list(args)
        if self.x_backwards:
            x = x.flip(0)
        h0 = args.pop(0) if self.initial_h else None
        c0 = args.pop(0) if self.initial_c else None
        mask = None
        if self.mask:
            mask = args.pop(0)
            if mask.dim() != 3 or mask.shape[-1] != 1:  # the body broadcast it over the features
                raise ValueError(f"the mask must be [T, N, 1], got {list(mask.shape)}")
            mask = mask.squeeze(-1)
        if self.lengths:
            lengths = args.pop(0)
            mask = (torch.arange(x.shape[0], device=x.device)[:, None] < lengths.to(x.device)[None, :]).expand(
                x.shape[0], x.shape[1])  # one length for every row broadcasts, as in the body
        result = self.layer(x, initial_h=None if h0 is None else h0.unsqueeze(0),
                            initial_c=None if c0 is None else c0.unsqueeze(0), mask=mask)
        y, h, c = (*result, None, None)[:3] if isinstance(result, tuple) else (result, None, None)
        y, h, c = (None if t is None else t[:, 0] if t.dim() == 4 else t[0] for t in (y, h, c))
        if x.shape[0] == 0:  # the loop never ran: its carried values are the initial ones
            h, c = (s if s is None or given is None else given for s, given in ((h, h0), (c, c0)))
        last = None
        if self.outputs[3]:
            last = y[-1] if y.shape[0] else y.new_zeros(y.shape[1:])
        if self.y_backwards and y is not None:
            y = y.flip(0)
        if y is not None and self.time_axis != 0:
            y = y[0] if self.time_axis is None else y.transpose(0, 1)
        results = tuple(r if wanted else None for r, wanted in zip((y, h, c, last), self.outputs, strict=True))
        return results

    def extra_repr(self) -> str:
        flags = [name for name in ("initial_h", "initial_c", "mask", "lengths", "x_backwards", "y_backwards")
                 if getattr(self, name)]
        window = [f"window={self.window}"] if self.window is not None else []
        axis = [f"time_axis={self.time_axis}"] if self.time_axis != 0 else []
        return ", ".join([f"{name}=True" for name in flags] + [f"outputs={list(self.outputs)}"] + window + axis)


class LoopedStack(Module):
    """Looped layers in turn, each reading the previous layer's y: a loop body that runs several cells per step (TF1's
    MultiRNNCell, ``passes/scans.py``). Every layer but the last outputs y.

    ``forward(x, *states, [mask | lengths])``: each layer's given initial states in layer order, then the mask or
    lengths that every layer reads. Returns the last layer's y, then each layer's h_n and c_n (None where that
    layer's ``outputs`` does not ask for them).
    """

    def __init__(self, layers: Sequence[LoopedRecurrent]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor, *args: Tensor):
        args = list(args)
        shared = [args.pop()] if self.layers[0].mask or self.layers[0].lengths else []
        states = []
        for layer in self.layers:
            given = [args.pop(0) for _ in range(layer.initial_h + layer.initial_c)]
            x, h, c, _ = layer(x, *given, *shared)
            states += [h, c]
        return (x, *states)


def _window(x: Tensor, window: tuple[int, int | None]) -> Tensor:
    """Steps start:stop of x, which x must have."""
    _check_steps(x, (window,))
    return x[window[0]:window[1]]


def _check_steps(x: Tensor, windows: Sequence[tuple[int, int | None]]) -> None:
    """x must have the steps every window reads: an unrolled layer reads the steps its exporter unrolled, and the
    unrolled graph fails on fewer."""
    needed = _steps_needed(windows)
    torch._check(x.shape[0] >= needed, lambda: f"the unrolled cell reads {needed} steps: x has fewer")


def _steps_needed(windows: Sequence[tuple[int, int | None]]) -> int:
    return max([0] + [max(-start, stop or 0) for start, stop in windows])  # Dynamo traces no max(default=)


def steps_read(module: nn.Module) -> int:
    """The fewest steps of x that every unrolled layer in ``module`` can run on (the steps its windows read; 0
    without windows)."""
    windows = [w for m in module.modules() if isinstance(m, StackedRecurrent | LoopedRecurrent)
               and m.window is not None for w in (m.window if isinstance(m, StackedRecurrent) else (m.window,))]
    return _steps_needed(windows)


def _one_window(x: Tensor, windows: tuple) -> tuple[int, int | None] | None:
    """The steps of x that every direction reads (``windows[d]``: direction d's), after checking x has them; None
    where they differ. The same steps: windows written alike, or, in eager calls, alike at x's length (dynamo's first
    and last T steps at the length it unrolled). While compiling, x's length may be symbolic: comparing it would
    specialise the program."""
    _check_steps(x, windows)
    if len(set(windows)) == 1 or (not torch.compiler.is_compiling() and len(
            {slice(*w).indices(x.shape[0]) for w in windows}) == 1):
        return windows[0]
    return None


def _over_windows(run, layer: nn.Module, x: Tensor, windows: tuple, *args) -> tuple:
    """A layer whose direction d reads the steps ``windows[d]`` of x: one call where every direction reads the same
    steps (``_one_window``), else one call per direction, each giving that direction's outputs (Y [T, D, N, H], Y_h
    and Y_c [D, N, H])."""
    window = _one_window(x, windows)
    if window is not None:
        return run(layer, x[window[0]:window[1]], *args)
    runs = [run(layer, x[start:stop], *args) for start, stop in windows]
    return tuple(None if first is None else torch.cat([r[k].narrow(axis, d, 1) for d, r in enumerate(runs)], axis)
                 for k, (first, axis) in enumerate(zip(runs[0], (1, 0, 0), strict=True)))


def _merged(y: Tensor) -> Tensor:
    """A layer's Y [T, D, N, H] as the next layer reads it, its directions side by side: [T, N, D*H] (one view
    where D is 1)."""
    return y.squeeze(1) if y.shape[1] == 1 else y.transpose(1, 2).flatten(2)


def _rows(states: tuple[Tensor, ...], where: tuple[int, int | None, int | None] | None) -> Tensor | None:
    """A layer's initial state: rows start:end of ``states[k]`` for ``where`` = (k, start, end), None for zeros."""
    if where is None:
        return None
    k, start, end = where
    return states[k] if start is None and end is None else states[k][start:end]  # all rows: no view to make


def _joined(per_layer: list[Tensor | None]) -> Tensor | None:
    """The layers' final states as one [L*D, N, H] tensor (None when the layers do not compute them)."""
    if per_layer[0] is None:
        return None
    return torch.cat(per_layer) if len(per_layer) > 1 else per_layer[0]
