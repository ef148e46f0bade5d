"""ONNX graph -> torch.fx GraphModule.

The pipeline, as ``build`` runs it::

    load (loading.py) -> recognise (passes/: spelled-out recurrences become fused nodes)
      -> plan (make_plan: each node's converter, all unsupported ops at once, what each node reads last)
      -> build (_GraphBuilder: one fx.Graph per graph, with one map {ONNX value name -> fx.Node})

A node whose run-time inputs are all constants is folded: its module runs once here and its outputs become
constants, so weights an exporter computes from initializers reach their consumer as plain tensors. Constants
consumed at run time become attributes of the GraphModule: float tensors ``nn.Parameter`` (trainable), scalars and
integer tensors buffers. One parameter per ONNX value, so tied weights stay tied.
"""

from __future__ import annotations

import keyword
import logging
import operator
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx
import torch
from torch import fx, nn

from . import executor, threads
from .errors import (
    ConversionError,
    GraphConversionError,
    Onnx2TorchError,
    UnsupportedOperatorError,
    UnsupportedTypeError,
)
from .folding import FoldLimit, FoldTooLarge
from .loading import LoadedModel, subgraphs
from .modules.common import DeclaredShape
from .node import Converted, OnnxNode, StaticInput, attribute_value, bodies, free_names, read_names
from .passes import FUSION_DOMAIN, Fusion, Recognised, recognise
from .recurrent import LoopedRecurrent, LoopedStack, Recurrent, StackedRecurrent
from .registry import NOT_FOLDABLE, Converter, normalize_domain, resolve, schema_for, static_inputs
from .shape_arithmetic import DeclaredSizes, FxSizes, ShapeArithmetic, derive, is_symbolic
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
    converters (e.g. a Reshape target defined outside the loop). ``plan``: the graph's plan (default: made here).
    """

    def __init__(self, loaded: LoadedModel, graph: onnx.GraphProto, parent: ConversionContext | None = None,
                 plan: Plan | None = None):
        self.loaded = loaded
        self.opsets = loaded.opsets
        self.parent = parent
        self._initializers = {t.name: t for t in graph.initializer}
        self._constants: dict[str, torch.Tensor] = {}
        self._underivable: set[str] = set()
        self.assumed_inputs: dict[str, None] = {}  # graph inputs whose declared static dims a derived value uses
        if plan is None:  # a body's plan counts uses of the whole model: its parent's
            plan = make_plan(graph, self.opsets, uses=None if parent is None else parent.plan.uses)
        self.plan = plan
        self._declared = ShapeArithmetic(self, DeclaredSizes(loaded.declared))  # shape arithmetic to derive

    def assume_declared_dims(self, name: str) -> None:
        """A derived constant relies on the static dims graph input ``name`` declares: the module checks them."""
        self.assumed_inputs[name] = None

    def static(self, node: OnnxNode, index: int, attribute: str | None = None) -> StaticInput:
        """Input ``index`` of ``node``, which its converter declares static (``register_converter(static=...)``): its
        value when conversion knows it, else its name for run time. ``attribute``: the attribute that held the value
        in the versions before it became an input (Squeeze's axes, TopK's k, ...), read where the node's schema has
        it."""
        if attribute is not None and node.schema is not None and attribute in node.schema.attributes:
            return StaticInput(node.attr(attribute), None)
        if index not in node.static_inputs:
            raise TypeError(f"the {node.op_type} converter reads input {index} as static without declaring it "
                            f"(register_converter(..., static=...))")
        name = node.input(index)
        value = self.constant(name)
        return StaticInput(value, None if value is not None else name)

    def _derived(self, name: str) -> torch.Tensor | None:
        """A run-time value that conversion can nonetheless know: shape arithmetic on the static dims that graph
        inputs declare (shape_arithmetic.py); in the main graph only, whose module checks those dims."""
        if self.parent is not None or name in self._underivable:
            return None
        self._underivable.add(name)  # also while deriving: the derivation may ask about the value itself
        value = derive(self, self._declared, name)
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
            read = self.loaded.weight(name) if scope.parent is None else None
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
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or self.plan.uses[name] > 1:
            return None
        return value

    def subgraph(self, graph: onnx.GraphProto) -> Subgraph:
        """Convert a control-flow body. Its module takes the body's inputs, then the captured outer values."""
        known = self.plan.bodies.get(id(graph))
        plan = known if known is not None and known.graph is graph else None  # None: one the converter made
        return _GraphBuilder(ConversionContext(self.loaded, graph, parent=self, plan=plan)).build()

    def convert(self, proto: onnx.NodeProto, opset: int | None = None) -> Converted:
        """Convert one node with its registered converter, as the builder does (a fused node builds its parts so).
        ``opset``: its domain's version where the model imports none (a com.microsoft op a pass writes)."""
        return convert_node(self, proto, opset=opset)[0]


