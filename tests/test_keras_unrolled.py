"""Keras recurrent layers with unroll=True (tests/models/keras/*_unrolled_*.onnx, tf2onnx 1.17 of Keras 3 and
tf_keras): tf2onnx writes T copies of the cell step in the main graph (x transposed to time-major and Split, each
step's h Unsqueezed and Concatenated, Y transposed back). Recognition (passes/unrolled.py) makes each layer and
direction one recurrent module again, and the glue that only moves data goes with them: one StackedRecurrent
absorbs the Transposes around and between layers and the ReverseSequence after a Bidirectional's backward layer
(only go_backwards' Y in processing order stays a LoopedRecurrent with its Transposes): it matches onnxruntime on the
original graph, leaves no per-step op, trains like the graph as written (fuse=False) and compiles in one graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.recurrent import StackedRecurrent
from tests.exporters.common import MODELS, compare_with_onnxruntime, manifest_input_sets, read_manifest
from tests.helpers import assert_fused_trains_like_literal, literal_ops, looped, recurrent_modules

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
    "unrolled_bi_gru_concat": [("GRU", GRU, True, "bidirectional")],
    "unrolled_stacked": [("LSTM", LSTM, False, "forward"), ("GRU", GRU, True, "forward")],
}
# go_backwards: a reverse LoopedRecurrent whose Y is in processing order (the graph's Y[0] is the h after x's last
# step); in the Bidirectional the graph's ReverseSequence turns the backward layer's Y back, the Transposes between
# cancel, and the two directions are one bidirectional layer
Y_BACKWARDS = {"unrolled_lstm_go_backwards": [True]}
# the converted module's top-level modules: one StackedRecurrent absorbs the Transposes around the layers, between
# them (they cancel: LSTM -> GRU is one stack) and after a Bidirectional's backward layer (with the ReverseSequence
# that undoes its Y in processing order), and gives return_state's [N, H] final states; go_backwards' Y in processing
# order keeps a LoopedRecurrent with its Transposes
TOP_LEVEL = {case: ["StackedRecurrent"] for case in LAYERS} | {
    "unrolled_lstm_go_backwards": ["Transpose", "LoopedRecurrent", "Transpose"]}
PER_STEP = {"MatMul", "Gemm", "Split", "Squeeze", "Unsqueeze", "Sigmoid", "Tanh", "Relu", "Mul", "Sub", "Add"}


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
    found = [(type(m).__name__.removeprefix("Onnx"), [a[0].name for a in m.config.activations],
              m.config.linear_before_reset, m.config.direction) for m in recurrent_modules(module)]
    assert found == LAYERS[case]
    assert [c.y_backwards for c in looped(module)] == Y_BACKWARDS.get(case, [False] * len(looped(module)))
    assert top_level(module) == TOP_LEVEL[case]
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


@pytest.mark.compile
@pytest.mark.parametrize("file", ["keras3_unrolled_bi_gru_concat.onnx", "tf_keras_unrolled_lstm_go_backwards.onnx",
                                  "tf_keras_unrolled_stacked.onnx", "keras3_unrolled_lstm_state.onnx"])
def test_unrolled_keras_layer_exports_with_dynamic_batch(file):
    """torch.export with a dynamic batch (the number of steps is the model's): one program for every batch size."""
    model = onnx.load(FOLDER / file)
    sets = input_sets(file)
    batch = torch.export.Dim("batch", min=1)
    exported = torch.export.export(onnx2torch_rnn.convert(model), (torch.from_numpy(sets[0]["x"]),),
                                   dynamic_shapes=[{0: batch}]).module()
    for feeds in sets:
        compare_with_onnxruntime(exported, model, feeds)


def top_level(module) -> list[str]:
    """The converted module's top-level modules in call order (recurrent ones and what glue is left)."""
    return [type(module.get_submodule(n.target)).__name__ for n in module.graph.nodes if n.op == "call_module"]



def _bidirectional(flavour: str) -> tuple[onnx.ModelProto, onnx.NodeProto, onnx.NodeProto, onnx.NodeProto]:
    """The unrolled Bidirectional model and the glue after its backward layer: the Transpose to batch-major, ReverseV2's
    Transpose back and its ReverseSequence (whose lengths are the Expanded dim 1 of the first Transpose's output)."""
    model = onnx.load(FOLDER / f"{flavour}_unrolled_bi_gru_concat.onnx")
    nodes = model.graph.node
    there = next(n for n in nodes if "backward_gru" in n.name and n.name.endswith("transpose_1"))
    back = next(n for n in nodes if "ReverseV2_Transpose" in n.name)
    reverse = next(n for n in nodes if n.op_type == "ReverseSequence")
    return model, there, back, reverse


def _stays_apart_and_matches(model: onnx.ModelProto, feeds_list=None) -> None:
    module = onnx2torch_rnn.convert(model)
    assert top_level(module).count("LoopedRecurrent") == 2 and "ReverseSequence" in top_level(module)
    file = "keras3_unrolled_bi_gru_concat.onnx"
    for feeds in feeds_list or input_sets(file):
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_bidirectional_joins_through_transposes_that_cancel_however_written(flavour):
    """Transposes (1, 2, 0) then (2, 0, 1) cancel too; the reversal's lengths then read dim 2 of the middle value."""
    model, there, back, reverse = _bidirectional(flavour)
    there.attribute[0].ints[:], back.attribute[0].ints[:] = [1, 2, 0], [2, 0, 1]
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([2], np.int64), "time_axis_index"))
    expand = next(n for n in model.graph.node if n.output[0] == reverse.input[1])
    gather = next(n for n in model.graph.node if n.output[0] == expand.input[0])
    gather.input[1] = "time_axis_index"
    module = onnx2torch_rnn.convert(model)
    assert top_level(module) == ["StackedRecurrent"]
    for feeds in input_sets(f"{flavour}_unrolled_bi_gru_concat.onnx"):
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_bidirectional_stays_apart_where_the_reversal_is_partial(flavour):
    """The same Transposes, but the lengths still read dim 1 of the middle value: H = 4 of T = 6 steps reversed."""
    model, there, back, _ = _bidirectional(flavour)
    there.attribute[0].ints[:], back.attribute[0].ints[:] = [1, 2, 0], [2, 0, 1]
    _stays_apart_and_matches(model)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_bidirectional_stays_apart_where_the_lengths_are_given(flavour):
    """The reversal's lengths the Min of T and given ones (its own lengths computation still read)."""
    model, _, _, reverse = _bidirectional(flavour)
    at = list(model.graph.node).index(reverse)
    model.graph.node.insert(at, onnx.helper.make_node("Min", [reverse.input[1], "lengths"], ["given_lengths"]))
    reverse.input[1] = "given_lengths"
    model.graph.input.append(onnx.helper.make_tensor_value_info("lengths", onnx.TensorProto.INT64, ["batch"]))
    sets = input_sets(f"{flavour}_unrolled_bi_gru_concat.onnx")
    for k, feeds in enumerate(sets):
        feeds["lengths"] = np.array([6, 3, 1][: len(feeds["x"])] if k else [6] * len(feeds["x"]), np.int64)
    _stays_apart_and_matches(model, sets)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_bidirectional_stays_apart_where_the_middle_value_is_read(flavour):
    model, there, _, _ = _bidirectional(flavour)
    batch_major = ["batch", 6, 4]
    model.graph.output.append(onnx.helper.make_tensor_value_info(there.output[0], onnx.TensorProto.FLOAT, batch_major))
    _stays_apart_and_matches(model)


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_bidirectional_stays_apart_where_a_shape_of_the_middle_value_feeds_nothing(flavour):
    """Lengths given directly: the Shapes that computed them read the middle value and feed nothing, so recognition
    could not absorb them: the glue stays (the backward layer is still one module)."""
    model, _, _, reverse = _bidirectional(flavour)
    reverse.input[1] = "lengths"
    model.graph.input.append(onnx.helper.make_tensor_value_info("lengths", onnx.TensorProto.INT64, ["batch"]))
    sets = input_sets(f"{flavour}_unrolled_bi_gru_concat.onnx")
    for feeds in sets:
        feeds["lengths"] = np.full(len(feeds["x"]), 6, np.int64)
    _stays_apart_and_matches(model, sets)


