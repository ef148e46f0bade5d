"""Recognition of Loops of one cell step (onnx2torch_rnn/passes/loops.py): tf2onnx's Keras LSTM / GRU / SimpleRNN.

tests/exporters/test_tf2onnx.py compares every Keras model (fused) with onnxruntime on four input sets and trains it;
here: which cell each Loop becomes with which attributes, masks with holes, torch.export with dynamic batch and time
and torch.compile in one graph, and near-misses (every proven detail changed) that must stay Loops and still match.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn.modules.control_flow import Loop
from tests.exporters.common import MODELS, compare_with_onnxruntime, manifest_input_sets, read_manifest
from tests.helpers import assert_fused_trains_like_literal, looped, sigmoid_before_first_tanh

KERAS = MODELS / "keras"
MANIFEST = read_manifest(KERAS)
ENTRIES = {e["file"]: e for e in MANIFEST["models"]}
LOOPS = sorted(f for f, e in ENTRIES.items() if "Loop" in e["emitted"] and e["case"] != "custom_cell")
# case -> (ONNX op, activations, linear_before_reset) of its Loops' cells
CELLS = {
    "gru_reset_after": ("GRU", ["Sigmoid", "Tanh"], 1), "gru_reset_before": ("GRU", ["Sigmoid", "Tanh"], 0),
    "gru_go_backwards": ("GRU", ["Sigmoid", "Tanh"], 1), "gru_last_state": ("GRU", ["Sigmoid", "Tanh"], 1),
    "gru_hard_sigmoid": ("GRU", ["HardSigmoid", "Tanh"], None), "masking_gru": ("GRU", ["Sigmoid", "Tanh"], None),
    "bi_gru_sum": ("GRU", ["Sigmoid", "Tanh"], 1), "lstm_hard_sigmoid": ("LSTM", ["HardSigmoid", "Tanh", "Tanh"], 0),
    "embedding_mask_lstm": ("LSTM", ["Sigmoid", "Tanh", "Tanh"], 0), "tagger": ("LSTM", ["Sigmoid", "Tanh", "Tanh"], 0),
    "stacked": ("GRU", ["Sigmoid", "Tanh"], 1), "simple_rnn": ("RNN", ["Tanh"], 0),
    "simple_rnn_relu_last": ("RNN", ["Relu"], 0), "bi_rnn_last": ("RNN", ["Tanh"], 0),
    "lstm_recurrent_dropout": ("LSTM", ["Sigmoid", "Tanh", "Tanh"], 0),
    "bi_gru_dropout": ("GRU", ["Sigmoid", "Tanh"], 1),
    "bi_lstm_float16": ("LSTM", ["Sigmoid", "Tanh", "Tanh"], 0), "gru_float16": ("GRU", ["Sigmoid", "Tanh"], 1),
}
MASKED = ("embedding_mask_lstm", "masking_gru", "tagger")


def input_sets(file: str) -> list[dict[str, np.ndarray]]:
    return manifest_input_sets(KERAS, ENTRIES[file], MANIFEST["sizes"])


@pytest.mark.parametrize("file", LOOPS)
def test_each_keras_loop_becomes_its_cell(file):
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    case = ENTRIES[file]["case"]
    op, activations, linear_before_reset = CELLS[case]
    cells = looped(module)
    assert len(cells) == [n.op_type for n in model.graph.node].count("Loop")
    assert not any(isinstance(m, Loop) for m in module.modules())
    for cell in cells:
        layer = cell.layer
        assert type(layer).__name__ == f"Onnx{op}"
        assert [a.name for a in layer.config.onnx_activations()] == activations
        if linear_before_reset is not None:
            assert layer.config.linear_before_reset == bool(linear_before_reset)
        assert cell.mask == (case in MASKED) and (layer.config.mask_output is not None) == cell.mask
        assert not cell.initial_h and not cell.initial_c  # tf2onnx's zero states are proven and dropped
    for feeds in input_sets(file)[1:]:
        compare_with_onnxruntime(module, model, feeds)


def test_hard_sigmoid_spellings_are_both_exact():
    """Keras 3 writes hard_sigmoid as Clip(x + 3, 0, 6) * (1/6), tf_keras as Max(Min(0.2 x + 0.5, 1), 0)."""
    for file, alpha in (("keras3_lstm_hard_sigmoid.onnx", 1 / 6), ("tf_keras_gru_hard_sigmoid.onnx", 1.0)):
        (cell,) = looped(onnx2torch_rnn.convert(KERAS / file))
        hard = cell.layer.config.onnx_activations()[0]
        assert hard.name == "HardSigmoid" and hard.alpha == pytest.approx(alpha) and hard.beta == 0.0


@pytest.mark.parametrize("file", ["keras3_embedding_mask_lstm.onnx", "tf_keras_embedding_mask_lstm.onnx",
                                  "keras3_masking_gru.onnx", "tf_keras_masking_gru.onnx", "tf_keras_tagger.onnx"])
def test_masks_with_holes(file):
    """A mask is not always post-padded: masked steps in the middle keep the state and hold (or zero) the output."""
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    feeds = input_sets(file)[-1]
    (name, x), = feeds.items()
    x = x.copy()
    x[0, 1] = 0  # a hole after the first step
    x[-1, ::2] = 0  # every other step of the last row, the first one included
    compare_with_onnxruntime(module, model, {name: x})


@pytest.mark.compile
@pytest.mark.parametrize("file", ["keras3_masking_gru.onnx", "tf_keras_embedding_mask_lstm.onnx",
                                  "keras3_gru_reset_before.onnx", "tf_keras_simple_rnn.onnx", "keras3_tagger.onnx",
                                  "keras3_bi_gru_sum.onnx", "keras3_gru_go_backwards.onnx",
                                  "keras3_bi_lstm_float16.onnx", "tf_keras_bi_gru_dropout.onnx"])
def test_fused_loops_export_with_dynamic_batch_and_time_and_compile_in_one_graph(file):
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    sets = input_sets(file)
    (x,) = sets[0].values()
    batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=2)
    exported = torch.export.export(module, (torch.from_numpy(x),), dynamic_shapes=({0: batch, 1: time},)).module()
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend="eager")
    for feeds in sets[1:]:
        for runner in (exported, compiled):
            compare_with_onnxruntime(runner, model, feeds)


def top_level(module) -> list[str]:
    return [type(module.get_submodule(n.target)).__name__ for n in module.graph.nodes if n.op == "call_module"]


# a Keras backward layer's Loop reads x reversed by a ReverseSequence of all of it (and a Bidirectional reverses its Y
# back): the reversals go with the Loop, a reverse layer over x (Y in processing order unless reversed back)
BACKWARD = {
    "keras3_bi_gru_sum.onnx": (["Transpose", "LoopedRecurrent", "LoopedRecurrent", "Function", "Transpose"],
                               [("forward", False), ("reverse", False)]),
    "keras3_bi_rnn_last.onnx": (["Transpose", "LoopedRecurrent", "LoopedRecurrent", "Slice", "Squeeze", "Slice",
                                 "Squeeze", "Concat"], [("forward", False), ("reverse", True)]),
    "tf_keras_bi_rnn_last.onnx": (["Transpose", "LoopedRecurrent", "LoopedRecurrent", "Slice", "Squeeze", "Slice",
                                   "Squeeze", "Concat"], [("forward", False), ("reverse", True)]),
    "keras3_gru_go_backwards.onnx": (["Transpose", "LoopedRecurrent", "Slice", "Squeeze"], [("reverse", True)]),
}


@pytest.mark.parametrize("file", sorted(BACKWARD))
def test_backward_loops_read_x_in_its_own_order(file):
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    modules, directions = BACKWARD[file]
    assert top_level(module) == modules
    assert sorted((c.layer.config.direction, c.y_backwards) for c in looped(module)) == directions
    for feeds in input_sets(file):
        compare_with_onnxruntime(module, model, feeds)


def test_backward_loop_keeps_a_reversal_of_given_lengths():
    """The reversal of x and of Y read Min(T, given lengths): both stay, the Loop a forward layer over them."""
    file = "keras3_bi_gru_sum.onnx"
    model = onnx.load(KERAS / file)
    for k, reverse in enumerate([n for n in model.graph.node if n.op_type == "ReverseSequence"]):
        model.graph.node.insert(list(model.graph.node).index(reverse), onnx.helper.make_node(
            "Min", [reverse.input[1], "lengths"], [f"given_lengths_{k}"]))
        reverse.input[1] = f"given_lengths_{k}"
    model.graph.input.append(onnx.helper.make_tensor_value_info("lengths", onnx.TensorProto.INT64, ["batch"]))
    module = onnx2torch_rnn.convert(model)
    assert top_level(module).count("ReverseSequence") == 2
    assert [(c.layer.config.direction, c.y_backwards) for c in looped(module)] == [("forward", False)] * 2
    for k, feeds in enumerate(input_sets(file)):
        time = feeds["x"].shape[1]
        feeds["lengths"] = np.array([time, 2, 1][: len(feeds["x"])] if k else [time] * len(feeds["x"]), np.int64)
        compare_with_onnxruntime(module, model, feeds)


# ---------------------------------------------------------------------------------------------------------------
# Near-misses: each changes one proven detail; the Loop must stay a Loop and the result still match.

def _body(model: onnx.ModelProto) -> onnx.GraphProto:
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    return next(a.g for a in loop.attribute if a.name == "body")


def _extra_op_in_the_cell(model):
    sigmoid_before_first_tanh(_body(model))


def _three_steps(model):
    """The trip count is 3, not T: the loop stops early."""
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    model.graph.initializer.append(numpy_helper.from_array(np.array(3, np.int64), "three"))
    loop.input[0] = "three"


def _shared_weight(model):
    """The recurrent kernel is also a graph output: a fused copy would untie it."""
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    kernel = next(v for v in loop.input[2:] if v in {t.name for t in model.graph.initializer}
                  and len(next(t for t in model.graph.initializer if t.name == v).dims) == 2)
    model.graph.node.append(helper.make_node("Identity", [kernel], ["kernel_out"]))
    model.graph.output.append(helper.make_tensor_value_info("kernel_out", onnx.TensorProto.FLOAT, [None, None]))


def _counter_read_outside(model):
    """The loop's final time counter is a graph output: the fused node cannot give it."""
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    model.graph.node.append(helper.make_node("Cast", [loop.output[0]], ["steps_out"], to=onnx.TensorProto.FLOAT))
    model.graph.output.append(helper.make_tensor_value_info("steps_out", onnx.TensorProto.FLOAT, []))


