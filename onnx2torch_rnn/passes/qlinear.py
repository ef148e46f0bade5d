"""QLinear chains as one module each, which computes every rounding as the nodes' modules do (one native call where it
takes them, else those modules), where each intermediate value has no other reader and the scales and zero points
are constants:

- ``qlinear_matmul_add``: a QLinearMatMul whose output only a QLinearAdd with a constant other operand reads (a
  classifier's product and bias), as QOperator models write it or as the ``qdq`` pattern makes it of
  DequantizeLinear -> MatMul -> QuantizeLinear -> DequantizeLinear -> Add (of a DequantizeLinear of a constant) ->
  QuantizeLinear: ``QLinearMatMulAdd``;
- ``quantize_concat_dequantize``: QuantizeLinear of each input of a QLinearConcat (QOperator models), its output
  dequantized (maybe through a Transpose): ``QuantizeConcatDequantize``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from ..errors import ConversionError
from ..modules.quantized import QLinearMatMulAdd, QuantizeConcatDequantize
from ..node import Converted
from . import Fusion, GraphView, register_pattern

if TYPE_CHECKING:
    from .qdq import QLinearNode

_STANDARD = ("", "ai.onnx")
_MS = "com.microsoft"


@register_pattern("qlinear_matmul_add")
def qlinear_matmul_add(view: GraphView):
    from .qdq import qlinear_chain  # here: importing qdq registers its pattern, which must run after this one

    for node in view.nodes:
        chain = qlinear_chain(view, node, "QLinearMatMul", "QLinearAdd")
        if chain is None:
            continue
        product, add, between = chain
        inputs, output = list(add.node.input), product.node.output[0]
        position = inputs.index(output) if len(inputs) == 8 and inputs.count(output) == 1 else None
        parameters = [name for i, name in enumerate(inputs) if i not in (0, 3) and name]
        if position not in (0, 3) or not view.is_constant(operand := inputs[3 - position]) or not all(
                name in add.made or view.is_constant(name) for name in parameters):
            continue
        reads = [*product.reads, *(name for name in add.reads if name != output)]
        yield Fusion("qlinear_matmul_add", "QLinearMatMul+QLinearAdd", [*product.nodes, *between, *add.nodes],
                     list(dict.fromkeys(reads)), [add.node.output[0]],
                     lambda ctx, product=product, add=add, position=position, operand=operand: _convert(
                         ctx, product, add, position, operand))


def _convert(ctx, product: QLinearNode, add: QLinearNode, position: int, operand: str) -> Converted:
    matmul, addition = product.convert(ctx), add.convert(ctx)
    expected = [None] * 8
    expected[position], expected[3 - position] = product.node.output[0], operand
    if list(addition.inputs) != expected:  # the pattern saw constants: the add's converter folded them
        raise ConversionError(add.nodes[0].name, "QLinearAdd", "its scales and zero points were not folded")
    return Converted(QLinearMatMulAdd(matmul.module, addition.module, ctx.constant(operand), position),
                     matmul.inputs)


def _op(node: onnx.NodeProto | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in _STANDARD


@register_pattern("quantize_concat_dequantize")
def quantize_concat_dequantize(view: GraphView):
    for concat in view.nodes:
        inputs = list(concat.input)
        if concat.op_type != "QLinearConcat" or concat.domain != _MS or len(inputs) < 5 or (len(inputs) - 2) % 3:
            continue
        quantizers = [view.producer.get(x) for x in inputs[2::3]]
        if not all(_op(q, "QuantizeLinear") and view.only_consumer(x) is concat
                   for q, x in zip(quantizers, inputs[2::3], strict=True)):
            continue
        reader, transpose = view.only_consumer(concat.output[0]), None
        if _op(reader, "Transpose"):
            transpose, reader = reader, view.only_consumer(reader.output[0])
        if not _op(reader, "DequantizeLinear"):
            continue
        parameters = [*inputs[:2], *inputs[3::3], *inputs[4::3], *reader.input[1:3],
                      *(name for q in quantizers for name in q.input[1:3])]
        if not all(view.is_constant(name) for name in parameters if name):
            continue
        parts = (tuple(quantizers), concat, transpose, reader)  # recognise sorts the fusion's node list
        yield Fusion("quantize_concat_dequantize", "QuantizeLinear+QLinearConcat+DequantizeLinear",
                     [concat, *quantizers, *([transpose] if transpose else []), reader],
                     [*(q.input[0] for q in quantizers), *filter(None, parameters)], [reader.output[0]],
                     lambda ctx, parts=parts: _quantized_concat(ctx, *parts))


def _quantized_concat(ctx, quantizers: tuple, concat: onnx.NodeProto, transpose: onnx.NodeProto | None,
                      dequantize: onnx.NodeProto) -> Converted:
    nodes = [*quantizers, concat, *([transpose] if transpose else []), dequantize]
    converted = [ctx.convert(node) for node in nodes]
    values = [node.output[0] for node in quantizers]
    expected = [[node.input[0]] for node in quantizers] + [[None, None, *(v for x in values for v in (x, None, None))]]
    expected += [[concat.output[0]], [transpose.output[0]]] if transpose else [[concat.output[0]]]
    for node, made, inputs in zip(nodes, converted, expected, strict=True):
        if [*made.inputs, *[None] * len(inputs)][:len(inputs)] != inputs or any(made.inputs[len(inputs):]):
            raise ConversionError(node.name, node.op_type, "its scales and zero points were not folded")
    modules = [made.module for made in converted]
    count = len(quantizers)
    return Converted(QuantizeConcatDequantize(modules[:count], modules[count], modules[-1],
                                              modules[count + 1] if transpose else None),
                     [node.input[0] for node in quantizers])