def test_transposes_cancel_where_their_perms_compose_to_the_identity():
    from onnx2torch_rnn.passes.stacked import _undoes

    assert _undoes([1, 0, 2], [1, 0, 2]) and _undoes([2, 0, 1], [1, 2, 0]) and _undoes([1, 2, 0], [2, 0, 1])
    assert not _undoes([1, 2, 0], [1, 2, 0]) and not _undoes([0, 2, 1], [1, 0, 2]) and not _undoes(None, [1, 0, 2])
    assert not _undoes([0, 1], [1, 0, 2]) and not _undoes([0, 0, 1], [0, 1, 2])


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_stack_stays_apart_where_the_value_between_layers_is_read(flavour):
    """The LSTM layer's batch-major Y (between the Transposes that cancel) also an output: two stacks, the GRU's
    reading it batch-major (the Transposes stay apart, each in its own stack)."""
    file = f"{flavour}_unrolled_stacked.onnx"
    model = onnx.load(FOLDER / file)
    between = next(n for n in model.graph.node if n.op_type == "Transpose" and "gru" in n.name).input[0]
    model.graph.output.append(onnx.helper.make_tensor_value_info(between, onnx.TensorProto.FLOAT, ["batch", 6, 6]))
    module = onnx2torch_rnn.convert(model)
    assert top_level(module) == ["StackedRecurrent", "StackedRecurrent"]
    assert [len(m.layers) for m in module.modules() if isinstance(m, StackedRecurrent)] == [1, 1]
    for feeds in input_sets(file):
        compare_with_onnxruntime(module, model, feeds)
