"""Recognition of Scans of one cell step (onnx2torch_rnn/passes/scans.py): tf2onnx's TF1 dynamic_rnn cells.

Which cell each fusable Scan becomes with which attributes (TF1's BasicRNNCell, GRUCell reset before the product,
LSTMCell with peepholes, dynamic_rnn with sequence_length, both halves of a bidirectional_dynamic_rnn, a scan reading
x or writing y backwards or both, MultiRNNCell's cells as layers in turn), the refused ones (cell_clip, num_proj)
staying Scans, near-misses that must stay Scans, and torch.export with dynamic batch and time; every model matches
onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn.modules.control_flow import Scan
from onnx2torch_rnn.recurrent import LoopedStack
from tests.exporters.common import MODELS, compare_with_onnxruntime, manifest_input_sets, read_manifest
from tests.helpers import assert_fused_trains_like_literal, looped, sigmoid_before_first_tanh

KERAS = MODELS / "keras"
MANIFEST = read_manifest(KERAS)
ENTRIES = {e["file"]: e for e in MANIFEST["models"]}
# case -> (ONNX op, activations, linear_before_reset, peepholes, lengths), one per Scan
FUSED = {
    "basic_rnn_cell": ("RNN", ["Tanh"], 0, False, False),
    "gru_cell": ("GRU", ["Sigmoid", "Tanh"], 0, False, False),
    "bi_gru_cell": ("GRU", ["Sigmoid", "Tanh"], 0, False, False),
    "lstm_peepholes": ("LSTM", ["Sigmoid", "Tanh", "Tanh"], 0, True, False),
    "lstm_sequence_length": ("LSTM", ["Sigmoid", "Tanh", "Tanh"], 0, False, True),
}
REFUSED = ("lstm_cell_clip", "lstm_projection")


def scans(module) -> int:
    return sum(isinstance(m, Scan) for m in module.modules())


def input_sets(file: str) -> list[dict[str, np.ndarray]]:
    return manifest_input_sets(KERAS, ENTRIES[file], MANIFEST["sizes"])


def test_the_manifest_has_every_case():
    assert {e["case"] for e in MANIFEST["models"] if e["file"].startswith("tf_v1_")} == {*FUSED, *REFUSED, "multi_cell"}


@pytest.mark.parametrize("case", sorted(FUSED))
def test_each_fusable_scan_becomes_its_cell(case):
    file = f"tf_v1_{case}.onnx"
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    op, activations, linear_before_reset, peepholes, lengths = FUSED[case]
    cells = looped(module)
    assert len(cells) == [n.op_type for n in model.graph.node].count("Scan") and not scans(module)
    for cell in cells:
        layer = cell.layer
        assert type(layer).__name__ == f"Onnx{op}"
        assert [a.name for a in layer.config.onnx_activations()] == activations
        assert layer.config.linear_before_reset == bool(linear_before_reset)
        assert (getattr(layer, "P", None) is not None) == peepholes
        assert cell.lengths == lengths and not cell.mask
        assert (layer.config.mask_output == "zero") == lengths
        assert not cell.initial_h and not cell.initial_c  # tf2onnx's zero states are proven and dropped
    for feeds in input_sets(file):  # the export's sizes and a second batch / time
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("case", REFUSED)
def test_cells_without_an_exact_onnx_op_stay_scans(case):
    """cell_clip clips the cell state (ONNX's clip clips the gates' pre-activations), num_proj projects h (no ONNX
    LSTM does, nor the recurrent runtime: see passes/scans.py)."""
    file = f"tf_v1_{case}.onnx"
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    assert not looped(module) and scans(module) == 1
    for feeds in input_sets(file):
        compare_with_onnxruntime(module, model, feeds)


def test_sequence_length_holds_states_and_zeroes_outputs_for_any_length():
    """Lengths 0, in between, T and past T (TF runs every step): the final h is each row's last valid one."""
    file = "tf_v1_lstm_sequence_length.onnx"
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    feeds = dict(input_sets(file)[-1])
    x = feeds["x:0"]
    steps, batch = x.shape[1], x.shape[0]
    for lengths in ([0, 2, steps], [1, steps + 3, 0], [steps - 1] * batch):
        feeds["lengths:0"] = np.resize(np.array(lengths, feeds["lengths:0"].dtype), batch)
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.compile
@pytest.mark.parametrize("case", ["gru_cell", "lstm_sequence_length"])
def test_fused_scans_export_with_dynamic_batch_and_time(case):
    file = f"tf_v1_{case}.onnx"
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    sets = input_sets(file)
    names = list(sets[0])
    batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=2)
    shapes = tuple({0: batch, 1: time} if v.ndim == 3 else {0: batch} for v in sets[0].values())
    args = tuple(torch.from_numpy(sets[0][n]) for n in names)
    exported = torch.export.export(module, args, dynamic_shapes=shapes).module()
    for feeds in sets[1:]:
        compare_with_onnxruntime(exported, model, feeds)


