"""``dequantize=True``: rewrite a quantized ONNX graph into the float graph it approximates, before conversion.

The result is a float model for fine-tuning: quantized weights become float initializers ``scale * (q - zero_point)``
(computed as onnxruntime's DequantizeLinear computes them, so they become ``nn.Parameter``s), activations are no
longer quantized, and every quantized op becomes its float op:

- DequantizeLinear of a constant: the float constant.
- DequantizeLinear of a value that a QuantizeLinear (or DynamicQuantizeLinear) made with the same parameters: that
  QuantizeLinear's float input. Data-movement ops between them (Reshape, Transpose, MaxPool, Gather, ...) run on the
  float values instead, which commutes exactly with per-tensor quantization.
- QLinearConv, QLinearMatMul, QGemm, QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
  QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax, QLinearConcat: the float op on dequantized inputs
  (int32 biases scaled by input scale * weight scale), followed by a QuantizeLinear that only stays where something
  still needs the quantized value (e.g. a quantized graph output).
- The dynamic-quantization pattern DynamicQuantizeLinear -> MatMulInteger/ConvInteger -> Cast -> Mul(scales):
  MatMul/Conv of the float input by the dequantized weight. DynamicQuantizeMatMul and MatMulIntegerToFloat: MatMul
  (+ Add bias). DynamicQuantizeLSTM: LSTM with dequantized W and R (back in ONNX layout).

Anything else stays as it is and is converted exactly. Subgraph bodies are not rewritten.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import MappingProxyType

import onnx
import torch
from onnx import helper, numpy_helper

from .modules.quantized import dequantize as dequantize_values
from .modules.quantized import per_axis
from .node import attribute_value, bodies, free_names, read_names
from .registry import normalize_domain
from .tensors import to_torch

# Ops that only move, select or take the maximum of values: DequantizeLinear (per tensor) commutes with them. Pad's
# constant becomes the float value it stands for; Resize interpolates the float values (what its quantized form
# approximates).
MOVEMENT = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather",
                      "GatherElements", "GatherND", "Expand", "Tile", "DepthToSpace", "SpaceToDepth", "MaxPool",
                      "ReduceMax", "ReduceMin", "Split", "Pad", "Resize"})
QUANTIZE_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
Params = tuple[str | None, str | None, int]  # (scale, zero point, axis) of a quantized value


def dequantize_model(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None) -> onnx.ModelProto:
    """The float model that ``model`` quantizes (a new ModelProto; ``model`` is not changed)."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    opset = next((o.version for o in model.opset_import if normalize_domain(o.domain) == ""), 1)
    rewriter = _Rewriter(result.graph, opset, None if base_dir is None else str(base_dir))
    rewriter.run()
    return result