@pytest.mark.parametrize("change", [_extra_op_in_the_cell, _three_steps, _shared_weight, _counter_read_outside])
@pytest.mark.parametrize("file", ["keras3_gru_reset_before.onnx", "tf_keras_masking_gru.onnx"])
def test_near_misses_stay_loops_and_still_match(file, change):
    model = onnx.load(KERAS / file)
    change(model)
    module = onnx2torch_rnn.convert(model)
    assert not looped(module) and any(isinstance(m, Loop) for m in module.modules())
    for feeds in input_sets(file)[1:]:
        compare_with_onnxruntime(module, model, feeds)


def _dropout_mask_per_step(model):
    """The recurrent dropout mask (ones_like(h) at inference) is multiplied by the iteration number: h is scaled by a
    value that changes from step to step, no cell's weight."""
    body = _body(model)
    ones = next(n for n in body.node if n.op_type == "ConstantOfShape")
    for node in body.node:
        node.input[:] = ["scaled" if v == ones.output[0] else v for v in node.input]
    at = list(body.node).index(ones) + 1
    body.node.insert(at, helper.make_node("Mul", [ones.output[0], "step"], ["scaled"]))
    body.node.insert(at, helper.make_node("Cast", [body.input[0].name], ["step"], to=onnx.TensorProto.FLOAT))
    onnx.checker.check_model(model)


