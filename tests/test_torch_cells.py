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
from tests.exporters.common import MODELS, compare_with_onnxruntime, read_manifest, run_onnxruntime
from tests.helpers import (
    assert_fused_trains_like_literal,
    literal_ops,
    looped,
    recurrent_modules,
    sigmoid_before_first_tanh,
)

FOLDER = MODELS / "torch_cells"
MANIFEST = read_manifest(FOLDER)
ENTRIES = {e["file"]: e for e in MANIFEST["models"]}
TIME_MAJOR = sorted(f for f, e in ENTRIES.items() if "_loop" in e["case"] and "_bf" not in e["case"])


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


@pytest.mark.parametrize("file", ["ts_lstm_loop.onnx", "dynamo_gru_loop.onnx", "ts_rnn_relu_loop.onnx",
                                  "ts_lstm_step.onnx", "dynamo_rnn_tanh_step.onnx", "ts_gru_loop_bf.onnx",
                                  "dynamo_lstm_loop_bf_zeros.onnx"])
def test_trains_like_the_graph(file):
    """The loss and the gradients at x and the given states match the graph as written; the gradient reaches every
    fused weight, a parameter."""
    feeds = input_sets(file)[2]
    fused, _ = assert_fused_trains_like_literal(FOLDER / file, *feeds.values())
    weights = list(looped(fused)[0].parameters())
    assert weights and all(isinstance(p, torch.nn.Parameter) and p.grad is not None and p.grad.abs().sum() > 0
                           for p in weights)


@pytest.mark.compile
@pytest.mark.parametrize("file", ["dynamo_lstm_loop.onnx", "ts_gru_loop.onnx", "ts_gru_step.onnx",
                                  "dynamo_lstm_step.onnx", "dynamo_rnn_relu_loop_bf.onnx",
                                  "ts_lstm_loop_bf_zeros.onnx"])
def test_compiles_in_one_graph(file):
    model = onnx.load(FOLDER / file)
    compiled = torch.compile(onnx2torch_rnn.convert(model), fullgraph=True, dynamic=True, backend="eager")
    for feeds in input_sets(file)[1:3]:
        compare_with_onnxruntime(compiled, model, feeds)


STEPPED = sorted(f for f, e in ENTRIES.items() if "_step" in e["case"] and "stacked" not in e["case"]
                 and "decoder" not in e["case"])
DECODERS = sorted(f for f, e in ENTRIES.items() if "decoder" in e["case"])
CRNNS = sorted(f for f, e in ENTRIES.items() if e["case"] == "bilstm_crnn")
STACKED_STATES = sorted(f for f, e in ENTRIES.items() if e["case"] == "lstm_step_stacked_state")
BATCH_FIRST = sorted(f for f, e in ENTRIES.items() if "_loop_bf" in e["case"])


def calls(module: torch.nn.Module, model: onnx.ModelProto, file: str, count: int = 4) -> None:
    """``count`` streaming calls at batch 1 and 3, each reading the states the previous one returned, compared with
    onnxruntime."""
    names, states_out = list(ENTRIES[file]["inputs"]), len(ENTRIES[file]["inputs"]) - 1
    rng = np.random.default_rng(3)
    for feeds in input_sets(file)[1:3]:
        for _ in range(count):
            compare_with_onnxruntime(module, model, feeds)
            states = run_onnxruntime(model, feeds)[-states_out:]
            x = rng.standard_normal(feeds["x"].shape).astype(np.float32)
            feeds = {"x": x, **dict(zip(names[1:], states, strict=True))}


@pytest.mark.parametrize("file", STEPPED)
def test_streaming_step_becomes_one_step(file):
    """x [N, I] without a time axis: one LoopedRecurrent of one step reading x as it is, the states given and
    returned as [N, H]; over a few calls, each reading the states the previous one returned."""
    model = onnx.load(FOLDER / file)
    (fused,) = looped(check(file, model))
    assert fused.time_axis is None and fused.initial_h and fused.initial_c == ("lstm" in file)
    assert fused.outputs[:3] == (False, True, "lstm" in file)
    calls(onnx2torch_rnn.convert(model), model, file)