class _Rewriter:
    def __init__(self, graph: onnx.GraphProto, opset: int, base_dir: str | None):
        self.graph, self.opset, self.base_dir = graph, opset, base_dir
        self.initializers = {t.name: t for t in graph.initializer}
        self.constants: dict[str, torch.Tensor] = {}  # values read so far (initializers, Constant nodes)
        self.producer = {name: node for node in graph.node for name in node.output if name}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.names = {name for node in graph.node for name in (*node.input, *node.output)} | set(self.initializers)
        self.nodes: list[onnx.NodeProto] = []
        self.added: list[onnx.TensorProto] = []
        self.float_of: dict[str, tuple[str, Params]] = {}  # quantized value -> (float value, its parameters)
        self.memo: dict[tuple, str] = {}
        self.alias: dict[str, str] = {}  # a replaced value -> the value standing for it from now on

    # ------------------------------------------------------------------------------------------- helpers

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            name, n = f"{base}_{n}", n + 1
        self.names.add(name)
        return name

    def constant(self, name: str | None) -> torch.Tensor | None:
        if not name:
            return None
        if name not in self.constants and name in self.initializers:
            self.constants[name] = to_torch(self.initializers[name], self.base_dir)
        return self.constants.get(name)

    def add_constant(self, base: str, value: torch.Tensor) -> str:
        name = self.fresh(base)
        self.added.append(numpy_helper.from_array(value.detach().numpy(), name))
        self.constants[name] = value
        return name

    def emit(self, op_type: str, inputs, outputs, domain: str = "", **attributes) -> onnx.NodeProto:
        node = helper.make_node(op_type, [self.alias.get(i, i) for i in inputs], list(outputs), domain=domain,
                                **attributes)
        self.nodes.append(node)
        return node

    def same(self, a: str | None, b: str | None) -> bool:
        """Whether two scale / zero-point inputs hold the same value (absent zero points are 0)."""
        if a == b:
            return True
        va, vb = self.constant(a), self.constant(b)
        if (a and va is None) or (b and vb is None):
            return False
        va = torch.zeros(()) if va is None else va
        vb = torch.zeros(()) if vb is None else vb
        return va.shape == vb.shape and bool((va.double() == vb.double()).all())

    # ------------------------------------------------------------------------------------------- float values

    def float_version(self, value: str, scale: str | None, zero_point: str | None, axis: int = 1) -> str:
        """A float value that the quantized ``value`` stands for under (scale, zero point, axis): its quantizer's
        input, a dequantized constant, data movement redone on float values, or else a DequantizeLinear."""
        key = (value, scale, zero_point, axis)
        if key not in self.memo:
            self.memo[key] = self._float_version(value, (scale, zero_point, axis))
        return self.memo[key]

    def _float_version(self, value: str, params: Params) -> str:
        scale, zero_point, axis = params
        known = self.float_of.get(value)
        if known is not None and self.same(known[1][0], scale) and self.same(known[1][1], zero_point) and (
                known[1][2] == axis or self.per_tensor(scale)):
            return known[0]
        q, s, z = self.constant(value), self.constant(scale), self.constant(zero_point)
        if q is not None and s is not None and (zero_point is None or z is not None):
            dims = dict(x=q, axis=axis)
            return self.add_constant(f"{value}_dequantized",
                                     dequantize_values(q, per_axis(s, **dims), per_axis(z, **dims)))
        node = self.producer.get(value)
        if node is not None and node.op_type in MOVEMENT and node.input[0] and self.per_tensor(scale) and \
                (node.op_type != "MaxPool" or len([o for o in node.output if o]) == 1) and \
                (node.op_type != "Pad" or self.opset >= 11):  # not MaxPool's Indices, nor Pad's old float attribute
            return self.moved(node, params)[list(node.output).index(value)]
        output = self.fresh(f"{value}_float")
        self.emit("DequantizeLinear", [value, scale or "", zero_point or ""], [output], axis=axis)
        return output

    def moved(self, node: onnx.NodeProto, params: Params) -> list[str]:
        """The outputs of a copy of the data-movement ``node`` that runs on float values (made once per params)."""
        key = (id(node), *params)
        if key not in self.memo:
            source = self.float_version(node.input[0], *params)
            moved = onnx.NodeProto()
            moved.CopyFrom(node)
            moved.name = self.fresh(f"{node.name or node.op_type}_float")
            moved.input[:] = [source] + [self.alias.get(i, i) for i in node.input[1:]]
            moved.output[:] = [self.fresh(f"{o}_float") if o else "" for o in node.output]
            if node.op_type == "Pad" and self.opset >= 11:
                self.float_pad_value(moved, node, params)
            self.nodes.append(moved)
            self.memo[key] = list(moved.output)
        return self.memo[key]

    def float_pad_value(self, moved: onnx.NodeProto, node: onnx.NodeProto, params: Params) -> None:
        """A quantized Pad's constant (0 when absent) as the float value it stands for: (value - zp) * scale."""
        scale, zero_point, _ = params
        value = self.constant(_input(node, 2))
        dtype = self.constant(zero_point).dtype if zero_point else torch.uint8
        value = torch.zeros((), dtype=dtype) if value is None else value
        float_value = dequantize_values(value, self.constant(scale), self.constant(zero_point))
        while len(moved.input) < 3:
            moved.input.append("")
        moved.input[2] = self.add_constant(f"{node.output[0]}_pad_value", float_value.reshape(value.shape))

    def per_tensor(self, scale: str | None) -> bool:
        value = self.constant(scale)
        return value is not None and value.numel() == 1

    def quantized_output(self, float_value: str, output: str, scale: str | None, zero_point: str | None,
                         axis: int = 1, domain: str = "") -> None:
        """Record that ``output`` quantizes ``float_value`` and keep a QuantizeLinear for consumers that need it."""
        self.float_of[output] = (float_value, (scale, zero_point, axis))
        inputs = [float_value, scale or ""] + ([zero_point] if zero_point else [])
        self.emit("QuantizeLinear", inputs, [output], domain=domain, axis=axis)

    # ------------------------------------------------------------------------------------------- the pass

    def run(self) -> None:
        patterns = self.dynamic_patterns()
        for node in self.graph.node:
            if node.op_type == "Constant" and normalize_domain(node.domain) == "":
                self.read_constant(node)
            lower = LOWERINGS.get((normalize_domain(node.domain), node.op_type))
            if node.output[0] in patterns:
                self.lower_dynamic_pattern(node, *patterns[node.output[0]])
            elif lower is None or not lower(self, node):
                self.keep(node)
        self.finish()

    def read_constant(self, node: onnx.NodeProto) -> None:
        attributes = {a.name: attribute_value(a) for a in node.attribute}
        if "value" in attributes and isinstance(attributes["value"], torch.Tensor):
            self.constants[node.output[0]] = attributes["value"]

    def keep(self, node: onnx.NodeProto) -> None:
        if node.op_type in QUANTIZE_OPS and normalize_domain(node.domain) in ("", "com.microsoft"):
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            params = (node.input[1], node.input[2] if len(node.input) > 2 else None, axis) \
                if node.op_type == "QuantizeLinear" else (node.output[1], node.output[2], 1)
            self.float_of[node.output[0]] = (self.alias.get(node.input[0], node.input[0]), params)
        kept = onnx.NodeProto()
        kept.CopyFrom(node)
        kept.input[:] = [self.alias.get(i, i) for i in node.input]
        for name in _subgraph_reads(node):  # values a body reads from outside keep their names
            self.restore(name)
        self.nodes.append(kept)

    def restore(self, name: str) -> None:
        """Make the replaced value ``name`` exist again under its own name (a graph output, a subgraph's read)."""
        if name in self.alias:
            self.nodes.append(helper.make_node("Identity", [self.alias.pop(name)], [name]))

    def finish(self) -> None:
        """Replace the graph's nodes, drop what no output needs (quantized weights included)."""
        for output in self.graph.output:
            self.restore(output.name)
        needed = {o.name for o in self.graph.output}
        kept = []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.output if o) or _has_subgraph(node):
                kept.append(node)
                needed.update(read_names(node))
        kept.reverse()
        self.graph.ClearField("node")
        self.graph.node.extend(kept)
        initializers = [t for t in (*self.graph.initializer, *self.added) if t.name in needed]
        self.graph.ClearField("initializer")
        self.graph.initializer.extend(initializers)
        produced = {o for node in kept for o in node.output} | {i.name for i in self.graph.input}
        infos = [v for v in self.graph.value_info if v.name in produced and v.name in needed]
        self.graph.ClearField("value_info")
        self.graph.value_info.extend(infos)

    # ------------------------------------------------------------------------------------------- dynamic pattern

    def dynamic_patterns(self) -> dict[str, tuple]:
        """{output of the final Mul: (integer node, float input, Mul node)} for each DynamicQuantizeLinear ->
        MatMulInteger/ConvInteger -> Cast -> Mul(x_scale * w_scale) whose weights are constants."""
        found = {}
        for node in self.graph.node:
            if node.op_type not in ("MatMulInteger", "ConvInteger") or normalize_domain(node.domain) != "":
                continue
            match = self.match_dynamic(node)
            if match is not None:
                found[match[1].output[0]] = (node, *match)
        return found

    def match_dynamic(self, node: onnx.NodeProto):
        quantizer = self.producer.get(node.input[0])
        if quantizer is None or quantizer.op_type != "DynamicQuantizeLinear" or len(node.input) < 3 or \
                node.input[2] != quantizer.output[2] or self.constant(node.input[1]) is None:
            return None
        cast = self._only_consumer(node.output[0], "Cast")
        if cast is None or next((a.i for a in cast.attribute if a.name == "to"), None) != onnx.TensorProto.FLOAT:
            return None
        mul = self._only_consumer(cast.output[0], "Mul")
        scales = self.producer.get(mul.input[1] if mul is not None and mul.input[0] == cast.output[0] else
                                   mul.input[0] if mul is not None else "")
        if scales is None or scales.op_type != "Mul" or quantizer.output[1] not in scales.input:
            return None
        weight_scale = scales.input[1] if scales.input[0] == quantizer.output[1] else scales.input[0]
        if self.constant(weight_scale) is None:
            return None
        return quantizer.input[0], mul, weight_scale

    def _only_consumer(self, value: str, op_type: str) -> onnx.NodeProto | None:
        users = self.consumers.get(value, [])
        return users[0] if len(users) == 1 and users[0].op_type == op_type and value not in \
            {o.name for o in self.graph.output} else None

    def lower_dynamic_pattern(self, mul: onnx.NodeProto, integer: onnx.NodeProto, source: str,
                              _: onnx.NodeProto, weight_scale: str) -> None:
        weight_zero_point = integer.input[3] if len(integer.input) > 3 and integer.input[3] else None
        conv = integer.op_type == "ConvInteger"
        # per output channel: the first axis of a convolution's weight, the last of a matmul's
        weight = self.float_version(integer.input[1], weight_scale, weight_zero_point, axis=0 if conv else -1)
        attributes = {a.name: attribute_value(a) for a in integer.attribute}
        self.emit("Conv" if conv else "MatMul", [source, weight], [mul.output[0]], **attributes)


