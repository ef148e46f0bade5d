"""Single-node LSTM/GRU/RNN models with a dynamic batch and sequence length, shared by the compile, export,
training and round-trip tests (tests/test_compile.py, test_export.py, test_training.py, test_roundtrip.py).

``path="fast"`` builds a node that converts to nn.LSTM/GRU/RNN; ``path="exact"`` one that needs the own cell loop
(LSTM peepholes, GRU linear_before_reset=0, RNN LeakyRelu). With ``lens`` sequence_lens is a graph input.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import torch
from onnx import helper

import onnx2torch_rnn
from tests.helpers import make_model

OPS = ("LSTM", "GRU", "RNN")
DIRECTIONS = ("forward", "reverse", "bidirectional")
PATHS = ("fast", "exact")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
INPUT_SIZE, HIDDEN = 3, 4
# The full matrix (op, direction, path, lens) and a small subset where every value of every factor appears, each
# op with both paths and both lens settings: what runs by default (the rest is marked slow).
MATRIX = list(itertools.product(OPS, DIRECTIONS, PATHS, (False, True)))
SUBSET = [("LSTM", "bidirectional", "fast", True), ("LSTM", "reverse", "exact", False),
          ("GRU", "forward", "fast", False), ("GRU", "bidirectional", "exact", True),
          ("RNN", "reverse", "fast", True), ("RNN", "forward", "exact", False)]


def matrix(slow_mark) -> list:
    """MATRIX as pytest params: the SUBSET plain, the rest with ``slow_mark``."""
    import pytest

    return [pytest.param(*case, id="-".join(map(str, case)), marks=() if case in SUBSET else slow_mark)
            for case in MATRIX]


def recurrent_model(op: str, direction: str = "forward", path: str = "fast", lens: bool = False,
                    seed: int = 0, opset: int = 14, initial: bool = False, layout: int = 0,
                    static_lens: list[int] | None = None) -> onnx.ModelProto:
    """X [T, N, 3] (and sequence_lens [N] int32 when ``lens``; initial_h (, initial_c) [D, N, 4] when ``initial``)
    -> Y, Y_h (, Y_c); weights are initializers. ``layout=1``: batch-major X, states and outputs. ``static_lens``:
    sequence_lens as an initializer."""
    rng = np.random.default_rng(seed)
    directions, gates = (2 if direction == "bidirectional" else 1), GATES[op]

    def rand(*shape):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)

    weights = {"W": rand(directions, gates * HIDDEN, INPUT_SIZE), "R": rand(directions, gates * HIDDEN, HIDDEN),
               "B": rand(directions, 2 * gates * HIDDEN)}
    attributes = {"hidden_size": HIDDEN, "direction": direction}
    if op == "LSTM" and path == "exact":
        weights["P"] = rand(directions, 3 * HIDDEN)
    if op == "GRU":
        attributes["linear_before_reset"] = int(path == "fast")
    if op == "RNN" and path == "exact":
        attributes["activations"] = ["LeakyRelu"] * directions
        attributes["activation_alpha"] = [0.1] * directions
    if layout:
        attributes["layout"] = layout
    if static_lens is not None:
        weights["sequence_lens"], lens = np.array(static_lens, np.int32), True
    states = ["initial_h", "initial_c"][: 2 if op == "LSTM" else 1] if initial else []
    h0, c0 = [*states, "", ""][:2]
    slots = ["X", "W", "R", "B", "sequence_lens" if lens else "", h0, c0, "P" if "P" in weights else ""]
    while not slots[-1]:
        slots.pop()
    outputs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    x_shape, state_shape = ["T", "N", INPUT_SIZE], [directions, "N", HIDDEN]
    if layout:  # the first two axes swapped
        x_shape, state_shape = [x_shape[1], x_shape[0], *x_shape[2:]], [state_shape[1], state_shape[0], HIDDEN]
    inputs = [("X", np.float32, x_shape)] + ([("sequence_lens", np.int32, ["N"])] if lens and static_lens is None
                                             else [])
    inputs += [(name, np.float32, state_shape) for name in states]
    return make_model([helper.make_node(op, slots, outputs, **attributes)], inputs, outputs, weights, opset=opset)


def convert(op: str, direction: str = "forward", path: str = "fast", lens: bool = False, seed: int = 0, **options):
    """The converted model, checked to take the path asked for (options: ``initial``, ``layout``)."""
    gm = onnx2torch_rnn.convert(recurrent_model(op, direction, path, lens, seed, **options))
    torch_modules = [m for m in gm.modules() if isinstance(m, (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN))]
    assert len(torch_modules) == (path == "fast"), gm
    return gm


def inputs(batch: int, steps: int, lens: bool, seed: int = 0, layout: int = 0) -> tuple[torch.Tensor, ...]:
    """X and, with ``lens``, lengths in [0, steps] with one full row (0 included where the batch allows)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, steps, INPUT_SIZE) if layout else (steps, batch, INPUT_SIZE), generator=generator)
    if not lens:
        return (x,)
    lengths = torch.randint(0, steps + 1, (batch,), generator=generator)
    lengths[0], lengths[-1] = steps, 0 if batch > 2 else lengths[-1]
    return x, lengths.to(torch.int32)


def states(op: str, direction: str, batch: int, layout: int = 0, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """initial_h (and initial_c for LSTM) for a model made with ``initial=True``."""
    generator = torch.Generator().manual_seed(seed + 1)
    shape = (2 if direction == "bidirectional" else 1, batch, HIDDEN)
    shape = (shape[1], shape[0], HIDDEN) if layout else shape
    return tuple(torch.randn(shape, generator=generator) for _ in range(2 if op == "LSTM" else 1))


def assert_same(actual, expected, rtol=1e-4, atol=1e-5) -> None:
    """Every output equal (shape, dtype, values) within float32 tolerance."""
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)


class CountingBackend:
    """A torch.compile backend that counts the graphs it compiles (first compile + recompiles)."""

    def __init__(self, name: str = "aot_eager"):
        self.backend = torch._dynamo.lookup_backend(name)
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.backend(gm, example_inputs)
