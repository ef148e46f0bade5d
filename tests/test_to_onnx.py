"""Back to ONNX with ``to_onnx``: every exporter model of the suite (tests/models) is converted, trained one step,
written with to_onnx and run by onnxruntime, which must equal the fine-tuned module at two shapes, with the
original's input and output names and dtypes and its native LSTM/GRU/RNN nodes. A module torch cannot export is
refused with the node named and nothing written (EXPECTED_REFUSALS: each listed model must still be refused for the
reason given; when one starts to export, it fails here until it leaves the list and takes the whole trip). A subset
runs by default (DEFAULT), every model with ``-m slow``.

Also the exporter-friendly forms of converted modules (the TorchScript exporter and torch.onnx's dynamo exporter
used directly) and the command line.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import helper
from torch.export import Dim

import onnx2torch_rnn
from onnx2torch_rnn import ExportError, to_onnx
from onnx2torch_rnn.cli import main
from onnx2torch_rnn.onnx_rewrite import lower_opset, opset_of
from onnx2torch_rnn.recurrent import StackedRecurrent
from onnx2torch_rnn.signature import recorded
from tests.exporters.common import (
    FLOAT16_TOLERANCE,
    MODELS,
    RECURRENT_OPS,
    backward,
    has_float16,
    manifest_input_sets,
    read_manifest,
)
from tests.helpers import looped, make_model
from tests.shape_patterns import pattern_model

pytestmark = [pytest.mark.compile,  # and torch.onnx's own deprecation warnings:
              pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")]

# model -> why to_onnx refuses it (a regex on the error); the error must name the node. None today: a recognised
# Keras layer with a mask, or a TF1 cell with sequence_length, is written as a Loop over its cell's step
# (test_masked_recurrences_with_holes_go_back_as_loops); the custom-cell Loops and the unrecognised TF1 Scans export
# as torch's while_loop and take the whole trip
EXPECTED_REFUSALS: dict[str, str] = {}

# What runs by default, one model for each way back to ONNX (the others are marked slow: about 3 min of CPU):
# both torch exporters and each recurrent op, layers, directions and initial states, PackedSequence's sorting,
# float16; a Keras Loop recognised as its cell, a custom-cell Loop as while_loop, a masked one refused; a TF1 Scan
# recognised, one as while_loop; MXNet's and Paddle's glue; dequantized dynamic, QDQ and QOperator models.
DEFAULT = frozenset({
    "torch/ts_rnn_tanh_op14", "torch/dynamo_gru", "torch/dynamo_lstm_l2_bi_h0c0",
    "torch/ts_packed_lstm_l2_unsorted_op19", "torch/ts_gru_bi_fp16_op18",
    "keras/keras3_gru_reset_before", "keras/keras3_custom_cell", "keras/tf_keras_masking_gru",
    "keras/tf_v1_basic_rnn_cell", "keras/tf_v1_lstm_projection",
    "patterns/mxnet_gru_opset12", "patterns/paddle2onnx_lstm_2layer_bidirectional",
    "quantized/ts_lstm_op14_dyn_pt_s8", "quantized/ts_audio_gru_op19_qdq_u16s8", "quantized/ts_tagger_op17_qop_u8u8",
})


def _cases() -> list:
    cases, quantized_forms = [], set()
    for folder in ("torch", "keras", "patterns", "quantized"):
        manifest = read_manifest(MODELS / folder)
        for entry in manifest["models"]:
            key = f"{folder}/{entry['file']}".removesuffix(".onnx")
            # of the quantized models, one per source, tool, format and weight granularity: the others differ in
            # weight type and reduce_range only, which dequantize=True turns into the same float graph
            settings = entry.get("settings", {})
            form = (entry.get("source"), entry.get("tool"), settings.get("quant_format"), settings.get("per_channel"))
            if folder == "quantized":
                if key not in DEFAULT and form in quantized_forms:
                    continue
                quantized_forms.add(form)
            sizes = entry["sizes"] if "sizes" in entry else manifest["sizes"]
            cases.append(pytest.param(folder, entry, sizes, id=key, marks=() if key in DEFAULT else pytest.mark.slow))
    return cases


def trip_options(folder: str, entry: dict, sizes: dict, model: onnx.ModelProto) -> dict:
    """to_onnx's dims (the export's sizes) and dynamic dims (the axes the manifest says the export left dynamic),
    by the model's own dim names."""
    symbolic = {i.name: [d.dim_param or f"{i.name}.{axis}" if not d.HasField("dim_value") else None
                         for axis, d in enumerate(i.type.tensor_type.shape.dim)] for i in model.graph.input}
    dims, dynamic = {}, set()
    for name, spec in entry["inputs"].items():
        for axis, label in enumerate(spec["dims"]):
            onnx_dim = symbolic[name][axis]
            if isinstance(label, str) and onnx_dim is not None:
                dims[onnx_dim] = sizes[label]["export"]
                if label in entry.get("dynamic_axes", [label]):
                    dynamic.add(onnx_dim)
    return {"dims": dims, "dynamic": dynamic}


