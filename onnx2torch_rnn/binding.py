"""Binding graph inputs to values the caller fixes at conversion (``convert(model, constants={"sr": 16000})``).

A bound input becomes an initializer of its value, so the builder folds whatever it decides (shapes, Equal, Where,
...). An If whose condition the bound values and other constants decide is replaced by the nodes of the branch it
takes (then by that branch's own such Ifs, in turn): the untaken branch and its weights are gone, and what remains
is one graph, which compiles without torch.cond (whose branches must agree in dtypes and ranks) and trains every
weight it keeps. The condition is evaluated with onnx's reference evaluator on the constant nodes it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import InvalidModelError

# ops whose result is not a function of their inputs: never evaluated at conversion
_RANDOM = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                     "Bernoulli"})
_EVALUATED_MAX_ELEMENTS = 1 << 16  # a constant that a condition reads is small; larger ones are not read here


@dataclass(frozen=True)
class Binding:
    """What binding did: the bound inputs' values (in graph input order) and the values the inlined branches
    compute (names that the original's main graph does not have)."""

    values: dict[str, np.ndarray]
    inlined: frozenset[str]
    inputs: dict[str, tuple[int, onnx.ValueInfoProto]]  # each bound input's position among the graph inputs, type


def bind(proto: onnx.ModelProto, constants: Mapping[str, object]) -> tuple[onnx.ModelProto, Binding]:
    """A copy of ``proto`` whose inputs named in ``constants`` are initializers of those values and whose Ifs that
    the constants decide are inlined. Raises InvalidModelError for a name that is no run-time graph input, or a
    value that its declared type or static dims cannot hold."""
    values = _values(proto.graph, constants)
    graph = copy_except(proto.graph, ("node", "input"))
    graph.input.extend(i for i in proto.graph.input if i.name not in values)
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in values.items())
    opsets = [o for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    nodes, inlined = _inline(list(proto.graph.node), graph, values, opsets)
    graph.node.extend(nodes)
    model = copy_except(proto, ("graph",))
    model.graph.CopyFrom(graph)
    inputs = {info.name: (position, info) for position, info in enumerate(proto.graph.input) if info.name in values}
    return model, Binding(values, frozenset(inlined), inputs)


def copy_except(message, skipped: tuple[str, ...]):
    """A copy of a protobuf message without the fields named in ``skipped`` (a model without its graph, a graph
    without its nodes): the parts kept are copied once, the skipped ones not at all."""
    copy = type(message)()
    for descriptor, value in message.ListFields():
        if descriptor.name in skipped:
            continue
        target = getattr(copy, descriptor.name)
        if hasattr(target, "extend"):  # repeated field
            target.extend(value)
        elif descriptor.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(copy, descriptor.name, value)
    return copy


def _values(graph: onnx.GraphProto, constants: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Each bound value as an array of its input's element type and declared shape, in graph input order."""
    initializers = {t.name for t in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in initializers}
    unknown = [name for name in constants if name not in inputs]
    if unknown:
        raise InvalidModelError(f"constants= names {unknown}, which are not run-time inputs of the model "
                                f"({', '.join(inputs) or 'it has none'})")
    values = {}
    for name, info in inputs.items():
        if name not in constants:
            continue
        tensor = info.type.tensor_type
        if not info.type.HasField("tensor_type") or not tensor.elem_type:
            raise InvalidModelError(f"input {name!r} is no tensor of a known type: it cannot be bound to a constant")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        given = constants[name]
        given = given.detach().cpu().numpy() if hasattr(given, "detach") else given
        value = np.asarray(given)
        kinds = value.dtype.kind, np.dtype(dtype).kind
        if kinds[0] != kinds[1] and not (kinds[0] in "iu" and kinds[1] in "iuf"):  # ints fit float and int inputs
            raise InvalidModelError(f"constants[{name!r}] is {value.dtype}; input {name!r} is {dtype}")
        converted = value.astype(dtype)
        if not np.array_equal(converted, value):
            raise InvalidModelError(f"constants[{name!r}] = {value.tolist()} does not fit input {name!r} of type "
                                    f"{dtype}")
        if tensor.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            if converted.ndim != len(dims) or any(d is not None and d != s for d, s in zip(dims, converted.shape,
                                                                                           strict=False)):
                shown = ["?" if d is None else d for d in dims]
                raise InvalidModelError(f"constants[{name!r}] has shape {list(converted.shape)}; input {name!r} is "
                                        f"declared {shown}")
        values[name] = np.array(converted, order="C")  # (ascontiguousarray makes a 0-d value 1-d)
    return values


def _inline(nodes: list[onnx.NodeProto], graph: onnx.GraphProto, bound: dict[str, np.ndarray],
            opsets: list[onnx.OperatorSetIdProto]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes with every If that constants decide replaced by its taken branch (repeatedly: an inlined branch's
    own Ifs are main-graph nodes then). Returns the nodes and the names the inlined branches compute."""
    known: dict[str, np.ndarray] = dict(bound)
    for tensor in graph.initializer:
        if tensor.name not in known and _small(tensor) and tensor.data_location != onnx.TensorProto.EXTERNAL:
            known[tensor.name] = numpy_helper.to_array(tensor)
    inlined: set[str] = set()
    changed = True
    while changed:
        changed = False
        for index, node in enumerate(nodes):
            if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
                continue
            cond = _evaluate(node.input[0], nodes[:index], known, opsets)
            if cond is None:
                continue
            branch = onnx.helper.get_attribute_value(
                next(a for a in node.attribute if a.name == ("then_branch" if bool(cond.reshape(())) else
                                                              "else_branch")))
            graph.initializer.extend(branch.initializer)
            graph.value_info.extend(branch.value_info)
            body = list(branch.node) + [onnx.helper.make_node("Identity", [inner.name], [outer],
                                                              name=f"{node.name or 'If'}_{outer}")
                                        for inner, outer in zip(branch.output, node.output, strict=True) if outer]
            inlined.update(name for n in body for name in n.output if name)
            nodes[index : index + 1] = body
            changed = True
            break
    return nodes, inlined


def _small(tensor: onnx.TensorProto) -> bool:
    return int(np.prod(tensor.dims)) <= _EVALUATED_MAX_ELEMENTS and (
        tensor.raw_data or not tensor.dims or any(len(getattr(tensor, f)) for f in (
            "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")))


def _evaluate(name: str, earlier: list[onnx.NodeProto], known: dict[str, np.ndarray],
              opsets: list[onnx.OperatorSetIdProto]) -> np.ndarray | None:
    """The value of ``name`` where only constants (``known``, Constant nodes and nodes of them among ``earlier``)
    compute it, else None. Values computed here are added to ``known``."""
    if name in known:
        return known[name]
    producer = {output: node for node in earlier for output in node.output if output}
    needed, order, pending = set(), [], [name]
    while pending:
        value = pending.pop()
        if value in known or value in needed:
            continue
        node = producer.get(value)
        if node is None or node.op_type in _RANDOM or node.domain not in ("", "ai.onnx") or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        needed.update(o for o in node.output if o)
        order.append(node)
        pending.extend(i for i in node.input if i)
    position = {id(n): i for i, n in enumerate(earlier)}
    order.sort(key=lambda n: position[id(n)])  # in graph order: producers first
    from onnx.reference import ReferenceEvaluator

    read = {i for n in order for i in n.input}
    graph = onnx.helper.make_graph(order, "condition", [], [onnx.helper.make_value_info(name, onnx.TypeProto())],
                                   [numpy_helper.from_array(v, k) for k, v in known.items() if k in read])
    try:
        result = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=opsets)).run(None, {})[0]
    except Exception:  # an op the reference evaluator lacks: the If stays
        return None
    known[name] = np.asarray(result)
    return known[name]
