"""Control flow: If, Loop, Scan (bodies converted recursively, reading outer values)."""

from __future__ import annotations

import onnx

from ..modules.control_flow import If, Loop, Scan, Scan8, Taken
from ..node import Converted, OnnxNode, read_names
from ..registry import register_converter

_LATER = (11, 13, 16, 19, 21, 23, 24, 25)  # versions since 11 differ only in the types they allow


@register_converter("If", (1, *_LATER))
def if_(node: OnnxNode, ctx) -> Converted:
    """Runs the branch the condition selects; branches may read any outer value and return tensors, sequences
    (tuples) or optionals (None when empty). A condition known at conversion builds the branch it takes alone. A
    condition computed from tensor sizes (Shape -> Gather -> Equal)
    selects the branch in Python, also compiled or exported (a guard on those sizes); any other is data, and compiled
    or exported the If is torch.cond, when the branches return tensors of the same dtypes and ranks (else bind the
    graph inputs that decide it: ``convert(model, constants=...)``)."""
    then_proto, else_proto = node.attr("then_branch"), node.attr("else_branch")
    known = ctx.constant(node.input(0))
    if known is not None:  # decided at conversion (a bound input, declared dims): the other branch is never built
        taken = ctx.subgraph(then_proto if bool(known.reshape(())) else else_proto)
        return Converted(Taken(taken.module, len(node.outputs)), taken.captured)
    then_branch, else_branch = ctx.subgraph(then_proto), ctx.subgraph(else_proto)
    captured = list(dict.fromkeys(then_branch.captured + else_branch.captured))
    module = If(then_branch.module, else_branch.module, [captured.index(n) for n in then_branch.captured],
                [captured.index(n) for n in else_branch.captured], len(node.outputs),
                _branch_mismatch(ctx, node.input(0), then_proto, else_proto))
    return Converted(module, [node.input(0), *captured], ints=(0,))


def _branch_mismatch(ctx, cond: str, then_proto: onnx.GraphProto, else_proto: onnx.GraphProto) -> str | None:
    """Why the branches' outputs cannot be one torch.cond (from their static types), or None if they may be; with
    the graph inputs the condition is computed from, which binding at conversion folds to one branch."""
    why = _why_not_cond(ctx, then_proto, else_proto)
    if why is None:
        return None
    sources = _graph_inputs(ctx, cond)
    example = ", ".join(f"{name!r}: ..." for name in sources) or "'<input>': ..."
    decided = (f"The condition is computed from graph input(s) {', '.join(map(repr, sources))}; where"
               if sources else "Where")
    return (f"{why}. {decided} the caller always passes one value, bind it at conversion: "
            f"onnx2torch_rnn.convert(model, constants={{{example}}}) (CLI: --constant NAME=VALUE) keeps only the "
            "branch it selects")


def _graph_inputs(ctx, name: str) -> list[str]:
    """The main graph's run-time inputs that the value ``name`` (of this graph or an enclosing one) is computed
    from."""
    root = ctx
    while root.parent is not None:
        root = root.parent
    inputs = {i.name for i in root.plan.graph.input}
    scopes, scope = [], ctx
    while scope is not None:
        scopes.append(scope)
        scope = scope.parent
    producer = {out: node for s in scopes for node in s.plan.graph.node for out in node.output if out}
    found, seen, pending = [], set(), [name]
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        if value in inputs and not root.is_constant(value):
            found.append(value)
        elif value in producer:
            pending.extend(read_names(producer[value]))
    return sorted(found)


def _why_not_cond(ctx, then_proto: onnx.GraphProto, else_proto: onnx.GraphProto) -> str | None:
    for k, (a, b) in enumerate(zip(then_proto.output, else_proto.output, strict=True)):
        types = [ctx.loaded.types.get(o.name) or o.type for o in (a, b)]
        if any(t.WhichOneof("value") not in (None, "tensor_type") for t in types):
            return f"output {k} is a sequence or optional value, and torch.cond returns tensors only"
        dtypes, shapes = [ctx.dtype(o.name) for o in (a, b)], [ctx.shape(o.name) for o in (a, b)]
        if None not in dtypes and dtypes[0] != dtypes[1]:
            return f"output {k} is {dtypes[0]} in then_branch and {dtypes[1]} in else_branch"
        if None not in shapes and len(shapes[0]) != len(shapes[1]):
            return (f"output {k} has rank {len(shapes[0])} in then_branch and {len(shapes[1])} in else_branch, and "
                    "torch.cond needs both branches to return tensors of the same dtypes and ranks")
    return None


