"""torch.export of converted models with dynamic batch and sequence length, run at other shapes.

Also the shape arithmetic exporters emit around recurrent layers (Shape -> Gather -> Unsqueeze -> Concat ->
Reshape / Expand / ConstantOfShape, Range, TopK): the builder rebuilds it as fx integer nodes on the inputs' sizes
(shape_arithmetic.py), so it compiles in one graph and exports with dynamic shapes. Each pattern is also
checked against onnxruntime.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from torch.export import Dim

import onnx2torch_rnn
from tests.helpers import check
from tests.recurrent_models import CountingBackend, assert_same, convert, inputs, matrix, states
from tests.shape_patterns import PATTERNS, pattern_model, x_of

pytestmark = pytest.mark.compile

EXAMPLE = Path(__file__).parent.parent / "examples" / "bilstm_tagger.onnx"


def dynamic(lens: bool) -> dict:
    """Time and batch of X dynamic (and the batch of sequence_lens, the same symbol)."""
    steps, batch = Dim("steps"), Dim("batch")
    return {"X": {0: steps, 1: batch}, **({"sequence_lens": {0: batch}} if lens else {})}


@pytest.mark.parametrize("op, direction, path, lens", matrix(pytest.mark.slow))
def test_export_with_dynamic_shapes(op, direction, path, lens):
    gm = convert(op, direction, path, lens)
    program = torch.export.export(gm, inputs(2, 5, lens), dynamic_shapes=dynamic(lens))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    ops = torch.ops.onnx2torch_rnn  # parameters require grad here: the differentiable variant of the op
    assert targets.count(ops.recurrent_differentiable.default) == 1  # the whole recurrence: one node
    assert targets.count(ops.recurrent.default) == 0
    exported = program.module()
    for batch, steps in [(3, 7), (4, 2), (2, 5)]:
        args = inputs(batch, steps, lens, seed=steps)
        assert_same(exported(*args), gm(*args))


def test_export_layout_1_with_initial_states():
    gm = convert("GRU", "bidirectional", "fast", lens=True, initial=True, layout=1)
    batch, steps = Dim("batch"), Dim("steps")
    shapes = {"X": {0: batch, 1: steps}, "sequence_lens": {0: batch}, "initial_h": {0: batch}}
    program = torch.export.export(gm, (*inputs(2, 5, True, layout=1), *states("GRU", "bidirectional", 2, 1)),
                                  dynamic_shapes=shapes)
    for n, t in [(3, 7), (4, 2)]:
        args = (*inputs(n, t, True, seed=t, layout=1), *states("GRU", "bidirectional", n, 1, seed=t))
        assert_same(program.module()(*args), gm(*args))


@pytest.mark.parametrize("path", ["fast", "exact"])
def test_constant_sequence_lens(path):
    """sequence_lens baked in at conversion travel as a constant tensor (the module's static_lens): the batch is fixed,
    time dynamic."""
    gm = convert("LSTM", "reverse", path, static_lens=[4, 0, 2])
    program = torch.export.export(gm, inputs(3, 5, False), dynamic_shapes={"X": {0: Dim("steps", min=4)}})
    torch._dynamo.reset()
    compiled = torch.compile(gm, fullgraph=True, backend="aot_eager")
    for steps in (4, 9):
        args = inputs(3, steps, False, seed=steps)
        assert_same(program.module()(*args), gm(*args))
        assert_same(compiled(*args), gm(*args))


def test_strict_export():
    """Strict mode traces with Dynamo (no graph break allowed), like torch.compile."""
    gm = convert("LSTM", "reverse", "fast", lens=True)
    program = torch.export.export(gm, inputs(2, 5, True), dynamic_shapes=dynamic(True), strict=True)
    args = inputs(3, 8, True, seed=1)
    assert_same(program.module()(*args), gm(*args))


def test_bundled_example_exports_and_reloads():
    """examples/bilstm_tagger.onnx: dynamic batch and time, saved and loaded (the op carries its whole static
    configuration as arguments, so a loaded program needs only `import onnx2torch_rnn`)."""
    gm = onnx2torch_rnn.convert(EXAMPLE)
    tokens = torch.randint(0, 50, (2, 5))
    program = torch.export.export(gm, (tokens,), dynamic_shapes={"tokens": {0: Dim("batch"), 1: Dim("time")}})
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    for shape in [(1, 1), (3, 9), (8, 2)]:
        tokens = torch.randint(0, 50, shape)
        assert_same(loaded(tokens), gm(tokens))


# ---- shape arithmetic computed at run time -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["compile", "export"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_shape_arithmetic(pattern, mode):
    model = pattern_model(pattern)
    # as written: recognition would drop the zero state (its shape computation is what this test compiles)
    gm = check(model, {"x": x_of(3, 4).numpy()}, fuse=False)  # eager against onnxruntime
    assert any(n.op == "call_method" and n.target == "size" for n in gm.graph.nodes)  # sizes as fx ints
    backend = CountingBackend()
    if mode == "compile":
        torch._dynamo.reset()
        run = torch.compile(gm, fullgraph=True, backend=backend)
    else:
        run = torch.export.export(gm, (x_of(2, 5),), dynamic_shapes={"x": {0: Dim("n"), 1: Dim("m")}}).module()
    for batch, steps in [(2, 5), (4, 3), (5, 8), (2, 7)]:
        x = x_of(batch, steps)
        assert_same(run(x), gm(x))
    assert backend.graphs <= 2  # sizes stay symbolic: one recompile when they first change, none after
