"""Recognition: subgraphs that compute a recurrence become one node before building (the design's "passes").

A pattern is a function ``pattern(view: GraphView) -> Iterable[Fusion]``: it reads the ONNX graph and proposes
fusions, each a set of nodes that it has proven to compute one recurrent module, and how to build that module.
Patterns fire exactly or not at all: a pattern that cannot prove every part of its match (cell equations, state flow,
shapes, which values are read outside) proposes nothing, and the graph is converted as written.

``recognise`` applies the registered patterns to the main graph and returns the rewritten node list: each fusion
becomes one node of the private domain ``FUSION_DOMAIN``, placed in topological order, and the nodes it replaces
(with those that only fed them) are gone. The model's proto is not modified. The builder converts a fused node by
calling ``Fusion.convert``; its fx node's ``meta["onnx"]["replaces"]`` lists the ONNX nodes it replaced.
"""

from __future__ import annotations

import heapq
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import ConversionError
from ..loading import LoadedModel
from ..node import Converted, read_names
from ..registry import NOT_FOLDABLE

logger = logging.getLogger(__name__)  # INFO: one line per fusion (pattern, nodes replaced)

FUSION_DOMAIN = "onnx2torch_rnn.fusion"


@dataclass
class Fusion:
    """A proven match: ``nodes`` compute ``outputs`` from ``inputs``, and ``convert`` builds the module doing it.

    ``inputs`` lists every value the nodes read from outside the match, weights included (conversion reads them);
    ``outputs`` are the output slots of the fused node (None for a slot nothing reads). ``convert(ctx)`` returns the
    module and the values it takes at run time, like a converter; the fused node's output slots are its outputs.
    """

    pattern: str
    op_type: str  # what the fused node computes, e.g. "LSTM stack": shown in logs and meta["onnx"]
    nodes: list[onnx.NodeProto]
    inputs: list[str]
    outputs: list[str | None]
    convert: Callable[..., Converted]
    name: str = ""  # the fused node's name: set by ``recognise``


Pattern = Callable[["GraphView"], Iterable[Fusion]]
_PATTERNS: dict[str, Pattern] = {}


def register_pattern(name: str, *, replace: bool = False) -> Callable[[Pattern], Pattern]:
    """Decorator registering a recognition pattern under ``name`` (patterns run in registration order)."""
    def decorate(pattern: Pattern) -> Pattern:
        if name in _PATTERNS and not replace:
            raise ValueError(f"pattern {name!r} is already registered; pass replace=True to override it")
        _PATTERNS[name] = pattern
        return pattern
    return decorate


def registered_patterns() -> dict[str, Pattern]:
    return dict(_PATTERNS)


