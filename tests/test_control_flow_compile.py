"""Control flow on data in one graph: If as torch.cond, Loop and Scan as torch.while_loop (modules/control_flow.py),
under torch.compile(fullgraph=True) and torch.export, against onnxruntime.

The Keras models are tf2onnx's spelled-out recurrences: a Loop whose trip count is the sequence length read from
Shape (keras3) or that only has a condition (tf_keras), carrying time, state and weights, with the per-step output as
a scan output. They convert with ``fuse=False``, so that the Loop itself is what runs (recognition would replace it
by a recurrent module). Export and compile each run two models by default and, with ``-m slow``, one model per
structural variant of the Loop (SWEPT_*): the other models differ from those only in the cell's arithmetic, which the
eager tests (tests/exporters) cover; compiling all 30 twice was most of CI's slow stage. Each swept variant is
exported or compiled, not both (the two trace the same Loop; exporting it costs 1.5-2x compiling it), so that every
variant goes through each of the two where it has a model per exporter.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch.export import Dim

import onnx2torch_rnn
from onnx2torch_rnn.modules.control_flow import If, Loop, Scan
from tests.control_flow_models import if_model, loop_model, scan_model
from tests.exporters.common import MODELS, compare_with_onnxruntime, manifest_input_sets, read_manifest
from tests.helpers import make_model
from tests.recurrent_models import CountingBackend

pytestmark = pytest.mark.compile

KERAS = MODELS / "keras"
_MANIFEST = read_manifest(KERAS)
# by default: a trip count and a condition (keras3), a condition only and a mask (tf_keras); shape arithmetic inside
# the body is keras3_custom_cell's, whose to_onnx round trip (tests/test_to_onnx.py) exports it the same way
EXPORTED = ["keras3_simple_rnn", "tf_keras_masking_gru"]
COMPILED = ["tf_keras_simple_rnn", "keras3_stacked"]  # keras3_stacked: Squeeze of a slice of a scan output
# with -m slow, per exporter: backwards, bidirectional, masks (exported by default: tf_keras_masking_gru), a custom
# cell, float16, dropout, hard sigmoid; the reset-before GRU both ways (the cheapest)
SWEPT_EXPORTED = ["keras3_lstm_hard_sigmoid", "keras3_custom_cell", "keras3_lstm_recurrent_dropout",
                  "tf_keras_gru_reset_before", "tf_keras_bi_rnn_last"]
SWEPT_COMPILED = ["keras3_gru_go_backwards", "keras3_bi_gru_sum", "keras3_embedding_mask_lstm",
                  "keras3_bi_lstm_float16", "tf_keras_gru_reset_before", "tf_keras_embedding_mask_lstm",
                  "tf_keras_custom_cell", "tf_keras_bi_gru_dropout"]
LIMIT = 2**31 - 1  # tf2onnx's Slice ends are INT32_MAX: the exported program checks that sizes stay below


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _keras(name: str):
    entry = next(e for e in _MANIFEST["models"] if e["file"] == f"{name}.onnx")
    model = onnx.load(KERAS / entry["file"])
    module = onnx2torch_rnn.convert(model, fuse=False)
    assert any(isinstance(m, Loop) for m in module.modules())
    return model, module, manifest_input_sets(KERAS, entry, entry.get("sizes", _MANIFEST["sizes"]))


def _torch(model: onnx.ModelProto, feeds: dict) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.array(feeds[i.name])) for i in model.graph.input if i.name in feeds)


def _dims(model: onnx.ModelProto, feeds: dict) -> tuple:
    """Every symbolic input dim dynamic, one Dim per dim name (batch and time)."""
    dims = {}
    return tuple({axis: dims.setdefault(d.dim_param, Dim(f"d{len(dims)}", max=LIMIT))
                  for axis, d in enumerate(i.type.tensor_type.shape.dim) if d.dim_param}
                 for i in model.graph.input if i.name in feeds)


@pytest.mark.parametrize("name", [*EXPORTED, *(pytest.param(n, marks=pytest.mark.slow) for n in SWEPT_EXPORTED)])
def test_keras_loop_exports_with_dynamic_batch_and_time(name):
    model, module, sets = _keras(name)
    program = torch.export.export(module, _torch(model, sets[0]), dynamic_shapes=_dims(model, sets[0]))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any("while_loop" in t for t in targets), targets
    for feeds in sets:  # two input sets of the export's sizes, then another batch and sequence length
        compare_with_onnxruntime(program.module(), model, feeds)


@pytest.mark.parametrize("name", [*COMPILED, *(pytest.param(n, marks=pytest.mark.slow) for n in SWEPT_COMPILED)])
def test_keras_loop_compiles_in_one_graph(name):
    model, module, sets = _keras(name)
    backend = CountingBackend()
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    for feeds in sets:
        compare_with_onnxruntime(compiled, model, feeds)
    assert backend.graphs <= 2  # automatic dynamic: one recompile when batch and time first change


# ---- onnx.helper models: every path of the structured forms --------------------------------------------------------


def _both(module: torch.nn.Module, args: tuple, dynamic_shapes=None) -> list:
    """The module compiled (fullgraph, aot_eager) and exported, with the backend that counts compiled graphs."""
    backend = CountingBackend()
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    return [compiled, program.module()], backend


def _expect(model, feeds, runs) -> None:
    for run in runs:
        compare_with_onnxruntime(run, model, feeds)


def test_if_on_data_is_torch_cond():
    model = if_model(17)
    module = onnx2torch_rnn.convert(model)
    feeds = [{"x": np.float32([1.0, 2.0, 3.0]) * sign, "bias": np.float32([0.5, 0.25, -1.0])} for sign in (1, -1)]
    runs, backend = _both(module, _torch(model, feeds[0]))
    for f in feeds + feeds:  # both branches from one graph
        _expect(model, f, runs)
    assert backend.graphs == 1


def test_if_branches_of_different_ranks_refuse_to_compile():
    """ONNX lets the branches differ in shape; torch.cond merges different sizes, not different ranks."""
    then_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["a"])], "then", [],
                                    [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])])
    else_branch = helper.make_graph([helper.make_node("Unsqueeze", ["x", "axes"], ["b"])], "else", [],
                                    [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 2])])
    nodes = [helper.make_node("If", ["flag"], ["r"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0)]
    model = make_model(nodes, [("flag", np.bool_, []), ("x", np.float32, [2])], [("y", np.float32, [])],
                       {"axes": np.int64([0])})
    module = onnx2torch_rnn.convert(model)
    (if_module,) = [m for m in module.modules() if isinstance(m, If)]
    assert if_module.uncompilable.startswith("output 0 has rank 1 in then_branch and 2 in else_branch")
    args = (torch.tensor(True), torch.ones(2))
    assert module(*args) == module(torch.tensor(False), args[1]) == 2  # eager as before
    message = "If cannot be compiled in one graph: output 0 has rank 1 in then_branch and 2 in else_branch"
    with pytest.raises(Exception, match=message):
        torch.compile(module, fullgraph=True, backend="eager")(*args)
    with pytest.raises(Exception, match=message):
        torch.export.export(module, args)


@pytest.mark.parametrize("trip_count, cond, scan_output", [("M", "c", True), ("M", "", True), ("", "c", True),
                                                           ("M", "c", False)])
def test_loop_stops_where_onnxruntime_does(trip_count, cond, scan_output):
    """The body's cond output stops the loop early (sum(h) reaches the limit, or i reaches 9); the trip count and
    the initial condition decide how many steps run at most; zero iterations included. One compiled graph, one
    exported program, for every count."""
    model = loop_model(17, trip_count, cond, scan_output)
    module = onnx2torch_rnn.convert(model)
    rng = np.random.default_rng(0)
    cases = []
    # without a cond input, ONNX ignores the body's cond output and onnxruntime does not: no early stop there
    stops = [(6, True, 3.0)] if cond else []
    for trips, go, scale in [(4, True, 0.3), *stops, (0, True, 0.3), (5, False, 0.3), (2, True, 0.3)]:
        feeds = {"xs": rng.standard_normal((6, 2, 3)).astype(np.float32) * scale,
                 "h0": rng.standard_normal((2, 3)).astype(np.float32) * 0.3}
        feeds |= {"M": np.array(trips, np.int64)} if trip_count else {}
        feeds |= {"c": np.array(go)} if cond else {}
        if trip_count or go:  # a loop with a condition only that is False from the start: onnxruntime's zero-row
            cases.append(feeds)  # scan output has its static shape; ours too, checked by the test below
    runs, backend = _both(module, _torch(model, cases[0]))
    for feeds in cases:
        _expect(model, feeds, runs)
    assert backend.graphs == 1


def test_loop_scan_outputs_of_zero_iterations():
    model = loop_model(17, "M", "c")
    module = onnx2torch_rnn.convert(model)
    args = (torch.randn(6, 2, 3), torch.randn(2, 3), torch.tensor(3), torch.tensor(True))
    runs, _ = _both(module, args)
    for trips, go in [(0, True), (3, False)]:
        h0 = torch.randn(2, 3)
        for run in runs:
            h_final, h_all = run(args[0], h0, torch.tensor(trips), torch.tensor(go))
            assert torch.equal(h_final, h0) and h_all.shape == (0, 2, 3)


def _nestedloop_model():
    """Loop(M) over rows of xs: an inner Loop(i + 1) sums the rows up to i (reading the outer body's i and the outer
    graph's xs), an If inside the inner body scales by -1 the rows where the running sum is negative."""
    info = helper.make_tensor_value_info
    flip = helper.make_graph([helper.make_node("Neg", ["row"], ["flipped"])], "flip", [],
                             [info("flipped", TensorProto.FLOAT, [3])])
    keep = helper.make_graph([helper.make_node("Identity", ["row"], ["kept"])], "keep", [],
                             [info("kept", TensorProto.FLOAT, [3])])
    inner = helper.make_graph([
        helper.make_node("Gather", ["xs", "j"], ["row"], axis=0),
        helper.make_node("ReduceSum", ["acc_in"], ["total"], keepdims=0),
        helper.make_node("Less", ["total", "zero"], ["negative"]),
        helper.make_node("If", ["negative"], ["signed"], then_branch=flip, else_branch=keep),
        helper.make_node("Add", ["acc_in", "signed"], ["acc_out"]),
        helper.make_node("Identity", ["inner_c_in"], ["inner_c_out"])],
        "inner", [info("j", TensorProto.INT64, []), info("inner_c_in", TensorProto.BOOL, []),
                  info("acc_in", TensorProto.FLOAT, [3])],
        [info("inner_c_out", TensorProto.BOOL, []), info("acc_out", TensorProto.FLOAT, [3])])
    outer = helper.make_graph([
        helper.make_node("Add", ["i", "one"], ["count"]),
        helper.make_node("Loop", ["count", "", "start"], ["summed"], body=inner),
        helper.make_node("Add", ["state_in", "summed"], ["state_out"]),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("Identity", ["summed"], ["per_step"])],
        "outer", [info("i", TensorProto.INT64, []), info("c_in", TensorProto.BOOL, []),
                  info("state_in", TensorProto.FLOAT, [3])],
        [info("c_out", TensorProto.BOOL, []), info("state_out", TensorProto.FLOAT, [3]),
         info("per_step", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("Loop", ["M", "", "state0"], ["state", "steps"], body=outer)]
    init = {"one": np.array(1, np.int64), "zero": np.float32(0.0), "start": np.zeros(3, np.float32)}
    return make_model(nodes, [("xs", np.float32, ["rows", 3]), ("state0", np.float32, [3]), ("M", np.int64, [])],
                      [("state", np.float32, [3]), ("steps", np.float32, ["M", 3])], init)


def test_nested_loops_and_if():
    model = _nestedloop_model()
    module = onnx2torch_rnn.convert(model)
    rng = np.random.default_rng(1)
    cases = [{"xs": rng.standard_normal((rows, 3)).astype(np.float32), "state0": np.ones(3, np.float32),
              "M": np.array(trips, np.int64)} for rows, trips in [(5, 4), (7, 7), (6, 0), (3, 2)]]
    runs, backend = _both(module, _torch(model, cases[0]), dynamic_shapes=({0: Dim("rows")}, None, None))
    for feeds in cases:
        _expect(model, feeds, runs)
    assert backend.graphs <= 2


@pytest.mark.parametrize("input_axis, input_direction, output_axis, output_direction",
                         [(0, 0, 0, 0), (1, 1, 1, 1), (-2, 1, -1, 0)])
def test_scan_with_dynamic_length(input_axis, input_direction, output_axis, output_direction):
    model = scan_model(16, input_axis, input_direction, output_axis, output_direction)
    axis = input_axis % 2
    model.graph.input[1].type.tensor_type.shape.dim[axis].dim_param = "steps"
    model.graph.output[1].type.tensor_type.shape.dim[output_axis].dim_param = "steps"
    module = onnx2torch_rnn.convert(model)
    assert any(isinstance(m, Scan) for m in module.modules())
    rng = np.random.default_rng(2)
    cases = [{"s0": rng.standard_normal(2).astype(np.float32),
              "xs": rng.standard_normal([steps, 2] if axis == 0 else [2, steps]).astype(np.float32)}
             for steps in (4, 7, 2)]
    runs, backend = _both(module, _torch(model, cases[0]), dynamic_shapes=(None, {axis: Dim("steps")}))
    for feeds in cases:
        _expect(model, feeds, runs)
    assert backend.graphs <= 2  # automatic dynamic: one recompile when the length first changes


def test_loop_carrying_a_growing_value_says_why_it_cannot_compile():
    info = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("Concat", ["acc_in", "piece"], ["acc_out"], axis=0),
                              helper.make_node("Identity", ["c_in"], ["c_out"])],
                             "body", [info("i", TensorProto.INT64, []), info("c_in", TensorProto.BOOL, []),
                                      info("acc_in", TensorProto.FLOAT, None)],
                             [info("c_out", TensorProto.BOOL, []), info("acc_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)]
    model = make_model(nodes, [("acc0", np.float32, [1]), ("M", np.int64, [])], [("acc", np.float32, [None])],
                       {"piece": np.float32([2.0])})
    module = onnx2torch_rnn.convert(model)
    args = (torch.ones(1), torch.tensor(3))
    assert module(*args).tolist() == [1.0, 2.0, 2.0, 2.0]  # eager is unchanged
    message = r"Loop cannot be compiled in one graph: carried value 0 enters the body as torch.float32 \[1\] and leaves"
    with pytest.raises(Exception, match=message):
        torch.compile(module, fullgraph=True, backend="eager")(*args)
    with pytest.raises(Exception, match=message):
        torch.export.export(module, args)