@pytest.mark.parametrize("file", ["tf_keras_lstm_recurrent_dropout.onnx", "keras3_lstm_recurrent_dropout.onnx"])
def test_recurrent_dropout_is_the_identity_at_inference(file):
    """tf_keras multiplies h by ones_like(h) (ConstantOfShape of its Shape) before each recurrent product: the Loop is
    the LSTM; a mask that changes per step is none, and the Loop stays."""
    model = onnx.load(KERAS / file)
    (cell,) = looped(onnx2torch_rnn.convert(model))
    assert type(cell.layer).__name__ == "OnnxLSTM"
    if not any(n.op_type == "ConstantOfShape" for n in _body(model).node):
        return  # Keras 3 writes no mask at inference
    _dropout_mask_per_step(model)
    module = onnx2torch_rnn.convert(model)
    assert not looped(module) and any(isinstance(m, Loop) for m in module.modules())
    for feeds in input_sets(file)[1:]:
        compare_with_onnxruntime(module, model, feeds)


def test_a_non_zero_initial_state_is_passed_not_dropped():
    """The zeros the state starts from become 0.5: still the cell, with the initial state given at run time."""
    model = onnx.load(KERAS / "keras3_simple_rnn.onnx")
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    expand = next(n for n in model.graph.node if n.op_type == "Expand" and n.output[0] in loop.input)
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    expand.input[0] = "half"
    module = onnx2torch_rnn.convert(model)
    (cell,) = looped(module)
    assert cell.initial_h
    for feeds in input_sets("keras3_simple_rnn.onnx"):
        compare_with_onnxruntime(module, model, feeds)


def test_fused_and_literal_loops_train_alike():
    """The fused cell's weights are the Loop's weights rearranged: the same loss and the same gradient at the
    input."""
    file = "tf_keras_masking_gru.onnx"
    fused, literal = assert_fused_trains_like_literal(KERAS / file, next(iter(input_sets(file)[0].values())))
    assert looped(fused) and not looped(literal)


@pytest.mark.parametrize("file", ["keras3_bi_lstm_float16.onnx", "keras3_gru_float16.onnx"])
def test_float16_loops_compute_as_onnxruntime_runs_them(file):
    """mixed_float16 cells: onnxruntime has no float16 kernels for their arithmetic on CPU, so it runs the body in
    float32 on the float32 weights (the Casts of the weights dropped; the GRU's bias, read through a Split, rounded)
    and rounds only what the Loop carries, the states, after every step. The recognised layer does the same
    (state_dtype): over 60 steps at most 1% of the outputs differ, by one unit in the last place (arithmetic order;
    a few subnormal units near 0).
    Computed in float32 with float32 states and rounded weights, as before, about half of them differed, by up to
    3 units."""
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    assert {cell.layer.config.state_dtype for cell in looped(module)} == {"float16"}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, grad in ((0, False), (1, False), (0, True)):  # inference: the kernel step by step; grad: the cell loop
        x = np.random.default_rng(seed).standard_normal([4, 60, 5]).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        with torch.set_grad_enabled(grad):
            got = module(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2**-10, atol=2**-20)  # one unit
        assert (got != want).mean() < 0.01
