"""Values a graph computes from its inputs' sizes and its constants only, kept per input signature at inference.

Exporters compute initial states from the input's sizes at run time (Keras: Expand(zeros, [x.size(0), 6]) ->
Unsqueeze -> QuantizeLinear -> QLinearConcat -> DequantizeLinear into a biLSTM's initial states; torch:
ConstantOfShape([2, x.size(0), 8]) -> Slice): a module call each on every call, for the same values at the same
sizes. ``kept_forward`` finds such nodes: their inputs are reads of a graph input's sizes, numel, device or dtype
(``x.size(0)``, as shape_arithmetic.py writes them), constants of the graph (get_attr), literals, or other such
nodes; each is a module of this package without children whose op folds at conversion (not random:
registry.NOT_FOLDABLE), or int arithmetic. It returns the graph's code with those nodes replaced by one call
returning the values the rest of the graph reads, computed on a miss and kept while the reads are equal, every
tensor they read (the graph's constants, the modules' parameters and buffers) is the same object at the same
version, and no kept tensor was changed in place. Only the executor's fast inference call runs it (executor.py):
the fx graph, hence training, torch.compile, export, codegen, check and to_onnx, is as before. A graph output is
never a kept value (each call returns its own tensors).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch import fx
from torch.utils._pytree import tree_leaves

from .registry import NOT_FOLDABLE
from .shape_arithmetic import ARITHMETIC

_SIZE_METHODS = frozenset({"size", "numel", "dim"})
_SIZE_ATTRIBUTES = frozenset({"device", "dtype"})
_INT_FUNCTIONS = frozenset({*ARITHMETIC.values(), torch.sym_max, torch.sym_min, operator.getitem})


def _is_read(node: fx.Node) -> bool:
    """A read of a graph input's signature: ``x.size(i)``, ``x.numel()``, ``x.dim()``, ``x.device``, ``x.dtype``."""
    if node.op == "call_method" and node.target in _SIZE_METHODS:
        pass
    elif not (node.op == "call_function" and node.target is getattr and node.args[1] in _SIZE_ATTRIBUTES):
        return False
    return isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder"


def _pure(module: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` computes the same value from the same inputs, with no effect but its result."""
    if node.op == "call_function":
        return node.target in _INT_FUNCTIONS or getattr(node.target, "__module__", None) == "_operator"
    if node.op != "call_module" or "onnx" not in node.meta or node.meta["onnx"]["op_type"] in NOT_FOLDABLE:
        return False
    child = module._modules.get(node.target)
    return child is not None and not child._modules and type(child).__module__.startswith(__package__ + ".")


def _signature_only(module: fx.GraphModule) -> set[fx.Node]:
    """The nodes whose value depends only on reads (``_is_read``), constants and literals."""
    only: set[fx.Node] = set()
    for node in module.graph.nodes:
        if node.op == "get_attr" or _is_read(node) or (
                _pure(module, node) and all(a in only for a in node.all_input_nodes)):
            only.add(node)
    return only


def _ancestors(nodes: list[fx.Node], within: set[fx.Node]) -> list[fx.Node]:
    seen: set[fx.Node] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending += [a for a in node.all_input_nodes if a in within]
    return [n for n in next(iter(nodes)).graph.nodes if n in seen]  # graph order


def kept_forward(module: fx.GraphModule, namespace) -> Callable | None:
    """``module``'s forward (called with ``namespace`` as ``self``) with its signature-only module calls kept per
    signature (see the module docstring), or None where it has none."""
    only = _signature_only(module)
    kept = {n for n in only if n.op != "get_attr" and not _is_read(n)
            and not any(u.op == "output" for u in n.users)}
    if not any(n.op == "call_module" for n in kept):
        return None
    frontier = [n for n in module.graph.nodes if n in kept and any(u not in kept for u in n.users)]
    needed = _ancestors(frontier, only)
    reads = [n for n in needed if _is_read(n)]
    values = _Kept(_compute(needed, reads, frontier, namespace),
                   [getattr(module, n.target) for n in needed if n.op == "get_attr"],
                   [child for n in needed if n.op == "call_module" for child in [module._modules[n.target]]])
    graph = fx.Graph()
    copies = {}
    graph.output(graph.graph_copy(module.graph, copies))  # graph_copy leaves the output node out
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
        call = graph.call_function(values.values, tuple(graph.node_copy(r, copies.__getitem__) for r in reads))
        for i, node in enumerate(frontier):
            copies[node].replace_all_uses_with(graph.call_function(operator.getitem, (call, i)))
    for node in reversed(module.graph.nodes):  # the kept nodes, then the reads and constants they alone read
        if node in only and node.op != "placeholder" and not copies[node].users:
            graph.erase_node(copies[node])
    return _function(graph)


def _compute(needed: list[fx.Node], reads: list[fx.Node], frontier: list[fx.Node], namespace) -> Callable:
    """The kept values from the reads: the needed nodes as a function."""
    graph = fx.Graph()
    copies = {read: graph.placeholder(read.name) for read in reads}
    for node in needed:
        if node not in copies:
            copies[node] = graph.node_copy(node, copies.__getitem__)
    graph.output(tuple(copies[n] for n in frontier))
    compute = _function(graph)
    return lambda *reads: compute(namespace, *reads)


def _function(graph: fx.Graph) -> Callable:
    code = graph.python_code(root_module="self")
    scope = dict(code.globals)
    exec(compile(code.src, "<signature_kept>", "exec"), scope)  # fx's own code, as GraphModule.recompile runs it
    return scope["forward"]


class _Kept:
    """The kept values of one graph state: one (reads, tensors, versions, values, value tensors, their versions)
    entry, replaced whole (a reader in another thread sees one)."""

    __slots__ = ("compute", "constants", "dicts", "entry")

    def __init__(self, compute: Callable, constants: list, children: list[torch.nn.Module]):
        self.compute = compute
        self.constants = [t for t in tree_leaves(constants) if isinstance(t, torch.Tensor)]
        # a child without parameters and buffers reads none (a buffer added later is no input of its forward)
        self.dicts = [d for child in children for d in (child._parameters, child._buffers) if d]
        self.entry = None

    def values(self, *reads) -> tuple:
        tensors = self.constants + [t for d in self.dicts for t in d.values() if t is not None]
        entry = self.entry
        if (entry is not None and reads == entry[0] and len(tensors) == len(entry[1])
                and all(map(operator.is_, tensors, entry[1])) and [t._version for t in tensors] == entry[2]
                and [t._version for t in entry[4]] == entry[5]):
            return entry[3]
        if any(t.is_inference() for t in tensors):  # no version counter to check: computed at every call
            return self.compute(*reads)
        with torch.inference_mode(False), torch.no_grad():  # tensors with version counters
            values = self.compute(*reads)
        made = [t for t in tree_leaves(values) if isinstance(t, torch.Tensor)]
        self.entry = (reads, tensors, [t._version for t in tensors], values, made, [t._version for t in made])
        return values
