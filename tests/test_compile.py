"""torch.compile(fullgraph=True) of converted recurrent models: one graph, matches eager, few recompiles.

The recurrence is one custom op (onnx2torch_rnn/recurrent/op.py), so Dynamo never graph-breaks on it and
dynamic batch / sequence length need at most one recompile. By default the tests compile with the ``aot_eager``
backend (Dynamo + AOTAutograd with the op's fake and autograd implementations: everything that is ours) for the
SUBSET of cases; the full matrix and more shapes run with ``-m slow``. One test runs the default inductor backend
on the bundled example.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import helper
from torch._dynamo.utils import counters

import onnx2torch_rnn
from onnx2torch_rnn import threads
from onnx2torch_rnn.checking import random_inputs
from tests.helpers import run_onnxruntime, weighted_model
from tests.recurrent_models import CountingBackend, assert_same, convert, inputs, matrix, states

pytestmark = pytest.mark.compile

EXAMPLE = Path(__file__).parent.parent / "examples" / "bilstm_tagger.onnx"
# two batch sizes x two sequence lengths; the second call changes both, so automatic dynamic shapes recompile once
SHAPES = [(2, 5), (3, 7), (2, 7), (3, 5)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend_name", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("op, direction, path, lens", matrix(pytest.mark.slow))
def test_compile_matches_eager(op, direction, path, lens, backend_name):
    gm = convert(op, direction, path, lens)
    backend = CountingBackend(backend_name)
    compiled = torch.compile(gm, fullgraph=True, backend=backend)
    for batch, steps in SHAPES:
        args = inputs(batch, steps, lens, seed=batch * steps)
        assert_same(compiled(*args), gm(*args))
    assert backend.graphs <= 2, f"{backend.graphs - 1} recompiles"


def test_dynamic_true_compiles_once():
    gm = convert("LSTM", "bidirectional", "exact", lens=True)
    backend = CountingBackend()
    compiled = torch.compile(gm, fullgraph=True, dynamic=True, backend=backend)
    for batch, steps in [*SHAPES, (4, 11)]:
        args = inputs(batch, steps, True, seed=steps)
        assert_same(compiled(*args), gm(*args))
    assert backend.graphs == 1


def test_compiled_backward_matches_eager():
    """The op's autograd formula (recompute + vjp in a second op) against eager autograd."""
    gm = convert("GRU", "bidirectional", "fast", lens=True)
    compiled = torch.compile(gm, fullgraph=True, backend=CountingBackend())
    args = inputs(3, 6, True)
    x = args[0].requires_grad_()
    grads = []
    for model in (compiled, gm):
        y, y_h = model(x, *args[1:])
        grads.append(torch.autograd.grad((y.square().sum() + y_h.sum()), [x, *gm.parameters()]))
    assert_same(grads[0], grads[1])


def test_compiled_backward_with_initial_states_and_layout():
    """Gradients reach initial_h / initial_c too; layout=1 (batch-major) through the op's fake shapes."""
    gm = convert("LSTM", "bidirectional", "exact", lens=True, initial=True, layout=1)
    compiled = torch.compile(gm, fullgraph=True, backend=CountingBackend())
    for batch, steps in [(3, 6), (4, 2)]:
        x, lens = inputs(batch, steps, True, layout=1)
        h0, c0 = states("LSTM", "bidirectional", batch, layout=1)
        leaves = [t.requires_grad_() for t in (x, h0, c0)]
        grads = []
        for model in (compiled, gm):
            outputs = model(x, lens, h0, c0)
            loss = sum(o.square().sum() for o in outputs)
            grads.append(torch.autograd.grad(loss, [*leaves, *gm.parameters()]))
        assert_same(grads[0], grads[1])


def test_sequence_lens_range_is_checked_inside_the_graph():
    """The run-time range check lives inside the op: no graph break, and a bad length still raises. (Compiled as a
    module, fx's GraphModule.__call__ error handler is itself traced when an error passes through it, so
    fullgraph=True reports that as Unsupported with our ValueError as its context; compiling gm.forward does not.)"""
    gm = convert("RNN", "forward", "fast", lens=True)
    x, _ = inputs(2, 4, True)
    for target in (gm, gm.forward):
        compiled = torch.compile(target, fullgraph=True, backend=CountingBackend())
        compiled(x, torch.tensor([4, 1], dtype=torch.int32))
        with pytest.raises(Exception) as raised:  # the error or its context: checked below
            compiled(x, torch.tensor([5, 1], dtype=torch.int32))
        error = raised.value if isinstance(raised.value, ValueError) else raised.value.__context__
        assert isinstance(error, ValueError) and "sequence_lens values must lie in [0, 4]" in str(error)


