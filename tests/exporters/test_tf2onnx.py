"""tf2onnx 1.17 models of Keras 3, tf_keras and tf.compat.v1 recurrent layers (tests/models/keras, made by
generate.py there).

tf2onnx turns what it matches into LSTM/GRU (Transpose -> op -> Squeeze, Keras gate order folded into W/R/B) and the
rest into a Loop over the step function: Keras 3 GRU and SimpleRNN, tf_keras GRU(reset_after=False), hard_sigmoid
cells, masking (Embedding(mask_zero=True), Masking) and own cells (recognition makes each Loop of a Keras cell one
recurrent module again: passes/loops.py); TF1 dynamic_rnn graphs (peepholes, cell_clip, projections, sequence_length,
MultiRNNCell) become a Scan (one of RNN / GRU / LSTM cell steps becomes one recurrent module per cell again:
passes/scans.py). Keras layers with unroll=True (a fixed number of steps) are written out step by step in the main
graph (each layer and direction one recurrent module again: passes/unrolled.py). Every model must match onnxruntime
(the export's sizes, other batch/time sizes, and one row of one step, where a masked Keras 3 layer's Loop runs zero
times) and train: gradients reach every weight matrix, also through the Loop and Scan bodies, and folded weights are
parameters.
"""

import numpy as np
import onnx
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.modules.control_flow import Loop, Scan
from onnx2torch_rnn.recurrent import StackedRecurrent
from tests.exporters.common import (
    MODELS,
    assert_weights_are_parameters,
    check_exported,
    compare_with_onnxruntime,
    manifest_input_sets,
    read_manifest,
)
from tests.helpers import recurrent_modules

FOLDER = MODELS / "keras"
MANIFEST = read_manifest(FOLDER)
ENTRIES = {entry["file"]: entry for entry in MANIFEST["models"]}
SCANS_KEPT = ("lstm_cell_clip", "lstm_projection")  # TF1 cells no ONNX op computes exactly
CELLS_PER_SCAN = {"multi_cell": 2}  # a MultiRNNCell's Scan becomes one recurrent module per cell
# unroll=True: T cell steps in the main graph become one recurrent module per layer (passes/unrolled.py; the two
# directions of a Bidirectional one bidirectional layer)
UNROLLED = {"unrolled_stacked": 2}
ONE_STEP = {"batch": {"export": 2, "second": 1}, "time": {"export": 5, "second": 1}}


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_tf2onnx_model(file):
    entry = ENTRIES[file]
    input_sets = manifest_input_sets(FOLDER, entry, MANIFEST["sizes"])
    input_sets.append(manifest_input_sets(FOLDER, entry, ONE_STEP, seed=1)[-1])
    module = check_exported(FOLDER / file, input_sets)
    assert_weights_are_parameters(module)
    # check_exported ran backward: every weight matrix, in recurrent modules or read by Loop bodies, got a gradient
    matrices = [(name, p) for name, p in module.named_parameters() if p.dim() >= 2]
    assert matrices
    for name, param in matrices:
        assert param.grad is not None and bool(param.grad.abs().sum() > 0), f"no gradient reaches {name}"
    model = onnx.load(str(FOLDER / file))
    ops = [node.op_type for node in model.graph.node]
    # every Loop of one Keras cell step and Scan of one TF1 cell step becomes a recurrent module (passes/loops.py,
    # passes/scans.py); an own cell stays a Loop, a TF1 cell without an exact ONNX op a Scan
    loops = ops.count("Loop") if entry["case"] == "custom_cell" else 0
    scans = ops.count("Scan") if entry["case"] in SCANS_KEPT else 0
    fused = ops.count("Loop") - loops + (ops.count("Scan") - scans) * CELLS_PER_SCAN.get(entry["case"], 1)
    fused += UNROLLED.get(entry["case"], 1) if entry["case"].startswith("unrolled_") else 0
    assert len(recurrent_modules(module)) == sum(op in ("LSTM", "GRU", "RNN") for op in ops) + fused
    assert sum(isinstance(m, Loop) for m in module.modules()) == loops
    assert sum(isinstance(m, Scan) for m in module.modules()) == scans
    assert sorted(set(ops) & {"LSTM", "GRU", "RNN", "Loop", "Scan"}) == entry["emitted"]


