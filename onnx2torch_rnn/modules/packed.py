"""The inference path of convolutions with constant weights: oneDNN on a weight packed once per weight version.

torch's eager convolution reorders the weight into oneDNN's blocked layout on every call, and on one thread it runs
many convolutions on its reference im2col kernel instead (a detector's first layer: 3.2 ms there, 0.5 ms on oneDNN
with a packed weight; its 13x13 layers of 256 channels: 1.7 ms each there). When nothing needs a gradient, a
converted model's 1-D and 2-D convolutions of at least ``SMALL_WORK`` multiply-adds run oneDNN's convolution on the
weight reordered once, on the input in channels-last layout (oneDNN's own; the output stays channels-last, which
every later op reads by strides). Smaller ones stay torch's: oneDNN's fixed cost per call (about 40 us with the
layout change) exceeds what it saves there, and other formulations (one product of the windows) measured no faster
inside whole models.
Under torch.compile (not export), a small convolution that needs no gradient is written as the product of its windows
(unfold, one batched matmul): inductor then fuses the window copy with its neighbours and calls one GEMM, where
torch's convolution would run its reference kernel (a VAD at batch 1: 457 -> 236 us per compiled call).
Training, torch.export and torch.jit tracing run torch's own convolution, and so does any call where a gradient is
needed. The modules are nn.Conv1d / nn.Conv2d in every other respect.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..torch_compat import onednn_convolution

SMALL_WORK = 1 << 19  # multiply-adds below which a convolution is small (oneDNN's fixed cost is about 40 us)


def inference_call(x: Tensor, weight: Tensor) -> bool:
    """Whether an eager call may take a packed path: float32 on CPU, a plain tensor (not fake, functional or a
    tracer's), nothing needing a gradient, nothing compiling or tracing."""
    return (not torch.compiler.is_compiling() and type(x) is torch.Tensor and x.dtype == torch.float32 and x.is_cpu
            and weight.dtype == torch.float32 and not torch.jit.is_tracing()
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


class _Packed:
    """A packed weight with the versions of the weight and bias it was made from. Never copied nor pickled (oneDNN's
    blocked tensors are neither): a copy of the module packs its own on first use."""

    __slots__ = ("key", "weight")

    def __init__(self, key: tuple, weight: Tensor):
        self.key, self.weight = key, weight

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return type(None), ()


def _version(t: Tensor | None) -> tuple:
    return () if t is None else (t._version, t.data_ptr())


def _compiled_inference(x: Tensor, weight: Tensor) -> bool:
    """Whether torch.compile (not export: its programs keep convolutions) traces a call that needs no gradient."""
    return (torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def window_product(x: Tensor, weight: Tensor, bias: Tensor | None, padding, stride, dilation, groups: int) -> Tensor:
    """The 2-D convolution of x [N, C, H, W] by weight [O, C/g, kh, kw] as (windows [N·H'·W', C/g·kh·kw]) @ weight
    per group: pure tensor ops that a compiler fuses, with the output positions as the product's rows."""
    if any(padding):
        x = torch.nn.functional.pad(x, [padding[1], padding[1], padding[0], padding[0]])
    windows = x
    for axis, (k, s, d) in enumerate(zip(weight.shape[2:], stride, dilation, strict=True), start=2):
        windows = windows.unfold(axis, (k - 1) * d + 1, s)[..., ::d]
    n, _, out_h, out_w = windows.shape[:4]
    rows = windows.permute(0, 2, 3, 1, 4, 5).reshape(n * out_h * out_w, groups, -1).transpose(0, 1)
    y = torch.bmm(rows, weight.reshape(groups, weight.shape[0] // groups, -1).transpose(1, 2))
    y = y.transpose(0, 1).reshape(n, out_h, out_w, weight.shape[0])
    return (y if bias is None else y + bias).permute(0, 3, 1, 2)


class _PackedConv:
    """The inference paths of nn.Conv1d / nn.Conv2d (mixed in before them); a 1-D convolution runs as height 1."""

    def forward(self, x: Tensor) -> Tensor:
        if self.padding_mode != "zeros" or x.dim() != self.weight.dim():
            return super().forward(x)
        compiled = _compiled_inference(x, self.weight)
        if not compiled and (onednn_convolution is None or not inference_call(x, self.weight)):
            return super().forward(x)
        one_d = x.dim() == 3
        x2, weight = (x.unsqueeze(2), self.weight.unsqueeze(2)) if one_d else (x, self.weight)
        height = [1] if one_d else []  # a 1-D convolution's height axis: size 1, no padding
        padding = [0] * len(height) + list(self.padding)
        stride, dilation = height + list(self.stride), height + list(self.dilation)
        work = x2.shape[0] * weight.numel()  # multiply-adds: batch x output positions x weight elements
        for size, k, p, s, d in zip(x2.shape[2:], weight.shape[2:], padding, stride, dilation, strict=True):
            work *= (size + 2 * p - d * (k - 1) - 1) // s + 1
        if compiled and work < SMALL_WORK:
            y = window_product(x2, weight, self.bias, padding, stride, dilation, self.groups)
        elif not compiled and work >= SMALL_WORK:
            y = self._onednn(x2, weight, padding, stride, dilation)
        else:
            return super().forward(x)
        return y.squeeze(2) if one_d else y

    def _onednn(self, x: Tensor, weight: Tensor, padding, stride, dilation) -> Tensor:
        reorder, convolve = onednn_convolution
        key = (_version(self.weight), _version(self.bias))
        packed = self.__dict__.get("_packed_weight")
        if packed is None or packed.key != key:
            packed = _Packed(key, reorder(weight.detach(), padding, stride, dilation, self.groups, list(x.shape)))
            self.__dict__["_packed_weight"] = packed
        return convolve(x.contiguous(memory_format=torch.channels_last), packed.weight, self.bias, padding, stride,
                        dilation, self.groups, "none", [], "")


class Conv1d(_PackedConv, nn.Conv1d):
    """nn.Conv1d whose inference packs its weight once per version (see the module docstring). codegen writes it as
    torch modules are written (its arguments are nn.Conv1d's)."""


class Conv2d(_PackedConv, nn.Conv2d):
    """nn.Conv2d whose inference packs its weight once per version (see the module docstring). codegen writes it as
    torch modules are written (its arguments are nn.Conv2d's)."""