class GraphView:
    """What a pattern may ask about the main graph: producers, consumers, small constant values, static types."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.graph = loaded.proto.graph
        self.nodes: list[onnx.NodeProto] = list(self.graph.node)
        self.position = {id(n): i for i, n in enumerate(self.nodes)}  # a node's index in graph order
        self.opsets = loaded.opsets
        self.producer: dict[str, onnx.NodeProto] = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in self.nodes:
            for name in read_names(node):
                self.consumers[name].append(node)
        self.graph_outputs = {o.name for o in self.graph.output}
        self.graph_inputs = {i.name for i in self.graph.input}
        self.initializers = {t.name: t for t in self.graph.initializer}
        self._constants: dict[str, bool] = {}
        self._folded: dict[str, np.ndarray | None] = {}

    def opset(self, node: onnx.NodeProto) -> int:
        return self.opsets.get(node.domain if node.domain not in ("", "ai.onnx") else "", 0)

    def is_weight(self, name: str) -> bool:
        """An initializer of the main graph (not overridable by a graph input of the same name)."""
        return name in self.initializers and name not in self.graph_inputs

    def is_constant(self, name: str) -> bool:
        """Whether conversion knows the value: an initializer, or computed from initializers and Constants only (the
        builder folds it, e.g. weights an exporter slices and concatenates out of one blob)."""
        known = self._constants
        pending = [name]
        while pending:
            value = pending[-1]
            if value in known:
                pending.pop()
                continue
            node = self.producer.get(value)
            if self.is_weight(value) or (node is not None and node.op_type == "Constant"):
                known[value] = True
            elif node is None or node.op_type in NOT_FOLDABLE or any(
                    a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                known[value] = False
            else:
                inputs = [v for v in node.input if v]
                unknown = [v for v in inputs if v not in known]
                if unknown:
                    pending += unknown
                    continue
                known[value] = all(known[v] for v in inputs)
            pending.pop()
        return known[name]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a Constant node's output or a small initializer, else None."""
        if self.is_weight(name):
            tensor = self.initializers[name]
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                return None
            weight = self.loaded.weights.get(name)
            return weight.numpy() if weight is not None else onnx.numpy_helper.to_array(tensor)
        node = self.producer.get(name)
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            return None
        attribute = node.attribute[0]
        if attribute.name == "value":
            return onnx.numpy_helper.to_array(attribute.t)
        if attribute.name in ("value_int", "value_ints", "value_float", "value_floats"):
            return np.array(onnx.helper.get_attribute_value(attribute))
        return None

    def folded(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when conversion knows it (``is_constant``), computed here with onnx's reference
        implementation (e.g. weights an exporter casts or slices out of an initializer), else None."""
        if name not in self._folded:
            value = self.constant(name)
            node = self.producer.get(name)
            if value is None and node is not None and self.is_constant(name):
                inputs = [self.folded(v) if v else None for v in node.input]
                if not any(v is None for v, n in zip(inputs, node.input, strict=True) if n):
                    try:
                        value = _run_node(node, inputs)[list(node.output).index(name)]
                    except Exception:  # an op onnx's reference cannot run: unknown here (the builder may fold it)
                        value = None
            self._folded[name] = value if isinstance(value, np.ndarray) else None  # not a sequence or optional
        return self._folded[name]

    def ints(self, name: str) -> list[int] | None:
        value = self.constant(name) if name else None
        if value is None or value.dtype.kind not in "iu":
            return None
        return [int(v) for v in value.reshape(-1)]

    def shape(self, name: str) -> list[int | str | None] | None:
        if name in self.initializers:
            return list(self.initializers[name].dims)
        value_type = self.loaded.types.get(name)
        if value_type is None or not value_type.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in value_type.tensor_type.shape.dim]

    def elem_type(self, name: str) -> int | None:
        if name in self.initializers:
            return self.initializers[name].data_type
        value_type = self.loaded.types.get(name)
        return value_type.tensor_type.elem_type if value_type is not None else None

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        """The one node that reads ``name``, if exactly one does (once) and it is not a graph output."""
        readers = self.consumers.get(name, [])
        if len(readers) != 1 or name in self.graph_outputs or list(read_names(readers[0])).count(name) != 1:
            return None
        return readers[0]


def _run_node(node: onnx.NodeProto, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """One node on constant inputs, by onnx's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    proto = onnx.NodeProto()
    proto.CopyFrom(node)
    proto.input[:] = [f"in{k}" if v is not None else "" for k, v in enumerate(inputs)]
    proto.output[:] = [f"out{k}" if v else "" for k, v in enumerate(node.output)]
    return ReferenceEvaluator(proto).run(None, {f"in{k}": v for k, v in enumerate(inputs) if v is not None})


def attribute(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


@dataclass
class Recognised:
    nodes: list[onnx.NodeProto]  # the main graph's nodes after the rewrites, in topological order
    fusions: dict[str, Fusion] = field(default_factory=dict)  # fused node name -> its fusion


def recognise(loaded: LoadedModel, patterns: Sequence[str] | None = None) -> Recognised:
    """Apply the registered patterns (or those named) to the main graph."""
    view = GraphView(loaded)
    taken: set[int] = set()  # ids of nodes already replaced by an earlier fusion
    read: set[str] = set()  # the values accepted fusions read (their consumers in ``view`` are the replaced nodes)
    accepted: list[Fusion] = []
    for name in _PATTERNS if patterns is None else patterns:
        try:
            for fusion in _PATTERNS[name](view):
                if {id(n) for n in fusion.nodes} & taken:
                    continue
                fusion.name = fusion.nodes[0].name or fusion.op_type  # after its first node (the pattern's main one)
                _absorb_feeders(view, fusion, taken)
                if not _self_contained(view, fusion, read) or not _acyclic(view, fusion):
                    continue
                taken |= {id(n) for n in fusion.nodes}
                read.update(fusion.inputs)
                accepted.append(fusion)
        except Exception as error:  # a pattern's bug must not hide behind a model it cannot read
            raise ConversionError("<recognition>", f"pattern {name}", f"{type(error).__name__}: {error} (convert with "
                                  "fuse=False, or --no-fuse, to convert the graph as written)") from error
    if not accepted:
        return Recognised(view.nodes)
    return _rewrite(view, accepted)


def _self_contained(view: GraphView, fusion: Fusion, read: set[str]) -> bool:
    """Whether the fused node can stand for its nodes: nothing outside reads a value it drops (``read``: what the
    fusions accepted before read, which may be a value their replaced nodes did not)."""
    inside = {id(n) for n in fusion.nodes}
    kept = {o for o in fusion.outputs if o}
    for node in fusion.nodes:
        for output in node.output:
            if output and output not in kept and (output in view.graph_outputs or output in read or any(
                    id(c) not in inside for c in view.consumers.get(output, []))):
                return False
    return True


def _acyclic(view: GraphView, fusion: Fusion) -> bool:
    """Whether no value the fusion reads depends on a value it produces (one node cannot both feed and follow)."""
    inside = {id(n) for n in fusion.nodes}
    produced = {o for n in fusion.nodes for o in n.output if o}
    sources = {id(view.producer[name]) for n in fusion.nodes for name in read_names(n)
               if name not in produced and name in view.producer}
    pending = [c for o in fusion.outputs if o for c in view.consumers.get(o, []) if id(c) not in inside]
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        if id(node) in sources:
            return False
        if id(node) not in seen:
            seen.add(id(node))
            pending += [c for o in node.output if o for c in view.consumers.get(o, []) if id(c) not in inside]
    return True


def _rewrite(view: GraphView, fusions: list[Fusion]) -> Recognised:
    replaced: dict[int, Fusion] = {}
    recognised = Recognised([])
    taken_names = {n.name for n in view.nodes}
    fused_nodes: dict[int, onnx.NodeProto] = {}
    for fusion in fusions:
        taken_names -= {n.name for n in fusion.nodes}  # a replaced node's name is free again
    for fusion in fusions:
        base = fusion.name
        n = 1
        while fusion.name in taken_names:
            fusion.name, n = f"{base}_{n}", n + 1
        taken_names.add(fusion.name)
        node = onnx.helper.make_node(fusion.op_type.replace(" ", "_"), fusion.inputs,
                                     [o or "" for o in fusion.outputs], name=fusion.name, domain=FUSION_DOMAIN)
        for member in fusion.nodes:
            replaced[id(member)] = fusion
        fused_nodes[id(fusion)] = node
        recognised.fusions[fusion.name] = fusion
        logger.info("fused %d nodes into %s %r (pattern %s): %s", len(fusion.nodes), fusion.op_type, fusion.name,
                    fusion.pattern, ", ".join(repr(n.name) for n in fusion.nodes))
    # Each fused node stands where its first member stood; a stable topological sort puts every node after
    # the producers of what it reads (a fused node reads values that some of its members' successors produced).
    order: list[onnx.NodeProto] = []
    rank: dict[int, int] = {}
    for index, node in enumerate(view.nodes):
        fusion = replaced.get(id(node))
        if fusion is None:
            order.append(node)
            rank[id(node)] = index
        elif id(fused_nodes[id(fusion)]) not in rank:
            order.append(fused_nodes[id(fusion)])
            rank[id(fused_nodes[id(fusion)])] = index
    recognised.nodes = _topological(order, rank)
    return recognised


def _absorb_feeders(view: GraphView, fusion: Fusion, replaced: set[int]) -> None:
    """Add to the fusion the nodes that only fed it (zero states built from Shape/ConstantOfShape, the Constants of
    its glue): once it is fused, nothing else reads them. ``replaced``: nodes of earlier fusions."""
    inside = {id(n) for n in fusion.nodes}
    needed = set(fusion.inputs)
    # a worklist of the producers of what members read: each node is looked at again only when a reader joins
    pending = [view.producer[v] for n in fusion.nodes for v in read_names(n) if v in view.producer]
    while pending:
        node = pending.pop()
        if id(node) in inside or id(node) in replaced:
            continue
        outputs = [o for o in node.output if o]
        readers = [c for o in outputs for c in view.consumers.get(o, [])]
        if readers and all(id(c) in inside for c in readers) and not any(
                o in view.graph_outputs or o in needed for o in outputs):
            fusion.nodes.append(node)
            inside.add(id(node))
            pending += [view.producer[v] for v in read_names(node) if v in view.producer]
    fusion.nodes.sort(key=lambda n: view.position[id(n)])
    produced = {o for n in fusion.nodes for o in n.output}
    reads = dict.fromkeys(name for n in fusion.nodes for name in read_names(n) if name not in produced)
    fusion.inputs = list(dict.fromkeys([*fusion.inputs, *reads]))


def _topological(nodes: list[onnx.NodeProto], rank: dict[int, int]) -> list[onnx.NodeProto]:
    producer = {o: n for n in nodes for o in n.output if o}
    waiting: dict[int, int] = {}
    readers: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    for node in nodes:
        sources = {id(producer[name]) for name in read_names(node) if name in producer} - {id(node)}
        waiting[id(node)] = len(sources)
        for source in sources:
            readers[source].append(node)
    ready = [(rank[id(n)], i, n) for i, n in enumerate(nodes) if waiting[id(n)] == 0]
    heapq.heapify(ready)
    position = {id(n): i for i, n in enumerate(nodes)}
    result = []
    while ready:
        _, _, node = heapq.heappop(ready)
        result.append(node)
        for reader in readers[id(node)]:
            waiting[id(reader)] -= 1
            if waiting[id(reader)] == 0:
                heapq.heappush(ready, (rank[id(reader)], position[id(reader)], reader))
    if len(result) != len(nodes):  # a pattern fused nodes that a value outside them both feeds and reads
        raise AssertionError("recognition made the graph cyclic")
    return result