def _subgraph_reads(node: onnx.NodeProto) -> list[str]:
    return [name for body in bodies(node) for name in free_names(body)]


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


# ----------------------------------------------------------------------------------------------- lowerings
# Each returns True when it replaced the node (False keeps the node as it is).

def _input(node: onnx.NodeProto, index: int) -> str | None:
    return node.input[index] if index < len(node.input) and node.input[index] else None


def _attributes(node: onnx.NodeProto, names=None) -> dict:
    return {a.name: attribute_value(a) for a in node.attribute if names is None or a.name in names}


def _bias(rewriter: _Rewriter, bias: str | None, scales: list[str | None]) -> str | bool | None:
    """An int32 bias in float (bias * scale_1 * scale_2 ...), a new constant; False if it is not constant."""
    if bias is None:
        return None
    values = [rewriter.constant(bias)] + [rewriter.constant(s) for s in scales]
    if any(v is None for v in values):
        return False
    scale = values[1].float()
    for extra in values[2:]:
        scale = scale * extra.float()
    scale = scale.reshape(-1 if scale.numel() > 1 else ())
    return rewriter.add_constant(f"{bias}_dequantized", values[0].float() * scale)


def _qlinear_conv(r: _Rewriter, node) -> bool:
    x = r.float_version(node.input[0], node.input[1], node.input[2])
    w = r.float_version(node.input[3], node.input[4], node.input[5], axis=0)
    bias = _bias(r, _input(node, 8), [node.input[1], node.input[4]])
    if bias is False:
        return False
    out = r.fresh(f"{node.output[0]}_float")
    r.emit("Conv", [x, w] + ([bias] if bias else []), [out], **_attributes(node))
    r.quantized_output(out, node.output[0], node.input[6], node.input[7])
    return True


