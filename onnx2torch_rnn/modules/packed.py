"""The inference path of convolutions with constant weights: oneDNN on a weight packed once per weight version.

torch's eager convolution reorders the weight into oneDNN's blocked layout on every call, and on one thread it runs
many convolutions on its reference im2col kernel instead (a detector's first layer: 3.2 ms there, 0.5 ms on oneDNN
with a packed weight). When nothing needs a gradient, a converted model's 1-D and 2-D convolutions with more than
``SMALL_POSITIONS`` output positions run oneDNN's convolution on the weight reordered once, on the input in
channels-last layout (oneDNN's own; the output stays channels-last, which every later op reads by strides). Smaller
ones stay torch's: oneDNN's fixed cost per call (about 40 us with the layout change) exceeds what it saves there, and
other small-size formulations (one product of the windows) measured no faster inside whole models.
Training, torch.compile, torch.export and torch.jit tracing run torch's own convolution, and so does any call where a
gradient is needed. The modules are nn.Conv1d / nn.Conv2d in every other respect.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..torch_compat import onednn_convolution

SMALL_POSITIONS = 256  # output positions (batch x spatial) up to which torch's own convolution is kept


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


class _PackedConv:
    """The inference path of nn.Conv1d / nn.Conv2d (mixed in before them); a 1-D convolution runs as height 1."""

    def forward(self, x: Tensor) -> Tensor:
        if (onednn_convolution is None or self.padding_mode != "zeros" or x.dim() != self.weight.dim()
                or not inference_call(x, self.weight)):
            return super().forward(x)
        one_d = x.dim() == 3
        if one_d:
            x = x.unsqueeze(2)
            kernel, padding = (1, *self.kernel_size), [0, *self.padding]
            stride, dilation = [1, *self.stride], [1, *self.dilation]
        else:
            kernel, padding, stride, dilation = self.kernel_size, list(self.padding), list(self.stride), list(
                self.dilation)
        positions = x.shape[0]
        for size, k, p, s, d in zip(x.shape[2:], kernel, padding, stride, dilation, strict=True):
            positions *= (size + 2 * p - d * (k - 1) - 1) // s + 1
        if positions <= SMALL_POSITIONS:
            return super().forward(x.squeeze(2) if one_d else x)
        reorder, convolve = onednn_convolution
        key = (_version(self.weight), _version(self.bias))
        packed = self.__dict__.get("_packed_weight")
        if packed is None or packed.key != key:
            weight = self.weight.detach()
            weight = reorder(weight.unsqueeze(2) if one_d else weight, padding, stride, dilation, self.groups,
                             list(x.shape))
            packed = self.__dict__["_packed_weight"] = _Packed(key, weight)
        y = convolve(x.contiguous(memory_format=torch.channels_last), packed.weight, self.bias, padding, stride,
                     dilation, self.groups, "none", [], "")
        return y.squeeze(2) if one_d else y


class Conv1d(_PackedConv, nn.Conv1d):
    """nn.Conv1d whose inference packs its weight once per version (see the module docstring). codegen writes it as
    torch modules are written (its arguments are nn.Conv1d's)."""


class Conv2d(_PackedConv, nn.Conv2d):
    """nn.Conv2d whose inference packs its weight once per version (see the module docstring). codegen writes it as
    torch modules are written (its arguments are nn.Conv2d's)."""
