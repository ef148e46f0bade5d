"""What a converter sees of an ONNX node, and what it returns; which values a node reads.

``OnnxNode`` records every attribute a converter reads; the builder refuses a node that carries an attribute its
converter never read, so no attribute can be ignored silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import torch
from torch import nn

from .errors import UnsupportedAttributeError
from .tensors import to_torch

_SCHEMA = object()  # sentinel: take the default from the operator schema


def attribute_value(attribute: onnx.AttributeProto) -> Any:
    """An attribute as a Python value: strings decoded, tensors as torch tensors, graphs as GraphProto."""
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return to_torch(value)
    if isinstance(value, list):
        if value and isinstance(value[0], bytes):
            return [v.decode() for v in value]
        if attribute.type == onnx.AttributeProto.TENSORS:
            return [to_torch(v) for v in value]
    return value


def bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """A node's subgraphs (If branches, Loop and Scan bodies), in attribute order."""
    return [body for attribute in node.attribute
            for body in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs)]


def read_names(node: onnx.NodeProto) -> list[str]:
    """The values a node reads: its inputs and what its subgraphs read from enclosing scopes."""
    return [name for name in node.input if name] + [name for body in bodies(node) for name in free_names(body)]


def free_names(graph: onnx.GraphProto, nodes: list[onnx.NodeProto] | None = None) -> list[str]:
    """Values a (sub)graph reads from enclosing scopes, in order of first use. ``nodes``: its nodes, if not its own."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    free: dict[str, None] = {}
    for node in graph.node if nodes is None else nodes:
        free.update((name, None) for name in read_names(node) if name not in defined)
        defined.update(node.output)
    free.update((o.name, None) for o in graph.output if o.name not in defined)
    return list(free)


class OnnxNode:
    """An ONNX node with resolved version, normalised optional inputs and tracked attribute reads."""

    def __init__(self, proto: onnx.NodeProto, name: str, version: int, schema: onnx.defs.OpSchema | None,
                 static_inputs: frozenset[int] = frozenset()):
        self.proto = proto
        self.name = name  # unique and non-empty, also when the ONNX node has no name
        self.op_type = proto.op_type
        self.domain = proto.domain
        self.version = version  # the since_version of the schema this node is converted under
        self.schema = schema
        # Optional inputs/outputs may be '' anywhere: normalised to None once, here.
        self.inputs: tuple[str | None, ...] = tuple(name or None for name in proto.input)
        self.outputs: tuple[str | None, ...] = tuple(name or None for name in proto.output)
        self.static_inputs = static_inputs  # the inputs its converter declares static (register_converter)
        self._attributes = {a.name: a for a in proto.attribute}
        self._read: set[str] = set()

    def input(self, index: int) -> str | None:
        """Name of input ``index``, or None when it is absent ('' or past the end)."""
        return self.inputs[index] if index < len(self.inputs) else None

    def output(self, index: int) -> str | None:
        return self.outputs[index] if index < len(self.outputs) else None

    def has_attr(self, name: str) -> bool:
        return name in self._attributes

    def attr(self, name: str, default: Any = _SCHEMA) -> Any:
        """The attribute's value; when absent, ``default`` or else the schema's default (None if it has none)."""
        self._read.add(name)
        if name in self._attributes:
            return attribute_value(self._attributes[name])
        if default is not _SCHEMA:
            return default
        if self.schema is not None and name in self.schema.attributes:
            proto = self.schema.attributes[name].default_value
            if proto.type != onnx.AttributeProto.UNDEFINED:
                return attribute_value(proto)
        return None

    def unread_attributes(self) -> list[str]:
        return [name for name in self._attributes if name not in self._read]

    def unsupported(self, attribute: str, value: Any, reason: str = "") -> UnsupportedAttributeError:
        """The error to raise for an attribute value (or input form) this converter cannot honour."""
        return UnsupportedAttributeError(self.name, self.op_type, attribute, value, reason)

    def __repr__(self) -> str:
        return f"OnnxNode({self.op_type!r}, name={self.name!r}, version={self.version})"


def refuse_uint64(node: OnnxNode, ctx) -> None:
    """Refuse, at conversion, a node with a uint64 input whose computation has no exact uint64 form: torch has no
    uint64 kernel for it, and reading the bits as int64 would turn values >= 2**63 negative (rather than torch's
    NotImplementedError at run time)."""
    for index, name in enumerate(node.inputs):
        try:
            uint64 = ctx.dtype(name) == torch.uint64
        except NotImplementedError:  # an element type torch has no dtype for: not uint64
            uint64 = False
        if uint64:
            raise node.unsupported(f"input {index}", "uint64", f"{node.op_type} has no exact uint64 computation "
                                   "(torch has no kernel; int64 would read values >= 2**63 as negative)")


@dataclass
class Converted:
    """A converter's result: the module to call and the ONNX values it takes at run time, in forward order.

    ``inputs`` entries may be None (an absent optional input is passed as None). The module returns one tensor
    when the node has one output, else a tuple with one entry per output slot of the node.

    ``ints``: positions of inputs the module also takes as Python ints (an int, or a list of them for a 1-d value):
    where shape arithmetic computes every one of them from tensor sizes, the builder passes them so
    (shape_arithmetic.py), and with ``device`` also ``device=`` of a tensor whose sizes they read (for a module
    that creates a tensor from a shape alone).
    """

    module: nn.Module
    inputs: Sequence[str | None]
    ints: Sequence[int] = ()
    device: bool = False


@dataclass(frozen=True)
class StaticInput:
    """An input that steers the computation (a shape, axes, pads, k, ...), as ``ConversionContext.static`` finds it:
    ``value`` when conversion knows it (a tensor, or the Python value of the attribute that held it in earlier
    versions), to bake into the module; else ``run_time``, the input's name, for the module to read at run time.
    Both are None when the optional input is absent."""

    value: Any
    run_time: str | None

    def values(self) -> list | None:
        """The value's elements as a flat Python list."""
        if self.value is None:
            return None
        if isinstance(self.value, torch.Tensor):
            return self.value.reshape(-1).tolist()
        return list(self.value) if isinstance(self.value, list | tuple) else [self.value]

    def ints(self) -> list[int] | None:
        """The elements as ints (floats truncate toward zero, as onnxruntime casts them)."""
        values = self.values()
        return None if values is None else [int(v) for v in values]

    def integer(self) -> int | None:
        """The first element as an int (a scalar such as TopK's k)."""
        values = self.ints()
        return None if values is None else values[0]

    def scalar(self) -> bool | int | float | None:
        """The single element of a scalar (or one-element) value."""
        values = self.values()
        return None if values is None else values[0]
