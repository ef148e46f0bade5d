"""Reading a model: parse, check, refuse unsafe external data, infer shapes, resolve opsets.

External tensor data is not loaded into the proto (which cannot exceed 2 GB): ``tensors.to_torch`` reads each
tensor straight from its file when a converter asks for it. The checker and shape inference run on a skeleton
of the model whose large initializers are declared as typed graph inputs instead, so no weight is serialized or
copied for them (and external files need not be resolved relative to the working directory).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch

from .binding import Binding, bind, copy_except
from .errors import InvalidModelError, UnsupportedOpsetError
from .registry import normalize_domain
from .tensors import external_data_path, is_external, to_torch

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


# Initializers up to this many elements stay in the skeleton, so shape inference can propagate their values
# (e.g. a Reshape's target shape); larger ones become typed inputs there.
SKELETON_MAX_ELEMENTS = 1024


@dataclass
class LoadedModel:
    proto: onnx.ModelProto  # the model (its large inline weights moved to ``weights`` when it was parsed here)
    inferred: onnx.ModelProto  # the weightless skeleton after shape inference: static types of values
    base_dir: str | None  # folder that external data paths are relative to; None for bytes
    opsets: dict[str, int]  # domain ('' for ai.onnx) -> opset version
    weights: dict[str, torch.Tensor] = field(default_factory=dict)  # main-graph initializers already read
    # what was loaded, as given (path, bytes or ModelProto): onnxruntime runs it as the reference (checking.py)
    source: ModelSource | None = None
    # converted once by the caller that loaded it (convert()): its weights move into the module rather than being
    # copied, so each is held once
    single_use: bool = False
    # the graph inputs bound to constants at load time (binding.py): their values, and what inlined Ifs compute
    binding: Binding | None = None
    types: dict[str, onnx.TypeProto] = field(init=False)  # value name -> inferred type, subgraphs included
    declared: dict[str, list[int | None]] = field(init=False)  # run-time graph input -> declared dims (None: symbolic)
    op_types: frozenset[str] = field(init=False)  # of every node, subgraphs included
    taken: set[str] = field(init=False, default_factory=set, repr=False)  # single-use: what a conversion took

    def __post_init__(self):
        graphs = list(subgraphs(self.inferred.graph))
        self.op_types = frozenset(node.op_type for graph in graphs for node in graph.node)
        self.types = {info.name: info.type for graph in graphs
                      for info in (*graph.input, *graph.value_info, *graph.output)
                      if info.type.HasField("tensor_type")}
        initializers = {t.name for t in self.proto.graph.initializer}
        self.declared = {info.name: [d.dim_value if d.HasField("dim_value") else None
                                     for d in info.type.tensor_type.shape.dim]
                         for info in self.proto.graph.input
                         if info.name not in initializers and info.type.tensor_type.HasField("shape")}

    def weight(self, name: str) -> torch.Tensor | None:
        """The main-graph initializer ``name`` if it was read at load time (else None: the builder reads it from the
        proto), for one conversion to own: a copy, so that every conversion gets its own parameters; a single-use
        model's tensor itself, taken from it."""
        if self.single_use:
            if name in self.taken:
                raise ValueError(f"weight {name!r} of this single-use LoadedModel went to an earlier conversion "
                                 "(load_model(..., single_use=False) loads a model to convert any number of times)")
            weight = self.weights.pop(name, None)
            if weight is not None:
                self.taken.add(name)
            return weight
        weight = self.weights.get(name)
        return None if weight is None else weight.clone()


def subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from subgraphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for g in attribute.graphs:
                    yield from subgraphs(g)


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    for g in subgraphs(graph):
        yield from g.initializer
        for node in g.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    yield attribute.t
                elif attribute.type == onnx.AttributeProto.TENSORS:
                    yield from attribute.tensors


def load_model(source: ModelSource, base_dir: str | os.PathLike | None = None, *,
               dequantize: bool = False, single_use: bool = False,
               constants: Mapping[str, object] | None = None) -> LoadedModel:
    """Parse and validate a model from a path, serialized bytes or a ModelProto.

    ``base_dir`` is where external data lives for bytes/ModelProto sources (a path source uses its own folder).
    ``dequantize`` rewrites a quantized graph into the float graph it approximates (see ``dequantize.py``).
    ``constants`` binds graph inputs to values the caller fixes (binding.py): they become constants, and the Ifs
    they decide become the branch taken.
    The model converts any number of times, each conversion with its own parameters; ``single_use``: once, its
    weights moving into the module (no copy: for a caller that converts the model it loaded and drops it).
    """
    if isinstance(source, onnx.ModelProto):
        proto = source
    elif isinstance(source, bytes | bytearray):
        proto = _parse(bytes(source), "<bytes>")
    elif isinstance(source, str | os.PathLike):
        proto = parse_file(source)
        base_dir = Path(source).resolve().parent if base_dir is None else base_dir
    else:
        raise TypeError(f"convert() takes a path, bytes or onnx.ModelProto, not {type(source).__name__}")
    base_dir = None if base_dir is None else str(base_dir)
    _check_text(proto)

    for tensor in _tensors(proto.graph):
        if is_external(tensor):
            external_data_path(tensor, base_dir)  # raises for a missing file or a path outside the folder
    if dequantize:
        from .dequantize import dequantize_model

        proto = dequantize_model(proto, base_dir)
    weights = {}
    if not isinstance(source, onnx.ModelProto) or dequantize:  # our own proto: hold each weight once, as a tensor
        proto, weights = _take_weights(proto)
    binding = None
    if constants:
        proto, binding = bind(proto, constants)
    skeleton = _skeleton(proto)
    try:
        onnx.checker.check_model(skeleton)
    except onnx.checker.ValidationError as error:
        # The checker refuses deprecated ops (e.g. GroupNormalization-18) that runtimes still run: not an error
        # here, though the checker stops at the first finding, so such a model is checked less.
        if "deprecated" not in str(error):
            raise InvalidModelError(f"invalid ONNX model: {error}") from error
    with contextlib.suppress(Exception):  # shape information only helps converters; a model may lack it
        skeleton = _infer_shapes(skeleton)
    opsets = {normalize_domain(o.domain): o.version for o in proto.opset_import}
    newest = onnx.defs.onnx_opset_version()  # the installed onnx's schemas: what the converters are resolved by
    if opsets.get("", 0) > newest:
        raise UnsupportedOpsetError("", opsets[""], newest)
    return LoadedModel(proto, skeleton, base_dir, opsets, weights, source, single_use, binding)