@pytest.mark.parametrize("file", STACKED_STATES)
def test_streaming_step_with_stacked_states(file):
    """Silero VAD's decoder: h and c are rows of one input [2, N, H] (Gathers along axis 0) and go back stacked in one
    output (Unsqueezes into a Concat over axis 0), the new h read by a head too: the cell is one LoopedRecurrent of one
    step reading the rows, the Gathers, the stacking and the head stay."""
    model = onnx.load(FOLDER / file)
    module = onnx2torch_rnn.convert(model)
    (fused,) = looped(module)
    assert fused.time_axis is None and fused.initial_h and fused.initial_c and fused.outputs[:3] == (False, True, True)
    assert "Gemm" not in literal_ops(module) and literal_ops(module).count("Gather") == 2
    calls(module, model, file)


@pytest.mark.compile
@pytest.mark.parametrize("file", ["ts_lstm_step_stacked_state.onnx",
                                  *(pytest.param(f, marks=pytest.mark.slow) for f in
                                    ["dynamo_lstm_step_stacked_state.onnx", "ts_lstm_step.onnx",
                                     "dynamo_gru2_decoder_step.onnx", "ts_lstm2_decoder_step.onnx"])])
def test_streaming_step_exports_with_dynamic_batch(file):
    """A streaming step (a VAD's cell as Gemm + Split, states in and out, silero's rows of one [2, N, H] state)
    exported at batch 2 with batch dynamic in every input runs at batch 1 and 3 as onnxruntime does (the issue's
    ``Guard failed: input.size()[0] == 2`` from such a VAD; the state's row count 2 is not the batch)."""
    model = onnx.load(FOLDER / file)
    module = onnx2torch_rnn.convert(model)
    inputs, batch = ENTRIES[file]["inputs"], torch.export.Dim("batch")
    dims = tuple({axis: batch for axis, d in enumerate(shape) if d == "batch"} for shape in inputs.values())
    example = tuple(torch.from_numpy(np.ascontiguousarray(value[:, :2] if inputs[name][0] != "batch" else value[:2]))
                    for name, value in input_sets(file)[2].items())  # batch 3, cut to 2
    program = torch.export.export(module, example, dynamic_shapes=dims).module()
    for feeds in input_sets(file)[1:3]:
        compare_with_onnxruntime(program, model, feeds)


@pytest.mark.parametrize("file", DECODERS)
def test_decoder_step_of_two_cells(file):
    """A decoder step of two cells in turn, every state passed in and returned (GRU cells written out with Linears and
    gate slices; nn.LSTMCells): each cell one LoopedRecurrent of one step, the second reading the first's new h; the
    head stays."""
    model = onnx.load(FOLDER / file)
    module = onnx2torch_rnn.convert(model)
    kind = "GRU" if "gru" in file else "LSTM"
    cells = looped(module)
    assert len(cells) == 2 and all(c.time_axis is None and type(c.layer).__name__ == f"Onnx{kind}" for c in cells)
    assert sorted(set(literal_ops(module))) == ["Gemm", "LogSoftmax"]
    calls(module, model, file)


@pytest.mark.parametrize("file", ["ts_gru2_decoder_step.onnx", "dynamo_lstm2_decoder_step.onnx"])
def test_decoder_cell_whose_state_is_not_returned_stays(file):
    """The graph returns relu(h1_n) instead of the first cell's new h: that cell's state is not the caller's and it
    stays as written; the second cell is still one LoopedRecurrent."""
    model = onnx.load(FOLDER / file)
    _state_not_returned_as(model.graph, "h1_n")
    module = onnx2torch_rnn.convert(model)
    assert len(looped(module)) == 1 and "Gemm" in literal_ops(module)
    for feeds in input_sets(file)[1:3]:
        compare_with_onnxruntime(module, model, feeds)


def _state_not_returned_as(graph, name):
    output = next(o for o in graph.output if o.name == name)
    producer = next(n for n in graph.node if name in n.output)
    producer.output[list(producer.output).index(name)] = f"{name}_cell"
    for node in graph.node:
        node.input[:] = [f"{name}_cell" if v == name else v for v in node.input]
    graph.node.append(onnx.helper.make_node("Relu", [f"{name}_cell"], [output.name]))


