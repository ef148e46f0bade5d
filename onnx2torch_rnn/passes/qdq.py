"""QDQ node groups (DequantizeLinear -> float op -> QuantizeLinear) as the QLinear ops onnxruntime's optimizer makes of
them, so that the numbers are its default session's.

onnxruntime's QDQ selectors (onnxruntime/core/optimizer/qdq_transformer/selectors_actions) replace each group by its
QLinear kernel on x86 CPUs, which rounds once where the float op, then QuantizeLinear, round twice. Recognised here
under the same conditions (the group's float op reads only DequantizeLinear outputs, its one output goes to one
QuantizeLinear only and is no graph output, the types match, no 16-bit types; scales and zero points constant), with
the types its QDQS8ToU8Transformer leaves (``_effective_type``):

- Conv -> QLinearConv, MatMul -> QLinearMatMul (uint8 activations: onnxruntime allows int8 ones on ARM alone, but
  turns int8 Q -> DQ pairs into uint8 first), Gemm -> QGemm (also with a float output; beta 1). The bias: an int32
  DequantizeLinear whose scale is x_scale * w_scale within onnxruntime's tolerance, or a float constant quantized
  as its WeightBiasQuantization does (``_bias``);
- Add, Mul -> QLinearAdd, QLinearMul; Concat -> QLinearConcat; AveragePool, GlobalAveragePool, LeakyRelu, Sigmoid,
  Softmax -> their QLinear ops;
- a Relu between the op and a QuantizeLinear whose zero point is the type's lowest value is left out (the
  quantization clamps the same values: onnxruntime's ReluQuantFusion);
- ops that only move or pick values (Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Gather, Slice, Expand, Tile,
  MaxPool and Resize nearest) where DequantizeLinear and QuantizeLinear have the same scalar scale and zero point: the
  op runs on the integers, with the same numbers (onnxruntime's "drop" rules; a speed-up only). Pad too (opset 11+),
  its constant value quantized: onnxruntime keeps that one in float, with the same numbers (``_pad_value``).

What onnxruntime leaves alone stays as written. Each group becomes the QLinear node onnxruntime writes, converted
by that op's converter (``ctx.convert``), so its arithmetic lives in one place (modules/quantized.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx
import torch

from ..modules.quantized import AsUint8, QuantizeDequantizeLinear, quantize
from ..node import Converted
from . import Fusion, GraphView, attribute, register_pattern

_STANDARD = ("", "ai.onnx")
_MS = "com.microsoft"
_U8, _S8, _I32 = onnx.TensorProto.UINT8, onnx.TensorProto.INT8, onnx.TensorProto.INT32
_SIXTEEN = (onnx.TensorProto.UINT16, onnx.TensorProto.INT16)
_UNARY = MappingProxyType({"AveragePool": "QLinearAveragePool", "GlobalAveragePool": "QLinearGlobalAveragePool",
                           "LeakyRelu": "QLinearLeakyRelu", "Sigmoid": "QLinearSigmoid", "Softmax": "QLinearSoftmax"})
_BINARY = MappingProxyType({"Add": "QLinearAdd", "Mul": "QLinearMul"})
# the float op of a QLinear op (the ops on integers are their own)
_FLOAT_OPS = MappingProxyType({**{v: k for k, v in {**_UNARY, **_BINARY}.items()}, "QLinearConv": "Conv",
                               "QGemm": "Gemm", "QLinearConcat": "Concat", "QLinearMatMul": "MatMul"})
# ops whose QDQ is dropped, and whether 16-bit types are (onnxruntime's drop rules)
_DROP = MappingProxyType({"Expand": True, "Flatten": True, "Gather": True, "Reshape": True, "Slice": True,
                          "Squeeze": True, "Tile": True, "Transpose": True, "Unsqueeze": True, "MaxPool": False,
                          "Resize": False, "Pad": True})


def _op(node: onnx.NodeProto | None, *op_types: str) -> bool:
    return node is not None and node.op_type in op_types and node.domain in _STANDARD


@dataclass
class QLinearNode:
    """One node of the QOperator form: as a QOperator model writes it, or as onnxruntime makes it of a QDQ group (its
    QLinear op, or the op on the integers where it drops the group's QuantizeLinear and DequantizeLinear). Patterns
    that fuse such nodes read them so, and fire on both forms of a model (passes/quantized.py, passes/qlinear.py)."""

    node: onnx.NodeProto  # what runs: its output is the group's QuantizeLinear's
    nodes: list[onnx.NodeProto]  # the nodes it replaces
    reads: list[str]  # the graph's values it reads
    made: dict[str, torch.Tensor] = field(default_factory=dict)  # constants it reads that the graph does not hold
    opset: int | None = None  # its domain's version where the model imports none (a com.microsoft op made here)
    shift: tuple[int, ...] = ()  # the inputs AsUint8 shifts (``_Group.qlinear``)

    @property
    def as_written(self) -> bool:
        return self.nodes[0] is self.node

    def constant(self, view: GraphView, name: str) -> np.ndarray | None:
        """The value of a constant that the node reads, else None."""
        if name in self.made:
            return self.made[name].numpy()
        return view.folded(name) if name and view.is_constant(name) else None

    def convert(self, ctx) -> Converted:
        for name, value in self.made.items():
            ctx.set_constant(name, value)
        converted = ctx.convert(self.node, self.opset)
        return Converted(AsUint8(converted.module, self.shift), converted.inputs) if self.shift else converted

    def fusion(self, pattern: str) -> Fusion:
        return Fusion(pattern, self.node.op_type, self.nodes, self.reads, [self.node.output[0]], self.convert)


class _Group:
    """One candidate group: the float op, the DequantizeLinear of each input (None where none) and its
    QuantizeLinear (None where none), with the Relu between them that the quantization makes redundant."""

    def __init__(self, view: GraphView, target: onnx.NodeProto):
        self.view, self.target = view, target
        self.inputs = [name for name in target.input if name]
        self.dqs = [view.producer.get(name) for name in self.inputs]
        self.dqs = [dq if _op(dq, "DequantizeLinear") and self._parameters(dq) else None for dq in self.dqs]
        self.relu = self.q = None
        outputs = [name for name in target.output if name]
        if len(outputs) == 1 and len(target.output) == 1:
            after, relu = view.only_consumer(outputs[0]), None
            if _op(after, "Relu") and _op(view.only_consumer(after.output[0]), "QuantizeLinear"):
                relu, after = after, view.only_consumer(after.output[0])
            if _op(after, "QuantizeLinear") and self._parameters(after) and (
                    relu is None or self._lowest_zero_point(after)):
                self.relu, self.q = relu, after

    def _parameters(self, node: onnx.NodeProto) -> bool:
        """Whether a Q/DQ's scale and zero point are constants (per tensor or per axis, no blocks)."""
        return all(self.view.is_constant(name) for name in node.input[1:3] if name) and not attribute(
            node, "block_size", 0)

    def _lowest_zero_point(self, q: onnx.NodeProto) -> bool:
        zero_point = self.view.folded(q.input[2]) if len(q.input) > 2 and q.input[2] else None
        if zero_point is None:  # no zero point: uint8, zero
            return len(q.input) < 3 or not q.input[2]
        return zero_point.size == 1 and int(zero_point.reshape(-1)[0]) == np.iinfo(zero_point.dtype).min

    def all_dequantized(self) -> bool:
        return bool(self.dqs) and all(dq is not None for dq in self.dqs)

    def type(self, index: int) -> int | None:
        """The integer type of the DequantizeLinear input ``index`` as onnxruntime's selectors see it."""
        return _effective_type(self.view, self.dqs[index].input[0])

    def output_type(self) -> int | None:
        return _effective_type(self.view, self.q.output[0])

    def nodes(self) -> list[onnx.NodeProto]:
        """The nodes the group replaces; the DequantizeLinear nodes that feed nothing else join by themselves
        (recognise absorbs them), others stay for their other readers."""
        return [n for n in (self.target, self.relu, self.q) if n is not None]

    def quantized(self, index: int) -> list[str]:
        """(integer value, scale, zero point) of input ``index``."""
        dq = self.dqs[index]
        return [dq.input[0], dq.input[1], dq.input[2] if len(dq.input) > 2 else ""]

    def output(self) -> list[str]:
        return [self.q.input[1], self.q.input[2] if len(self.q.input) > 2 else ""]

    def qlinear(self, op_type: str, inputs: list[str], domain: str = _MS, extra: dict | None = None,
                attributes: list | None = None, constants: tuple[str, np.ndarray] | None = None,
                shift: tuple[int, ...] = ()) -> QLinearNode:
        """The group as ``op_type`` on ``inputs`` with the target's attributes (or ``attributes``) and ``extra``.
        ``shift``: the positions of its int8 inputs that onnxruntime has made uint8, -1 for its output (``AsUint8``;
        their zero points, the inputs two after them or the last, shifted to uint8 here)."""
        output = (self.q or self.target).output[0]
        shifted = {}
        for position in shift:
            zero = inputs[-1] if position < 0 else inputs[position + 2]
            shifted[zero] = (f"{zero}_as_uint8", np.asarray(self.view.folded(zero).astype(np.int16) + 128, np.uint8))
        inputs = [shifted[name][0] if name in shifted else name for name in inputs]
        node = onnx.helper.make_node(op_type, inputs, [output], name=self.target.name, domain=domain)
        node.attribute.extend(self.target.attribute if attributes is None else attributes)
        for key, value in (extra or {}).items():
            node.attribute.append(onnx.helper.make_attribute(key, value))
        # constants this pass makes (a quantized bias, shifted zero points): defined under new names
        made = {name: torch.from_numpy(value) for name, value in [*([constants] if constants else []),
                                                                    *shifted.values()]}
        reads = [name for name in inputs if name and name not in made]
        if constants is not None:
            reads.append(self.inputs[2])
        reads += list(shifted)
        return QLinearNode(node, self.nodes(), reads, made, 1 if domain == _MS else None, shift)

    def shift(self, *positions: int) -> tuple[int, ...] | None:
        """Those of ``positions`` (one per DequantizeLinear) whose int8 values onnxruntime's selectors see as uint8
        (``_effective_type``), and -1 where the output's are: what ``AsUint8`` shifts; None where a shifted value's
        zero point is not one constant (left alone)."""
        names = [dq.input[0] for dq in self.dqs] + [self.q.output[0]]
        zero_points = [dq.input[2] if len(dq.input) > 2 else "" for dq in self.dqs] + [
            self.q.input[2] if len(self.q.input) > 2 else ""]
        shifted = [(position, zero) for position, name, zero in zip((*positions, -1), names, zero_points, strict=True)
                   if self.view.elem_type(name) == _S8 and _effective_type(self.view, name) == _U8]
        return tuple(p for p, _ in shifted) if all(_scalar(self.view, z) is not None for _, z in shifted) else None

    def mixed(self) -> bool:
        """Whether the group's 8-bit values are of both types as written."""
        return len({self.view.elem_type(name) for name in [dq.input[0] for dq in self.dqs] + [self.q.output[0]]}) > 1


def _scalar(view: GraphView, name: str) -> int | None:
    """The single integer value of a constant, else None."""
    value = view.folded(name) if name else None
    return int(value.reshape(-1)[0]) if value is not None and value.size == 1 and value.dtype.kind in "iu" else None


def _effective_type(view: GraphView, name: str) -> int | None:
    """The type of a QuantizeLinear output or DequantizeLinear input once onnxruntime's QDQS8ToU8Transformer has run
    (x86): an int8 QuantizeLinear -> DequantizeLinear pair (the Q read by that DQ alone, one equal int8 zero point
    each) becomes uint8: values and zero points shifted by 128, the same numbers, but its selectors then see uint8.
    An int8 constant stays int8 (its session option session.x64quantprecision, off by default, would make one with a
    value outside [-64, 64] uint8 too: measured, onnxruntime 1.32)."""
    elem_type = view.elem_type(name)
    if elem_type != _S8:
        return elem_type
    q = view.producer.get(name)
    if _op(q, "QuantizeLinear"):
        dq = view.only_consumer(name)
        pair = _op(dq, "DequantizeLinear") and len(q.input) == 3 and len(dq.input) == 3 and len(
            view.consumers.get(name, [])) == 1
        zero = _scalar(view, q.input[2]) if pair else None
        same = zero is not None and zero == _scalar(view, dq.input[2]) and view.elem_type(q.input[2]) == _S8
        return _U8 if same else _S8
    return _S8


def _eight_bit(*types: int | None) -> bool:
    return all(t in (_U8, _S8) for t in types)


def qlinear_group(view: GraphView, target: onnx.NodeProto) -> Fusion | None:
    """The QLinear fusion that the ``qdq`` pattern makes of the group around ``target``, or None."""
    made = _select(view, _Group(view, target)) if target.domain in _STANDARD else None
    return None if made is None else made.fusion("qdq")


def qlinear_node(view: GraphView, node: onnx.NodeProto | None, *op_types: str) -> QLinearNode | None:
    """The QOperator node of one of ``op_types`` that ``node`` stands for: the one onnxruntime makes of the QDQ group
    around it, or ``node`` itself as written (an op on integers), else None."""
    if node is None:
        return None
    if node.domain in _STANDARD and node.op_type in {_FLOAT_OPS.get(op, op) for op in op_types}:
        made = _select(view, _Group(view, node))
        if made is not None:
            return made if made.node.op_type in op_types else None
    if node.op_type not in op_types or node.domain not in (*_STANDARD, _MS):
        return None
    return QLinearNode(node, [node], [name for name in node.input if name])


def qlinear_reader(view: GraphView, output: str, *op_types: str) -> tuple[QLinearNode, list[onnx.NodeProto]] | None:
    """The QOperator node of one of ``op_types`` that alone reads ``output`` (a QOperator node's), and the nodes
    between: none as written, or the one DequantizeLinear of the QDQ group it stands for (which reads it alone)."""
    reader = view.only_consumer(output)
    if _op(reader, "DequantizeLinear") and reader.input[0] == output:
        made = qlinear_node(view, view.only_consumer(reader.output[0]), *op_types)
        fits = made is not None and not made.as_written and output in made.node.input
        return (made, [reader]) if fits else None
    made = qlinear_node(view, reader, *op_types)
    return (made, []) if made is not None and made.as_written else None


def qlinear_chain(view: GraphView, node: onnx.NodeProto, op_type: str,
                  *then: str) -> tuple[QLinearNode, QLinearNode, list[onnx.NodeProto]] | None:
    """``node`` as the QOperator node ``op_type`` (``qlinear_node``), the node of one of ``then`` that alone reads
    its output (``qlinear_reader``) and the nodes between, else None."""
    first = qlinear_node(view, node, op_type)
    found = qlinear_reader(view, first.node.output[0], *then) if first is not None else None
    return None if found is None else (first, *found)


@register_pattern("qdq")
def qdq(view: GraphView):
    for target in view.nodes:
        fusion = qlinear_group(view, target)
        if fusion is not None:
            yield fusion
    for q in view.nodes:  # what the groups leave
        fusion = _round_trip(view, q)
        if fusion is not None:
            yield fusion


def _round_trip(view: GraphView, q: onnx.NodeProto) -> Fusion | None:
    """QuantizeLinear -> DequantizeLinear (the Q read by that DQ alone), each of one constant float32 scale and at
    most one zero point, float32 in and out: one module (QuantizeDequantizeLinear), the same numbers in one call."""
    dq = view.only_consumer(q.output[0]) if _op(q, "QuantizeLinear") else None
    if not _op(dq, "DequantizeLinear") or view.elem_type(q.input[0]) != onnx.TensorProto.FLOAT:
        return None
    parameters = [*q.input[1:3], *dq.input[1:3]]
    for index, name in enumerate(parameters):
        value = view.folded(name) if name else None
        if (index % 2 == 0 and (value is None or value.dtype != np.float32)) or (
                name and (value is None or value.size != 1)):
            return None

    def convert(ctx, q=q, dq=dq):
        quantize, dequantize = ctx.convert(q), ctx.convert(dq)
        return Converted(QuantizeDequantizeLinear(quantize.module, dequantize.module), [q.input[0]])
    return Fusion("qdq", "QuantizeLinear+DequantizeLinear", [q, dq], [q.input[0], *filter(None, parameters)],
                  [dq.output[0]], convert)


def _select(view: GraphView, group: _Group) -> QLinearNode | None:
    """The node onnxruntime's selectors make of this group, or None."""
    op = group.target.op_type
    if op in _DROP:
        return _drop(view, group)
    if op in ("Conv", "Gemm"):
        return _weighted(view, group)
    if group.q is None or not group.all_dequantized() or not _eight_bit(group.output_type()):
        return None
    count, output_type = len(group.dqs), group.output_type()
    # where onnxruntime adds the output's zero point in float before rounding, the uint8 form it runs matters;
    # elsewhere the int8 form gives the same numbers, but values of both types must be of one
    shift = group.shift(*((0, 3) if op in _BINARY else (0,))) if op in (*_BINARY, "AveragePool") or (
        op in _UNARY and group.mixed()) else ()
    if shift is None or (op == "Concat" and group.mixed()):
        return None
    if op in _UNARY and count == 1 and group.type(0) == output_type:
        extra = {"opset": view.opset(group.target)} if op == "Softmax" else None
        return group.qlinear(_UNARY[op], [*group.quantized(0), *group.output()], extra=extra, shift=shift)
    if op in _BINARY and count == 2 and group.type(0) == group.type(1) == output_type:
        return group.qlinear(_BINARY[op], [*group.quantized(0), *group.quantized(1), *group.output()], shift=shift)
    if op == "Concat" and all(group.type(i) == output_type for i in range(count)):
        return group.qlinear("QLinearConcat", [*group.output(), *[n for i in range(count) for n in group.quantized(i)]])
    if op == "MatMul" and count == 2 and group.type(0) == _U8 == output_type and _eight_bit(group.type(1)):
        return group.qlinear("QLinearMatMul", [*group.quantized(0), *group.quantized(1), *group.output()], domain="")
    return None


def _weighted(view: GraphView, group: _Group) -> QLinearNode | None:
    """Conv -> QLinearConv (uint8 activations, 8-bit weights); Gemm -> QGemm (8-bit A and B, int8 A only with int8
    B), its output quantized or float. The bias: an int32 DequantizeLinear input, or a float constant that
    onnxruntime's WeightBiasQuantization quantizes first."""
    conv = group.target.op_type == "Conv"
    if len(group.dqs) < 2 or group.dqs[0] is None or group.dqs[1] is None:
        return None
    a, b = group.type(0), group.type(1)
    if conv and (group.q is None or a != _U8 or not _eight_bit(b)):
        return None
    if not _eight_bit(a, b) or (a == _S8 and b != _S8) or (group.q is not None and group.output_type() != a):
        return None
    if group.q is None and any(_op(n, "QuantizeLinear") for n in view.consumers.get(group.target.output[0], [])):
        return None  # a QuantizeLinear this pass cannot read (onnxruntime's QGemm would requantize)
    bias = _bias(view, group) if len(group.dqs) == 3 else ("", None)
    if bias is None:
        return None
    inputs = [*group.quantized(0), *group.quantized(1)]
    if conv:
        return group.qlinear("QLinearConv", [*inputs, *group.output(), bias[0]], domain="", constants=bias[1])
    if bias[0] and attribute(group.target, "beta", 1.0) != 1.0:
        return None
    keep = [a for a in group.target.attribute if a.name != "beta"]
    outputs = group.output() if group.q is not None else []
    return group.qlinear("QGemm", [*inputs, bias[0], *outputs], attributes=keep, constants=bias[1])


def _bias(view: GraphView, group: _Group) -> tuple[str, tuple | None] | None:
    """(name, constants to define) of QLinearConv's / QGemm's int32 bias, or None where onnxruntime does not fuse.
    A DequantizeLinear of int32 values whose scale is x_scale * w_scale to within 1e-6 + 1% (onnxruntime's
    tolerance, measured; it then reads the integers as they are); a float constant vector: round_half_even(b /
    (x_scale * w_scale)) in float32, where the group's output goes to a QuantizeLinear."""
    dq, name = group.dqs[2], group.inputs[2]
    x_scale, w_scale = view.folded(group.dqs[0].input[1]), view.folded(group.dqs[1].input[1])
    if x_scale is None or w_scale is None or x_scale.size != 1:
        return None
    product = (x_scale.reshape(()) * w_scale.reshape(-1)).astype(np.float32)
    if dq is not None:
        scale = view.folded(dq.input[1])
        if view.elem_type(dq.input[0]) != _I32 or scale is None or scale.size not in (1, product.size) or not bool(
                (np.abs(scale.reshape(-1) - product) <= 1e-6 + 0.01 * np.abs(product)).all()):
            return None
        return dq.input[0], None
    value = view.folded(name) if view.is_constant(name) else None
    if group.q is None or value is None or value.dtype != np.float32 or value.ndim != 1 or product.size not in (
            1, value.size) or attribute(group.dqs[1], "block_size", 0):
        return None
    made = f"{name}_quantized_by_{group.target.name or 'qdq'}"
    return made, (made, np.round(value / product).astype(np.int32))


def _drop(view: GraphView, group: _Group) -> QLinearNode | None:
    """DQ -> op -> Q with the same scalar scale and zero point: the op on the integers."""
    target, dq, q = group.target, group.dqs[0] if group.dqs else None, group.q
    if dq is None or q is None or any(d is not None for d in group.dqs[1:]):
        return None
    if target.input[0] != dq.output[0] or group.type(0) != group.output_type():
        return None
    if group.type(0) in _SIXTEEN and not _DROP[target.op_type]:
        return None
    if target.op_type == "Resize" and attribute(target, "mode", "nearest") != "nearest":
        return None
    if target.op_type == "MaxPool" and view.opset(target) < 12:
        return None
    if not _same_parameters(view, dq, q, positive=target.op_type == "MaxPool"):
        return None
    node = onnx.NodeProto()
    node.CopyFrom(target)
    node.input[0], node.output[0] = dq.input[0], q.output[0]
    made = _pad_value(view, group, node) if target.op_type == "Pad" else {}
    if made is None:
        return None
    inputs = [name for name in [*target.input[1:], dq.input[0]] if name]

    return QLinearNode(node, group.nodes(), inputs, made)


def _pad_value(view: GraphView, group: _Group, node: onnx.NodeProto) -> dict | None:
    """A Pad between a DequantizeLinear and a QuantizeLinear of the same parameters, on the integers: its constant
    value quantized ({name: value} to define, written into ``node``), None where not exact. onnxruntime keeps the
    float Pad; the numbers agree because quantize(dequantize(q)) = q: (q - z) * s / s is within |q - z| * 2^-23 of
    q - z in float32 (< 0.5 below 2^16) where the scale is a normal number far from overflow."""
    scale = float(view.folded(group.q.input[1]).reshape(-1)[0])
    if view.opset(group.target) < 11 or not 2.0**-100 < scale < 2.0**100:
        return None
    if attribute(group.target, "mode", "constant") != "constant":
        return {}
    value = view.folded(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.float32)
    if value is None or value.size != 1:
        return None
    zero_point = view.folded(group.q.input[2]) if len(group.q.input) > 2 and group.q.input[2] else None
    zero_point = None if zero_point is None else torch.tensor(zero_point.reshape(()))
    dtype = torch.uint8 if zero_point is None else zero_point.dtype
    quantized = quantize(torch.tensor(np.float32(value.reshape(()))), torch.tensor(scale), zero_point, dtype)
    name = f"{node.name or 'Pad'}_value_quantized"
    while len(node.input) < 3:
        node.input.append("")
    node.input[2] = name
    return {name: quantized}


def _same_parameters(view: GraphView, dq: onnx.NodeProto, q: onnx.NodeProto, positive: bool) -> bool:
    """Whether a DQ and a Q have the same single scale and zero point (positive scale if asked)."""
    values = []
    for node in (dq, q):
        scale = view.folded(node.input[1])
        zero = view.folded(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale is None or scale.size != 1 or (zero is not None and zero.size != 1):
            return False
        values.append((scale.dtype, float(scale.reshape(-1)[0]),
                       None if zero is None else (zero.dtype, int(zero.reshape(-1)[0]))))
    zero_default = [v[2] or (np.dtype(np.uint8), 0) for v in values]
    return values[0][:2] == values[1][:2] and zero_default[0] == zero_default[1] and (
        not positive or values[0][1] > 0)
