"""Control flow: If, Loop, Scan (bodies converted recursively, reading outer values)."""

from __future__ import annotations

from ..modules.control_flow import If, Loop, Scan, Scan8
from ..node import Converted, OnnxNode
from ..registry import register_converter

_LATER = (11, 13, 16, 19, 21, 23, 24, 25)  # versions since 11 differ only in the types they allow


@register_converter("If", (1, *_LATER))
def if_(node: OnnxNode, ctx) -> Converted:
    """Runs the branch the condition selects; branches may read any outer value and return tensors, sequences
    (tuples) or optionals (None when empty). Data-dependent: torch.compile breaks the graph here."""
    then_branch = ctx.subgraph(node.attr("then_branch"))
    else_branch = ctx.subgraph(node.attr("else_branch"))
    captured = list(dict.fromkeys(then_branch.captured + else_branch.captured))
    module = If(then_branch.module, else_branch.module, [captured.index(n) for n in then_branch.captured],
                [captured.index(n) for n in else_branch.captured], len(node.outputs))
    return Converted(module, [node.input(0), *captured])


@register_converter("Loop", (1, *_LATER))
def loop(node: OnnxNode, ctx) -> Converted:
    """Trip count and/or condition, known or computed at run time; loop-carried values and scan outputs (stacked
    on a new first axis); the body may read outer values, and gradients flow through every iteration. A loop that
    runs zero iterations returns its initial values and, as onnxruntime, empty scan outputs of shape
    [0, *static shape of the body output] with 0 for unknown dims ([0] when even the rank is unknown). Carried
    values may be sequences (tuples) or optionals (None when empty); scan outputs are tensors."""
    body_proto = node.attr("body")
    body = ctx.subgraph(body_proto)
    carried = node.inputs[2:]
    scan_outputs = [o.name for o in body_proto.output[1 + len(carried):]]
    empty = [((0, *(d if isinstance(d, int) else 0 for d in ctx.shape(name) or ())), ctx.dtype(name))
             for name in scan_outputs]
    module = Loop(body.module, len(carried), len(scan_outputs), len(node.outputs), empty)
    return Converted(module, [node.input(0), node.input(1), *carried, *body.captured])


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
    """State variables and scan inputs/outputs with any axes and directions; the body may read outer values."""
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
