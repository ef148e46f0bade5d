"""Dynamic quantization of a float input, its integer product by constant weights and the scaling back to float, as
onnxruntime's quantize_dynamic writes them (per MatMul or Conv):

    DynamicQuantizeLinear(x) -> (xq, x_scale, x_zero_point)
    MatMulInteger or ConvInteger(xq, W, x_zero_point, W_zero_point) -> Cast(float) -> Mul(., x_scale * W_scale)
    [-> Add(., bias)] [-> Relu] [-> MaxPool, after a ConvInteger]

become one module (``DynamicQuantizedProduct``): six or seven modules per call as written, one here. The same
operations on the same values in the same order (the two products and the sum are commutative in float32, and
broadcast alike), so the same numbers as the nodes as written, i.e. onnxruntime's. Only where each intermediate value
has no other reader, the weights, their zero point, scale and the bias are constants and the scale and bias are
float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..modules.common import constructor_arguments
from ..modules.nn import MaxPool
from ..modules.quantized import DynamicQuantizedProduct, QGemm, QLinearConv
from ..node import Converted
from ..torch_compat import buffer_dict
from . import Fusion, GraphView, attribute, register_pattern

if TYPE_CHECKING:
    from .qdq import QLinearNode

_STANDARD = ("", "ai.onnx")
_FLOAT = onnx.TensorProto.FLOAT


def _op(node: onnx.NodeProto | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in _STANDARD


def _other(node: onnx.NodeProto, name: str) -> str | None:
    """The other input of a two-input node that reads ``name`` once."""
    inputs = list(node.input)
    if len(inputs) != 2 or inputs.count(name) != 1:
        return None
    return inputs[1 - inputs.index(name)]


def _float_constant(view: GraphView, name: str | None) -> bool:
    return bool(name) and view.is_constant(name) and view.elem_type(name) == _FLOAT


@register_pattern("dynamic_quantized_product")
def dynamic_quantized_product(view: GraphView):
    for product in view.nodes:
        if not (_op(product, "MatMulInteger") or _op(product, "ConvInteger")):
            continue
        inputs = [*product.input, "", "", ""][:4]
        quantizer = view.producer.get(inputs[0])
        if not _op(quantizer, "DynamicQuantizeLinear") or inputs[2] != quantizer.output[2]:
            continue
        if view.only_consumer(inputs[0]) is not product or view.only_consumer(inputs[2]) is not product or not all(
                view.is_constant(name) for name in (inputs[1], inputs[3]) if name):
            continue
        cast = view.only_consumer(product.output[0])
        if not _op(cast, "Cast") or attribute(cast, "to") != _FLOAT:
            continue
        mul = view.only_consumer(cast.output[0])
        scales = view.producer.get(_other(mul, cast.output[0]) or "") if _op(mul, "Mul") else None
        if not _op(scales, "Mul") or view.only_consumer(scales.output[0]) is not mul or view.only_consumer(
                quantizer.output[1]) is not scales or not _float_constant(view, _other(scales, quantizer.output[1])):
            continue
        nodes, bias = [product, quantizer, scales, cast, mul], None
        add = view.only_consumer(mul.output[0])
        if _op(add, "Add") and _float_constant(view, _other(add, mul.output[0])):
            nodes, bias = [*nodes, add], _other(add, mul.output[0])
        relu = view.only_consumer(nodes[-1].output[0])
        relu = _op(relu, "Relu") and len(relu.input) == 1
        if relu:
            nodes.append(view.only_consumer(nodes[-1].output[0]))
        pool = _pool_after(view, nodes[-1]) if _op(product, "ConvInteger") else None
        nodes += [pool] if pool else []
        names = (quantizer.input[0], inputs[1], inputs[3] or None, _other(scales, quantizer.output[1]), bias)
        yield Fusion("dynamic_quantized_product", f"dynamic quantized {product.op_type}", nodes,
                     [name for name in names if name], [nodes[-1].output[0]],
                     lambda ctx, product=product, names=names, relu=relu, pool=pool: _convert(ctx, product, *names,
                                                                                             relu, pool))


def _pool_after(view: GraphView, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The MaxPool without indices that alone reads ``node``'s output (a convolution's), if one does."""
    pool = view.only_consumer(node.output[0])
    return pool if _op(pool, "MaxPool") and _one_output(pool) else None


