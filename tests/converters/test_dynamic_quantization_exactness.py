"""Float values upstream of dynamic quantizers, as onnxruntime computes them.

A dynamic quantizer (DynamicQuantizeLinear, DynamicQuantizeLSTM's input and state, DynamicQuantizeMatMul) rounds a
float value to a uint8 step over a range it computes from the value itself: a float one ulp away from onnxruntime's
can land one step away and, in a recurrence, carry to every later step. So in a model that quantizes dynamically,
Tanh and Sigmoid compute as MLAS does (bit for bit); LayerNormalization, Softmax and float MatMul/Gemm/Conv agree
only to float32 rounding (documented in README's "Quantized models"), and ``check`` names a step that flips there.

The models in tests/models/quantized/shipped_like (made by its make_models.py) are built like int8 models public
packages ship: float layers upstream of dynamic quantizers, int8 LSTMs, run here over 50 and 64 steps at six seeds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.checking import compare, random_inputs, run_torch
from onnx2torch_rnn.modules.quantized import onnxruntime_sigmoid, onnxruntime_tanh
from tests.helpers import TensorProto, helper, make_model

SHIPPED_LIKE = Path(__file__).resolve().parents[1] / "models" / "quantized" / "shipped_like"
MODELS = ["attention_tagger_dyn", "voice_filter_dyn"]
NOT_BIT_EXACT = {"LayerNormalization", "Softmax", "MatMul"}  # float ops documented to agree to rounding only


def _sessions(path: Path) -> list:
    sessions = []
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.graph_optimization_level = 1, level
        sessions.append(ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))
    return sessions


@pytest.mark.parametrize("name", MODELS)
def test_shipped_like_models_are_exact_or_flip_at_a_documented_op(name):
    """Every output bit for bit onnxruntime's (graph optimisations off and on), or else the first value that differs
    comes from a float op documented as not bit-exact, and with check's tolerance a differing output is reported as
    a quantization step flipped downstream of that op."""
    path = SHIPPED_LIKE / f"{name}.onnx"
    module = onnx2torch_rnn.convert(path)
    sessions, exact = _sessions(path), 0
    for seed in range(6):
        for steps in (50, 64):
            feeds = random_inputs(path, seed, {"batch": 3, "time": steps})
            got = run_torch(module, path, feeds)
            if all(np.array_equal(g, w) for session in sessions for g, w in zip(got, session.run(None, feeds),
                                                                                   strict=True)):
                exact += 1
                continue
            divergence = compare(path, feeds, module=module, rtol=0, atol=0, bisect=True).divergence
            assert divergence.op_type in NOT_BIT_EXACT, str(divergence)
            report = compare(path, feeds, module=module)
            if not report.ok:
                assert report.divergence.flipped_by.split()[0] in NOT_BIT_EXACT, str(report.divergence)
    assert exact >= 9  # of 12: the documented ops rarely change a last bit that matters


def _model(op: str, quantized: bool = True) -> bytes:
    """x -> op -> y, and y's DynamicQuantizeLinear when ``quantized``."""
    nodes = [helper.make_node(op, ["x"], ["y"])]
    outputs = [("y", TensorProto.FLOAT, [None])]
    if quantized:
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["y"], ["q", "s", "z"]))
        outputs += [("q", TensorProto.UINT8, [None]), ("s", TensorProto.FLOAT, []), ("z", TensorProto.UINT8, [])]
    return make_model(nodes, [("x", TensorProto.FLOAT, [None])], outputs).SerializeToString()


@pytest.mark.parametrize("op", ["Tanh", "Sigmoid"])
def test_activations_upstream_of_a_dynamic_quantizer_are_onnxruntimes(op):
    """Bit for bit on values where torch's functions differ from MLAS's in about half the elements (zeros, the clamp
    bounds and values past them included); a float model keeps torch's function."""
    x = (np.random.default_rng(0).standard_normal(100_000) * 4).astype(np.float32)
    x[:8] = [1e30, -1e30, 30.0, 0.0, -0.0, 9.0, 18.0, -30.0]
    model = _model(op)
    module = onnx2torch_rnn.convert(model)
    got = run_torch(module, model, {"x": x})
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    fast = {"Tanh": torch.tanh, "Sigmoid": torch.sigmoid}[op]
    assert (fast(torch.from_numpy(x[8:])).numpy() != want[0][8:]).mean() > 0.2  # the test can fail
    plain = onnx2torch_rnn.convert(_model(op, quantized=False))
    assert [m.fn for m in plain.modules() if hasattr(m, "fn")] == [fast]
    exact = {"Tanh": onnxruntime_tanh, "Sigmoid": onnxruntime_sigmoid}[op]
    assert [m.fn for m in module.modules() if hasattr(m, "fn")][:1] == [exact]


@pytest.mark.parametrize("op", ["Tanh", "Sigmoid"])
def test_compiled_activations_upstream_of_a_dynamic_quantizer_are_one_op(op):
    """torch.compile (fullgraph) calls MLAS's activation as one op (mlas_activation: its rational approximation
    traced step by step was a dozen ops over the tensor), with eager's numbers bit for bit, quantized outputs too."""
    x = (np.random.default_rng(1).standard_normal(4096) * 4).astype(np.float32)
    x[:4] = [1e30, -0.0, 9.0, -30.0]
    module = onnx2torch_rnn.convert(_model(op))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(module, backend=backend, fullgraph=True)(torch.from_numpy(x))
        eager = module(torch.from_numpy(x))
    targets = [n.target for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.onnx2torch_rnn.mlas_activation.default in targets
    assert torch.addcmul not in targets  # the approximation's Horner steps are not in the graph
    for c, e in zip(compiled, eager, strict=True):
        assert torch.equal(c, e)


def test_check_names_a_flipped_quantization_step():
    """A float input one ulp above onnxruntime's, on a value whose quotient by the scale is a half: the uint8 output
    rounds to the other step, and the bisect says so, naming the op whose output is off in its last bit."""
    scale = np.float32(1) / np.float32(255)
    step = next(k for k in range(2, 250, 2)
                if np.float32(np.float32((k + 0.5) * scale) / scale) == k + 0.5
                and np.float32(np.nextafter(np.float32((k + 0.5) * scale), np.float32(2)) / scale) > k + 0.5)
    x = np.array([1.0, (step + 0.5) * scale], np.float32)
    model = _model("Relu")
    module = onnx2torch_rnn.convert(model)
    relu = next(m for m in module.modules() if getattr(m, "fn", None) is not None)
    relu.fn = lambda v: torch.where(v < 1, torch.nextafter(torch.relu(v), torch.tensor(2.0)), torch.relu(v))
    report = compare(model, {"x": x}, module=module)
    assert not report.ok
    assert report.divergence.op_type == "DynamicQuantizeLinear"
    assert report.divergence.flipped_by.startswith("Relu node")
    assert "quantization step flipped at node" in str(report.divergence)