@pytest.mark.parametrize("file", CRNNS)
def test_crnn_bilstm_of_two_cells_stepped_in_python(file):
    """A CRNN's BiLSTM written as two nn.LSTMCells stepped over 20 columns, the backward one from the last column with
    its hs put back in order: no cell op stays (TorchScript: one bidirectional layer; dynamo: one layer per
    direction)."""
    model = onnx.load(FOLDER / file)
    module = onnx2torch_rnn.convert(model)
    assert not {"Gemm", "MatMul", "Sigmoid", "Tanh", "Split"} & set(literal_ops(module))
    directions = [m.config.direction for m in recurrent_modules(module)]
    assert sorted(directions) in (["bidirectional"], ["forward", "reverse"])
    for feeds in input_sets(file)[1:3]:
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("file", BATCH_FIRST)
def test_batch_first_loop_becomes_one_looped_recurrent(file):
    """x[:, t] per step, the hs stacked over axis 1: one LoopedRecurrent over x's axis 1; zeros made inside forward
    from x's batch are no inputs of it."""
    (fused,) = looped(check(file))
    given = "zeros" not in file
    assert fused.time_axis == 1 and fused.initial_h == given and fused.initial_c == (given and "lstm" in file)


# ---------------------------------------------------------------------------------------------------------------
# Near-misses: each changes one proven detail of an export; its nodes stay as written and still match.

def _output(graph: onnx.GraphProto, name: str) -> None:
    graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [None, None]))


def _sigmoid_before_tanh(graph, producer):
    """tanh(sigmoid(.)) in the (first) step: no cell's activation."""
    sigmoid_before_first_tanh(graph)


def _h_minus_n_swapped(graph, producer):
    """The GRU's new h is n + z * (n - h): no GRU."""
    sub = next(n for n in graph.node if n.op_type == "Sub")
    sub.input[:] = list(sub.input)[::-1]


def _weight_read_elsewhere(graph, producer):
    """The input kernel is a graph output too: a fused copy would untie it."""
    _output(graph, "cell.weight_ih")


def _middle_state_read(graph, producer):
    """The first step's h is a graph output too: the fused node does not give it."""
    first = next(n for n in graph.node if n.op_type in ("Tanh", "Relu") and n.input[0] in producer and
                 producer[n.input[0]].op_type == "Add")  # an RNN's first new h
    _output(graph, first.output[0])


def _steps_swapped_in_y(graph, producer):
    """Y stacks steps 0 and 1 swapped."""
    concat = next(n for n in graph.node if n.op_type == "Concat" and len(n.input) == 5)
    concat.input[:2] = list(concat.input[:2])[::-1]


def _other_weights_in_one_step(graph, producer):
    """The third step's recurrent Gemm reads a kernel of its own."""
    gemms = [n for n in graph.node if n.op_type == "Gemm" and n.input[1] == "cell.weight_hh"]
    weight = next(t for t in graph.initializer if t.name == "cell.weight_hh")
    other = onnx.numpy_helper.to_array(weight) * 1.5
    graph.initializer.append(onnx.numpy_helper.from_array(other.astype(np.float32), "other_weight_hh"))
    gemms[2].input[1] = "other_weight_hh"


def _state_computed(graph, producer):
    """The step reads relu(h): its state is no graph input, so one step is no streaming call (the caller carries no
    state)."""
    graph.node.insert(0, onnx.helper.make_node("Relu", ["h"], ["relu_h"]))
    for node in graph.node[1:]:
        node.input[:] = ["relu_h" if v == "h" else v for v in node.input]


def _state_not_returned(graph, producer):
    """The graph returns relu(h_n), not the new state."""
    graph.node.append(onnx.helper.make_node("Relu", ["h_n"], ["relu_h_n"]))
    graph.output[0].name = "relu_h_n"


def _row_of_a_computed_value(graph, producer):
    """h and c are rows of relu(state), not of the caller's state."""
    graph.node.insert(0, onnx.helper.make_node("Relu", ["state"], ["relu_state"]))
    for node in graph.node[1:]:
        node.input[:] = ["relu_state" if v == "state" else v for v in node.input]