def _one_output(node: onnx.NodeProto) -> bool:
    return len([o for o in node.output if o]) == 1 and bool(node.output[0])


def _convert(ctx, product: onnx.NodeProto, x: str, weight: str, zero_point: str | None, scale: str,
             bias: str | None, relu: bool, pool: onnx.NodeProto | None) -> Converted:
    integer = ctx.convert(product).module  # the MatMulInteger or ConvInteger module, its attributes checked
    constants = [ctx.constant(name) if name else None for name in (weight, zero_point, scale, bias)]
    pooling = None if pool is None else ctx.convert(pool).module
    return Converted(DynamicQuantizedProduct(integer, *constants, relu=relu, pool=pooling), [x])


# The patterns below read QOperator nodes as written or as onnxruntime makes them of QDQ groups (passes/qdq.py):
# the same fusions for both forms of a model.

def _chain(view: GraphView, node: onnx.NodeProto, op_type: str, *then: str) -> tuple | None:
    """(``node`` as the QOperator node ``op_type``, the node of ``then`` that alone reads its output as its first
    input, the nodes between: passes/qdq.py's ``qlinear_chain``), neither with int8 shifted to uint8, else None."""
    from .qdq import qlinear_chain  # here: importing qdq registers its pattern, which must run after these

    found = qlinear_chain(view, node, op_type, *then)
    if found is None or found[0].shift or found[1].shift or found[1].node.input[0] != found[0].node.output[0]:
        return None
    return found


def _pair(pattern: str, op_type: str, chain: tuple[QLinearNode, QLinearNode, list], convert) -> Fusion:
    """A ``_chain`` as one fusion: ``convert`` builds its module."""
    first, second, between = chain
    inner = first.node.output[0]
    inputs = [name for name in [*first.reads, *second.reads] if name != inner]
    return Fusion(pattern, op_type, [*first.nodes, *between, *second.nodes], list(dict.fromkeys(inputs)),
                  [second.node.output[0]], convert)


@register_pattern("pooled_qlinear_conv")
def pooled_qlinear_conv(view: GraphView):
    """QLinearConv -> MaxPool (onnxruntime's QOperator CNNs: the Relu folded into the conv's output range): one
    module, the convolution's native call pooling its output (the same integers: the pooling compares them)."""
    for node in view.nodes:
        chain = _chain(view, node, "QLinearConv", "MaxPool")
        if chain is not None and _one_output(chain[1].node):
            yield _conv_fusion(view, "pooled_qlinear_conv", "pooled QLinearConv", chain, "pool")


@register_pattern("looked_up_qlinear_conv")
def looked_up_qlinear_conv(view: GraphView):
    """QLinearConv -> com.microsoft QLinearLeakyRelu or QLinearSigmoid of constant scales and zero points (a
    QOperator CNN's activation): one module, the convolution's native call looking its outputs up in the activation's
    256-entry table (the same integers)."""
    for node in view.nodes:
        chain = _chain(view, node, "QLinearConv", "QLinearLeakyRelu", "QLinearSigmoid")
        lookup = chain[1] if chain is not None else None
        if (lookup is not None and lookup.node.domain == "com.microsoft"
                and all(view.is_constant(name) for name in lookup.node.input[1:] if name)
                and any(lookup.node.input[2:5:2])):
            yield _conv_fusion(view, "looked_up_qlinear_conv", "looked-up QLinearConv", chain, "lookup")


@register_pattern("quantized_qlinear_conv")
def quantized_qlinear_conv(view: GraphView):
    """QuantizeLinear -> QLinearConv (the float input of a QOperator CNN) where no pooling or activation joins it
    (the patterns above take the QuantizeLinear along): one module, the convolution's native call quantizing its x
    (the same integers: quantize_linear's arithmetic)."""
    from .qdq import qlinear_node

    for node in view.nodes:
        conv = qlinear_node(view, node, "QLinearConv")
        if conv is not None and not conv.shift and _quantizer(view, conv) is not None:
            yield _conv_fusion(view, "quantized_qlinear_conv", "quantized QLinearConv", (conv, None, []))