# ---------------------------------------------------------------------------------------------------------------
# Near-misses: each changes one proven detail; the Scan must stay a Scan and the result still match.

def _scan(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Scan")


def _body(model: onnx.ModelProto) -> onnx.GraphProto:
    return next(a.g for a in _scan(model).attribute if a.name == "body")


def _extra_op_in_the_cell(model):
    sigmoid_before_first_tanh(_body(model))


def _reversed_input(model):
    """The scan reads x from the last step to the first but writes y forwards."""
    _scan(model).attribute.append(helper.make_attribute("scan_input_directions", [1]))


def _reversed_output(model):
    """The scan writes y from the last step to the first but reads x forwards."""
    _scan(model).attribute.append(helper.make_attribute("scan_output_directions", [1]))


def _reversed_scan(model):
    """Both reversed: ONNX's reverse direction (see below)."""
    _reversed_input(model)
    _reversed_output(model)


def _input_axis(model):
    """x scanned along axis 0 written as -3: refused as any axis but 0."""
    _scan(model).attribute.append(helper.make_attribute("scan_input_axes", [-3]))


def _reversed_input_and_output_axis(model):
    """x read backwards and y written along axis 1: refused as any axis but 0."""
    _reversed_input(model)
    _scan(model).attribute.append(helper.make_attribute("scan_output_axes", [1]))
    model.graph.node[-1].attribute[0].ints[:] = [0, 1, 2]  # y is now [N, T, H]: no Transpose back


def _shared_weight(model):
    """The kernel is also a graph output: a fused copy would untie it."""
    kernel = next(t for t in model.graph.initializer if "kernel" in t.name and len(t.dims) == 2)
    model.graph.node.append(helper.make_node("Identity", [kernel.name], ["kernel_out"]))
    model.graph.output.append(helper.make_tensor_value_info("kernel_out", onnx.TensorProto.FLOAT, [None, None]))


def _counter_from_one(model):
    """The step counter starts at 1: with sequence_length every row's steps would shift by one."""
    scan = _scan(model)
    model.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int32), "one"))
    scan.input[0] = "one"


@pytest.mark.parametrize(("file", "change"), [
    ("tf_v1_gru_cell.onnx", _extra_op_in_the_cell), ("tf_v1_gru_cell.onnx", _shared_weight),
    ("tf_v1_gru_cell.onnx", _input_axis), ("tf_v1_gru_cell.onnx", _reversed_input_and_output_axis),
    ("tf_v1_lstm_sequence_length.onnx", _shared_weight), ("tf_v1_lstm_sequence_length.onnx", _counter_from_one),
    ("tf_v1_lstm_peepholes.onnx", _extra_op_in_the_cell)])
def test_near_misses_stay_scans_and_still_match(file, change):
    assert_stays_a_scan_and_matches(file, change)