def train_one_step(module: torch.nn.Module, model: onnx.ModelProto, feeds: dict) -> None:
    module.train()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    backward(module, model, feeds)
    optimizer.step()


def run_onnxruntime(path: Path, feeds: dict) -> list[np.ndarray]:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def recurrent_nodes(model: onnx.ModelProto) -> int:
    """LSTM/GRU/RNN nodes, the quantized DynamicQuantizeLSTM included (dequantize=True makes it an LSTM)."""
    return sum(n.op_type in (*RECURRENT_OPS, "DynamicQuantizeLSTM") for n in model.graph.node)


def fused_nodes(module: torch.fx.GraphModule) -> int:
    """The LSTM/GRU/RNN nodes that to_onnx writes for what recognition fused out of other ops: one per cell of a
    recognised Loop, Scan or unrolled chain (a MultiRNNCell's: one per cell), one per layer of an unrolled stack (at
    the static time the trips of dynamo's unrolled models keep; with a dynamic time a first layer whose directions
    read other steps is two nodes: test_an_unrolled_model_exports_at_the_steps_it_reads_by_default)."""
    count = sum(not m.mask and not m.lengths for m in looped(module))  # a masked one is written as a Loop
    for node in module.graph.nodes:
        stack = module.get_submodule(node.target) if node.op == "call_module" else None
        if isinstance(stack, StackedRecurrent) and node.meta["onnx"].get("pattern") == "unrolled_cells":
            count += len(stack.layers)
    return count


def interface(model: onnx.ModelProto, static: dict[str, int] | None = None) -> list:
    """Names, element types and dims of the run-time inputs (``static`` symbolic dims as numbers), and names and
    element types of the outputs."""
    constants, static = {t.name for t in model.graph.initializer}, static or {}

    def dims(tensor):
        return [d.dim_value if d.HasField("dim_value") else static.get(d.dim_param, d.dim_param)
                for d in tensor.shape.dim]

    return [[(i.name, i.type.tensor_type.elem_type, dims(i.type.tensor_type)) for i in model.graph.input
             if i.name not in constants],
            [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output]]