def _qlinear_matmul(r: _Rewriter, node) -> bool:
    a = r.float_version(node.input[0], node.input[1], node.input[2])
    b = r.float_version(node.input[3], node.input[4], node.input[5], axis=-1)
    out = r.fresh(f"{node.output[0]}_float")
    r.emit("MatMul", [a, b], [out])
    r.quantized_output(out, node.output[0], node.input[6], node.input[7])
    return True


def _qgemm(r: _Rewriter, node) -> bool:
    attributes = _attributes(node)
    a = r.float_version(node.input[0], node.input[1], node.input[2])
    b = r.float_version(node.input[3], node.input[4], node.input[5], axis=0 if attributes.get("transB") else -1)
    bias = _bias(r, _input(node, 6), [node.input[1], node.input[4]])
    if bias is False:
        return False
    y_scale, y_zero_point = _input(node, 7), _input(node, 8)
    quantized = y_zero_point is not None
    out = r.fresh(f"{node.output[0]}_float") if quantized or y_scale else node.output[0]
    r.emit("Gemm", [a, b] + ([bias] if bias else []), [out], **attributes)
    if quantized:
        r.quantized_output(out, node.output[0], y_scale, y_zero_point)
    elif y_scale:  # float output divided by y_scale (onnxruntime)
        r.emit("Div", [out, y_scale], [node.output[0]])
    return True


