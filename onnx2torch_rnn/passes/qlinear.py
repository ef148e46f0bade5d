"""A QLinearMatMul whose output only a QLinearAdd with a constant other operand reads (a classifier's product and
bias), as QOperator models write it or as the ``qdq`` pattern makes it of DequantizeLinear -> MatMul -> QuantizeLinear
-> DequantizeLinear -> Add (of a DequantizeLinear of a constant) -> QuantizeLinear: one module (``QLinearMatMulAdd``),
which computes both ops' roundings as their modules do (the native call where it takes them, else the two modules).
Only where the product's output has no other reader and every input of the add but the product is a constant.
"""

from __future__ import annotations

import onnx

from ..errors import ConversionError
from ..modules.quantized import QLinearMatMulAdd
from ..node import Converted
from . import Fusion, GraphView, register_pattern

_STANDARD = ("", "ai.onnx")
_MS = "com.microsoft"


def _node(node: onnx.NodeProto) -> Fusion:
    """One QOperator node as a fusion of itself (its own converter)."""
    return Fusion("qlinear_matmul_add", node.op_type, [node], [name for name in node.input if name],
                  [node.output[0]], lambda ctx, node=node: ctx.convert(node))


def _product(view: GraphView, node: onnx.NodeProto) -> Fusion | None:
    if node.op_type == "QLinearMatMul" and node.domain in _STANDARD and len(node.output) == 1:
        return _node(node)
    if node.op_type == "MatMul" and node.domain in _STANDARD:
        fusion = _qdq_group(view, node)
        return fusion if fusion is not None and fusion.op_type == "QLinearMatMul" else None
    return None


def _add(view: GraphView, product: str) -> tuple[Fusion, list[onnx.NodeProto], int, str] | None:
    """(the add's fusion, the DequantizeLinear between (QDQ), the product's position among QLinearAdd's inputs, the
    constant operand's name) of the QLinearAdd that alone reads ``product``, or None."""
    reader = view.only_consumer(product)
    if reader is not None and reader.op_type == "QLinearAdd" and reader.domain == _MS and len(reader.input) == 8:
        inputs, between, add = list(reader.input), [], _node(reader)
        position = inputs.index(product)
        values = [inputs[3 - position]]
        parameters = [name for i, name in enumerate(inputs) if i not in (0, 3)]
    elif reader is not None and reader.op_type == "DequantizeLinear" and reader.domain in _STANDARD:
        dq, target = reader, view.only_consumer(reader.output[0])
        add = _qdq_group(view, target) if target is not None and target.op_type == "Add" else None
        if add is None or add.op_type != "QLinearAdd" or list(target.input).count(dq.output[0]) != 1:
            return None
        between, position = [dq], 3 * list(target.input).index(dq.output[0])
        other = view.producer.get(target.input[1 - position // 3])
        values, parameters = [other.input[0]], []  # the group's scales and zero points are constants (qdq.py)
    else:
        return None
    if not all(name and view.is_constant(name) for name in values) or not all(
            view.is_constant(name) for name in parameters if name):
        return None
    return add, between, position, values[0]


def _qdq_group(view: GraphView, target: onnx.NodeProto) -> Fusion | None:
    from .qdq import qlinear_group  # here: importing qdq registers its pattern, which must run after this one

    return qlinear_group(view, target)


@register_pattern("qlinear_matmul_add")
def qlinear_matmul_add(view: GraphView):
    for node in view.nodes:
        product = _product(view, node)
        found = _add(view, product.outputs[0]) if product is not None else None
        if found is None:
            continue
        add, between, position, operand = found
        inputs = [*product.inputs, *(name for name in add.inputs if name != product.outputs[0])]
        yield Fusion("qlinear_matmul_add", "QLinearMatMul+QLinearAdd", [*product.nodes, *between, *add.nodes],
                     list(dict.fromkeys(inputs)), add.outputs,
                     lambda ctx, product=product, add=add, position=position, operand=operand: _convert(
                         ctx, product, add, position, operand))


def _convert(ctx, product: Fusion, add: Fusion, position: int, operand: str) -> Converted:
    matmul, addition = product.convert(ctx), add.convert(ctx)
    expected = [None] * 8
    expected[position], expected[3 - position] = product.outputs[0], operand
    if list(addition.inputs) != expected:  # the pattern saw constants: the add's converter folded them
        raise ConversionError(add.nodes[0].name, "QLinearAdd", "its scales and zero points were not folded")
    return Converted(QLinearMatMulAdd(matmul.module, addition.module, ctx.constant(operand), position),
                     matmul.inputs)