@pytest.mark.parametrize("folder, entry, sizes", _cases())
def test_exporter_model_round_trips(folder, entry, sizes, tmp_path):
    key = f"{folder}/{entry['file']}"
    model = onnx.load(MODELS / folder / entry["file"])
    module = onnx2torch_rnn.convert(model, dequantize=folder == "quantized")
    sets = manifest_input_sets(MODELS / folder, entry, sizes)
    train_one_step(module, model, sets[0])
    path = tmp_path / "model.onnx"
    if key in EXPECTED_REFUSALS:
        with pytest.raises(ExportError, match=EXPECTED_REFUSALS[key]):
            to_onnx(module, path, **trip_options(folder, entry, sizes, model))
        assert not list(tmp_path.iterdir()), "a refused model leaves nothing behind"
        return
    options = trip_options(folder, entry, sizes, model)
    summary = to_onnx(module, path, **options)
    written = onnx.load(path)
    static = {name: size for name, size in options["dims"].items() if name not in options["dynamic"]}
    assert interface(written) == interface(model, static)
    assert recurrent_nodes(written) == summary.recurrent_nodes == recurrent_nodes(model) + fused_nodes(module)
    assert [n.op_type for n in written.graph.node].count("Loop") >= sum(m.mask or m.lengths for m in looped(module))
    opset = recorded(module).opset  # the exporter's is 20 with torch 2.13: at most that
    assert min(opset, 18) <= summary.opset == written.opset_import[0].version <= max(opset, 18)
    tolerance = FLOAT16_TOLERANCE if has_float16(model) else {"rtol": 1e-4, "atol": 1e-5}
    names = [o.name for o in model.graph.output]
    for feeds in sets:  # the export's sizes twice, then other sizes on the dynamic axes
        with torch.no_grad():
            actual = module(*(torch.from_numpy(feeds[i.name]) for i in recorded(module).inputs))
        actual = actual if isinstance(actual, tuple) else (actual,)
        for name, got, want in zip(names, actual, run_onnxruntime(path, feeds), strict=True):
            np.testing.assert_allclose(want, got.numpy(), strict=True, err_msg=f"output {name!r}", **tolerance)
    before = run_onnxruntime(MODELS / folder / entry["file"], sets[0])
    after = run_onnxruntime(path, sets[0])
    assert max(np.abs(a.astype(np.float64) - b).max() for a, b in zip(after, before, strict=True)) > 1e-3, \
        "the written model has the fine-tuned weights, not the original ones"


def test_an_unrolled_model_exports_at_the_steps_it_reads_by_default(tmp_path):
    """dynamo's unrolled nn.RNN reads 5 steps (its fused stack's window): the default example has them, where the
    default size 4 could not be traced."""
    model = onnx.load(MODELS / "torch" / "dynamo_rnn_relu_l2_bi_bf.onnx")
    module = onnx2torch_rnn.convert(model)
    summary = to_onnx(module, tmp_path / "model.onnx")
    assert summary.checked_shapes[0] == [[5, 5, 6]]
    # the first layer's directions read the first and the last 5 steps of a dynamic time: one RNN node each
    assert summary.recurrent_nodes == 3
    x = np.random.default_rng(0).standard_normal((3, 5, 6)).astype(np.float32)
    for got, want in zip(run_onnxruntime(tmp_path / "model.onnx", {"x": x}),
                         run_onnxruntime(MODELS / "torch" / "dynamo_rnn_relu_l2_bi_bf.onnx", {"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("file, holes", [("keras3_tagger.onnx", "tokens"), ("tf_keras_masking_gru.onnx", "steps"),
                                         ("tf_keras_embedding_mask_lstm.onnx", "tokens")])
def test_masked_recurrences_with_holes_go_back_as_loops(file, holes, tmp_path):
    """A masked Keras layer (ONNX's LSTM/GRU have no per-step mask) is written as a Loop over its cell's step with the
    mask's selects, as the original was: it keeps the states and holds (or zeroes) the output at masked steps
    anywhere, not only at the end (padding tokens 0, or all-zero steps for Masking)."""
    model = onnx.load(MODELS / "keras" / file)
    module = onnx2torch_rnn.convert(model)
    summary = to_onnx(module, tmp_path / "model.onnx")
    written = onnx.load(tmp_path / "model.onnx")
    assert summary.recurrent_nodes == 0 and "Loop" in [n.op_type for n in written.graph.node]
    assert not any(o.domain.startswith("onnx2torch_rnn") for o in written.opset_import)
    rng = np.random.default_rng(5)
    for batch, time in ((2, 6), (3, 9)):
        if holes == "tokens":
            x = rng.integers(1, 12, (batch, time)).astype(np.int32)
            x[0, 1], x[1, 2:4], x[-1, -2:] = 0, 0, 0  # holes in the middle and padding at the end
        else:
            x = rng.standard_normal((batch, time, 5)).astype(np.float32)
            x[0, 1], x[1, 2:4], x[-1, -2:] = 0.0, 0.0, 0.0
        with torch.no_grad():
            expected = module(torch.from_numpy(x))
        for got, want in zip(run_onnxruntime(tmp_path / "model.onnx", {"x": x}), (expected,), strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_listed_models_are_models_of_the_suite():
    keys = {f"{folder}/{entry['file']}" for folder in ("torch", "keras", "patterns", "quantized")
            for entry in read_manifest(MODELS / folder)["models"]}
    assert set(EXPECTED_REFUSALS) <= keys
    assert {f"{key}.onnx" for key in DEFAULT} <= keys


# ---- to_onnx's own contract -----------------------------------------------------------------------------------------

RNG = np.random.default_rng(0)


def _dense(opset: int = 17, **initializers) -> onnx.ModelProto:
    """y = tanh(x @ w + b), x: [batch, 4]."""
    weights = {"w": RNG.standard_normal((4, 3)).astype(np.float32), "b": RNG.standard_normal(3).astype(np.float32)}
    weights.update(initializers)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="project"),
             helper.make_node("Add", ["m", "b"], ["a"], name="shift"),
             helper.make_node("Tanh", ["a"], ["y"], name="squash")]
    return make_model(nodes, [("x", np.float32, ["batch", 4])], ["y"], weights, opset=opset)


