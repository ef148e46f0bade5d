"""ONNX -> torch -> ONNX: torch.onnx.export of converted models, run by onnxruntime at other shapes.

- TorchScript exporter (dynamo=False): traces the eager path; fast-path modules come back as native LSTM/GRU/RNN
  nodes (torch.lstm & co. with pack_padded_sequence for sequence_lens). The exact path's own cell loop would be
  unrolled for the traced length, so it is not round-tripped this way.
- Dynamo exporter (dynamo=True) with ``onnx_translation_table()``: the recurrence is one custom op, translated back
  into the ONNX node it came from, for both paths: a one-node model stays one node.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from torch.export import Dim

import onnx2torch_rnn
from onnx2torch_rnn.recurrent import onnx_translation_table
from tests.recurrent_models import MATRIX, SUBSET, assert_same, convert, inputs, matrix, states
from tests.shape_patterns import PATTERNS, pattern_model, x_of

# Expected here: tracing reads sizes as Python values (the exporter records the shape arithmetic separately), the
# TorchScript exporter is the legacy one, and its batch-size warning does not apply (zero states follow the batch).
pytestmark = [pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export"),
              pytest.mark.filterwarnings("ignore:Exporting a model to ONNX with a batch_size other than 1")]

EXAMPLE = Path(__file__).parent.parent / "examples" / "bilstm_tagger.onnx"
FAST = [case for case in MATRIX if case[2] == "fast"]


def names(op: str, lens: bool) -> tuple[list[str], list[str]]:
    return ["X"] + ["sequence_lens"] * lens, ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]


def run_onnxruntime(model: onnx.ModelProto, args) -> tuple[torch.Tensor, ...]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
    return tuple(torch.from_numpy(out) for out in session.run(None, feeds))


def check_at_other_shapes(model: onnx.ModelProto, gm, lens: bool) -> None:
    for batch, steps in [(3, 7), (4, 2)]:
        args = inputs(batch, steps, lens, seed=steps)
        with torch.no_grad():
            assert_same(run_onnxruntime(model, args), gm(*args))


@pytest.mark.parametrize("op, direction, path, lens", [
    pytest.param(*case, id="-".join(map(str, case)), marks=() if case in SUBSET else pytest.mark.slow)
    for case in FAST])
def test_torchscript_exporter(op, direction, path, lens):
    gm = convert(op, direction, path, lens)
    input_names, output_names = names(op, lens)
    axes = {"X": {0: "T", 1: "N"}, "sequence_lens": {0: "N"}, **{name: {} for name in output_names}}
    buffer = io.BytesIO()
    # output_names are required: without them the exporter mistakes the fx GraphModule for a ScriptModule
    torch.onnx.export(gm, inputs(2, 5, lens), buffer, dynamo=False, input_names=input_names,
                      output_names=output_names, dynamic_axes={k: v for k, v in axes.items() if k in input_names},
                      opset_version=17)
    model = onnx.load_from_string(buffer.getvalue())
    op_types = [n.op_type for n in model.graph.node]
    assert op_types.count(op) == 1 and not {"Loop", "Scan", "MatMul"} & set(op_types), op_types
    check_at_other_shapes(model, gm, lens)


@pytest.mark.compile
@pytest.mark.parametrize("op, direction, path, lens", matrix(pytest.mark.slow))
def test_dynamo_exporter(op, direction, path, lens):
    gm = convert(op, direction, path, lens)
    batch = Dim("batch")
    dynamic_shapes = {"X": {0: Dim("steps"), 1: batch}, **({"sequence_lens": {0: batch}} if lens else {})}
    program = torch.onnx.export(gm, inputs(2, 5, lens), dynamo=True, dynamic_shapes=dynamic_shapes,
                                custom_translation_table=onnx_translation_table(), verbose=False)
    model = program.model_proto
    assert [n.op_type for n in model.graph.node] == [op]  # the weights' reordering is folded into initializers
    check_at_other_shapes(model, gm, lens)


@pytest.mark.compile
@pytest.mark.parametrize("dynamo", [False, True])
def test_bundled_example(dynamo):
    gm = onnx2torch_rnn.convert(EXAMPLE)
    tokens = torch.randint(0, 50, (2, 5))
    if dynamo:
        model = torch.onnx.export(gm, (tokens,), dynamo=True, custom_translation_table=onnx_translation_table(),
                                  dynamic_shapes={"tokens": {0: Dim("batch"), 1: Dim("time")}},
                                  verbose=False).model_proto
    else:
        buffer = io.BytesIO()
        torch.onnx.export(gm, (tokens,), buffer, dynamo=False, input_names=["tokens"], output_names=["scores"],
                          dynamic_axes={"tokens": {0: "batch", 1: "time"}})
        model = onnx.load_from_string(buffer.getvalue())
    assert [n.op_type for n in model.graph.node].count("LSTM") == 2
    for shape in [(1, 1), (3, 9)]:
        tokens = torch.randint(0, 50, shape)
        with torch.no_grad():
            assert_same(run_onnxruntime(model, (tokens,)), gm(tokens))


def test_round_trip_keeps_attributes():
    """Everything the node said comes back: clip, activations with their alpha/beta, direction, layout-free."""
    from onnx import helper

    from tests.helpers import make_model

    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((2, 12, 3)).astype(np.float32),
               "R": rng.standard_normal((2, 12, 4)).astype(np.float32)}
    node = helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=4, direction="bidirectional",
                            clip=2.5, activations=["HardSigmoid", "LeakyRelu", "Sigmoid", "ScaledTanh"],
                            activation_alpha=[0.3, 0.2, 0.7], activation_beta=[0.4, 1.5])
    gm = onnx2torch_rnn.convert(make_model([node], [("X", np.float32, ["T", "N", 3])], ["Y", "Y_h"], weights))
    program = torch.onnx.export(gm, inputs(2, 5, False), dynamo=True, custom_translation_table=onnx_translation_table(),
                                dynamic_shapes={"X": {0: Dim("steps"), 1: Dim("batch")}}, verbose=False)
    (exported,) = program.model_proto.graph.node
    attributes = {a.name: helper.get_attribute_value(a) for a in exported.attribute}
    assert attributes["clip"] == pytest.approx(2.5)
    assert [a.decode() for a in attributes["activations"]] == ["HardSigmoid", "LeakyRelu", "Sigmoid", "ScaledTanh"]
    assert attributes["activation_alpha"] == pytest.approx([0.3, 0.2, 0.7])
    assert attributes["activation_beta"] == pytest.approx([0.4, 1.5])
    check_at_other_shapes(program.model_proto, gm, False)


@pytest.mark.compile
def test_dynamo_exporter_layout_1_with_initial_states():
    """onnxruntime rejects layout=1: the translation transposes around a layout-0 node instead."""
    gm = convert("LSTM", "bidirectional", "exact", lens=True, initial=True, layout=1)
    batch = Dim("batch")
    shapes = {"X": {0: batch, 1: Dim("steps")}, "sequence_lens": {0: batch}, "initial_h": {0: batch},
              "initial_c": {0: batch}}
    args = (*inputs(2, 5, True, layout=1), *states("LSTM", "bidirectional", 2, 1))
    model = torch.onnx.export(gm, args, dynamo=True, dynamic_shapes=shapes, verbose=False,
                              custom_translation_table=onnx_translation_table()).model_proto
    assert [n.op_type for n in model.graph.node].count("LSTM") == 1
    for n, t in [(3, 7), (4, 2)]:
        args = (*inputs(n, t, True, seed=t, layout=1), *states("LSTM", "bidirectional", n, 1, seed=t))
        with torch.no_grad():
            assert_same(run_onnxruntime(model, args), gm(*args))


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_shape_arithmetic(pattern, dynamo):
    """Sizes computed from x.shape come back as shape arithmetic, not as the traced numbers."""
    gm = onnx2torch_rnn.convert(pattern_model(pattern))
    outputs = ["y", "order"] if pattern == "topk" else ["y"]
    if dynamo:
        model = torch.onnx.export(gm, (x_of(2, 5),), dynamo=True, dynamic_shapes={"x": {0: Dim("n"), 1: Dim("m")}},
                                  custom_translation_table=onnx_translation_table(), verbose=False).model_proto
    else:
        buffer = io.BytesIO()
        torch.onnx.export(gm, (x_of(2, 5),), buffer, dynamo=False, input_names=["x"], output_names=outputs,
                          dynamic_axes={"x": {0: "n", 1: "m"}})
        model = onnx.load_from_string(buffer.getvalue())
    for batch, steps in [(4, 3), (3, 8)]:
        x = x_of(batch, steps)
        with torch.no_grad():
            assert_same(run_onnxruntime(model, (x,)), gm(x))