def _elementwise(op_type: str) -> Callable:
    def lower(r: _Rewriter, node) -> bool:
        a = r.float_version(node.input[0], node.input[1], _input(node, 2))
        b = r.float_version(node.input[3], node.input[4], _input(node, 5))
        out = r.fresh(f"{node.output[0]}_float")
        r.emit(op_type, [a, b], [out])
        r.quantized_output(out, node.output[0], node.input[6], _input(node, 7))
        return True
    return lower


def _activation(op_type: str, **defaults) -> Callable:
    def lower(r: _Rewriter, node) -> bool:
        x = r.float_version(node.input[0], node.input[1], _input(node, 2))
        out = r.fresh(f"{node.output[0]}_float")
        r.emit(op_type, [x], [out], **{**defaults, **_attributes(node)})
        r.quantized_output(out, node.output[0], node.input[3], _input(node, 4))
        return True
    return lower


def _qlinear_global_average_pool(r: _Rewriter, node) -> bool:
    if _attributes(node).get("channels_last", 0):
        return False
    x = r.float_version(node.input[0], node.input[1], _input(node, 2))
    out = r.fresh(f"{node.output[0]}_float")
    r.emit("GlobalAveragePool", [x], [out])
    r.quantized_output(out, node.output[0], node.input[3], _input(node, 4))
    return True


def _qlinear_average_pool(r: _Rewriter, node) -> bool:
    attributes = _attributes(node)
    if attributes.pop("channels_last", 0):
        return False
    x = r.float_version(node.input[0], node.input[1], _input(node, 2))
    out = r.fresh(f"{node.output[0]}_float")
    r.emit("AveragePool", [x], [out], **attributes)
    r.quantized_output(out, node.output[0], node.input[3], _input(node, 4))
    return True


def _qlinear_softmax(r: _Rewriter, node) -> bool:
    """Softmax with the node's semantics; kept quantized where the graph's Softmax version has the other ones."""
    attributes = _attributes(node)
    semantics = attributes.pop("opset")
    if (semantics >= 13) != (r.opset >= 13):
        return False
    x = r.float_version(node.input[0], node.input[1], _input(node, 2))
    out = r.fresh(f"{node.output[0]}_float")
    r.emit("Softmax", [x], [out], axis=attributes.get("axis", 1 if semantics < 13 else -1))
    r.quantized_output(out, node.output[0], node.input[3], _input(node, 4))
    return True


def _qlinear_concat(r: _Rewriter, node) -> bool:
    inputs = list(node.input[2:])
    parts = [r.float_version(x, s, z or None) for x, s, z in zip(inputs[::3], inputs[1::3], inputs[2::3],
                                                                  strict=True)]
    out = r.fresh(f"{node.output[0]}_float")
    r.emit("Concat", parts, [out], **_attributes(node))
    r.quantized_output(out, node.output[0], node.input[0], node.input[1])
    return True