@dataclass
class Subgraph:
    module: fx.GraphModule  # returns a tuple with one entry per graph output
    captured: list[str]  # outer-scope values the body reads, passed after its own inputs


@dataclass
class Step:
    """One node of a plan: what converts it."""

    proto: onnx.NodeProto
    name: str  # unique and non-empty, also when the ONNX node has no name
    converter: Converter | None  # None for a fused node
    version: int  # the since_version it converts under (1 for a fused node)
    schema: onnx.defs.OpSchema | None
    fusion: Fusion | None  # for a fused node: what recognition proved it computes
    release: list[str]  # values this node is the last in its graph to read: dropped after it (ctx.release)
    static_inputs: frozenset[int] = frozenset()  # the inputs its converter declares static (register_converter)


@dataclass
class Plan:
    """What building a graph needs to know before its first node converts, worked out once by ``make_plan``."""

    graph: onnx.GraphProto
    steps: list[Step]  # one per node, in order (after recognition for the main graph)
    captured: list[str]  # values read from enclosing scopes (a body's extra inputs), in order of first use
    uses: Counter  # value name -> node inputs and graph outputs that read it, in every graph of the model
    bodies: dict[int, Plan]  # id of a subgraph of its nodes -> its plan (which holds it: the id stays its own)


def make_plan(graph: onnx.GraphProto, opsets: dict[str, int], nodes: list[onnx.NodeProto] | None = None,
              fusions: dict[str, Fusion] | None = None, *, uses: Counter | None = None) -> Plan:
    """The plan of a graph, its nodes' bodies included: every node's converter resolved for the model's opsets, or
    one UnsupportedOperatorError listing every op that has none. ``nodes``: the graph's nodes after recognition (a
    fused node, described in ``fusions``, stands for nodes that need no converter of their own). ``uses``: the
    model's, for a body planned on its own; counted here otherwise."""
    if uses is None:
        graphs = list(subgraphs(graph))
        uses = Counter(name for g in graphs for node in g.node for name in node.input if name)
        uses.update(output.name for g in graphs for output in g.output)
    missing: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    plan = _plan(graph, list(graph.node) if nodes is None else nodes, fusions or {}, opsets, uses, missing)
    if missing:
        raise UnsupportedOperatorError(missing)
    return plan


def _plan(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], fusions: dict[str, Fusion], opsets: dict[str, int],
          uses: Counter, missing: dict[tuple[str, str, int], list[str]]) -> Plan:
    """``make_plan`` for one graph, then for its nodes' bodies (depth first); ops without a converter go to
    ``missing``, with the names of their nodes."""
    last_reader = {name: index for index, node in enumerate(nodes) for name in read_names(node)}
    for info in graph.output:  # graph outputs are read at the end
        last_reader.pop(info.name, None)
    release = defaultdict(list)
    for name, index in last_reader.items():
        release[index].append(name)
    plan = Plan(graph, [], free_names(graph, nodes), uses, {})
    for index, node in enumerate(nodes):
        domain = normalize_domain(node.domain)
        step = Step(node, node.name or f"{node.op_type}_{index}", None, 1, None, None, release[index])
        if domain == FUSION_DOMAIN and node.name in fusions:
            step.fusion = fusions[node.name]
        elif (found := resolve(domain, node.op_type, opsets[domain]) if domain in opsets else None) is None:
            missing[(domain, node.op_type, opsets.get(domain, 0))].append(node.name or f"#{index}")
        else:
            step.converter, step.version = found
            step.schema = schema_for(domain, node.op_type, opsets[domain])
            step.static_inputs = static_inputs(domain, node.op_type, step.version)
        plan.steps.append(step)
    for node in nodes:
        for body in bodies(node):
            plan.bodies[id(body)] = _plan(body, list(body.node), {}, opsets, uses, missing)
    return plan


