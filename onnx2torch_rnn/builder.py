"""ONNX graph -> torch.fx GraphModule.

Plan first (every node must have a converter: one error lists all that do not), then walk the nodes in order
with one map {ONNX value name -> fx.Node}. A node whose run-time inputs are all constants is folded: its module
runs once here and its outputs become constants, so weights an exporter computes from initializers reach their
consumer as plain tensors. Constants consumed at run time become attributes of the GraphModule: float tensors
``nn.Parameter`` (trainable), scalars and integer tensors buffers. One parameter per ONNX value, so tied
weights stay tied.
"""

from __future__ import annotations

import keyword
import logging
import operator
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import onnx
import torch
from torch import fx, nn

from .errors import ConversionError, Onnx2TorchError, UnsupportedOperatorError, UnsupportedTypeError
from .folding import FoldLimit, FoldTooLarge
from .loading import LoadedModel, subgraphs
from .modules.common import DeclaredShape
from .node import Converted, OnnxNode, attribute_value
from .passes import FUSION_DOMAIN, Fusion, recognise
from .registry import NOT_FOLDABLE, normalize_domain, resolve, schema_for
from .signature import META_KEY, record
from .tensors import to_torch, torch_dtype

logger = logging.getLogger(__name__)  # DEBUG: one line per node (converter, module, fast/exact path)

RELEASE_MIN_ELEMENTS = 1024  # constants larger than this are dropped from the context after their last reader

# Ops whose result holds every element of their input, rearranged or cast: folding one of a weight that another node
# also reads would copy that weight (see _unties).
WHOLE_TENSOR_OPS = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "CastLike",
                              "Identity"})


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
    """What converters may ask about a graph: constant values, static types and shapes, opsets, subgraphs.

    A subgraph (If/Loop/Scan body) gets a child context: constants of enclosing graphs stay visible to its
    converters (e.g. a Reshape target defined outside the loop).
    """

    # Derives the value of a run-time value that conversion can nonetheless know (shape arithmetic on the static
    # dims that graph inputs declare), or None; installed by converters/shape.py, which owns shape expressions.
    derive_constant: ClassVar[Callable[[ConversionContext, str], torch.Tensor | None] | None] = None

    def __init__(self, loaded: LoadedModel, graph: onnx.GraphProto, parent: ConversionContext | None = None):
        self.loaded = loaded
        self.opsets = loaded.opsets
        self.parent = parent
        self._initializers = {t.name: t for t in graph.initializer}
        self._constants: dict[str, torch.Tensor] = {}
        self._underivable: set[str] = set()
        self.assumed_inputs: dict[str, None] = {}  # graph inputs whose declared static dims a derived value uses
        self.fusions: dict[str, Fusion] = {}  # fused node name -> what recognition proved it computes

    def assume_declared_dims(self, name: str) -> None:
        """A derived constant relies on the static dims graph input ``name`` declares: the module checks them."""
        self.assumed_inputs[name] = None

    def _derived(self, name: str) -> torch.Tensor | None:
        if self.derive_constant is None or name in self._underivable:
            return None
        self._underivable.add(name)  # also while deriving: the derivation may ask about the value itself
        value = self.derive_constant(name)
        if value is not None:
            self._underivable.discard(name)
            self._constants[name] = value
        return value

    def _owner(self, name: str | None) -> ConversionContext | None:
        scope = self
        while scope is not None and name is not None:
            if name in scope._constants or name in scope._initializers:
                return scope
            scope = scope.parent
        return None

    def is_constant(self, name: str | None) -> bool:
        return self.constant(name) is not None

    def is_local_constant(self, name: str | None) -> bool:
        return self._owner(name) is self

    def constant(self, name: str | None, derive: bool = True) -> torch.Tensor | None:
        """The value of an initializer, folded or derived constant, else None (absent or computed at run time)."""
        scope = self._owner(name)
        if scope is None:
            return None if name is None or not derive else self._derived(name)
        if name not in scope._constants:
            proto = scope._initializers.pop(name)
            read = self.loaded.weights.pop(name, None) if scope.parent is None else None
            scope._constants[name] = read if read is not None else to_torch(proto, self.loaded.base_dir)
        return scope._constants[name]

    def set_constant(self, name: str, value: torch.Tensor) -> None:
        self._constants[name] = value

    def release(self, name: str) -> None:
        """Every reader of ``name`` is converted: drop a large constant of this scope, so a weight that a converter
        copied into its module (e.g. reordered into an nn.LSTM) is not held twice. Small ones stay for converters
        that trace shape arithmetic back through the graph."""
        value = self._constants.get(name)
        if isinstance(value, torch.Tensor) and value.numel() > RELEASE_MIN_ELEMENTS:
            del self._constants[name]

    def dtype(self, name: str | None) -> torch.dtype | None:
        """Static element type of a value when known."""
        value = self.constant(name)
        if value is not None:
            return value.dtype
        value_type = self.loaded.types.get(name)
        return torch_dtype(value_type.tensor_type.elem_type) if value_type else None

    def shape(self, name: str | None) -> list[int | str | None] | None:
        """Static shape when known: ints, symbolic dim names, or None for unknown dims; None if the rank is unknown."""
        value = self.constant(name)
        if value is not None:
            return list(value.shape)
        value_type = self.loaded.types.get(name)
        if value_type is None or not value_type.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in value_type.tensor_type.shape.dim]

    def owned_constant(self, name: str | None) -> torch.Tensor | None:
        """The value of ``name`` if it is a float constant that only one node input reads, else None.

        Such a tensor may become a parameter of that node's own torch module (nn.Linear, nn.Conv2d, ...); a shared
        one must stay one parameter of the GraphModule so that tied weights stay tied.
        """
        value = self.constant(name)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or self.loaded.uses[name] > 1:
            return None
        return value

    def subgraph(self, graph: onnx.GraphProto) -> Subgraph:
        """Convert a control-flow body. Its module takes the body's inputs, then the captured outer values."""
        return _build_graph(ConversionContext(self.loaded, graph, parent=self), graph)


