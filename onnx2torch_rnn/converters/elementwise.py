"""Element-wise arithmetic, logic and activation ops."""

from __future__ import annotations

import torch

from ..modules.common import ConstantValue, Function
from ..node import Converted, OnnxNode
from ..registry import register_converter

_BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul}


def _binary(node: OnnxNode, ctx) -> Converted:
    return Converted(Function(_BINARY[node.op_type]), node.inputs)


for _op in _BINARY:
    register_converter(_op, (7, 13, 14))(_binary)


@register_converter("Relu", (6, 13, 14))
def relu(node: OnnxNode, ctx) -> Converted:
    return Converted(Function(torch.relu), node.inputs)


@register_converter("Identity", (1, 13, 14, 16, 19, 21, 23, 24, 25))
def identity(node: OnnxNode, ctx) -> Converted:
    return Converted(torch.nn.Identity(), node.inputs)


@register_converter("Constant", (1, 9, 11, 12, 13, 19, 21, 23, 24, 25))
def constant(node: OnnxNode, ctx) -> Converted:
    kinds = ["value", "value_float", "value_floats", "value_int", "value_ints", "sparse_value", "value_string",
             "value_strings"]
    given = [k for k in kinds if node.has_attr(k)]
    if len(given) != 1:
        raise node.unsupported("value", given, "a Constant needs exactly one value attribute")
    kind = given[0]
    value = node.attr(kind)
    if kind in ("sparse_value", "value_string", "value_strings"):
        raise node.unsupported(kind, value, "sparse and string constants have no torch equivalent")
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=torch.float32 if kind.startswith("value_float") else torch.int64)
    return Converted(ConstantValue(value), [])