def build(loaded: LoadedModel, progress: Callable[[int, int], None] | None = None, *,
          fuse: bool = True) -> fx.GraphModule:
    """``progress(done, total)`` is called after each node of the main graph. ``fuse``: apply the recognition
    patterns (passes/) first, so that recurrences an exporter spelled out convert as one recurrent module."""
    graph = loaded.proto.graph
    recognised = recognise(loaded) if fuse else Recognised(list(graph.node))
    plan = make_plan(graph, loaded.opsets, recognised.nodes, recognised.fusions)
    if plan.captured:  # what a body reads from outside is computed there; the main graph has no outside
        shown = ", ".join(repr(name) for name in plan.captured[:5]) + (
            f" and {len(plan.captured) - 5} more" if len(plan.captured) > 5 else "")
        raise GraphConversionError(graph.name, f"no earlier node, graph input or initializer computes {shown}")
    module = _GraphBuilder(ConversionContext(loaded, graph, plan=plan)).build(progress).module
    module.meta[META_KEY] = record(loaded.proto, loaded.types, loaded.binding)  # names, dtypes and dims, for to_onnx
    # a model of recurrent nodes alone has no torch ops to keep on one thread; one of large weights gains from more
    module.meta[threads.ONE_THREAD] = _runs_glue(module) and _glue_weights(module) <= threads.GLUE_WEIGHTS
    return module.eval()  # ONNX semantics are inference semantics (BatchNormalization, Dropout)


_RECURRENT_MODULES = (Recurrent, StackedRecurrent, LoopedRecurrent, LoopedStack)


def _runs_glue(module: fx.GraphModule) -> bool:
    """Whether ``module``'s graph calls anything but recurrent modules and the unpacking of their outputs."""
    for node in module.graph.nodes:
        if node.op == "call_module" and not isinstance(module.get_submodule(node.target), _RECURRENT_MODULES):
            return True
        if node.op in ("call_function", "call_method") and node.target is not operator.getitem:
            return True
    return False


def _glue_weights(module: nn.Module) -> int:
    """The elements of ``module``'s parameters and buffers outside its recurrent modules."""
    inside = {id(t) for m in module.modules() if isinstance(m, _RECURRENT_MODULES)
              for t in (*m.parameters(), *m.buffers())}
    return sum(t.numel() for t in (*module.parameters(), *module.buffers()) if id(t) not in inside)


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


def convert_node(ctx: ConversionContext, proto: onnx.NodeProto, name: str | None = None,
                 opset: int | None = None) -> tuple[Converted, int, Callable]:
    """Run a node's converter (``resolve``d for the context's opset), refusing attributes it did not read.
    Returns the result, the since_version it was converted under and the converter. For a node that is not in the
    plan (e.g. a layer that a fused node converts); the builder converts the plan's nodes with their own."""
    domain = normalize_domain(proto.domain)
    opset = opset or ctx.opsets[domain]
    converter, version = resolve(domain, proto.op_type, opset)
    node = OnnxNode(proto, name or proto.name, version, schema_for(domain, proto.op_type, opset),
                    static_inputs(domain, proto.op_type, version))
    return _run_converter(ctx, node, converter), version, converter


def _run_converter(ctx: ConversionContext, node: OnnxNode, converter: Converter) -> Converted:
    result = converter(node, ctx)
    unread = node.unread_attributes()
    if unread:
        attribute = next(a for a in node.proto.attribute if a.name == unread[0])
        raise node.unsupported(attribute.name, attribute_value(attribute), "the converter does not read it")
    return result