def _stacked_state_not_returned(graph, producer):
    """The new states are stacked into a value the graph returns only through a Relu."""
    concat = next(n for n in graph.node if n.op_type == "Concat" and n.output[0] == "state_n")
    concat.output[0] = "stacked"
    graph.node.append(onnx.helper.make_node("Relu", ["stacked"], ["state_n"]))


NEAR_MISSES = [("ts_lstm_step_stacked_state.onnx", _row_of_a_computed_value),
               ("dynamo_lstm_step_stacked_state.onnx", _stacked_state_not_returned),
               ("ts_gru_step.onnx", _state_computed), ("dynamo_rnn_relu_step.onnx", _state_not_returned),
               ("ts_lstm_step.onnx", _sigmoid_before_tanh), ("dynamo_gru_loop.onnx", _sigmoid_before_tanh),
               ("dynamo_gru_step.onnx", _h_minus_n_swapped), ("ts_gru_loop_bf.onnx", _h_minus_n_swapped),
               ("ts_rnn_tanh_step.onnx", _weight_read_elsewhere), ("dynamo_lstm_step.onnx", _weight_read_elsewhere),
               ("ts_rnn_tanh_loop.onnx", _middle_state_read), ("dynamo_rnn_relu_loop_bf.onnx", _middle_state_read),
               ("dynamo_lstm_loop_bf.onnx", _steps_swapped_in_y), ("ts_gru_loop.onnx", _steps_swapped_in_y),
               ("ts_rnn_relu_loop_bf.onnx", _other_weights_in_one_step),
               ("ts_lstm_loop.onnx", _other_weights_in_one_step)]


@pytest.mark.parametrize("file, edit", NEAR_MISSES, ids=[f"{f}-{e.__name__}" for f, e in NEAR_MISSES])
def test_near_misses_stay_as_written(file, edit):
    model = onnx.load(FOLDER / file)
    edit(model.graph, {o: n for n in model.graph.node for o in n.output})
    module = onnx2torch_rnn.convert(model)
    assert not looped(module) and "Gemm" in literal_ops(module)
    for feeds in input_sets(file)[1:3]:
        compare_with_onnxruntime(module, model, feeds)


def test_streaming_step_with_a_head():
    """The new h is returned and also read by a linear head: the step is fused, the head stays."""
    model = onnx.load(FOLDER / "ts_lstm_step.onnx")
    weight = np.random.default_rng(4).standard_normal((8, 3)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(weight, "head_weight"))
    model.graph.node.append(onnx.helper.make_node("MatMul", [model.graph.output[0].name, "head_weight"], ["scores"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, ["batch", 3]))
    module = onnx2torch_rnn.convert(model)
    assert len(looped(module)) == 1 and literal_ops(module) == ["MatMul"]
    for feeds in input_sets("ts_lstm_step.onnx")[1:3]:
        compare_with_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("file, axis", [("dynamo_gru_step.onnx", None), ("ts_lstm_loop_bf.onnx", 1)])
def test_codegen_writes_the_time_axis(file, axis, tmp_path):
    """The generated code builds the same LoopedRecurrent, its time axis included."""
    from onnx2torch_rnn import codegen

    model = onnx.load(FOLDER / file)
    converted = codegen.write(model, tmp_path)
    rebuilt = codegen.load_generated(tmp_path).load()
    assert f"time_axis={axis}" in (tmp_path / "model.py").read_text()
    feeds = input_sets(file)[2]
    args = [torch.from_numpy(v) for v in feeds.values()]
    with torch.no_grad():
        for got, want in zip(rebuilt(*args), converted(*args), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    compare_with_onnxruntime(rebuilt, model, feeds)


def test_looped_recurrent_refuses_another_time_axis():
    layer = looped(onnx2torch_rnn.convert(FOLDER / "ts_rnn_tanh_step.onnx"))[0].layer
    with pytest.raises(ValueError, match="time_axis must be 0, 1 or None"):
        LoopedRecurrent(layer, time_axis=2)