def _dequantize_linear(r: _Rewriter, node) -> bool:
    axis = _attributes(node).get("axis", 1)
    if _attributes(node).get("block_size", 0) or _attributes(node).get("output_dtype", 0):
        return False
    r.alias[node.output[0]] = r.float_version(node.input[0], node.input[1], _input(node, 2), axis)
    return True


def _matmul_with_bias(r: _Rewriter, node, a: str, b: str, bias: str | None) -> None:
    if bias is None:
        r.emit("MatMul", [a, b], [node.output[0]])
        return
    product = r.fresh(f"{node.output[0]}_matmul")
    r.emit("MatMul", [a, b], [product])
    r.emit("Add", [product, bias], [node.output[0]])


def _dynamic_quantize_matmul(r: _Rewriter, node) -> bool:
    b = r.float_version(node.input[1], node.input[2], _input(node, 3), axis=-1)
    _matmul_with_bias(r, node, node.input[0], b, _input(node, 4))
    return True


def _matmul_integer_to_float(r: _Rewriter, node) -> bool:
    a = r.float_version(node.input[0], node.input[2], _input(node, 4))
    b = r.float_version(node.input[1], node.input[3], _input(node, 5), axis=-1)
    _matmul_with_bias(r, node, a, b, _input(node, 6))
    return True


def _dynamic_quantize_lstm(r: _Rewriter, node) -> bool:
    """W [D, I, 4H] and R [D, H, 4H] (scales and zero points per direction or per direction and column) back to
    float ONNX layout [D, 4H, I] / [D, 4H, H]."""
    weights = []
    for index, scale_index in ((1, 8), (2, 10)):
        q, s, z = (r.constant(node.input[i]) for i in (index, scale_index, scale_index + 1))
        if q is None or s is None or z is None:
            return False
        shape = [s.shape[0], 1, -1]  # [D] or [D, 4H]: per direction, broadcast over the column axis last
        value = dequantize_values(q, s.reshape(shape), z.reshape(shape)).transpose(1, 2).contiguous()
        weights.append(r.add_constant(f"{node.input[index]}_dequantized", value))
    inputs = [node.input[0], *weights, *(node.input[3:8])]
    while inputs and not inputs[-1]:
        inputs.pop()
    r.emit("LSTM", inputs, list(node.output), **_attributes(node))
    return True


LOWERINGS: Mapping[tuple[str, str], Callable[[_Rewriter, onnx.NodeProto], bool]] = MappingProxyType({
    ("", "DequantizeLinear"): _dequantize_linear,
    ("com.microsoft", "DequantizeLinear"): _dequantize_linear,
    ("", "QLinearConv"): _qlinear_conv,
    ("", "QLinearMatMul"): _qlinear_matmul,
    ("com.microsoft", "QGemm"): _qgemm,
    ("com.microsoft", "QLinearAdd"): _elementwise("Add"),
    ("com.microsoft", "QLinearMul"): _elementwise("Mul"),
    ("com.microsoft", "QLinearSigmoid"): _activation("Sigmoid"),
    ("com.microsoft", "QLinearLeakyRelu"): _activation("LeakyRelu", alpha=0.01),
    ("com.microsoft", "QLinearGlobalAveragePool"): _qlinear_global_average_pool,
    ("com.microsoft", "QLinearConcat"): _qlinear_concat,
    ("com.microsoft", "QLinearAveragePool"): _qlinear_average_pool,
    ("com.microsoft", "QLinearSoftmax"): _qlinear_softmax,
    ("com.microsoft", "DynamicQuantizeMatMul"): _dynamic_quantize_matmul,
    ("com.microsoft", "MatMulIntegerToFloat"): _matmul_integer_to_float,
    ("com.microsoft", "DynamicQuantizeLSTM"): _dynamic_quantize_lstm,
})

