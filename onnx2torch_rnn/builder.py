"""ONNX graph -> torch.fx GraphModule.

Plan first (every node must have a converter: one error lists all that do not), then walk the nodes in order
with one map {ONNX value name -> fx.Node}. A node whose run-time inputs are all constants is folded: its module
runs once here and its outputs become constants, so weights an exporter computes from initializers reach their
consumer as plain tensors. Constants consumed at run time become attributes of the GraphModule: float ones
``nn.Parameter`` (trainable), others buffers. One parameter per ONNX value, so tied weights stay tied.
"""

from __future__ import annotations

import keyword
import operator
import re
from collections import defaultdict
from collections.abc import Iterable

import onnx
import torch
from torch import fx, nn

from .errors import ConversionError, Onnx2TorchError, UnsupportedOperatorError
from .loading import LoadedModel
from .node import OnnxNode, attribute_value
from .registry import normalize_domain, resolve, schema_for
from .tensors import to_torch, torch_dtype

# Ops that must never be evaluated at conversion time, even when all their inputs are constants.
NOT_FOLDABLE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                          "Bernoulli"})


def sanitize(name: str) -> str:
    """A valid Python identifier close to an ONNX name."""
    name = re.sub(r"\W", "_", name).strip("_") or "value"
    if name[0].isdigit() or keyword.iskeyword(name):
        name = "_" + name
    return name


class _Names:
    """Allocates unique identifiers, also avoiding names that an nn.Module already has."""

    def __init__(self, reserved: Iterable[str] = ()):
        self.taken = set(reserved)

    def __call__(self, name: str) -> str:
        base = sanitize(name)
        candidate, n = base, 1
        while candidate in self.taken:
            candidate, n = f"{base}_{n}", n + 1
        self.taken.add(candidate)
        return candidate


