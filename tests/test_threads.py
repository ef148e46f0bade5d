"""A small converted model runs torch's own ops on one thread at inference and gives the recurrent kernel the
caller's thread count (onnx2torch_rnn/threads.py); everything else keeps its threads."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn import threads
from onnx2torch_rnn.recurrent import kernel, op

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "bilstm_tagger.onnx"

pytestmark = pytest.mark.skipif(threads._runtime() is None, reason="torch's parallel backend is not OpenMP")


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def counts_seen(module, tokens, monkeypatch) -> dict[str, int]:
    """torch.get_num_threads() as the tagger's classifier (glue) and its recurrent stack's kernel call see it."""
    seen = {}
    module.classify_MatMul.register_forward_hook(lambda *_: seen.__setitem__("glue", torch.get_num_threads()))
    stack = op._STACK

    def spy(*args):
        seen["kernel"] = torch.get_num_threads()
        return stack(*args)

    monkeypatch.setattr(op, "_STACK", spy)
    module(tokens)
    return seen


def test_glue_runs_on_one_thread_and_the_kernel_on_the_callers(two_threads, monkeypatch):
    if not kernel.load():
        pytest.skip("no native kernel here")
    module = onnx2torch_rnn.convert(EXAMPLE)
    tokens = torch.randint(0, 50, (8, 64))
    with torch.no_grad():
        assert counts_seen(module, tokens, monkeypatch) == {"glue": 1, "kernel": 2}
        got = module(tokens)
    assert torch.get_num_threads() == 2
    expected = ort.InferenceSession(str(EXAMPLE)).run(None, {"tokens": tokens.numpy()})[0]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_training_and_large_inputs_keep_the_threads(two_threads, monkeypatch):
    """With grad (training) the glue keeps torch's threads; so does a call with more input elements than the
    limit (the kernel does not run with grad: only the glue is looked at)."""
    module = onnx2torch_rnn.convert(EXAMPLE)
    seen = counts_seen(module, torch.randint(0, 50, (2, 8)), monkeypatch)
    assert seen["glue"] == 2
    monkeypatch.setattr(threads, "INPUT_ELEMENTS", 15)
    with torch.no_grad():
        assert counts_seen(module, torch.randint(0, 50, (2, 8)), monkeypatch)["glue"] == 2


def test_an_error_in_the_forward_restores_the_count(two_threads):
    module = onnx2torch_rnn.convert(EXAMPLE)
    with torch.no_grad(), pytest.raises(IndexError):
        module(torch.full((2, 8), 1000))  # out of the embedding's range
    assert torch.get_num_threads() == 2


def test_another_thread_keeps_its_count(two_threads):
    """The counts are the calling thread's: a thread that runs beside a forward keeps its own."""
    module = onnx2torch_rnn.convert(EXAMPLE)
    tokens = torch.randint(0, 50, (8, 64))
    seen = []
    stop = threading.Event()

    def watch():
        torch.set_num_threads(2)
        while not stop.is_set():
            seen.append(torch.get_num_threads())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with torch.no_grad():
            for _ in range(50):
                module(tokens)
    finally:
        stop.set()
        watcher.join()
    assert set(seen) == {2}


def test_a_model_with_large_glue_keeps_the_threads():
    """Weights outside recurrent nodes past GLUE_WEIGHTS (a CNN front end, say): not marked."""
    def model(size):
        weight = numpy_helper.from_array(np.ones((4, size), np.float32), "w")
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, size])], [weight])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    assert onnx2torch_rnn.convert(model(8)).meta[threads.ONE_THREAD]
    assert not onnx2torch_rnn.convert(model(threads.GLUE_WEIGHTS // 4 + 1)).meta[threads.ONE_THREAD]


def test_a_model_of_recurrent_nodes_alone_is_not_marked():
    """Nothing to keep on one thread: the switch would only cost the call a few microseconds."""
    hidden = 4
    weights = [numpy_helper.from_array(np.ones((1, 4 * hidden, n), np.float32), name)
               for name, n in (("W", 3), ("R", hidden))]
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y", "y_h"], hidden_size=hidden)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 2, hidden]),
                               helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [1, 2, hidden])], weights)
    module = onnx2torch_rnn.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert not module.meta[threads.ONE_THREAD]


def test_two_python_threads_run_converted_models_at_once(two_threads):
    """Two threads of the caller's own, each running a converted model over and over at 2 torch threads (the glue
    on one, the kernel's workers shared turn by turn), get onnxruntime's numbers."""
    module = onnx2torch_rnn.convert(EXAMPLE)
    inputs = [torch.randint(0, 50, (8, 64), generator=torch.Generator().manual_seed(k)) for k in (0, 1)]
    session = ort.InferenceSession(str(EXAMPLE))
    expected = [session.run(None, {"tokens": tokens.numpy()})[0] for tokens in inputs]
    results: dict[int, list] = {0: [], 1: []}

    def work(k):
        torch.set_num_threads(2)
        with torch.no_grad():
            results[k] += [module(inputs[k]).numpy() for _ in range(30)]

    workers = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for k in (0, 1):
        assert len(results[k]) == 30
        for got in results[k]:
            np.testing.assert_allclose(got, expected[k], rtol=1e-4, atol=1e-5)