def _quantizer(view: GraphView, conv: QLinearNode) -> onnx.NodeProto | None:
    """The QuantizeLinear that makes ``conv``'s x of float32 values and that only ``conv`` reads, by a constant
    float32 scale and zero point of one value each, to uint8 or int8 (what QLinearConv's native call quantizes
    itself), else None."""
    name, inside = conv.node.input[0], {id(n) for n in conv.nodes}
    quantizer, readers = view.producer.get(name), view.consumers.get(name, [])

    def only_conv(reader: onnx.NodeProto) -> bool:  # the convolution, or (QDQ) a DequantizeLinear only it reads
        output = reader.output[0] if _op(reader, "DequantizeLinear") and reader.input[0] == name else None
        return id(reader) in inside or (output is not None and output not in view.graph_outputs and bool(
            view.consumers.get(output)) and all(id(c) in inside for c in view.consumers[output]))

    if not (_op(quantizer, "QuantizeLinear") and readers and all(map(only_conv, readers))
            and name not in view.graph_outputs and view.elem_type(quantizer.input[0]) == _FLOAT):
        return None
    scale, zero = ([*quantizer.input, ""][1:3])
    output = attribute(quantizer, "output_dtype", 0) or onnx.TensorProto.UINT8  # without a zero point
    scale, zero = view.folded(scale), view.folded(zero) if zero else np.zeros((), {
        onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8}.get(output, np.float32))
    ok = (scale is not None and scale.dtype == np.float32 and scale.size == 1 and zero is not None
          and zero.dtype in (np.uint8, np.int8) and zero.size == 1)
    return quantizer if ok else None


def _conv_fusion(view: GraphView, pattern: str, op_type: str, chain: tuple, role: str = "") -> Fusion:
    """A convolution's ``_chain`` (the node after it as its ``role``, pool or lookup; (conv, None, []): the
    convolution alone) as one fusion, with the QuantizeLinear before it where one makes its x (``_quantizer``)."""
    conv, after = chain[0], {} if chain[1] is None else {role: chain[1]}
    quantizer = _quantizer(view, conv)

    def convert(ctx):
        return _convert_qlinear_conv(ctx, conv, quantizer, after)

    fusion = conv.fusion(pattern) if chain[1] is None else _pair(pattern, op_type, chain, convert)
    fusion.op_type, fusion.convert = op_type, convert
    if quantizer is not None:
        x = conv.node.input[0]
        taken = {id(n) for n in fusion.nodes}
        readers = [r for r in view.consumers[x] if id(r) not in taken]  # QDQ: its DequantizeLinear
        fusion.nodes = [*fusion.nodes, quantizer, *readers]
        fusion.inputs = list(dict.fromkeys([name for name in quantizer.input if name] + [
            name for name in fusion.inputs if name != x]))
    return fusion


def _convert_qlinear_conv(ctx, conv: QLinearNode, quantizer: onnx.NodeProto | None,
                          after: dict[str, QLinearNode]) -> Converted:
    """QLinearConv's module with the modules of the nodes ``after`` it by role (pool or lookup) and of the
    QuantizeLinear before it (quantize), if any."""
    converted = conv.convert(ctx)  # QLinearConv's module, its attributes checked and its constants folded
    args, kwargs = constructor_arguments(converted.module)
    if converted.module.folded:  # the folded constants themselves (the recorded arguments hold stubs of large ones)
        buffers = buffer_dict(converted.module)
        kwargs = {**kwargs, "constants": {name: buffers[name] for name in QLinearConv.FOLDED}}
    modules = {role: node.convert(ctx).module for role, node in after.items()}
    inputs = list(converted.inputs)
    if quantizer is not None:
        modules["quantize"], inputs[0] = ctx.convert(quantizer).module, quantizer.input[0]
    return Converted(QLinearConv(*args, **{**kwargs, **modules}), inputs)