class _GraphBuilder:
    """Builds one graph's GraphModule from its plan, with one method per kind of value and node, as torch.fx's
    Interpreter has one per kind of fx node: graph inputs, constants (initializers and folded values), ordinary and
    fused nodes, outputs. A control-flow body gets a builder of its own (ConversionContext.subgraph).

    ``env`` maps each ONNX value computed at run time to its fx.Node; a constant becomes an attribute of the module
    when a run-time node first reads it. A failure at a node raises an error naming it; one after the last node
    raises GraphConversionError.
    """

    def __init__(self, ctx: ConversionContext):
        self.ctx, self.plan = ctx, ctx.plan
        self.root, self.graph = nn.Module(), fx.Graph()
        self.attribute_names = _Names(dir(self.root))
        self.placeholder_names = _Names(("self",))  # forward's own first argument
        self.env: dict[str, fx.Node] = {}
        self.constants: dict[str, fx.Node | tuple[fx.Node, ...]] = {}  # ONNX value -> its attribute(s)
        # shape arithmetic as fx integer nodes, traced once per value: a body's too, so that a loop compiled as
        # torch.while_loop computes its sizes from symbolic shapes (tensors would give unbacked sizes)
        self.shapes = ShapeArithmetic(ctx, FxSizes(ctx, self.graph, self.value))

    def build(self, progress: Callable[[int, int], None] | None = None) -> Subgraph:
        """``progress(done, total)`` after each node."""
        for info in self.plan.graph.input:
            self.graph_input(info)
        # A body reads outer values as extra inputs: gradients then reach the outer parameters.
        captures = {name: self.placeholder(name) for name in self.plan.captured}
        for index, step in enumerate(self.plan.steps):
            self.node(step)
            if progress is not None:
                progress(index + 1, len(self.plan.steps))
            for name in step.release:
                self.ctx.release(name)
        try:
            return self.finish(captures)
        except Onnx2TorchError:
            raise
        except Exception as error:
            raise GraphConversionError(self.plan.graph.name, f"{type(error).__name__}: {error}") from error

    def placeholder(self, name: str) -> fx.Node:
        self.env[name] = self.graph.placeholder(self.placeholder_names(name))
        return self.env[name]

    def graph_input(self, info: onnx.ValueInfoProto) -> None:
        if not self.ctx.is_local_constant(info.name):  # an input with an initializer of the same name is a constant
            _check_input_type(info)
            self.placeholder(info.name)

    def value(self, name: str | None) -> fx.Node | tuple[fx.Node, ...] | None:
        """What reads ``name`` at run time: the node computing it, or the attribute holding its constant value."""
        if name is None:
            return None
        if name in self.env:
            return self.env[name]
        if name not in self.constants:
            self.constants[name] = self.constant(name)
        return self.constants[name]

    def constant(self, name: str) -> fx.Node | tuple[fx.Node, ...]:
        """An initializer or folded value that a run-time node reads: an attribute of the module, or a tuple of
        them for a folded sequence (SequenceConstruct, SplitToSequence of constants)."""
        value = self.ctx.constant(name)
        if value is None:
            raise LookupError(f"value {name!r} is used before it is computed")
        if isinstance(value, tuple | list):
            return tuple(self.attribute(f"{name}_{i}", t) for i, t in enumerate(value))
        return self.attribute(name, value)

    def attribute(self, name: str, tensor: torch.Tensor) -> fx.Node:
        target = self.attribute_names(name)
        # Weights train; a scalar (an epsilon, a clip bound, the 1 in 1 - z) is a constant, not a weight. Contiguous:
        # FSDP2 shards only contiguous parameters (a folded Transpose is a view).
        if tensor.is_floating_point() and tensor.numel() > 1:
            self.root.register_parameter(target, nn.Parameter(tensor.contiguous()))
        else:
            self.root.register_buffer(target, tensor)
        return self.graph.get_attr(target)

    def node(self, step: Step) -> None:
        """Convert a node: its outputs become constants when it folds, else values its module computes."""
        node = OnnxNode(step.proto, step.name, step.version, step.schema, step.static_inputs)
        try:
            result, where = self.fused(step, node) if step.fusion is not None else self.ordinary(step, node)
            outputs = self.fold(step, result)
            if logger.isEnabledFor(logging.DEBUG):
                _log(self.ctx, node, step.version, where, None if outputs is not None else result.module)
            if outputs is not None:
                for name, tensor in _per_output(node, outputs):
                    self.ctx.set_constant(name, tensor)
            else:
                self.call(step, node, result)
        except Onnx2TorchError:
            raise
        except Exception as error:
            raise ConversionError(node.name, node.op_type, f"{type(error).__name__}: {error}") from error

    def ordinary(self, step: Step, node: OnnxNode) -> tuple[Converted, str]:
        converter = step.converter
        return (_run_converter(self.ctx, node, converter),
                f"{converter.__module__.removeprefix('onnx2torch_rnn.')}.{converter.__qualname__}")

    def fused(self, step: Step, node: OnnxNode) -> tuple[Converted, str]:
        node.op_type = step.fusion.op_type
        return step.fusion.convert(self.ctx), f"pattern {step.fusion.pattern}"

    def fold(self, step: Step, result: Converted):
        """The node's outputs if it folds (it reads only constants at run time), else None."""
        if step.fusion is not None or step.proto.op_type in NOT_FOLDABLE or not all(
                name is None or self.ctx.is_constant(name) for name in result.inputs):
            return None
        outputs = _fold(self.ctx, result)
        if outputs is None or (step.proto.op_type in WHOLE_TENSOR_OPS and _unties(self.ctx, result.inputs, outputs)):
            return None
        return outputs

    def call(self, step: Step, node: OnnxNode, result: Converted) -> None:
        """The node's module, called at run time on the values it reads; its outputs become values of the graph."""
        target = self.attribute_names(node.name)
        self.root.add_module(target, result.module)
        fx_node = self.graph.call_module(target, *self.arguments(result))
        domain = normalize_domain(node.domain)
        fx_node.meta["onnx"] = {"name": step.proto.name, "op_type": step.proto.op_type, "domain": node.domain,
                                "version": step.version, "opset": self.ctx.opsets.get(domain, 1)}
        if step.fusion is not None:  # the ONNX nodes it stands for, in graph order
            fx_node.meta["onnx"].update(op_type=step.fusion.op_type, pattern=step.fusion.pattern,
                                        replaces=[n.name for n in step.fusion.nodes])
        # the ONNX value of each call argument and of each output slot (None where absent), for debugging tools
        fx_node.meta["onnx_values"] = {"inputs": tuple(result.inputs), "outputs": node.outputs}
        if len(node.outputs) == 1:
            outputs = fx_node
        else:
            outputs = [self.graph.call_function(operator.getitem, (fx_node, i)) for i in range(len(node.outputs))]
        for name, out in _per_output(node, outputs):
            self.env[name] = out

    def arguments(self, result: Converted) -> tuple[tuple, dict]:
        """A module's call arguments: the values it reads, those at ``result.ints`` as ints where shape arithmetic
        computes every one of them (at least one from sizes at run time), else all as tensors."""
        names = {i: result.inputs[i] for i in result.ints if i < len(result.inputs) and result.inputs[i] is not None}
        ints = {i: self.shapes.trace(name) for i, name in names.items()}
        if None in ints.values() or not any(map(is_symbolic, ints.values())):
            ints = {}
        args = tuple(ints[i] if i in ints else self.value(name) for i, name in enumerate(result.inputs))
        if not ints or not result.device:
            return args, {}
        tensor = next(source for name in names.values() for source in self.shapes.reads(name))
        return args, {"device": self.graph.call_function(getattr, (self.value(tensor), "device"))}

    def finish(self, captures: dict[str, fx.Node]) -> Subgraph:
        """The graph's outputs and checks of declared dims; then what no output needs is removed."""
        self.check_declared_dims()
        outputs = [self.value(info.name) for info in self.plan.graph.output]
        is_subgraph = self.ctx.parent is not None
        self.graph.output(outputs[0] if len(outputs) == 1 and not is_subgraph else tuple(outputs))
        self.graph.owning_module = self.root  # dead-code elimination asks the called modules whether they are impure
        self.graph.eliminate_dead_code()
        captured = [name for name in self.plan.captured if captures[name].users]
        for name in self.plan.captured:
            if not captures[name].users:  # read only by nodes that were folded or are dead
                self.graph.erase_node(captures[name])
        # After the clean-up: the GraphModule copies only the attributes its graph uses, and generates its code once.
        # inference calls skip nn.Module.__call__ per node (executor.py)
        module = executor.Graph(self.root, self.graph, class_name=sanitize(self.plan.graph.name or "OnnxModel"))
        return Subgraph(module, captured)

    def check_declared_dims(self) -> None:
        """Like onnxruntime, refuse inputs whose static dims differ from the declared ones, where a derived constant
        relies on them (ConversionContext.assume_declared_dims)."""
        if not self.ctx.assumed_inputs:
            return
        with self.graph.inserting_after([n for n in self.graph.nodes if n.op == "placeholder"][-1]):
            for name in self.ctx.assumed_inputs:
                dims = {i: d for i, d in enumerate(self.ctx.loaded.declared[name]) if isinstance(d, int)}
                target = self.attribute_names(f"check_{name}")
                self.root.add_module(target, DeclaredShape(name, dims))
                self.graph.call_module(target, (self.env[name],))


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
        name is not None and ctx.plan.uses[name] > 1 and _is_weight(ctx.constant(name)) for name in inputs)


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
