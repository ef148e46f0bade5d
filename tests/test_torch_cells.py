"""PyTorch's nn.LSTMCell / nn.GRUCell / nn.RNNCell as torch.onnx writes them (tests/models/torch_cells): Gemm, Split,
activations and Mul / Add per call, recognised by ``unrolled_cells`` (passes/unrolled.py).

A Python loop over time (x[t] or x[:, t], the hs stacked) becomes one LoopedRecurrent over x's time axis, a streaming
step (x [N, I], the states passed in and returned) one LoopedRecurrent of one step. Each matches onnxruntime at batch 1
and 3 (a streaming model also over a few calls, each call's states the previous call's outputs), trains like the
graph as written and compiles in one graph. Near-misses (an op that is no cell's in the step, a state or a weight read
elsewhere, a step with other weights) stay as written and still match.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.recurrent import LoopedRecurrent
from tests.exporters.common import MODELS, compare_with_onnxruntime, read_manifest
from tests.helpers import assert_fused_trains_like_literal

FOLDER = MODELS / "torch_cells"
MANIFEST = read_manifest(FOLDER)
ENTRIES = {e["file"]: e for e in MANIFEST["models"]}
TIME_MAJOR = sorted(f for f, e in ENTRIES.items() if "_loop" in e["case"] and "_bf" not in e["case"])


def looped(module) -> list[LoopedRecurrent]:
    return [m for m in module.modules() if isinstance(m, LoopedRecurrent)]


def literal_ops(module) -> list[str]:
    """The ONNX op types of the converted module's nodes that are not fused."""
    return [n.meta["onnx"]["op_type"] for n in module.graph.nodes if "onnx" in n.meta and "pattern" not in n.meta[
        "onnx"]]


def input_sets(file: str) -> list[dict[str, np.ndarray]]:
    """Two random input sets at batch 1 and two at batch 3."""
    rng = np.random.default_rng(len(file))
    return [{name: rng.standard_normal([batch if d == "batch" else d for d in dims]).astype(np.float32)
             for name, dims in ENTRIES[file]["inputs"].items()} for batch in (1, 1, 3, 3)]


def cell_kind(file: str) -> tuple[str, str]:
    """(ONNX op type, activation) of the file's cell."""
    case = ENTRIES[file]["case"]
    kind = case.split("_")[0].upper()
    return kind, "Relu" if "relu" in case else "Tanh"


def check(file: str, model: onnx.ModelProto | None = None) -> torch.nn.Module:
    """Converts to one LoopedRecurrent of the file's cell, every node fused, matching onnxruntime."""
    model = model or onnx.load(FOLDER / file)
    module = onnx2torch_rnn.convert(model)
    (fused,) = looped(module)
    kind, activation = cell_kind(file)
    assert type(fused.layer).__name__ == f"Onnx{kind}" and not literal_ops(module)
    assert fused.layer.config.linear_before_reset == (kind == "GRU")  # torch's GRU resets after the product
    assert kind != "RNN" or fused.layer.config.activations[0][0].name.lower() == activation.lower()
    for feeds in input_sets(file):
        compare_with_onnxruntime(module, model, feeds)
    return module


@pytest.mark.parametrize("file", TIME_MAJOR)
def test_time_major_loop_becomes_one_looped_recurrent(file):
    module = check(file)
    (fused,) = looped(module)
    assert fused.window is None and fused.initial_h and fused.initial_c == ("lstm" in file)
    assert fused.layer.config.direction == "forward"


@pytest.mark.parametrize("file", ["ts_lstm_loop.onnx", "dynamo_gru_loop.onnx", "ts_rnn_relu_loop.onnx"])
def test_trains_like_the_graph(file):
    """The loss and the gradients at x and the given states match the graph as written; the gradient reaches every
    fused weight, a parameter."""
    feeds = input_sets(file)[2]
    fused, _ = assert_fused_trains_like_literal(FOLDER / file, *feeds.values())
    weights = list(looped(fused)[0].parameters())
    assert weights and all(isinstance(p, torch.nn.Parameter) and p.grad is not None and p.grad.abs().sum() > 0
                           for p in weights)


@pytest.mark.compile
@pytest.mark.parametrize("file", ["dynamo_lstm_loop.onnx", "ts_gru_loop.onnx"])
def test_compiles_in_one_graph(file):
    model = onnx.load(FOLDER / file)
    compiled = torch.compile(onnx2torch_rnn.convert(model), fullgraph=True, dynamic=True, backend="eager")
    for feeds in input_sets(file)[1:3]:
        compare_with_onnxruntime(compiled, model, feeds)