@dataclass
class Subgraph:
    module: fx.GraphModule  # returns a tuple with one entry per graph output
    captured: list[str]  # outer-scope values the body reads, passed after its own inputs


def check_supported(graph: onnx.GraphProto, opsets: dict[str, int], nodes: list[onnx.NodeProto] | None = None) -> None:
    """One UnsupportedOperatorError listing every op without a converter, subgraphs included. ``nodes``: the main
    graph's nodes after recognition (a fused node stands for nodes that need no converter of their own)."""
    missing = defaultdict(list)
    main = list(graph.node) if nodes is None else nodes
    bodies = [body for node in main for attribute in node.attribute
              for body in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs)]
    for g in [main, *(sub.node for body in bodies for sub in subgraphs(body))]:
        for index, node in enumerate(g):
            domain = normalize_domain(node.domain)
            if domain == FUSION_DOMAIN:
                continue
            opset = opsets.get(domain)
            if opset is None or resolve(domain, node.op_type, opset) is None:
                missing[(domain, node.op_type, opset or 0)].append(node.name or f"#{index}")
    if missing:
        raise UnsupportedOperatorError(missing)


def _reads(node: onnx.NodeProto) -> list[str]:
    """The values a node reads: its inputs and what its subgraphs read from enclosing scopes."""
    reads = [name for name in node.input if name]
    for attribute in node.attribute:
        for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
            reads += _free_names(body)
    return reads