class ConversionContext:
    """What converters may ask about the graph: constant values, static types and shapes, opsets."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.opsets = loaded.opsets
        graph = loaded.proto.graph
        self._initializers = {t.name: t for t in graph.initializer}
        self._constants: dict[str, torch.Tensor] = {}
        self._types: dict[str, onnx.TypeProto] = {}
        inferred = loaded.inferred.graph
        for info in (*inferred.input, *inferred.value_info, *inferred.output):
            if info.type.HasField("tensor_type"):
                self._types[info.name] = info.type

    def is_constant(self, name: str | None) -> bool:
        return name is not None and (name in self._constants or name in self._initializers)

    def constant(self, name: str | None) -> torch.Tensor | None:
        """The value of an initializer or folded constant, else None (absent input or computed at run time)."""
        if name is None:
            return None
        if name not in self._constants and name in self._initializers:
            self._constants[name] = to_torch(self._initializers.pop(name), self.loaded.base_dir)
        return self._constants.get(name)

    def set_constant(self, name: str, value: torch.Tensor) -> None:
        self._constants[name] = value

    def dtype(self, name: str | None) -> torch.dtype | None:
        """Static element type of a value when known."""
        if self.is_constant(name):
            return self.constant(name).dtype
        value_type = self._types.get(name)
        return torch_dtype(value_type.tensor_type.elem_type) if value_type else None

    def shape(self, name: str | None) -> list[int | str | None] | None:
        """Static shape when known: ints, symbolic dim names, or None for unknown dims; None if the rank is unknown."""
        if self.is_constant(name):
            return list(self.constant(name).shape)
        value_type = self._types.get(name)
        if value_type is None or not value_type.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in value_type.tensor_type.shape.dim]


def plan(graph: onnx.GraphProto, opsets: dict[str, int]) -> list[tuple]:
    """(converter, version, schema) for each node; one UnsupportedOperatorError listing every missing op."""
    steps, missing = [], defaultdict(list)
    for index, node in enumerate(graph.node):
        domain = normalize_domain(node.domain)
        opset = opsets.get(domain)
        found = resolve(domain, node.op_type, opset) if opset is not None else None
        if found is None:
            missing[(domain, node.op_type, opset or 0)].append(node.name or f"#{index}")
            continue
        converter, version = found
        steps.append((converter, version, schema_for(domain, node.op_type, opset)))
    if missing:
        raise UnsupportedOperatorError(missing)
    return steps


def build(loaded: LoadedModel) -> fx.GraphModule:
    graph_proto = loaded.proto.graph
    steps = plan(graph_proto, loaded.opsets)
    ctx = ConversionContext(loaded)
    root, graph = nn.Module(), fx.Graph()
    attribute_names = _Names(dir(root))
    env: dict[str, fx.Node] = {}
    constant_nodes: dict[str, fx.Node] = {}

    def value(name: str | None) -> fx.Node | None:
        if name is None:
            return None
        if name in env:
            return env[name]
        if name not in constant_nodes:
            tensor = ctx.constant(name)
            if tensor is None:
                raise ConversionError("<graph>", "-", f"value {name!r} is used before it is computed")
            target = attribute_names(name)
            if tensor.is_floating_point():
                root.register_parameter(target, nn.Parameter(tensor))
            else:
                root.register_buffer(target, tensor)
            constant_nodes[name] = graph.get_attr(target)
        return constant_nodes[name]

    placeholder_names = _Names()
    for info in graph_proto.input:
        if not ctx.is_constant(info.name):  # an input with an initializer of the same name is a constant
            env[info.name] = graph.placeholder(placeholder_names(info.name))

    for index, (proto, (converter, version, schema)) in enumerate(zip(graph_proto.node, steps, strict=True)):
        node = OnnxNode(proto, proto.name or f"{proto.op_type}_{index}", version, schema)
        try:
            result = converter(node, ctx)
            unread = node.unread_attributes()
            if unread:
                attribute = next(a for a in proto.attribute if a.name == unread[0])
                raise node.unsupported(attribute.name, attribute_value(attribute), "the converter does not read it")
            foldable = proto.op_type not in NOT_FOLDABLE and all(
                name is None or ctx.is_constant(name) for name in result.inputs
            )
            if foldable:
                with torch.no_grad():
                    outputs = result.module(*(ctx.constant(name) for name in result.inputs))
        except Onnx2TorchError:
            raise
        except Exception as error:
            raise ConversionError(node.name, node.op_type, f"{type(error).__name__}: {error}") from error

        if foldable:
            for name, tensor in _per_output(node, outputs):
                ctx.set_constant(name, tensor)
            continue
        target = attribute_names(node.name)
        root.add_module(target, result.module)
        fx_node = graph.call_module(target, tuple(value(name) for name in result.inputs))
        fx_node.meta["onnx"] = {"name": proto.name, "op_type": proto.op_type, "domain": node.domain,
                                "version": version, "opset": loaded.opsets[normalize_domain(node.domain)]}
        if len(node.outputs) == 1:
            outputs = fx_node
        else:
            outputs = [graph.call_function(operator.getitem, (fx_node, i)) for i in range(len(node.outputs))]
        for name, out in _per_output(node, outputs):
            env[name] = out

    outputs = [value(info.name) for info in graph_proto.output]
    graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
    module = fx.GraphModule(root, graph, class_name=sanitize(graph_proto.name or "OnnxModel"))
    module.graph.eliminate_dead_code()
    module.delete_all_unused_submodules()
    used = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    for n in constant_nodes.values():
        if n.target not in used:  # a constant that only a dead node consumed
            delattr(module, n.target)
    module.recompile()
    return module


def _per_output(node: OnnxNode, result):
    """(ONNX output name, value) pairs: a single-output node's result is the value, otherwise one item per slot."""
    if len(node.outputs) == 1:
        if node.outputs[0] is not None:
            yield node.outputs[0], result
        return
    for index, name in enumerate(node.outputs):
        if name is not None:
            yield name, result[index]