@register_pattern("padded_max_pool")
def padded_max_pool(view: GraphView):
    """A constant Pad of the spatial axes of 8-bit values -> MaxPool (no indices, no padding of its own, floor mode):
    one MaxPool that reads the Pad's value outside its input (QOperator CNNs pad with a zero point), the same
    integers in one native call instead of two."""
    for node in view.nodes:
        chain = _chain(view, node, "Pad", "MaxPool")
        pool = chain[1].node if chain is not None else None
        if pool is None or not _one_output(pool) or any(attribute(pool, "pads") or ()) or attribute(
                pool, "ceil_mode") or attribute(pool, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            continue
        padding = _constant_padding(view, chain[0], len(attribute(pool, "kernel_shape") or ()) + 2)
        if padding is not None:
            yield _pair("padded_max_pool", "padded MaxPool", chain,
                        lambda ctx, pool=chain[1], x=chain[0].node.input[0], padding=padding: _convert_padded(
                            ctx, pool, x, padding))


def _constant_padding(view: GraphView, made: QLinearNode, rank: int) -> tuple[list, list, int] | None:
    """(begins, ends, value) of a constant-mode Pad of 8-bit values (its type, or its constant value's, says so) by
    constant, non-negative amounts on the spatial axes of a rank-``rank`` input, else None."""
    pad = made.node
    inputs = [*pad.input, "", "", ""]
    pads = attribute(pad, "pads") if view.opset(pad) < 11 else view.ints(inputs[1])
    axes = view.ints(inputs[3]) if inputs[3] else list(range(rank))
    value = made.constant(view, inputs[2]) if inputs[2] else np.zeros((), np.uint8 if view.elem_type(
        pad.input[0]) == onnx.TensorProto.UINT8 else np.int8 if view.elem_type(pad.input[0]) == onnx.TensorProto.INT8
        else np.float32)
    if (attribute(pad, "mode", "constant") != "constant" or pads is None or axes is None or value is None
            or value.dtype not in (np.uint8, np.int8) or value.size != 1 or len(pads) != 2 * len(axes)):
        return None
    begins, ends = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begins[axis % rank], ends[axis % rank] = int(pads[i]), int(pads[i + len(axes)])
    if min(begins + ends) < 0 or any(begins[:2] + ends[:2]):
        return None
    return begins, ends, int(value.reshape(()))


def _convert_padded(ctx, pool: QLinearNode, x: str, padding: tuple) -> Converted:
    args, kwargs = constructor_arguments(pool.convert(ctx).module)  # MaxPool's, its attributes checked
    return Converted(MaxPool(*args, **{**kwargs, "padding": padding}), [x])


@register_pattern("flattened_qgemm")
def flattened_qgemm(view: GraphView):
    """Flatten -> com.microsoft QGemm that alone reads it, as A (a QOperator classifier's head): one module, the
    product's native call reading A flattened (the same integers: Flatten only moves them)."""
    for flatten in view.nodes:
        gemm = view.only_consumer(flatten.output[0]) if _op(flatten, "Flatten") else None
        if gemm is not None and gemm.op_type == "QGemm" and gemm.domain == "com.microsoft" and (
                gemm.input[0] == flatten.output[0]):
            yield Fusion("flattened_qgemm", "flattened QGemm", [gemm, flatten],
                         [flatten.input[0], *[name for name in gemm.input[1:] if name]], [gemm.output[0]],
                         lambda ctx, gemm=gemm, flatten=flatten: _convert_flattened(ctx, gemm, flatten))


def _convert_flattened(ctx, gemm: onnx.NodeProto, flatten: onnx.NodeProto) -> Converted:
    converted = ctx.convert(gemm)  # QGemm's module, its attributes and types checked
    args, kwargs = constructor_arguments(converted.module)
    if converted.module.folded:  # the constants as given (the recorded arguments hold stubs of large ones)
        names = [*gemm.input[1:], *[""] * len(QGemm.FOLDED)][:len(QGemm.FOLDED)]
        kwargs = {**kwargs, "constants": {name: ctx.constant(value) if value else None
                                          for name, value in zip(QGemm.FOLDED, names, strict=True)}}
    module = QGemm(*args, **{**kwargs, "flatten": ctx.convert(flatten).module})
    return Converted(module, [flatten.input[0], *converted.inputs[1:]])