def assert_stays_a_scan_and_matches(file: str, change) -> None:
    model = onnx.load(KERAS / file)
    change(model)
    module = onnx2torch_rnn.convert(model)
    assert not looped(module) and scans(module) == 1
    for feeds in input_sets(file):
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("change", [_reversed_input, _reversed_output, _reversed_scan])
@pytest.mark.parametrize("file", ["tf_v1_gru_cell.onnx", "tf_v1_lstm_sequence_length.onnx"])
def test_a_scan_reading_or_writing_backwards_is_a_forward_recurrence_flipped(file, change):
    """x read backwards: the forward layer over x flipped in time; y written backwards: its y flipped; both with
    sequence_length (the lengths count the scan's steps, not x's): both flips."""
    model = onnx.load(KERAS / file)
    change(model)
    module = onnx2torch_rnn.convert(model)
    (cell,) = looped(module)
    assert not scans(module)
    if change is _reversed_scan and not cell.lengths:  # ONNX's reverse direction (below)
        assert cell.layer.config.direction == "reverse" and not cell.x_backwards and not cell.y_backwards
    else:
        assert cell.layer.config.direction == "forward"
        assert (cell.x_backwards, cell.y_backwards) == (change is not _reversed_output, change is not _reversed_input)
    for feeds in input_sets(file):
        compare_with_onnxruntime(module, model, feeds)
    if cell.lengths:  # lengths 0, in between, past T
        steps, batch = feeds["x:0"].shape[1], feeds["x:0"].shape[0]
        feeds["lengths:0"] = np.resize(np.array([0, steps - 2, steps + 1], np.int32), batch)
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.compile
@pytest.mark.parametrize("change", [_reversed_input, _reversed_output])
def test_flipped_scans_export_with_dynamic_batch_and_time_and_compile_in_one_graph(change):
    file = "tf_v1_lstm_sequence_length.onnx"
    model = onnx.load(KERAS / file)
    change(model)
    module = onnx2torch_rnn.convert(model)
    sets = input_sets(file)
    batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=2)
    shapes = tuple({0: batch, 1: time} if v.ndim == 3 else {0: batch} for v in sets[0].values())
    exported = torch.export.export(module, tuple(torch.from_numpy(v) for v in sets[0].values()),
                                   dynamic_shapes=shapes).module()
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend="eager")
    for feeds in sets[1:]:
        for runner in (exported, compiled):
            compare_with_onnxruntime(runner, model, feeds)


@pytest.mark.parametrize("case", ["basic_rnn_cell", "lstm_peepholes"])
def test_a_scan_read_and_written_backwards_is_the_reverse_direction(case):
    file = f"tf_v1_{case}.onnx"
    model = onnx.load(KERAS / file)
    _reversed_scan(model)
    module = onnx2torch_rnn.convert(model)
    (cell,) = looped(module)
    assert cell.layer.config.direction == "reverse" and not scans(module)
    for feeds in input_sets(file):
        compare_with_onnxruntime(module, model, feeds)


# ---------------------------------------------------------------------------------------------------------------
# MultiRNNCell: the cells of one step become looped layers in turn (one LoopedStack), each reading the previous
# layer's y.

MULTI = "tf_v1_multi_cell.onnx"  # MultiRNNCell([LSTMCell(5), GRUCell(4)])


def _with_sequence_length(model):
    """dynamic_rnn(MultiRNNCell, sequence_length=lengths:0) as tf2onnx writes a cell's (tf_v1_lstm_sequence_length):
    where the step counter is >= a row's length every state keeps its value and y is zero, by Mul and Add."""
    scan, body = _scan(model), _body(model)
    carried = len(scan.input) - 1
    counters = [k for k in range(carried) if scan.input[k] == "rnn/time:0"]
    zeros = next(v for v in scan.input[:carried] if "GRUCellZeroState" in v)  # [N, 4], what y is where a row is past
    model.graph.input.append(helper.make_tensor_value_info("lengths:0", onnx.TensorProto.INT32, ["batch"]))
    body.initializer.append(numpy_helper.from_array(np.array([-1, 1], np.int64), "column"))
    float_ = onnx.TensorProto.FLOAT
    body.node.extend([helper.make_node("GreaterOrEqual", [body.input[counters[0]].name, "lengths:0"], ["past_row"]),
                      helper.make_node("Reshape", ["past_row", "column"], ["past"]),
                      helper.make_node("Not", ["past"], ["valid"]),
                      helper.make_node("Cast", ["past"], ["past_f"], to=float_),
                      helper.make_node("Cast", ["valid"], ["valid_f"], to=float_)])
    for k, output in enumerate(body.output):
        if k in counters:
            continue
        kept = body.input[k].name if k < carried else zeros
        body.node.extend([helper.make_node("Mul", ["past_f", kept], [f"kept_{k}"]),
                          helper.make_node("Mul", [output.name, "valid_f"], [f"new_{k}"]),
                          helper.make_node("Add", [f"kept_{k}", f"new_{k}"], [f"selected_{k}"])])
        output.name = f"selected_{k}"
    onnx.checker.check_model(model)


def _multi_input_sets(lengths: bool) -> list[dict[str, np.ndarray]]:
    sets = input_sets(MULTI)
    if lengths:  # 0, past T, and in between
        for feeds in sets:
            steps, batch = feeds["x:0"].shape[1], feeds["x:0"].shape[0]
            feeds["lengths:0"] = np.resize(np.array([steps - 2, 0, steps + 3], np.int32), batch)
    return sets


