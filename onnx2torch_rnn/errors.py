"""Error types. Every error that concerns a node names it, so a failure in a large graph is easy to find."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any


class Onnx2TorchError(Exception):
    """Base of every error this package raises on purpose."""


class InvalidModelError(Onnx2TorchError, ValueError):
    """The model is not valid ONNX (the checker's reason is in the message) or is unsafe to load."""


class UnsupportedOperatorError(Onnx2TorchError, NotImplementedError):
    """One or more (domain, op_type, opset) have no registered converter.

    ``missing`` maps each ``(domain, op_type, opset)`` to the names of the nodes that use it, so one error
    reports everything a model lacks.
    """

    def __init__(self, missing: Mapping[tuple[str, str, int], Sequence[str]]):
        self.missing = {key: list(names) for key, names in missing.items()}
        lines = []
        for (domain, op_type, opset), names in sorted(self.missing.items()):
            shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            lines.append(f"  {domain or 'ai.onnx'}::{op_type} (opset {opset}): nodes {shown}")
        super().__init__(f"{len(self.missing)} unsupported operator(s):\n" + "\n".join(lines))


class UnsupportedOpsetError(Onnx2TorchError, NotImplementedError):
    """The model imports an opset of the default domain newer than any this package knows: its ops may mean
    something else there, so it is not converted as if it were the newest known one."""

    def __init__(self, domain: str, opset: int, newest: int):
        self.domain, self.opset, self.newest = domain, opset, newest
        super().__init__(f"the model imports opset {opset} of {domain or 'ai.onnx'}; the newest this package knows "
                         f"is {newest}")


class UnsupportedTypeError(Onnx2TorchError, NotImplementedError):
    """An ONNX element type torch has no dtype for (string, float8, int4, ...), or a number that is no ONNX type."""


class UnsupportedAttributeError(Onnx2TorchError, NotImplementedError):
    """A node uses an attribute (or an attribute value, or an input form) that its converter cannot honour."""

    def __init__(self, node_name: str, op_type: str, attribute: str, value: Any, reason: str = ""):
        self.node_name, self.op_type, self.attribute, self.value = node_name, op_type, attribute, value
        message = f"{op_type} node {node_name!r}: attribute {attribute}={value!r} is not supported"
        super().__init__(message + (f": {reason}" if reason else ""))


class ConversionError(Onnx2TorchError):
    """A converter failed on a node for another reason; the original exception is chained."""

    def __init__(self, node_name: str, op_type: str, message: str):
        self.node_name, self.op_type = node_name, op_type
        super().__init__(f"{op_type} node {node_name!r}: {message}")


class GraphConversionError(ConversionError):
    """Conversion failed for a graph as a whole, at no one node: a value that the graph reads but nothing computes
    (no earlier node, graph input or initializer), or assembling the module from the converted nodes. A subclass of
    ConversionError, which such failures raised before (naming the node ``'<graph>'``). ``graph_name`` names the
    ONNX graph (a control-flow body has its own); ``node_name`` and ``op_type`` are None."""

    def __init__(self, graph_name: str, message: str):
        self.graph_name, self.node_name, self.op_type = graph_name, None, None
        Onnx2TorchError.__init__(self, f"graph {graph_name!r}: {message}")


class ExportError(Onnx2TorchError):
    """``to_onnx`` wrote nothing: torch cannot export the module (the message names the ONNX node whose module
    fails, when known), or onnxruntime's outputs of the exported model differ from the module's (it names the
    output)."""


class ReferenceRuntimeError(Onnx2TorchError):
    """onnxruntime, the reference that ``compare`` checks against, cannot run the model on the given inputs (or is
    not installed); onnxruntime's own exception is chained."""


class ModuleRunError(Onnx2TorchError):
    """The converted module fails on inputs that onnxruntime runs (``compare``); the module's exception is chained."""

    def __init__(self, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")


class OutputExistsError(Onnx2TorchError, FileExistsError):
    """Generated files would overwrite an existing, non-empty folder and overwriting was not asked for."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        super().__init__(f"{path} exists; pass force=True to overwrite it")
