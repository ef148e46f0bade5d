"""Models written by onnxruntime's quantization tool (tests/models/quantized, made by its make_models.py from the float
exports in tests/models/torch and tests/models/keras): quantize_dynamic with per-tensor and per-channel int8/uint8
weights with and without reduce_range, quantize_static in QDQ and QOperator formats (8- and 16-bit).

Exact mode: every output matches onnxruntime on two input sets of the export's sizes and one of other sizes.
dequantize=True: a float model whose weights all train and whose outputs stay within DEQUANTIZED_BOUND of
onnxruntime's quantized outputs (relative to the largest output magnitude), on every input set for dynamic
quantization and on the calibration inputs for static quantization: outside the calibrated ranges the quantized
model saturates its activations and the float model does not (differences of several percent were measured there).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime, run_torch
from onnx2torch_rnn.modules import quantized as q
from tests.exporters.common import (
    MODELS,
    assert_trains,
    assert_weights_are_parameters,
    compare_with_onnxruntime,
    manifest_input_sets,
    read_manifest,
)
from tests.helpers import assert_float_only

FOLDER = MODELS / "quantized"
MANIFEST = read_manifest(FOLDER)
ENTRIES = MANIFEST["models"]
IDS = [m["file"].removesuffix(".onnx") for m in ENTRIES]
DEQUANTIZED_BOUND = 0.02  # max |float - onnxruntime int8| / max |onnxruntime int8|; 0.1 % to 1.2 % measured


def input_sets(entry) -> list[dict]:
    return manifest_input_sets(FOLDER, entry, entry["sizes"])


def output_step(model: onnx.ModelProto) -> float | None:
    """The quantization step of the graph's outputs (the scale of the DequantizeLinear that produces them), None
    when a float op computes one of them."""
    producers = {o: n for n in model.graph.node for o in n.output}
    scales = {t.name: float(onnx.numpy_helper.to_array(t).max()) for t in model.graph.initializer}
    nodes = [producers[o.name] for o in model.graph.output]
    if not all(n.op_type == "DequantizeLinear" and n.input[1] in scales for n in nodes):
        return None
    return max(scales[n.input[1]] for n in nodes)


def quantizes_inputs_only(module: torch.nn.Module) -> bool:
    """Whether every QuantizeLinear of the converted graph reads a graph input: passes/qdq.py fused every float op
    between a DequantizeLinear and a QuantizeLinear into an integer op, so nothing rounds in float but as onnxruntime
    does."""
    quantizers = (q.QuantizeLinear, q.QuantizeDequantizeLinear)
    return all(node.args[0].op == "placeholder" for node in module.graph.nodes
               if node.op == "call_module" and isinstance(module.get_submodule(node.target), quantizers))


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_exact(entry):
    """Bit for bit on every quantized op. In the QDQ format the float ops left between a DequantizeLinear and the
    next QuantizeLinear (a recurrence, LayerNorm, 16-bit ops that onnxruntime does not fuse) agree with
    onnxruntime's MLAS kernels only to float32 rounding, so a value within that rounding of a quantization boundary
    can land one step away: the documented bound there is one quantization step of a quantized output (the usual
    tolerance where float ops compute the outputs). Where passes/qdq.py fused them all, the outputs are exact."""
    model = onnx.load(FOLDER / entry["file"])
    module = onnx2torch_rnn.convert(model)
    step = output_step(model) if entry["settings"].get("quant_format") == "QDQ" else None
    if step is not None and quantizes_inputs_only(module):
        tolerance = {"rtol": 0, "atol": 0}
    else:
        tolerance = {} if step is None else {"atol": step * (1 + 1e-6)}
    for feeds in input_sets(entry):
        compare_with_onnxruntime(module, model, feeds, **tolerance)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_dequantized_trains_and_stays_close(entry):
    model = onnx.load(FOLDER / entry["file"])
    module = onnx2torch_rnn.convert(model, dequantize=True)
    assert_float_only(module)
    assert_weights_are_parameters(module)
    sets = input_sets(entry)
    calibrated = sets if entry["tool"].endswith("dynamic") else sets[:2]  # make_models calibrates on these
    for feeds in calibrated:
        expected, actual = run_onnxruntime(model, feeds), run_torch(module, model, feeds)
        for want, got in zip(expected, actual, strict=True):
            distance = np.abs(got - want).max() / np.abs(want).max()
            assert distance <= DEQUANTIZED_BOUND, f"{distance:.3g} of the output's magnitude"
            assert distance > 0  # a float model does not round like the quantized one
    assert_trains(module.train(), model, sets[0])


def test_model_set_covers_the_tool():
    settings = [(m["tool"].rsplit("_", 1)[1], m["settings"]) for m in ENTRIES]
    dynamic = {(s["per_channel"], s["weight_type"], s["reduce_range"]) for kind, s in settings if kind == "dynamic"}
    assert len(dynamic) == 8  # per tensor / per channel x QInt8 / QUInt8 x reduce_range
    formats = {(s["quant_format"], s["activation_type"]) for kind, s in settings if kind == "static"}
    assert {("QDQ", "QUInt8"), ("QDQ", "QUInt16"), ("QOperator", "QUInt8"), ("QOperator", "QInt8")} <= formats
    emitted = {op for m in ENTRIES for op in m["emitted"]}
    assert {"com.microsoft::DynamicQuantizeLSTM", "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul",
            "com.microsoft::QGemm", "com.microsoft::QLinearAdd", "com.microsoft::QLinearConcat",
            "com.microsoft::QLinearMul", "com.microsoft::QLinearSigmoid", "com.microsoft::QLinearLeakyRelu",
            "com.microsoft::QLinearAveragePool", "com.microsoft::QLinearGlobalAveragePool",
            "com.microsoft::QLinearSoftmax"} <= emitted
    assert all(m["bytes"] < 32 * 1024 for m in ENTRIES)


@pytest.mark.parametrize("file, node", [("ts_crnn_op18_dyn_pt_s8.onnx", "ConvInteger node"),
                                        ("ts_crnn_op18_qop_u8s8.onnx", "QLinearConv node"),
                                        ("ts_tagger_op17_dyn_pt_s8.onnx", "DynamicQuantizeLSTM module")])
def test_to_onnx_refuses_integer_ops_by_name(file, node, tmp_path):
    """The exact int8 module is not written back (its integer ops have no ONNX translation here): ExportError names
    the first such node and says how to get an int8 file (dequantize, to_onnx, quantize again)."""
    module = onnx2torch_rnn.convert(FOLDER / file)
    with pytest.raises(onnx2torch_rnn.ExportError, match=f"{node} .*dequantize=True.*onnxruntime.quantization"):
        onnx2torch_rnn.to_onnx(module, tmp_path / "model.onnx")
    assert not list(tmp_path.iterdir())
