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


class SequenceConstruct(_Attributes):
    """The inputs, in order, as one sequence."""

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tensors


class SequenceLength(_Attributes):
    def forward(self, sequence: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.tensor(len(sequence), dtype=torch.int64)


def _index(position: int, length: int, inclusive_end: bool) -> int:
    """A position in [-n, n - 1] (or up to n, to insert at the back) as an index from the front; else IndexError."""
    if not -length <= position < length + inclusive_end:
        raise IndexError(f"position {position} is out of range for a sequence of {length} tensors")
    return position + length if position < 0 else position


class SequenceInsert(_Attributes):
    """``tensor`` inserted before ``position`` (baked or read at run time; absent: at the back)."""

    _shown = ("position",)

    def __init__(self, position: int | None = None):
        super().__init__()
        self.position = position

    def forward(self, sequence: Sequence[torch.Tensor], tensor: torch.Tensor,
                position: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        index = scalar(self.position, position)
        index = len(sequence) if index is None else _index(index, len(sequence), inclusive_end=True)
        return (*sequence[:index], tensor, *sequence[index:])


class SequenceErase(_Attributes):
    """The sequence without the tensor at ``position`` (baked or read at run time; absent: the last)."""

    _shown = ("position",)

    def __init__(self, position: int | None = None):
        super().__init__()
        self.position = position

    def forward(self, sequence: Sequence[torch.Tensor],
                position: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        index = scalar(self.position, position)
        index = _index(-1 if index is None else index, len(sequence), inclusive_end=False)
        return (*sequence[:index], *sequence[index + 1:])


class ConcatFromSequence(_Attributes):
    """The tensors concatenated along ``axis``, or stacked along a new ``axis`` when ``new_axis`` is 1."""

    _shown = ("axis", "new_axis")

    def __init__(self, axis: int, new_axis: int = 0):
        super().__init__()
        self.axis, self.new_axis = axis, new_axis

    def forward(self, sequence: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.stack(sequence, self.axis) if self.new_axis else torch.cat(sequence, self.axis)


class SequenceEmpty(_Attributes):
    """A sequence with no tensors (its ``dtype`` only types the ONNX graph)."""

    def forward(self) -> tuple[torch.Tensor, ...]:
        return ()


# An ONNX optional is, at run time, None when empty and else the tensor or sequence it holds.

class Optional(_Attributes):
    """The input as an optional (the value itself), or an empty one (None) without an input."""

    def forward(self, value: torch.Tensor | Sequence[torch.Tensor] | None = None):
        return value


class OptionalHasElement(_Attributes):
    """A bool scalar: whether the optional (or the plain tensor or sequence) holds a value; absent input: false."""

    def forward(self, value: torch.Tensor | Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        return torch.tensor(value is not None)


class OptionalGetElement(_Attributes):
    """The value an optional holds (a plain tensor or sequence passes through); an empty one raises."""

    def forward(self, value: torch.Tensor | Sequence[torch.Tensor] | None):
        if value is None:
            raise ValueError("OptionalGetElement of an empty optional")
        return value
