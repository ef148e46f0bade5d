"""Modules for ONNX sequence ops. An ONNX sequence is a Python tuple of tensors in the GraphModule."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .shape import _Attributes, ints, scalar


class SplitToSequence(_Attributes):
    """Parts along ``axis``: of the sizes in a 1-D ``split`` (>= 0, as onnxruntime), of a scalar ``split`` (> 0; the
    last part may be smaller), or of size 1 without ``split``, squeezed when ``keepdims`` is 0. A scalar split of 1 is
    squeezed too (onnxruntime; the spec says keepdims is ignored once split is given)."""

    _shown = ("axis", "keepdims", "split")

    def __init__(self, axis: int = 0, keepdims: int = 1, split: int | Sequence[int] | None = None):
        super().__init__()
        self.axis, self.keepdims, self.split = axis, keepdims, split

    def forward(self, data: torch.Tensor, split: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        sizes = self.split if split is None else (int(split) if split.dim() == 0 else ints(None, split))
        if sizes is None or sizes == 1:
            return data.unbind(self.axis) if not self.keepdims else data.split(1, self.axis)
        if sizes <= 0 if isinstance(sizes, int) else any(size < 0 for size in sizes):
            raise ValueError(f"split must be a positive scalar or sizes >= 0, got {sizes}")
        return data.split(sizes, self.axis)  # sizes must sum to the axis size: torch checks it


class SequenceAt(_Attributes):
    """The tensor at ``position`` (baked or read at run time), negative counting from the back."""

    _shown = ("position",)

    def __init__(self, position: int | None = None):
        super().__init__()
        self.position = position

    def forward(self, sequence: Sequence[torch.Tensor], position: torch.Tensor | None = None) -> torch.Tensor:
        index = scalar(self.position, position)
        if not -len(sequence) <= index < len(sequence):
            raise IndexError(f"position {index} is out of range for a sequence of {len(sequence)} tensors")
        return sequence[index]