def _multi_model(lengths: bool) -> onnx.ModelProto:
    model = onnx.load(KERAS / MULTI)
    if lengths:
        _with_sequence_length(model)
    return model


@pytest.mark.parametrize("lengths", [False, True])
def test_multi_rnn_cell_scans_become_their_cells_in_turn(lengths):
    model = _multi_model(lengths)
    module = onnx2torch_rnn.convert(model)
    (stack,) = [m for m in module.modules() if isinstance(m, LoopedStack)]
    assert [type(layer.layer).__name__ for layer in stack.layers] == ["OnnxLSTM", "OnnxGRU"]
    assert [layer.layer.config.hidden_size for layer in stack.layers] == [5, 4]
    assert stack.layers[1].layer.config.linear_before_reset is False  # GRUCell resets before the product
    assert all(layer.lengths == lengths and not layer.initial_h for layer in stack.layers)
    assert len(looped(module)) == 2 and not scans(module)
    for feeds in _multi_input_sets(lengths):
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.compile
@pytest.mark.parametrize("lengths", [False, True])
def test_multi_rnn_cell_exports_with_dynamic_batch_and_time_and_compiles_in_one_graph(lengths):
    model = _multi_model(lengths)
    module = onnx2torch_rnn.convert(model)
    sets = _multi_input_sets(lengths)
    batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=2)
    shapes = tuple({0: batch, 1: time} if v.ndim == 3 else {0: batch} for v in sets[0].values())
    args = tuple(torch.from_numpy(v) for v in sets[0].values())
    exported = torch.export.export(module, args, dynamic_shapes=shapes).module()
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend="eager")
    for feeds in sets[1:]:
        for runner in (exported, compiled):
            compare_with_onnxruntime(runner, model, feeds)


def test_multi_rnn_cell_fused_and_literal_train_alike():
    """The layers' weights are the Scan's kernels rearranged: the same loss and the same gradient at the input."""
    fused, literal = assert_fused_trains_like_literal(KERAS / MULTI, input_sets(MULTI)[0]["x:0"])
    assert looped(fused) and not looped(literal)


def test_a_multi_rnn_cell_scan_read_and_written_backwards_runs_each_layer_in_reverse():
    model = onnx.load(KERAS / MULTI)
    _reversed_scan(model)
    module = onnx2torch_rnn.convert(model)
    assert [cell.layer.config.direction for cell in looped(module)] == ["reverse", "reverse"] and not scans(module)
    for feeds in input_sets(MULTI):
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("change", [_reversed_input, _reversed_output])
def test_a_multi_rnn_cell_scan_reading_or_writing_backwards_flips_the_first_layer_x_or_the_last_y(change, lengths):
    model = _multi_model(lengths)
    change(model)
    module = onnx2torch_rnn.convert(model)
    first, second = looped(module)
    assert not scans(module) and first.layer.config.direction == second.layer.config.direction == "forward"
    assert (first.x_backwards, first.y_backwards) == (change is _reversed_input, False)
    assert (second.x_backwards, second.y_backwards) == (False, change is _reversed_output)
    for feeds in _multi_input_sets(lengths):
        compare_with_onnxruntime(module, model, feeds)


def _second_cell_reads(value: str):
    """The GRU's kernels read ``value`` where they read the LSTM's new h."""
    def change(model):
        body = _body(model)
        lstm_concat = next(n for n in body.node if n.op_type == "Concat")  # [x, h]
        for node in body.node:
            if node.op_type == "Concat" and "gru_cell" in node.name:
                node.input[0] = {"x": lstm_concat.input[0], "old h": lstm_concat.input[1]}[value]
    change.__name__ = f"_second_cell_reads_{value.replace(' ', '_')}"
    return change


@pytest.mark.parametrize("change", [_second_cell_reads("old h"), _second_cell_reads("x"), _extra_op_in_the_cell,
                                    _shared_weight])
def test_multi_rnn_cell_near_misses_stay_scans_and_still_match(change):
    """A second cell reading the first one's h from before the step, or x (two cells side by side, not in turn), is
    no stack of layers; nor is a first cell with an extra op, or a kernel read elsewhere."""
    assert_stays_a_scan_and_matches(MULTI, change)