def _free_names(graph: onnx.GraphProto) -> list[str]:
    """Values a (sub)graph reads from enclosing scopes, in order of first use."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    free: dict[str, None] = {}
    for node in graph.node:
        free.update((name, None) for name in _reads(node) if name not in defined)
        defined.update(node.output)
    free.update((o.name, None) for o in graph.output if o.name not in defined)
    return list(free)


def build(loaded: LoadedModel, progress: Callable[[int, int], None] | None = None, *,
          fuse: bool = True) -> fx.GraphModule:
    """``progress(done, total)`` is called after each node of the main graph. ``fuse``: apply the recognition
    patterns (passes/) first, so that recurrences an exporter spelled out convert as one recurrent module."""
    ctx = ConversionContext(loaded, loaded.proto.graph)
    recognised = recognise(loaded) if fuse else None
    check_supported(loaded.proto.graph, loaded.opsets, None if recognised is None else recognised.nodes)
    if recognised is not None:
        ctx.fusions = recognised.fusions
    module = _build_graph(ctx, loaded.proto.graph, progress, None if recognised is None else recognised.nodes).module
    module.meta[META_KEY] = record(loaded.proto, loaded.types)  # names, dtypes and dims, for to_onnx
    return module.eval()  # ONNX semantics are inference semantics (BatchNormalization, Dropout)


def _describe(module: nn.Module) -> str:
    """One line: class and extra_repr, with submodules (not subgraph bodies) in brackets."""
    children = [_describe(m) for m in module.children() if not isinstance(m, fx.GraphModule)]
    return f"{type(module).__name__}({module.extra_repr()}{' [' + ', '.join(children) + ']' if children else ''})"


def _log(ctx: ConversionContext, node: OnnxNode, version: int, where: str, module: nn.Module | None) -> None:
    depth = 0
    while ctx.parent is not None:
        ctx, depth = ctx.parent, depth + 1
    logger.debug("%s%s-%d node %r -> %s: %s", "  " * depth, node.op_type, version, node.name, where,
                 "folded (constant at conversion)" if module is None else _describe(module))


def convert_node(ctx: ConversionContext, proto: onnx.NodeProto,
                 name: str | None = None) -> tuple[Converted, int, Callable]:
    """Run a node's converter (``resolve``d once, for the context's opset), refusing attributes it did not read.
    Returns the result, the since_version it was converted under and the converter."""
    domain = normalize_domain(proto.domain)
    converter, version = resolve(domain, proto.op_type, ctx.opsets[domain])
    node = OnnxNode(proto, name or proto.name, version, schema_for(domain, proto.op_type, ctx.opsets[domain]))
    result = converter(node, ctx)
    unread = node.unread_attributes()
    if unread:
        attribute = next(a for a in proto.attribute if a.name == unread[0])
        raise node.unsupported(attribute.name, attribute_value(attribute), "the converter does not read it")
    return result, version, converter


def _build_graph(ctx: ConversionContext, graph_proto: onnx.GraphProto,
                 progress: Callable[[int, int], None] | None = None,
                 nodes: list[onnx.NodeProto] | None = None) -> Subgraph:
    """``nodes``: the graph's nodes after recognition (default: as written)."""
    nodes = list(graph_proto.node) if nodes is None else nodes
    is_subgraph = ctx.parent is not None
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
            value = ctx.constant(name)
            if value is None:
                raise ConversionError("<graph>", "-", f"value {name!r} is used before it is computed")
            # a folded sequence (SequenceConstruct, SplitToSequence of constants): a tuple of attributes
            constant_nodes[name] = tuple(attribute(f"{name}_{i}", t) for i, t in enumerate(value)) if isinstance(
                value, tuple | list) else attribute(name, value)
        return constant_nodes[name]

    def attribute(name: str, tensor: torch.Tensor) -> fx.Node:
        target = attribute_names(name)
        # Weights train; a scalar (an epsilon, a clip bound, the 1 in 1 - z) is a constant, not a weight.
        if tensor.is_floating_point() and tensor.numel() > 1:
            root.register_parameter(target, nn.Parameter(tensor))
        else:
            root.register_buffer(target, tensor)
        return graph.get_attr(target)

    placeholder_names = _Names(("self",))  # forward's own first argument
    for info in graph_proto.input:
        if not ctx.is_local_constant(info.name):  # an input with an initializer of the same name is a constant
            _check_input_type(info)
            env[info.name] = graph.placeholder(placeholder_names(info.name))
    # A body reads outer values as extra inputs: gradients then reach the outer parameters.
    captured = _free_names(graph_proto) if is_subgraph else []
    capture_nodes = {name: graph.placeholder(placeholder_names(name)) for name in captured}
    env.update(capture_nodes)

    remaining = Counter(name for proto in nodes for name in _reads(proto))
    remaining.update(info.name for info in graph_proto.output)  # graph outputs are read at the end
    for index, proto in enumerate(nodes):
        domain = normalize_domain(proto.domain)
        fusion = ctx.fusions.get(proto.name) if domain == FUSION_DOMAIN else None
        node = OnnxNode(proto, proto.name or f"{proto.op_type}_{index}", 1, None)
        try:
            if fusion is not None:
                node.op_type = fusion.op_type
                result, version, where = fusion.convert(ctx), 1, f"pattern {fusion.pattern}"
            else:
                result, version, converter = convert_node(ctx, proto, node.name)
                where = f"{converter.__module__.removeprefix('onnx2torch_rnn.')}.{converter.__qualname__}"
            foldable = fusion is None and proto.op_type not in NOT_FOLDABLE and all(
                name is None or ctx.is_constant(name) for name in result.inputs
            )
            if foldable:
                outputs = _fold(ctx, result)
                foldable = outputs is not None and (
                    proto.op_type not in WHOLE_TENSOR_OPS or not _unties(ctx, result.inputs, outputs))
        except Onnx2TorchError:
            raise
        except Exception as error:
            raise ConversionError(node.name, node.op_type, f"{type(error).__name__}: {error}") from error

        if logger.isEnabledFor(logging.DEBUG):
            _log(ctx, node, version, where, None if foldable else result.module)
        if progress is not None:
            progress(index + 1, len(nodes))
        if foldable:
            for name, tensor in _per_output(node, outputs):
                ctx.set_constant(name, tensor)
        else:
            target = attribute_names(node.name)
            root.add_module(target, result.module)
            fx_node = graph.call_module(target, tuple(value(name) for name in result.inputs))
            fx_node.meta["onnx"] = {"name": proto.name, "op_type": proto.op_type, "domain": node.domain,
                                    "version": version, "opset": ctx.opsets.get(domain, 1)}
            if fusion is not None:  # the ONNX nodes it stands for, in graph order
                fx_node.meta["onnx"].update(op_type=fusion.op_type, pattern=fusion.pattern,
                                            replaces=[n.name for n in fusion.nodes])
            # the ONNX value of each call argument and of each output slot (None where absent), for debugging tools
            fx_node.meta["onnx_values"] = {"inputs": tuple(result.inputs), "outputs": node.outputs}
            if len(node.outputs) == 1:
                outputs = fx_node
            else:
                outputs = [graph.call_function(operator.getitem, (fx_node, i)) for i in range(len(node.outputs))]
            for name, out in _per_output(node, outputs):
                env[name] = out
        for name in _reads(proto):  # after value() above: it may still need a constant this node reads last
            remaining[name] -= 1
            if remaining[name] == 0:
                ctx.release(name)

    if ctx.assumed_inputs:  # like onnxruntime, refuse inputs whose static dims differ from the declared ones
        with graph.inserting_after([n for n in graph.nodes if n.op == "placeholder"][-1]):
            for name in ctx.assumed_inputs:
                dims = {i: d for i, d in enumerate(ctx.loaded.declared[name]) if isinstance(d, int)}
                target = attribute_names(f"check_{name}")
                root.add_module(target, DeclaredShape(name, dims))
                graph.call_module(target, (env[name],))
    outputs = [value(info.name) for info in graph_proto.output]
    graph.output(outputs[0] if len(outputs) == 1 and not is_subgraph else tuple(outputs))
    graph.owning_module = root  # dead-code elimination asks the called modules whether they are impure
    graph.eliminate_dead_code()
    for name in captured[:]:
        if not capture_nodes[name].users:  # read only by nodes that were folded or are dead
            graph.erase_node(capture_nodes[name])
            captured.remove(name)
    # After the clean-up: the GraphModule copies only the attributes its graph uses, and generates its code once.
    module = fx.GraphModule(root, graph, class_name=sanitize(graph_proto.name or "OnnxModel"))
    return Subgraph(module, captured)


