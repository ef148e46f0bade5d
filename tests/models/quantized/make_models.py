"""Quantize small float test models with onnxruntime's quantization tool.

Run ``python tests/models/quantized/make_models.py``.
Sources are float exports committed in tests/models/torch and tests/models/keras, and small_cnn.onnx, a float CNN
written here with onnx.helper (Conv, LeakyRelu, AveragePool, Sigmoid, Mul, Add, Resize, Pad, MaxPool, Concat,
GlobalAveragePool, Gemm, Softmax: the ops the tool has QOperator kernels for). Each case runs
``onnxruntime.quantization.quantize_dynamic`` or ``quantize_static`` (QDQ or QOperator format) with the settings
listed below, writes ``<source>_<case>.onnx`` here and records the tool's version, the settings, the source's input
description (for tests/models/... feeds) and the ops the tool emitted in manifest.json. Static quantization
calibrates on four random input sets of the source's export sizes (seeded).
"""

from __future__ import annotations

import collections
import json
import logging
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent
sys.path.insert(0, str(MODELS.parents[1]))  # the repository root, for tests.exporters.common

from tests.exporters.common import manifest_input_sets, read_manifest  # noqa: E402

DYNAMIC_MATRIX = {  # case suffix -> quantize_dynamic settings (the tool always quantizes LSTM weights to int8)
    f"dyn_{'pc' if pc else 'pt'}_{'s8' if w == QuantType.QInt8 else 'u8'}{'_rr' if rr else ''}":
        {"per_channel": pc, "weight_type": w, "reduce_range": rr}
    for pc in (False, True) for w in (QuantType.QInt8, QuantType.QUInt8) for rr in (False, True)
}
QDQ = {"quant_format": QuantFormat.QDQ, "activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8}
QOP = {"quant_format": QuantFormat.QOperator, "activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8}

# (source folder, source file, case, "dynamic" or "static", settings)
CASES = [
    # ConvInteger, MatMulInteger and DynamicQuantizeLSTM: every setting changes some weight
    *[("torch", "ts_crnn_op18.onnx", case, "dynamic", settings) for case, settings in DYNAMIC_MATRIX.items()],
    ("torch", "ts_lstm_op14.onnx", "dyn_pt_s8", "dynamic", DYNAMIC_MATRIX["dyn_pt_s8"]),
    ("torch", "ts_lstm_op14.onnx", "dyn_pc_s8_rr", "dynamic", DYNAMIC_MATRIX["dyn_pc_s8_rr"]),
    ("torch", "ts_tagger_op17.onnx", "dyn_pt_s8", "dynamic", DYNAMIC_MATRIX["dyn_pt_s8"]),
    ("torch", "ts_tagger_op17.onnx", "dyn_pc_u8_rr", "dynamic", DYNAMIC_MATRIX["dyn_pc_u8_rr"]),
    ("torch", "ts_seq2seq_op16.onnx", "dyn_pt_s8", "dynamic", DYNAMIC_MATRIX["dyn_pt_s8"]),
    ("torch", "ts_audio_gru_op19.onnx", "dyn_pt_u8", "dynamic", DYNAMIC_MATRIX["dyn_pt_u8"]),
    ("keras", "tf_keras_lstm_hard_sigmoid.onnx", "dyn_pt_s8", "dynamic", DYNAMIC_MATRIX["dyn_pt_s8"]),
    ("keras", "tf_keras_bi_lstm_concat.onnx", "dyn_pc_s8_rr", "dynamic", DYNAMIC_MATRIX["dyn_pc_s8_rr"]),
    ("torch", "ts_crnn_op18.onnx", "qdq_u8s8", "static", QDQ),
    ("torch", "ts_crnn_op18.onnx", "qdq_u8s8_pc", "static", {**QDQ, "per_channel": True}),
    ("torch", "ts_crnn_op18.onnx", "qop_u8s8", "static", QOP),
    ("torch", "ts_crnn_op18.onnx", "qop_s8s8_pc", "static",
     {**QOP, "activation_type": QuantType.QInt8, "per_channel": True}),
    ("torch", "ts_tagger_op17.onnx", "qdq_u8s8", "static", QDQ),
    ("torch", "ts_tagger_op17.onnx", "qop_u8u8", "static", {**QOP, "weight_type": QuantType.QUInt8}),
    ("torch", "ts_audio_gru_op19.onnx", "qop_u8s8", "static", QOP),
    ("torch", "ts_audio_gru_op19.onnx", "qdq_u16s8", "static", {**QDQ, "activation_type": QuantType.QUInt16}),
    ("torch", "ts_seq2seq_op16.onnx", "qop_u8s8", "static", QOP),
    ("keras", "tf_keras_bi_lstm_concat.onnx", "qop_u8s8", "static", QOP),
    ("quantized", "small_cnn.onnx", "qop_u8s8", "static", QOP),
    ("quantized", "small_cnn.onnx", "qop_s8s8_pc", "static",
     {**QOP, "activation_type": QuantType.QInt8, "per_channel": True}),
    ("quantized", "small_cnn.onnx", "qdq_u8s8", "static", QDQ),
]
SMALL_CNN = {"file": "small_cnn.onnx", "inputs": {"x": {"kind": "float", "dims": [1, 3, 16, 16]}}}


def small_cnn() -> onnx.ModelProto:
    """The float CNN source: one op of each kind the tool quantizes in CNNs, random weights (seeded)."""
    rng = np.random.default_rng(0)
    weights = {}

    def weight(name: str, *shape: int) -> str:
        weights[name] = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        return name

    nodes = [
        helper.make_node("Conv", ["x", weight("w1", 8, 3, 3, 3), weight("b1", 8)], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c1"], ["l1"], alpha=0.1),
        helper.make_node("AveragePool", ["l1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", weight("w2", 8, 8, 3, 3), weight("b2", 8)], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["s2", "p1"], ["m2"]),
        helper.make_node("Add", ["m2", "p1"], ["a2"]),
        helper.make_node("Resize", ["a2", "", "scales"], ["r2"], mode="nearest"),
        helper.make_node("Pad", ["r2", "pads"], ["pd"], mode="constant"),
        helper.make_node("MaxPool", ["pd"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["mp", "mp"], ["cc"], axis=1),
        helper.make_node("GlobalAveragePool", ["cc"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", weight("w3", 16, 5), weight("b3", 5)], ["o"]),
        helper.make_node("Softmax", ["o"], ["y"], axis=-1),
    ]
    weights["scales"] = np.array([1, 1, 2, 2], np.float32)
    weights["pads"] = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    graph = helper.make_graph(nodes, "small_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class RandomInputs(CalibrationDataReader):
    def __init__(self, folder: str, entry: dict, sizes: dict):
        self.sets = [s for seed in (0, 1) for s in manifest_input_sets(MODELS / folder, entry, sizes, seed)[:2]]

    def get_next(self):
        return self.sets.pop() if self.sets else None


def _plain(settings: dict) -> dict:
    return {k: (v.name if hasattr(v, "name") else v) for k, v in settings.items()}


def quantize(folder: str, source: str, case: str, kind: str, settings: dict) -> dict:
    manifest = {"models": [SMALL_CNN], "sizes": {}} if source == SMALL_CNN["file"] else read_manifest(MODELS / folder)
    entry = next(m for m in manifest["models"] if m["file"] == source)
    target = HERE / f"{source.removesuffix('.onnx')}_{case}.onnx"
    if kind == "dynamic":
        quantize_dynamic(MODELS / folder / source, target, **settings)
    else:
        with tempfile.TemporaryDirectory() as scratch:  # the calibrator writes augmented models next to its input
            copy = Path(scratch) / source
            copy.write_bytes((MODELS / folder / source).read_bytes())
            quantize_static(copy, target, RandomInputs(folder, entry, manifest["sizes"]), **settings)
    model = onnx.load(target)
    ops = collections.Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    return {"file": target.name, "source": f"{folder}/{source}", "case": case,
            "tool": f"onnxruntime.quantization.quantize_{kind}", "settings": _plain(settings),
            "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "emitted": dict(sorted(ops.items())), "bytes": target.stat().st_size,
            "inputs": entry["inputs"], "sizes": manifest["sizes"],
            **({"dynamic_axes": entry["dynamic_axes"]} if "dynamic_axes" in entry else {})}


def main() -> None:
    logging.disable(logging.WARNING)  # the tool logs advice about pre-processing for every model
    np.random.seed(0)
    onnx.save(small_cnn(), HERE / SMALL_CNN["file"])
    models = [quantize(*case) for case in CASES]
    manifest = {"generated_by": "tests/models/quantized/make_models.py",
                "versions": {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
                             "numpy": np.__version__, "python": platform.python_version()},
                "models": models}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(models)} models, {sum(m['bytes'] for m in models) / 1024:.0f} KB")


if __name__ == "__main__":
    main()