class _CompiledDiffers(torch.nn.Module):
    """Computes what it wraps in eager mode and 1 % more while exported: an exported model that is wrong."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        y = self.inner(x)
        return y * 1.01 if torch.compiler.is_compiling() else y


def test_a_wrong_export_is_refused_and_nothing_is_written(tmp_path):
    module = onnx2torch_rnn.convert(_dense())
    module.squash = _CompiledDiffers(module.squash)
    path = tmp_path / "model.onnx"
    path.write_bytes(b"previous")
    with pytest.raises(ExportError, match=r"^output 'y' of the exported model differs from the module's at input "
                                          r"shapes \[\[4, 4\]\]: max abs error .*; nothing written$"):
        to_onnx(module, path)
    assert path.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    summary = to_onnx(module, path, check=False)  # unchecked, it is written (and wrong)
    assert summary.checked_shapes == [] and onnx.load(path).graph.output[0].name == "y"


def test_names_numeric_and_pass_through_outputs(tmp_path):
    """Numeric names, an output that is the input itself and one that repeats another output keep their names."""
    nodes = [helper.make_node("Relu", ["0"], ["1"]), helper.make_node("Identity", ["0"], ["2"]),
             helper.make_node("Identity", ["1"], ["3"])]
    model = make_model(nodes, [("0", np.float32, ["n", 4])], ["1", "2", "3"])
    module = onnx2torch_rnn.convert(model)
    to_onnx(module, tmp_path / "m.onnx")
    written = onnx.load(tmp_path / "m.onnx")
    assert interface(written) == interface(model)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for got, want in zip(run_onnxruntime(tmp_path / "m.onnx", {"0": x}), [np.maximum(x, 0), x, np.maximum(x, 0)],
                         strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pattern", ["zeros_state", "range", "merge_dims"])
def test_shape_arithmetic_exports_with_its_dynamic_dims(tmp_path, pattern):
    """Sizes the module computes as fx integer nodes (a zero state of the batch's size, positions 0..M-1, merged
    dims) stay symbolic: the written model runs at other sizes, as the summary's check shows."""
    model = pattern_model(pattern)
    summary = to_onnx(onnx2torch_rnn.convert(model, fuse=False), tmp_path / "m.onnx")
    assert summary.dynamic_dims == ["M", "N"] and len(summary.checked_shapes) == 2
    assert interface(onnx.load(tmp_path / "m.onnx")) == interface(model)