def _fold(ctx: ConversionContext, result: Converted):
    """The node's outputs computed from its constant inputs, or None: it stays a run-time node when its result is
    an empty optional (None is no constant) or a tensor over FOLD_LIMIT_BYTES (folding.py)."""
    try:
        with torch.no_grad(), FoldLimit():
            return result.module(*(ctx.constant(name) for name in result.inputs))
    except FoldTooLarge:
        return None


def _is_weight(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 1


def _unties(ctx: ConversionContext, inputs: Iterable[str | None], outputs) -> bool:
    """Whether folding would copy a weight that other nodes also read: a float result computed from a float
    constant with several readers (e.g. a tied embedding, read by a Gather and, transposed, by a MatMul) would
    become a parameter of its own and train apart. Such a node runs at run time, on the one parameter. Only for ops
    that move a whole tensor (WHOLE_TENSOR_OPS): parts of one blob (MXNet's Slices of all weights) fold apart, as
    each part is its own weight."""
    results = outputs if isinstance(outputs, tuple | list) else (outputs,)
    return any(_is_weight(r) for r in results) and any(
        name is not None and ctx.loaded.uses[name] > 1 and _is_weight(ctx.constant(name)) for name in inputs)


def _check_input_type(info: onnx.ValueInfoProto) -> None:
    """A tensor input of an element type torch has no dtype for (string, float8, int4, ...) cannot be passed to
    forward: refused here, naming it, rather than when the caller tries."""
    elem_type = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
    if elem_type:
        try:
            torch_dtype(elem_type)
        except UnsupportedTypeError as error:
            raise UnsupportedTypeError(f"graph input {info.name!r}: {error}") from None


def _per_output(node: OnnxNode, result):
    """(ONNX output name, value) pairs: a single-output node's result is the value, otherwise one item per slot."""
    if len(node.outputs) == 1:
        if node.outputs[0] is not None:
            yield node.outputs[0], result
        return
    for index, name in enumerate(node.outputs):
        if name is not None:
            yield name, result[index]
