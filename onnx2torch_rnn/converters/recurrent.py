"""Recurrent ops: LSTM, GRU, RNN.

One converter body for the three ops; the modules of the recurrent runtime (``recurrent/``) share one skeleton and
differ only in their cell description. Constant W, R, B, P become parameters of the module (of a real
nn.LSTM/nn.GRU/nn.RNN on the fast path); weights computed at run time are passed to ``forward`` and gradients flow to
them.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from ..errors import InvalidModelError
from ..node import Converted, OnnxNode
from ..recurrent import InvalidAttribute, OnnxGRU, OnnxLSTM, OnnxRNN, Recurrent
from ..recurrent.validation import INPUTS, InvalidInput, check_lengths_dtype, check_shapes
from ..registry import register_converter

_WEIGHTS = MappingProxyType({"W": 1, "R": 2, "B": 3, "P": 7})  # input index of each weight-like input

_COMMON = """
- Inputs: each optional input may be absent or ''; B and the initial states default to zeros. W, R, B and P may be
  initializers (trainable parameters of the module) or computed at run time (passed to forward; gradients flow).
- sequence_lens, constant or computed at run time, unsorted, 0 allowed: a row stops at its length, Y is zero past
  it, Y_h/Y_c hold the state of its last valid step, the reverse direction runs over each row's own length, and a
  row of length 0 ends in zero states, not initial_h (onnxruntime). Values outside [0, T] raise at run time.