def test_inductor_compiles_the_bundled_example():
    """The torch.onnx export of an Embedding -> 2-layer BiLSTM -> Linear tagger (shape arithmetic included) with the
    default inductor backend: one graph, one recompile at most over batch and time changes."""
    gm = onnx2torch_rnn.convert(EXAMPLE)
    compiled = torch.compile(gm, fullgraph=True)
    before = counters["stats"]["unique_graphs"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for batch, steps in SHAPES:
            tokens = torch.randint(0, 50, (batch, steps), generator=generator)
            assert_same(compiled(tokens), gm(tokens))
    assert counters["stats"]["unique_graphs"] - before <= 2


def test_compile_after_export_deepcopy_and_to():
    """The compiled path reads the nn.LSTM's weights without the module (recurrent.module.FastWeights): that
    view must survive torch.export's attribute snapshot, deepcopy and .to(dtype)."""
    gm = convert("LSTM", "bidirectional", "fast", lens=True)
    args = inputs(3, 6, True)
    torch.export.export(gm, args)
    for model in (gm, copy.deepcopy(gm), copy.deepcopy(gm).double()):
        (recurrent,) = [m for m in model.modules() if hasattr(m, "rnn")]
        flat = [w for layer in recurrent.rnn.all_weights for w in layer]
        assert all(a is b for a, b in zip(recurrent._fast_weights(), flat, strict=True))
        torch._dynamo.reset()
        x = args[0].to(next(model.parameters()).dtype)
        assert_same(torch.compile(model, fullgraph=True, backend="aot_eager")(x, args[1]), model(x, args[1]))


def test_compile_for_inference_matches_onnxruntime():
    """The documented fastest inference (inductor, the module frozen) on a convolution and an LSTM: one compiled frame,
    which runs under the guard-skipping stance its docstring recommends to servers (with thread hooks as frames of
    their own, as the library had them, that stance recompiled and raised)."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((8, 2, 3)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32),
               "W": rng.standard_normal((1, 16, 8)).astype(np.float32),
               "R": rng.standard_normal((1, 16, 4)).astype(np.float32), "perm": np.array([2, 0, 1], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[2, 0, 1]),
             helper.make_node("LSTM", ["t", "W", "R"], ["y", "h"], hidden_size=4)]
    model, _ = weighted_model(nodes, [("x", np.float32, (1, 2, "time"))], weights, 14, outputs=("y", "h"))
    feeds = random_inputs(model, dims={"time": 300})
    module = onnx2torch_rnn.convert(model)
    compiled = onnx2torch_rnn.compile_for_inference(module)
    assert module.meta[threads.ONE_THREAD]  # executor.py's wrapper keeps its ops on one thread
    x = torch.from_numpy(feeds["x"])
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        for got, want in zip(compiled(x), run_onnxruntime(model, feeds), strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
        assert counters["frames"]["total"] == 1
        compiled(x)
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            for got, want in zip(compiled(x), run_onnxruntime(model, feeds), strict=True):
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
        longer = random_inputs(model, seed=1, dims={"time": 410})
        for got, want in zip(compiled(torch.from_numpy(longer["x"])), run_onnxruntime(model, longer), strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)  # the input's guards stay
    # another model compiled in the same process runs its own graph (each compiled call has its own code: with the
    # module's guards dropped, a shared one ran the first module's code, here KeyError 'LSTM_2')
    gru_weights = {**weights, "W": weights["W"][:, :12], "R": weights["R"][:, :12]}
    gru, _ = weighted_model([*nodes[:2], helper.make_node("GRU", ["t", "W", "R"], ["y", "h"], hidden_size=4)],
                            [("x", np.float32, (1, 2, "time"))], gru_weights, 14, outputs=("y", "h"))
    other = onnx2torch_rnn.compile_for_inference(onnx2torch_rnn.convert(gru))
    with torch.no_grad():
        for got, want in zip(other(x), run_onnxruntime(gru, feeds), strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
