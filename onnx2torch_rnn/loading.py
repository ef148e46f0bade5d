"""Reading a model: parse, check, refuse unsafe external data, infer shapes, resolve opsets.

External tensor data is not loaded into the proto (which cannot exceed 2 GB): ``tensors.to_torch`` reads each
tensor straight from its file when a converter asks for it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from .errors import InvalidModelError
from .registry import normalize_domain
from .tensors import external_data_path, is_external

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    base_dir: str | None  # folder that external data paths are relative to; None for bytes
    opsets: dict[str, int]  # domain ('' for ai.onnx) -> opset version


def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _subgraphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for g in attribute.graphs:
                    yield from _subgraphs(g)


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    for g in _subgraphs(graph):
        yield from g.initializer
        for node in g.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    yield attribute.t
                elif attribute.type == onnx.AttributeProto.TENSORS:
                    yield from attribute.tensors


def load_model(source: ModelSource, base_dir: str | os.PathLike | None = None) -> LoadedModel:
    """Parse and validate a model from a path, serialized bytes or a ModelProto.

    ``base_dir`` is where external data lives for bytes/ModelProto sources (a path source uses its own folder).
    """
    if isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)  # shape inference below must not touch the caller's model
    elif isinstance(source, bytes | bytearray):
        proto = _parse(bytes(source), "<bytes>")
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no ONNX model at {str(path)!r}")
        proto = _parse(path.read_bytes(), str(path))
        base_dir = path.resolve().parent if base_dir is None else base_dir
    else:
        raise TypeError(f"convert() takes a path, bytes or onnx.ModelProto, not {type(source).__name__}")
    base_dir = None if base_dir is None else str(base_dir)

    for tensor in _tensors(proto.graph):
        if is_external(tensor):
            external_data_path(tensor, base_dir)  # raises for a missing file or a path outside the folder
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        raise InvalidModelError(f"invalid ONNX model: {error}") from error
    with contextlib.suppress(Exception):  # shape information only helps converters; a model may lack it
        proto = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    opsets = {normalize_domain(o.domain): o.version for o in proto.opset_import}
    return LoadedModel(proto, base_dir, opsets)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as error:  # protobuf raises its own DecodeError
        raise InvalidModelError(f"{where} is not a serialized ONNX model: {error}") from error
    return proto