def test_initializer_names_like_the_exporters_own(tmp_path):
    """Constants named val_N (as torch.onnx's dynamo exporter names its values) become parameters and buffers of
    those names; written back, they must not collide with the exporter's values ('Initializer val_3 is already
    registered')."""
    nodes, weights = [], {}
    for i in (0, 3):
        weights.update({f"val_{i}": np.array(0.5, np.float32), f"val_{i + 1}": np.array([-1, 4]),
                        f"val_{i + 2}": RNG.standard_normal(4).astype(np.float32)})
        nodes += [helper.make_node("Mul", ["x" if i == 0 else "s0", f"val_{i}"], [f"m{i}"]),
                  helper.make_node("Reshape", [f"m{i}", f"val_{i + 1}"], [f"r{i}"]),
                  helper.make_node("Add", [f"r{i}", f"val_{i + 2}"], [f"a{i}"]),
                  helper.make_node("LeakyRelu", [f"a{i}"], ["s0" if i == 0 else "y"], alpha=0.3)]
    module = onnx2torch_rnn.convert(make_model(nodes, [("x", np.float32, ["batch", 4])], ["y"], weights))
    assert {"val_0", "val_3", "val_5"} <= set(module.state_dict())
    assert to_onnx(module, tmp_path / "m.onnx").max_abs_error < 1e-6


def test_opset_defaults_to_the_originals_where_the_converter_reaches_it(tmp_path):
    module = onnx2torch_rnn.convert(_dense(opset=13))
    assert to_onnx(module, tmp_path / "a.onnx", check=False).opset == 13
    assert to_onnx(module, tmp_path / "b.onnx", opset=18, check=False).opset == 18
    written = onnx.load(tmp_path / "a.onnx")
    assert written.ir_version == 7 and written.producer_name == "onnx2torch_rnn"
    for opset in (19, 20):  # torch.onnx writes opset 20 (torch 2.13): an original at 19 or 20 keeps its opset
        assert to_onnx(onnx2torch_rnn.convert(_dense(opset=opset)), tmp_path / "c.onnx").opset == opset


