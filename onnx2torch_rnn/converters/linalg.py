"""Linear algebra: MatMul, Gemm, Einsum."""

from __future__ import annotations

import torch
from torch import nn

from ..modules.common import Function
from ..modules.nn import Einsum, Gemm
from ..node import Converted, OnnxNode, refuse_uint64
from ..registry import register_converter


def linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An nn.Linear holding ``weight`` (out x in) and ``bias`` as its parameters."""
    module = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    module.weight = nn.Parameter(weight.contiguous())
    if bias is not None:
        module.bias = nn.Parameter(bias.contiguous())
    return module


@register_converter("MatMul", (1, 9, 13))
def matmul(node: OnnxNode, ctx) -> Converted:
    """Numpy-style matmul (torch.matmul). A constant 2-D floating right operand used by this node only becomes a
    bias-free nn.Linear (exact for 1-D and N-D left operands too)."""
    refuse_uint64(node, ctx)
    b = ctx.owned_constant(node.input(1))
    if b is not None and b.dim() == 2:
        return Converted(linear(b.t(), None), [node.input(0)])
    return Converted(Function(torch.matmul), node.inputs)


@register_converter("Gemm", (7, 9, 11, 13))
def gemm(node: OnnxNode, ctx) -> Converted:
    """alpha * A' @ B' + beta * C. With transA=0, a constant B and a constant (or absent) C that broadcasts along
    rows only, it becomes nn.Linear with alpha, beta and transB folded into its weight and bias; otherwise a
    generic module."""
    refuse_uint64(node, ctx)
    alpha, beta = node.attr("alpha"), node.attr("beta")
    trans_a, trans_b = node.attr("transA"), node.attr("transB")
    b, c = ctx.owned_constant(node.input(1)), ctx.owned_constant(node.input(2))
    if b is not None and b.dim() == 2 and not trans_a:
        weight = b if trans_b else b.t()
        out_features = weight.shape[0]
        # C acts as a bias when it broadcasts to (M, N) without depending on the row
        if node.input(2) is None or (c is not None and c.dtype == b.dtype and c.numel() in (1, out_features)
                                     and (c.dim() < 2 or c.shape[0] == 1)):
            bias = None if c is None else (c * beta).reshape(-1).expand(out_features).clone()
            return Converted(linear(weight * alpha, bias), [node.input(0)])
    return Converted(Gemm(alpha, beta, trans_a, trans_b), node.inputs)


@register_converter("Einsum", (12, 28))
def einsum(node: OnnxNode, ctx) -> Converted:
    """torch.einsum with the node's equation (explicit and implicit forms, ellipsis broadcasting)."""
    refuse_uint64(node, ctx)
    return Converted(Einsum(node.attr("equation")), node.inputs)
