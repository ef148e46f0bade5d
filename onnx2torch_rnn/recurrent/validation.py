"""What the inputs of a recurrent node must look like, in one place.

The converter checks the shapes and dtypes it knows statically (and refuses the model), the Python runtime checks
the tensors a caller passes; the native kernel (kernel/recurrent.cpp: ``check_shape``) words its errors the same
way. Sizes (ONNX's names): D num_directions, G gates (LSTM 4, GRU 3, RNN 1), H hidden_size, I input_size,
N batch_size, T seq_length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Dim = int | str | None  # a size: known, symbolic (a dim name, at conversion) or unknown
INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")  # ONNX input order
LENGTH_DTYPES = (torch.int32, torch.int64)  # at run time; the ONNX type is int32 only (checked at conversion)


class InvalidInput(ValueError):
    """An input of a recurrent node (``input``, an entry of INPUTS) does not meet ``requirement``."""

    def __init__(self, input_name: str, requirement: str):
        self.input, self.requirement = input_name, requirement
        super().__init__(f"{input_name} {requirement}")


def _text(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _times(k: int, size: Dim) -> Dim:
    return k * size if isinstance(size, int) else None


def check_shapes(gates: int, directions: int, layout: int, hidden: Dim,
                 shapes: Mapping[str, Sequence[Dim] | None]) -> None:
    """Refuse the first input (in ONNX order) whose shape contradicts the others'; absent inputs (None) and unknown
    sizes pass. ``hidden``: the hidden_size attribute, else R's last dim. I comes from W, N and T from X: a
    wrong X is blamed on X, not on the weights."""
    x, w = shapes.get("X"), shapes.get("W")
    if x is not None and len(x) != 3:
        raise InvalidInput("X", f"must have 3 dimensions, got shape {_text(x)}")
    if hidden is None and shapes.get("R"):
        hidden = shapes["R"][-1]
    steps, batch = (None, None) if x is None else (x[1], x[0]) if layout else (x[0], x[1])
    size = w[-1] if w else None
    state = (batch, directions, hidden) if layout else (directions, batch, hidden)
    expected = {"W": (directions, _times(gates, hidden), size), "R": (directions, _times(gates, hidden), hidden),
                "B": (directions, _times(2 * gates, hidden)), "P": (directions, _times(3, hidden)),
                "X": (batch, steps, size) if layout else (steps, batch, size),
                "initial_h": state, "initial_c": state, "sequence_lens": (batch,)}
    for name in ("W", "R", "B", "P", "X", "initial_h", "initial_c", "sequence_lens"):
        check_shape(name, expected[name], shapes.get(name))


def check_shape(name: str, expected: Sequence[Dim], actual: Sequence[Dim] | None) -> None:
    """Only sizes known on both sides are compared (at conversion a dim may be symbolic or unknown)."""
    if actual is None:
        return
    if len(actual) != len(expected) or any(isinstance(e, int) and isinstance(a, int) and e != a
                                           for e, a in zip(expected, actual, strict=False)):
        raise InvalidInput(name, f"must have shape {_text(expected)}, got {_text(actual)}")


def check_lengths_dtype(dtype: torch.dtype | None, allowed: Sequence[torch.dtype] = LENGTH_DTYPES) -> None:
    if dtype is not None and dtype not in allowed:
        names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
        raise InvalidInput("sequence_lens", f"must be {names}, got {str(dtype).removeprefix('torch.')}")