def parse_file(path: str | os.PathLike) -> onnx.ModelProto:
    """The model in the file at ``path``, only parsed: neither checked nor its external data resolved (``load_model``
    does both)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX model at {str(path)!r}")
    return _parse(path.read_bytes(), str(path))


def _check_text(message) -> None:
    """Every string field of the model (names, op types, attributes' strings) as valid UTF-8: protobuf parses ONNX's
    proto2 strings unchecked and fails only where a field is read, deep inside the checker or a converter."""
    for descriptor, value in message.ListFields():
        # `is_repeated` in newer protobuf, where `label` is deprecated
        repeated = (descriptor.is_repeated if hasattr(descriptor, "is_repeated")
                    else descriptor.label == descriptor.LABEL_REPEATED)
        if descriptor.type == descriptor.TYPE_MESSAGE:
            for item in value if repeated else (value,):
                _check_text(item)
        elif descriptor.type == descriptor.TYPE_STRING:
            for item in value if repeated else (value,):
                if not isinstance(item, str):
                    raise InvalidModelError(f"invalid ONNX model: a {descriptor.full_name} is not valid UTF-8 "
                                            f"text: {item!r}")


def _large(tensor: onnx.TensorProto) -> bool:
    return int(np.prod(tensor.dims)) > SKELETON_MAX_ELEMENTS


def _take_weights(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    """Read the large inline initializers of the main graph into tensors and return a copy of the model whose
    initializers for them carry no data, so the parsed bytes can be freed (protobuf frees a message only whole)."""
    weights = {t.name: to_torch(t) for t in proto.graph.initializer if _large(t) and not is_external(t)}
    if not weights:
        return proto, weights
    graph = copy_except(proto.graph, ("initializer",))
    for tensor in proto.graph.initializer:
        if tensor.name in weights:
            tensor = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        graph.initializer.append(tensor)
    stripped = copy_except(proto, ("graph",))
    stripped.graph.CopyFrom(graph)
    return stripped, weights


def _skeleton(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model whose large or external initializers are typed graph inputs instead."""
    skeleton = copy_except(proto, ("graph",))
    skeleton.graph.CopyFrom(copy_except(proto.graph, ("initializer",)))
    declared = {i.name for i in proto.graph.input}
    for tensor in proto.graph.initializer:
        if is_external(tensor) or _large(tensor):
            if tensor.name not in declared:
                skeleton.graph.input.append(
                    onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
        else:
            skeleton.graph.initializer.append(tensor)
    return skeleton


def _infer_shapes(skeleton: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference, with the ranks it leaves out before opset 14: Reshape-5's inference gives an output
    no rank when the target shape is computed (paddle2onnx's Concat of Shape slices), though the target's length is
    known, as Reshape-14's gives it. Shape arithmetic on such an output (its sizes read as ints, shape_arithmetic.py)
    needs the rank: each is declared and inference runs again, while that finds more (one Reshape after another)."""
    inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False)
    while _declare_reshape_ranks(inferred):
        try:
            inferred = onnx.shape_inference.infer_shapes(inferred, check_type=False, strict_mode=False)
        except Exception:  # what inference found so far stands
            break
    return inferred


def _declare_reshape_ranks(model: onnx.ModelProto) -> bool:
    """Declare the rank of every Reshape output that inference left without one where its target's length is known;
    whether there was one."""
    found = False
    for graph in subgraphs(model.graph):
        infos = {info.name: info for info in (*graph.input, *graph.value_info, *graph.output)}
        for node in graph.node:
            rank = _reshape_rank(node, infos)
            if rank is not None:
                info = infos.get(node.output[0]) or graph.value_info.add(name=node.output[0])
                info.type.tensor_type.elem_type = infos[node.input[0]].type.tensor_type.elem_type
                info.type.tensor_type.shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in range(rank))
                found = True
    return found


def _reshape_rank(node: onnx.NodeProto, infos: Mapping[str, onnx.ValueInfoProto]) -> int | None:
    """The rank of a Reshape's output that inference left without one, from the known length of its target."""
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    data, target, output = (infos.get(name) for name in (node.input[0], node.input[1], node.output[0]))
    if data is None or target is None or (output is not None and output.type.tensor_type.HasField("shape")):
        return None
    dims = target.type.tensor_type.shape.dim
    return dims[0].dim_value if len(dims) == 1 and dims[0].HasField("dim_value") else None


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as error:  # protobuf raises its own DecodeError
        raise InvalidModelError(f"{where} is not a serialized ONNX model: {error}") from error
    return proto