def test_lowering_compares_schemas_at_the_exported_opset():
    """torch.onnx writes opset 20 (torch 2.13), where ConstantOfShape is version 20 (aten::new_zeros), and ONNX's
    version converter has no adapter down from it. It means there what ConstantOfShape-9 means: compared with the
    schema at the model's own opset, not at 18, it is kept out of the converter's way and the model reaches 17."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
             helper.make_node("Pad", ["x", "pads"], ["padded"], mode="edge"),
             helper.make_node("Sub", ["zeros", "padded"], ["y"])]
    exported = make_model(nodes, [("x", np.float32, [2, 3])], ["y"], {"pads": np.zeros(4, np.int64)}, opset=20)
    exported = onnx.shape_inference.infer_shapes(exported)  # every value typed, as torch.onnx writes them
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for target in (19, 17, 13):
        lowered = lower_opset(onnx.ModelProto.FromString(exported.SerializeToString()), target)
        assert opset_of(lowered) == target
        session = onnxruntime.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], -x)


def test_argument_errors(tmp_path):
    with pytest.raises(ExportError, match="no recorded ONNX signature"):
        to_onnx(torch.nn.Linear(2, 2), tmp_path / "m.onnx")
    module = onnx2torch_rnn.convert(_dense())
    with pytest.raises(ExportError, match=r"dynamic names \['time'\], which are not symbolic dims .*\(batch\)"):
        to_onnx(module, tmp_path / "m.onnx", dynamic=["time"])
    with pytest.raises(ExportError, match=r"dynamic dim\(s\) \[0\] need a size of at least 2"):
        to_onnx(module, tmp_path / "m.onnx", dims={"batch": 1})
    with pytest.raises(ExportError, match=r"example input 'x' is torch\.float64"):
        to_onnx(module, tmp_path / "m.onnx", [torch.zeros(2, 4, dtype=torch.float64)])
    assert not list(tmp_path.iterdir())


def test_static_dims_on_request_and_the_training_mode_is_restored(tmp_path):
    module = onnx2torch_rnn.convert(_dense()).train()
    summary = to_onnx(module, tmp_path / "m.onnx", dims={"batch": 5}, dynamic=False)
    assert summary.dynamic_dims == [] and summary.checked_shapes == [[[5, 4]]]
    assert interface(onnx.load(tmp_path / "m.onnx"))[0] == [("x", onnx.TensorProto.FLOAT, [5, 4])]
    assert module.training


# ---- exporter-friendly modules (torch.onnx used directly) -----------------------------------------------------------

def _torchscript(module, x, name="x"):
    buffer = io.BytesIO()
    torch.onnx.export(module, (x,), buffer, dynamo=False, input_names=[name], output_names=["y"],
                      dynamic_axes={name: {2: "h", 3: "w"}})
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:You are using the legacy TorchScript")
def test_torchscript_export_keeps_ceil_mode_pool_sizes():
    """The output size of a ceil_mode pool is a ceil division; written -(-a // b) it exports as a truncating Div."""
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    module = onnx2torch_rnn.convert(make_model([pool], [("x", np.float32, [1, 2, "h", "w"])], ["y"]))
    exported = _torchscript(module, torch.randn(1, 2, 8, 8))
    for size in (10, 12):
        x = RNG.standard_normal((1, 2, size, size)).astype(np.float32)
        (got,) = onnxruntime.InferenceSession(exported.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(got, module(torch.from_numpy(x)).numpy())


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:You are using the legacy TorchScript")
def test_torchscript_export_of_resize_is_valid_onnx():
    """Resize moves each axis last and back: with -1 for the last axis, the exporter writes a Transpose perm of -1."""
    resize = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = make_model([resize], [("x", np.float32, [1, 2, "h", "w"])], ["y"],
                       {"scales": np.array([1, 1, 2, 2], np.float32)})
    module = onnx2torch_rnn.convert(model)
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    exported = _torchscript(module, torch.from_numpy(x))
    onnx.checker.check_model(exported, full_check=True)
    (got,) = onnxruntime.InferenceSession(exported.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_dynamo_export_of_a_last_step_slice():
    """Keras' last step: Slice(start -1, end INT32_MAX) then Squeeze. torch must prove the slice has one row, or
    the squeeze decomposes to prims.view_of, which torch.onnx cannot translate."""
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Squeeze", ["s", "axes"], ["y"])]
    ints = {"starts": np.array([-1]), "ends": np.array([2**31 - 1]), "axes": np.array([0])}
    module = onnx2torch_rnn.convert(make_model(nodes, [("x", np.float32, ["time", "batch", 3])], ["y"], ints))
    program = torch.onnx.export(module, (torch.randn(5, 2, 3),), dynamo=True, verbose=False,
                                dynamic_shapes={"x": {0: Dim("time"), 1: Dim("batch")}})
    x = RNG.standard_normal((7, 4, 3)).astype(np.float32)
    (got,) = onnxruntime.InferenceSession(program.model_proto.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(got, x[-1])


# ---- command line ---------------------------------------------------------------------------------------------------

def test_cli_writes_the_fine_tuned_model(tmp_path, capsys, recwarn):
    source = MODELS / "torch" / "ts_lstm_op14.onnx"
    module = onnx2torch_rnn.convert(source)
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(0.5)
    torch.save(module.state_dict(), tmp_path / "tuned.pt")
    out = tmp_path / "tuned.onnx"
    assert main(["to-onnx", str(source), "-o", str(out), "--weights", str(tmp_path / "tuned.pt"), "--dim",
                 "time=3"]) == 0
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)], "torch's deprecations are not shown"
    printed = capsys.readouterr().out
    assert f"wrote {out} (opset 14, 1 LSTM/GRU/RNN nodes, dynamic dims: batch, time)" in printed
    assert re.search(r"checked: onnxruntime matches the module at input shapes \[\[3, 4, 6\]\] and \[\[6, 7, 6\]\]",
                     printed)
    x = RNG.standard_normal((3, 2, 6)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x))
    for got, want in zip(run_onnxruntime(out, {"x": x}), expected, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_cli_refusals_and_exit_codes(tmp_path, capsys):
    int8 = MODELS / "quantized" / "ts_lstm_op14_dyn_pt_s8.onnx"  # exact int8 ops: refused
    assert main(["to-onnx", str(int8), "-o", str(tmp_path / "m.onnx")]) == 1
    assert re.search(r"^not written: .*to_onnx does not write int8 ops back", capsys.readouterr().err)
    torch.save({"nothing": torch.zeros(1)}, tmp_path / "bad.pt")
    assert main(["to-onnx", str(MODELS / "torch" / "ts_lstm_op14.onnx"), "-o", str(tmp_path / "m.onnx"),
                 "--weights", str(tmp_path / "bad.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cannot load {tmp_path / 'bad.pt'} into the model converted from ") and "Missing key" in err
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert main(["to-onnx", str(MODELS / "torch" / "ts_lstm_op14.onnx"), "-o", str(tmp_path / "m.onnx"),
                 "--weights", str(tmp_path / "junk.pt")]) == 2
    assert capsys.readouterr().err.startswith(f"cannot load {tmp_path / 'junk.pt'} into the model converted from ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt", "junk.pt"]


def _if_on_time(size: int, then_nodes: list) -> onnx.ModelProto:
    """y [batch, 3] = then_nodes(x) where x's time dim (axis 1) is ``size``, else the maximum over time."""
    then_branch = helper.make_graph([*then_nodes, helper.make_node("Neg", ["a"], ["then_y"])], "then", [],
                                    [helper.make_tensor_value_info("then_y", onnx.TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("ReduceMax", ["x", "axis1"], ["else_y"], keepdims=0)], "else",
                                    [], [helper.make_tensor_value_info("else_y", onnx.TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["time"]),
             helper.make_node("Equal", ["time", "size"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], name="by_time", then_branch=then_branch,
                              else_branch=else_branch)]
    consts = {"one": np.array(1), "size": np.array(size), "axis1": np.array([1])}
    return make_model(nodes, [("x", np.float32, ["batch", "time", 3])], [("y", np.float32, ["batch", 3])], consts, 18)


def test_if_on_a_size_is_written_as_an_if(tmp_path):
    """A condition on a dynamic size that some sizes meet (time == 3, exported at time 4) is torch.cond in the
    exported program, so the written model keeps both branches; a Python branch kept the else branch alone, which
    the written model then took at time 3 too."""
    model = _if_on_time(3, [helper.make_node("ReduceMin", ["x", "axis1"], ["a"], keepdims=0)])
    to_onnx(onnx2torch_rnn.convert(model), tmp_path / "m.onnx")
    written = onnx.load(tmp_path / "m.onnx")
    assert "If" in [n.op_type for n in written.graph.node]
    for time in (1, 3, 5):
        x = RNG.standard_normal((2, time, 3)).astype(np.float32)
        want, got = (onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                     .run(None, {"x": x})[0] for m in (model, written))
        np.testing.assert_array_equal(got, want)


def test_if_decided_by_the_sizes_torch_assumes_is_refused(tmp_path):
    """time == 1 (squeezing the axis, as a streaming model's single step): torch.export takes a dynamic size to be
    at least 2, so it decides the condition and the squeezing branch cannot even be traced. The written model would
    take the else branch at time 1 too: refused, naming the node and the condition; with time static it is written."""
    model = _if_on_time(1, [helper.make_node("Squeeze", ["x", "axis1"], ["a"])])
    module = onnx2torch_rnn.convert(model)
    with pytest.raises(ExportError, match=r"If node 'by_time'.*\(Eq\(time, 1\)\) is decided while exporting"):
        to_onnx(module, tmp_path / "m.onnx")
    assert to_onnx(module, tmp_path / "m.onnx", dims={"time": 1}, dynamic=["batch"]).dynamic_dims == ["batch"]