@register_converter("Loop", (1, *_LATER))
def loop(node: OnnxNode, ctx) -> Converted:
    """Trip count and/or condition, known or computed at run time; loop-carried values and scan outputs (stacked
    on a new first axis); the body may read outer values, and gradients flow through every iteration. A loop that
    runs zero iterations returns its initial values and, as onnxruntime, empty scan outputs of shape
    [0, *static shape of the body output] with 0 for unknown dims ([0] when even the rank is unknown). Carried
    values may be sequences (tuples) or optionals (None when empty); scan outputs are tensors. Compiled or exported:
    torch.while_loop, when the carried values are tensors that keep their shapes (zero iterations then give scan
    outputs of shape [0, *the body output's shape])."""
    body_proto = node.attr("body")
    body = ctx.subgraph(body_proto)
    carried = node.inputs[2:]
    scan_outputs = [o.name for o in body_proto.output[1 + len(carried):]]
    empty = [((0, *(d if isinstance(d, int) else 0 for d in ctx.shape(name) or ())), ctx.dtype(name))
             for name in scan_outputs]
    module = Loop(body.module, len(carried), len(scan_outputs), len(node.outputs), empty,
                  _cond_state(body_proto, len(carried)))
    return Converted(module, [node.input(0), node.input(1), *carried, *body.captured])


def _cond_state(body: onnx.GraphProto, num_carried: int) -> list[int]:
    """The carried values (positions) that the body's cond output depends on, directly or through other carried
    values: all that a compiled Loop needs to count its iterations."""
    producer = {name: n for n in body.node for name in n.output}
    carried_in = [i.name for i in body.input[2 : 2 + num_carried]]

    def sources(name: str) -> set[str]:  # the values without a producer in the body that ``name`` is computed from
        seen, pending = set(), [name]
        while pending:
            value = pending.pop()
            if value not in seen:
                seen.add(value)
                pending.extend(read_names(producer[value]) if value in producer else ())
        return {value for value in seen if value not in producer}

    kept: set[int] = set()
    pending = [body.output[0].name]
    while pending:
        found = sources(pending.pop())
        for k, name in enumerate(carried_in):
            if name in found and k not in kept:
                kept.add(k)
                pending.append(body.output[1 + k].name)
    return sorted(kept)


def _scan(node: OnnxNode, ctx, num_state: int, directions_attribute: str) -> tuple[Scan, list[str]]:
    body_proto = node.attr("body")
    body = ctx.subgraph(body_proto)
    num_scan_inputs = node.attr("num_scan_inputs")
    num_scan_outputs = len(body_proto.output) - num_state

    def listed(name: str, count: int) -> list[int]:
        values = node.attr(name) or [0] * count
        if len(values) != count:
            raise node.unsupported(name, values, f"expected {count} entries")
        return list(values)

    module = Scan(body.module, num_state, num_scan_inputs,
                  listed("scan_input_axes", num_scan_inputs) if node.version >= 9 else [0] * num_scan_inputs,
                  listed(directions_attribute, num_scan_inputs),
                  listed("scan_output_axes", num_scan_outputs) if node.version >= 9 else [0] * num_scan_outputs,
                  listed("scan_output_directions", num_scan_outputs) if node.version >= 9 else [0] * num_scan_outputs,
                  len(node.outputs))
    return module, body.captured


@register_converter("Scan", (9, 11, 16, 19, 21, 23, 24, 25))
def scan(node: OnnxNode, ctx) -> Converted:
    """State variables and scan inputs/outputs with any axes and directions; the body may read outer values.
    Compiled or exported: torch.while_loop over a dynamic length."""
    num_state = len(node.inputs) - node.attr("num_scan_inputs")
    module, captured = _scan(node, ctx, num_state, "scan_input_directions")
    return Converted(module, [*node.inputs, *captured])


@register_converter("Scan", 8)
def scan_8(node: OnnxNode, ctx) -> Converted:
    """Scan-8: batch axis 0 on all inputs and outputs, optional sequence_lens (scan outputs zero past each row's
    length)."""
    num_state = len(node.inputs) - 1 - node.attr("num_scan_inputs")
    module, captured = _scan(node, ctx, num_state, "directions")
    return Converted(Scan8(module), [*node.inputs, *captured])
