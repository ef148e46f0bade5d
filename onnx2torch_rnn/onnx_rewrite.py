"""ONNX-level finishing of an exported model for ``to_onnx``: the original's input and output names and dim names,
no exporter metadata, and the original's opset where ONNX's version converter can take the model there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import onnx

from ._version import __version__
from .errors import ExportError
from .node import bodies
from .signature import OnnxSignature

HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)

_ASIDE = "onnx2torch_rnn.aside"  # a private domain the version converter leaves alone


def opset_of(proto: onnx.ModelProto) -> int:
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def _rename(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename values everywhere in ``graph``, subgraphs included."""
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for body in bodies(node):
            _rename(body, mapping)
    for info in (*graph.input, *graph.output, *graph.value_info):
        info.name = mapping.get(info.name, info.name)
    for tensor in graph.initializer:
        tensor.name = mapping.get(tensor.name, tensor.name)


def _names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in (*graph.input, *graph.value_info)} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(node.output)
        for body in bodies(node):
            names |= _names(body)
    return names


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


def restore_interface(proto: onnx.ModelProto, signature: OnnxSignature) -> None:
    """Give the exported model the original's input and output names and dim names, check its dtypes against the
    original's, and drop the exporter's metadata."""
    graph = proto.graph
    if len(graph.input) != len(signature.inputs) or len(graph.output) != len(signature.outputs):
        raise ExportError(f"the exported model has {len(graph.input)} inputs and {len(graph.output)} outputs; the "
                          f"original has {len(signature.inputs)} and {len(signature.outputs)}")
    _rename(graph, _interface_names(graph, signature))
    _restore_dims(graph, signature)
    for kind, infos, specs in (("input", graph.input, signature.inputs), ("output", graph.output, signature.outputs)):
        for info, spec in zip(infos, specs, strict=True):
            got = info.type.tensor_type.elem_type
            if spec.elem_type and got != spec.elem_type:
                raise ExportError(f"{kind} {spec.name!r} of the exported model is {_type_name(got)}; the original "
                                  f"model's is {_type_name(spec.elem_type)}")
    _drop_metadata(graph)
    proto.producer_name, proto.producer_version = "onnx2torch_rnn", __version__


def _interface_names(graph: onnx.GraphProto, signature: OnnxSignature) -> dict[str, str]:
    """Exported value name -> new name: inputs and outputs get the original's; an output that is an input, a
    constant or another output gets an Identity first; internal values that hold a wanted name step aside."""
    taken = _names(graph)
    targets = {i.name: spec.name for i, spec in zip(graph.input, signature.inputs, strict=True)}
    fixed = {t.name for t in graph.initializer} | set(targets)
    for out, spec in zip(graph.output, signature.outputs, strict=True):
        if out.name in fixed and targets.get(out.name) != spec.name:
            copy = _unique(f"{out.name}_output", taken)
            graph.node.append(onnx.helper.make_node("Identity", [out.name], [copy]))
            out.name = copy
        fixed.add(out.name)
        targets[out.name] = spec.name
    wanted = set(targets.values())
    mapping = {name: _unique(f"{name}_", taken) for name in _names(graph) if name in wanted and name not in targets}
    return {**mapping, **targets}


def _restore_dims(graph: onnx.GraphProto, signature: OnnxSignature) -> None:
    """Input dims the exporter left symbolic get the original's names (or none where the original has none);
    other values' dims named after an input dim follow."""
    symbols: dict[str, str] = {}
    for info, spec in zip(graph.input, signature.inputs, strict=True):
        for dim, declared in zip(info.type.tensor_type.shape.dim, spec.dims or (), strict=False):
            if not dim.HasField("dim_param") or isinstance(declared, int):
                continue
            if declared is None:
                dim.Clear()
            else:
                symbols.setdefault(dim.dim_param, declared)
                dim.dim_param = declared
    for info in (*graph.output, *graph.value_info):
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in symbols:
                dim.dim_param = symbols[dim.dim_param]


def _type_name(elem_type: int) -> str:
    return onnx.TensorProto.DataType.Name(elem_type).lower()


def _drop_metadata(graph: onnx.GraphProto) -> None:
    """The exporter's per-value and per-node metadata (stack traces, fx names; they need IR version 10)."""
    for item in (*graph.input, *graph.output, *graph.value_info, *graph.initializer, *graph.node):
        del item.metadata_props[:]
    for node in graph.node:
        for body in bodies(node):
            _drop_metadata(body)


def has_half_precision(proto: onnx.ModelProto) -> bool:
    """Whether the model computes anything in float16/bfloat16 (rounding then differs by a unit in the last place)."""
    graph = proto.graph
    return (any(t.data_type in HALF_TYPES for t in graph.initializer)
            or any(v.type.tensor_type.elem_type in HALF_TYPES for v in (*graph.input, *graph.output,
                                                                         *graph.value_info))
            or any(a.name == "to" and a.i in HALF_TYPES for n in graph.node if n.op_type == "Cast"
                   for a in n.attribute))


