"""Keras recurrent layers with unroll=True (tests/models/keras/*_unrolled_*.onnx, tf2onnx 1.17 of Keras 3 and
tf_keras): tf2onnx writes T copies of the cell step in the main graph (x transposed to time-major and Split, each
step's h Unsqueezed and Concatenated, Y transposed back). Recognition (passes/unrolled.py) makes each layer and
direction one recurrent module again (a LoopedRecurrent, or a StackedRecurrent that absorbs the Transposes where
nothing else reads the layer's final states): it matches onnxruntime on the original graph, leaves no per-step op,
trains like the graph as written (fuse=False) and compiles in one graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.recurrent import LoopedRecurrent
from tests.exporters.common import MODELS, compare_with_onnxruntime, manifest_input_sets, read_manifest
from tests.helpers import assert_fused_trains_like_literal, recurrent_modules

FOLDER = MODELS / "keras"
MANIFEST = read_manifest(FOLDER)
ENTRIES = {e["file"]: e for e in MANIFEST["models"] if e["case"].startswith("unrolled_")}
# case -> each fused layer in graph order: (cell, activations, linear_before_reset, direction)
RNN, LSTM = ["Tanh"], ["Sigmoid", "Tanh", "Tanh"]
GRU = ["Sigmoid", "Tanh"]
LAYERS = {
    "unrolled_lstm_seq": [("LSTM", LSTM, False, "forward")],
    "unrolled_lstm_state": [("LSTM", LSTM, False, "forward")],
    "unrolled_gru_reset_after": [("GRU", GRU, True, "forward")],
    "unrolled_gru_reset_before": [("GRU", GRU, False, "forward")],
    "unrolled_simple_rnn": [("RNN", RNN, False, "forward")],
    "unrolled_simple_rnn_relu_last": [("RNN", ["Relu"], False, "forward")],
    "unrolled_lstm_go_backwards": [("LSTM", LSTM, False, "reverse")],
    "unrolled_bi_gru_concat": [("GRU", GRU, True, "forward"), ("GRU", GRU, True, "reverse")],
    "unrolled_stacked": [("LSTM", LSTM, False, "forward"), ("GRU", GRU, True, "forward")],
}
# go_backwards: a reverse LoopedRecurrent whose Y is in processing order (the graph's Y[0] is the h after x's last
# step); in the Bidirectional the graph's ReverseSequence turns the backward layer's Y back
Y_BACKWARDS = {"unrolled_lstm_go_backwards": [True], "unrolled_bi_gru_concat": [False, True]}
PER_STEP = {"MatMul", "Gemm", "Split", "Squeeze", "Unsqueeze", "Sigmoid", "Tanh", "Relu", "Mul", "Sub", "Add"}


def looped(module) -> list[LoopedRecurrent]:
    return [m for m in module.modules() if isinstance(m, LoopedRecurrent)]


def literal_ops(module) -> list[str]:
    return [n.meta["onnx"]["op_type"] for n in module.graph.nodes if "onnx" in n.meta and "pattern" not in n.meta[
        "onnx"]]


def input_sets(file: str) -> list[dict[str, np.ndarray]]:
    """Two input sets at batch 2 and one at batch 3 (the number of steps is the model's)."""
    return manifest_input_sets(FOLDER, ENTRIES[file], MANIFEST["sizes"])


def test_every_case_is_generated_by_both_keras_flavours():
    assert sorted(ENTRIES) == sorted(f"{flavour}_{case}.onnx" for flavour in ("keras3", "tf_keras") for case in LAYERS)


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_unrolled_keras_layer_becomes_one_module_per_layer_and_direction(file):
    model = onnx.load(FOLDER / file)
    module = onnx2torch_rnn.convert(model)
    case = ENTRIES[file]["case"]
    found = [(type(m).__name__.removeprefix("Onnx"), [a.name for (a,) in m.config.activations],
              m.config.linear_before_reset, m.config.direction) for m in recurrent_modules(module)]
    assert found == LAYERS[case]
    assert [c.y_backwards for c in looped(module)] == Y_BACKWARDS.get(case, [False] * len(looped(module)))
    assert not PER_STEP & set(literal_ops(module)), literal_ops(module)
    sets = input_sets(file)
    assert {s["x"].shape[0] for s in sets} == {2, 3}
    for feeds in sets:
        compare_with_onnxruntime(module, model, feeds)
    literal = onnx2torch_rnn.convert(model, fuse=False)
    assert not looped(literal) and "MatMul" in literal_ops(literal)


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_unrolled_keras_layer_trains_like_the_graph_as_written(file):
    fused, _ = assert_fused_trains_like_literal(FOLDER / file, input_sets(file)[0]["x"])
    for layer in recurrent_modules(fused):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


@pytest.mark.compile
@pytest.mark.parametrize("file", ["keras3_unrolled_bi_gru_concat.onnx", "tf_keras_unrolled_lstm_go_backwards.onnx",
                                  "tf_keras_unrolled_stacked.onnx", "keras3_unrolled_lstm_state.onnx"])
def test_unrolled_keras_layer_compiles_in_one_graph(file):
    model = onnx.load(FOLDER / file)
    module = onnx2torch_rnn.convert(model)
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend="eager")
    for feeds in input_sets(file):
        compare_with_onnxruntime(compiled, model, feeds)