- Shapes (D directions, G gates, H hidden_size, I input size, N batch): W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H],
  P [D, 3*H], initial_h/initial_c [D, N, H] (layout 1: [N, D, H]), sequence_lens [N], X's last dim I. Checked at
  conversion where static (InvalidModelError naming node, input, expected and actual shape) and on what is passed at
  run time (ValueError naming input, expected and actual shape; recurrent/validation.py). sequence_lens must be int32
  (the spec's only type; at run time int64 is accepted too).
- Outputs: any subset, positional. v1's output_sequence only says whether Y may be omitted: either value is
  accepted, and neither changes the numbers.
- direction: forward, reverse, bidirectional. layout 0 and 1 (onnxruntime rejects 1; we follow the spec, checked
  against Transpose + layout 0 + Transpose). hidden_size: inferred from R when missing.
- activations: Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu (x if x > alpha), ScaledTanh, HardSigmoid
  (clamp(alpha*x + beta, 0, 1), not F.hardsigmoid), Elu, Softsign, Softplus (the literal log(1 + exp(x)): inf past
  float overflow, as onnxruntime), and they may differ per direction; unknown names are refused.
- activation_alpha / activation_beta follow onnxruntime: consumed in list order, across directions, only by the
  functions that take them; extra values are ignored; missing ones default to LeakyRelu 0.01, HardSigmoid 0.2/0.5,
  Elu 1.0 and 0 for Affine, ScaledTanh, ThresholdedRelu (the spec's "defaults of the ONNX operators" would give
  Affine and ThresholdedRelu alpha 1).
- Types: float32; float64 (onnxruntime refuses it: checked against a numpy reference); float16 computed in float32
  and cast back, as onnxruntime does; bfloat16 likewise (onnxruntime refuses it: checked against its float32 result).
"""


def _document(summary: str, notes: str):
    """Converter docstring: the summary (operators.md's table), then op notes and the shared notes (Details)."""
    def decorate(converter):
        converter.__doc__ = f"{summary}\n\n{notes.strip()}\n{_COMMON.strip()}"
        return converter
    return decorate


def _convert(node: OnnxNode, ctx, module_class: type[Recurrent]) -> Converted:
    def attr(name: str, default=None):
        # Only attributes of this version's schema are read: any other attribute is refused by the builder.
        return node.attr(name, default) if name in node.schema.attributes else default

    names = {key: node.input(index) for key, index in _WEIGHTS.items()}
    constants = {key: ctx.constant(name) for key, name in names.items()}
    runtime = tuple(key for key, name in names.items() if name is not None and constants[key] is None)

    hidden_size = attr("hidden_size")
    if hidden_size is not None and hidden_size <= 0:
        raise node.unsupported("hidden_size", hidden_size, "must be > 0")

    lens_name = node.input(4)
    lens = ctx.constant(lens_name)
    directions = 2 if attr("direction", "forward") == "bidirectional" else 1
    try:  # what conversion can know of the inputs' shapes and of sequence_lens' dtype (the spec's: int32)
        check_shapes(module_class.cell.gates, directions, attr("layout", 0), hidden_size,
                     {name: ctx.shape(node.input(k)) for k, name in enumerate(INPUTS)})
        check_lengths_dtype(ctx.dtype(lens_name), (torch.int32,))
    except InvalidInput as error:
        value = node.input(INPUTS.index(error.input))
        raise InvalidModelError(f"{node.op_type} node {node.name!r}: input {error.input} ({value!r}) "
                                f"{error.requirement}") from None
    if hidden_size is None:  # taken from R (at run time when R's shape is not static)
        r_shape = ctx.shape(names["R"])
        hidden_size = r_shape[-1] if r_shape and isinstance(r_shape[-1], int) else None
    attr("output_sequence", 0)  # v1: Y optional or not; outputs are positional either way, numbers unchanged
    x_dtype = ctx.dtype(node.input(0)) or next((t.dtype for t in constants.values() if t is not None), torch.float32)
    try:
        module = module_class(
            hidden_size=hidden_size,
            direction=attr("direction", "forward"),  # not the schema default: GRU-1's schema says "foward"
            layout=attr("layout", 0),
            activations=attr("activations"),
            activation_alpha=attr("activation_alpha"),
            activation_beta=attr("activation_beta"),
            clip=attr("clip"),
            input_forget=attr("input_forget", 0),
            linear_before_reset=attr("linear_before_reset", 0),
            outputs=[name is not None for name in node.outputs],
            **constants,
            sequence_lens=None if lens is None else lens.tolist(),
            runtime_weights=runtime,
            dtype=x_dtype,
        )
    except InvalidAttribute as error:
        raise node.unsupported(error.attribute, error.value, error.reason) from None
    inputs = [node.input(0), *(names[k] if k in runtime else None for k in ("W", "R", "B")),
              None if lens is not None else lens_name, node.input(5), node.input(6),
              names["P"] if "P" in runtime else None]
    return Converted(module, inputs)


@register_converter("LSTM", (1, 7, 14, 22))
@_document(
    "Every input, attribute and output, exact to onnxruntime. nn.LSTM where exact, else an exact cell loop.",
    """
- Fast path: a real nn.LSTM holding W, R, B reordered once (iofc -> ifgo) when they are constants, activations are
  the defaults, clip is absent, input_forget=0 and P is absent or all zero. Otherwise an exact cell loop.
- P (peepholes, order i, o, f): the i and f terms use C(t-1), the o term C(t). input_forget=1: f = 1 - i.
- clip (> 0; onnxruntime rejects <= 0) clamps the i, f, c, o pre-activations after bias and peephole terms (as
  onnxruntime); C(t) itself is not clipped.
- activations: 3 per direction (f, g, h), names case-insensitive (onnxruntime).
""")
def lstm(node: OnnxNode, ctx) -> Converted:
    return _convert(node, ctx, OnnxLSTM)


@register_converter("GRU", (1, 3, 7, 14, 22))
@_document(
    "Every input, attribute and output, exact to onnxruntime. nn.GRU where exact, else an exact cell loop.",
    """
- Fast path: a real nn.GRU holding W, R, B reordered once (zrh -> rzn) when they are constants,
  linear_before_reset=1, default activations and no clip. linear_before_reset=0 (the ONNX default), clip or other
  activations run the exact cell loop.
- clip (> 0; onnxruntime rejects <= 0) clamps the z, r and whole h~ pre-activations.
- activations: 2 per direction (f, g), names case-insensitive (onnxruntime).
- GRU-1 without direction is forward (its schema's default is the typo "foward").
""")
def gru(node: OnnxNode, ctx) -> Converted:
    return _convert(node, ctx, OnnxGRU)


@register_converter("RNN", (1, 7, 14, 22))
@_document(
    "Every input, attribute and output, exact to onnxruntime. nn.RNN where exact, else an exact cell loop.",
    """
- Fast path: a real nn.RNN when W, R, B are constants, the activation is Tanh or Relu (the same in both
  directions) and there is no clip.
- activations: 1 per direction, names case-sensitive (onnxruntime 1.31+ rejects "tanh"). The schema default
  [Tanh, Tanh] also serves one direction: a forward or reverse node with two names uses the first (onnxruntime).
- clip clamps the whole pre-activation. As onnxruntime: clip=0 clamps to 0, a negative clip means no clip.
""")
def rnn(node: OnnxNode, ctx) -> Converted:
    return _convert(node, ctx, OnnxRNN)