def lower_opset(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """The model at the lowest opset from ``target`` up that ONNX's version converter reaches, with the lowest IR
    version that opset allows. The converter lacks most downward adapters, so nodes that mean the same at the lower
    opset are kept out of its way (_means_the_same) and Shape's start/end becomes a Slice below opset 15.
    onnxruntime checks the result like any other."""
    from onnx import version_converter

    exported = opset_of(proto)  # torch.onnx's (20 with torch 2.13): the highest that to_onnx writes
    for opset in range(target, exported):
        try:
            source = _without_shape_ranges(proto) if opset < 15 else proto
            types = _value_types(source.graph)
            aside = [n for n in source.graph.node if _means_the_same(n, opset, exported, types)]
            _drop_new_attributes(aside, opset)
            with _set_aside(source, aside):
                lowered = version_converter.convert_version(source, opset)
            _bring_back(lowered, opset)
            onnx.checker.check_model(lowered)
        except Exception:  # no adapter, or a model too large to convert in memory: try the next opset
            continue
        proto = lowered
        break
    proto.ir_version = onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
    return proto


def _value_types(graph: onnx.GraphProto) -> dict[str, str]:
    """Value name -> its type as schemas write it ('tensor(float)'), where known."""
    types = {t.name: t.data_type for t in graph.initializer}
    types.update((i.name, i.type.tensor_type.elem_type) for i in (*graph.input, *graph.value_info, *graph.output)
                 if i.type.tensor_type.elem_type)
    return {name: f"tensor({_type_name(t)})" for name, t in types.items()}


def _means_the_same(node: onnx.NodeProto, opset: int, exported: int, types: Mapping[str, str]) -> bool:
    """Whether ``node`` means at ``opset`` what it means at the ``exported`` model's opset, though its op has a newer
    version there: the older schema has every attribute, input and output the node uses, for the node's types (ONNX
    bumps a version for new types, attributes or inputs; this node uses none of them)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    try:
        old, new = (onnx.defs.get_schema(node.op_type, v) for v in (opset, exported))
    except onnx.defs.SchemaError:  # the op is newer than ``opset``
        return False
    if old.since_version == new.since_version:
        return False
    for attribute in node.attribute:  # an attribute added later means the same as its absence at its default
        if attribute.name not in old.attributes and not _is_default(attribute, new):
            return False
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in old.type_constraints}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    for values, formals in ((node.input, old.inputs), (node.output, old.outputs)):
        for index, name in enumerate(values):
            if not name:
                continue
            if index >= len(formals) and not (formals and formals[-1].option == variadic):
                return False
            formal = formals[min(index, len(formals) - 1)]
            if types.get(name) not in allowed.get(formal.type_str, {formal.type_str}):
                return False
    return True


def _is_default(attribute: onnx.AttributeProto, schema: onnx.defs.OpSchema) -> bool:
    default = schema.attributes[attribute.name].default_value if attribute.name in schema.attributes else None
    return (default is not None and default.type != onnx.AttributeProto.UNDEFINED
            and onnx.helper.get_attribute_value(default) == onnx.helper.get_attribute_value(attribute))


def _drop_new_attributes(nodes: list[onnx.NodeProto], opset: int) -> None:
    """Remove the attributes (at their defaults, see _means_the_same) that ``opset``'s schemas do not have."""
    for node in nodes:
        known = onnx.defs.get_schema(node.op_type, opset).attributes
        kept = [a for a in node.attribute if a.name in known]
        del node.attribute[:]
        node.attribute.extend(kept)


def _without_shape_ranges(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy in which each Shape with start/end (opset 15) is a whole Shape followed by a Slice."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    graph, taken = copy.graph, _names(copy.graph)
    nodes = []
    for node in graph.node:
        bounds = {a.name: a.i for a in node.attribute}
        if node.op_type != "Shape" or not bounds:
            nodes.append(node)
            continue
        whole = _unique(f"{node.output[0]}_whole", taken)
        limits = {"starts": bounds.get("start", 0), "ends": bounds.get("end", 2**63 - 1), "axes": 0}
        names = {key: _unique(f"{node.output[0]}_{key}", taken) for key in limits}
        graph.initializer.extend(onnx.helper.make_tensor(names[key], onnx.TensorProto.INT64, [1], [value])
                                 for key, value in limits.items())
        nodes.append(onnx.helper.make_node("Shape", node.input, [whole], name=node.name))
        graph.value_info.append(onnx.helper.make_tensor_value_info(whole, onnx.TensorProto.INT64, [None]))
        nodes.append(onnx.helper.make_node("Slice", [whole, names["starts"], names["ends"], names["axes"]],
                                           node.output, name=f"{node.name}_range"))
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


@contextlib.contextmanager
def _set_aside(proto: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> Iterator[None]:
    """Move ``nodes`` to a private domain while the converter runs, then back."""
    for node in nodes:
        node.domain = _ASIDE
    proto.opset_import.append(onnx.helper.make_opsetid(_ASIDE, 1))
    try:
        yield
    finally:
        for node in nodes:
            node.domain = ""
        del proto.opset_import[-1]


def _bring_back(proto: onnx.ModelProto, opset: int) -> None:
    """Undo _set_aside, and drop what the converter leaves behind: noop_with_empty_axes=0 (the default) on the
    Reduce ops that took their axes as an attribute before opset 18."""
    for node in proto.graph.node:
        if node.domain == _ASIDE:
            node.domain = ""
        if node.op_type.startswith("Reduce") and node.op_type != "ReduceSum" and opset < 18:
            kept = [a for a in node.attribute if not (a.name == "noop_with_empty_axes" and a.i == 0)]
            del node.attribute[:]
            node.attribute.extend(kept)
    kept = [o for o in proto.opset_import if o.domain != _ASIDE]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)