def test_manifest_covers_the_issue():
    """Both Keras flavours, each of the layer options the issue names, Loops from masking and own cells, and Scans
    from TF1 cells tf2onnx does not match."""
    cases = {(e["exporter"], e["case"]) for e in MANIFEST["models"]}
    for flavour in ("tf2onnx (keras3)", "tf2onnx (tf_keras)"):
        for case in ("lstm_seq", "lstm_state", "gru_reset_after", "gru_reset_before", "simple_rnn",
                     "lstm_go_backwards", "bi_lstm_concat", "stacked", "lstm_hard_sigmoid", "embedding_mask_lstm",
                     "masking_gru", "custom_cell", "unrolled_lstm_seq", "unrolled_lstm_state",
                     "unrolled_gru_reset_after", "unrolled_gru_reset_before", "unrolled_simple_rnn",
                     "unrolled_lstm_go_backwards", "unrolled_bi_gru_concat", "unrolled_stacked"):
            assert (flavour, case) in cases
    for case in ("lstm_peepholes", "lstm_cell_clip", "gru_cell", "lstm_sequence_length"):
        assert ("tf2onnx (tf_v1)", case) in cases
    emitted = {op for e in MANIFEST["models"] for op in e["emitted"]}
    assert {"LSTM", "GRU", "Loop", "Scan"} <= emitted
    assert all(e["bytes"] < 100_000 for e in MANIFEST["models"])


def test_masked_loop_trains_through_the_mask():
    """Embedding(mask_zero) -> LSTM runs as a Loop: a padded step leaves the state alone, so the gradient of the
    final state does not depend on the padded steps' embeddings while the unpadded ones get one."""
    entry = ENTRIES["tf_keras_embedding_mask_lstm.onnx"]
    module = check_exported(FOLDER / entry["file"], manifest_input_sets(FOLDER, entry, MANIFEST["sizes"]))
    embedding = next(p for p in module.parameters() if p.shape[0] == 12)  # the [vocab, 4] table
    tokens = torch.tensor([[3, 5, 0, 0, 0], [7, 0, 2, 4, 1]], dtype=torch.int32)
    module.zero_grad()
    module(tokens).sum().backward()
    grad = embedding.grad.abs().sum(1)
    assert bool((grad[[1, 2, 3, 4, 5, 7]] > 0).all())
    assert float(grad[[6, 8, 9, 10, 11]].abs().sum()) == 0.0  # tokens never fed
    np.testing.assert_array_equal(grad[0].numpy(), 0.0)  # padding (row 0 of the table) never reaches the state


def _top_level(module) -> list[str]:
    return [type(module.get_submodule(n.target)).__name__ for n in module.graph.nodes if n.op == "call_module"]


@pytest.mark.parametrize("file, expected", [
    ("keras3_lstm_state.onnx", ["StackedRecurrent"]),
    ("tf_keras_lstm_state.onnx", ["StackedRecurrent"]),
    ("tf_keras_gru_last_state.onnx", ["StackedRecurrent", "Slice", "Squeeze"]),  # Y's last step stays a Slice
    ("tf_keras_stacked.onnx", ["StackedRecurrent", "Slice", "Squeeze", "Linear"]),
])
def test_glue_joins_the_stack(file, expected):
    """return_state's Y_h / Y_c [1, N, H], each read only by a Squeeze of axis 0: the stack gives them as [N, H];
    LSTM, LSTM -> GRU is one stack of three layers."""
    entry = ENTRIES[file]
    module = check_exported(FOLDER / file, manifest_input_sets(FOLDER, entry, MANIFEST["sizes"]))
    assert _top_level(module) == expected
    if "stacked" in file:
        (stack,) = [m for m in module.modules() if isinstance(m, StackedRecurrent)]
        assert [type(layer).__name__ for layer in stack.layers] == ["OnnxLSTM", "OnnxLSTM", "OnnxGRU"]


def test_stack_of_two_cells_stays_apart_where_the_value_between_is_read():
    """The second LSTM layer's output also a graph output: the GRU is a stack of its own."""
    model = onnx.load(FOLDER / "tf_keras_stacked.onnx")
    gru = next(n for n in model.graph.node if n.op_type == "GRU")
    time_major = ["time", "batch", 6]
    model.graph.output.append(onnx.helper.make_tensor_value_info(gru.input[0], onnx.TensorProto.FLOAT, time_major))
    module = onnx2torch_rnn.convert(model)
    assert [len(m.layers) for m in module.modules() if isinstance(m, StackedRecurrent)] == [2, 1]
    for feeds in manifest_input_sets(FOLDER, ENTRIES["tf_keras_stacked.onnx"], MANIFEST["sizes"]):
        compare_with_onnxruntime(module, model, feeds)


def test_return_state_squeeze_stays_where_the_state_is_read_as_it_is():
    """The LSTM's Y_h also an output as [1, N, H]: both Squeezes stay (h_n and c_n come out alike)."""
    model = onnx.load(FOLDER / "keras3_lstm_state.onnx")
    lstm = next(n for n in model.graph.node if n.op_type == "LSTM")
    model.graph.output.append(onnx.helper.make_tensor_value_info(lstm.output[1], onnx.TensorProto.FLOAT,
                                                                 [1, "batch", 6]))
    module = onnx2torch_rnn.convert(model)
    assert _top_level(module) == ["StackedRecurrent", "Squeeze", "Squeeze"]
    for feeds in manifest_input_sets(FOLDER, ENTRIES["keras3_lstm_state.onnx"], MANIFEST["sizes"]):
        compare_with_onnxruntime(module, model, feeds)
