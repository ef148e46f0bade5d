"""Small float models built like the int8 models public packages ship, quantized with onnxruntime's quantize_dynamic.

Run ``python tests/models/quantized/shipped_like/make_models.py``. Each model has float layers upstream of dynamic
quantizers (Tanh, Softmax, Sigmoid, LayerNormalization, float MatMul) and int8 LSTMs (DynamicQuantizeLSTM) meant to
run over 50+ steps:

- ``attention_tagger``: token ids -> embedding -> bidirectional LSTM -> additive attention (MatMul, Tanh, MatMul,
  Softmax, MatMul) -> classifier, as a BiLSTM diacritizer;
- ``voice_filter``: features and initial states -> LayerNormalization -> MatMul -> Relu -> two LSTMs (initial states
  sliced from the inputs) -> MatMul -> Sigmoid mask, plus the final states, as a voice filter.

Writes ``<name>_dyn.onnx`` (QInt8 weights, per tensor) next to this script; the float sources are not kept.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

HERE = Path(__file__).resolve().parent


class Weights:
    def __init__(self, seed: int):
        self.rng, self.tensors = np.random.default_rng(seed), []

    def __call__(self, name: str, *shape: int, scale: float = 0.3, values=None) -> str:
        array = values if values is not None else (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.tensors.append(numpy_helper.from_array(np.asarray(array), name))
        return name


def attention_tagger() -> onnx.ModelProto:
    w, hidden, vocab, embed, attention, classes = Weights(0), 16, 40, 12, 20, 7
    nodes = [
        helper.make_node("Gather", [w("embedding", vocab, embed), "ids"], ["e"]),
        helper.make_node("Transpose", ["e"], ["et"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["et", w("W", 2, 4 * hidden, embed), w("R", 2, 4 * hidden, hidden),
                                  w("B", 2, 8 * hidden, scale=0.1)], ["y"], hidden_size=hidden,
                         direction="bidirectional"),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[2, 0, 1, 3]),
        helper.make_node("Reshape", ["yt", w("shape", values=np.array([0, 0, -1], np.int64))], ["h"]),
        helper.make_node("MatMul", ["h", w("Wa", 2 * hidden, attention)], ["wh"]),
        helper.make_node("MatMul", ["h", w("Ua", 2 * hidden, attention)], ["uh"]),
        helper.make_node("Unsqueeze", ["wh", w("axis2", values=np.array([2], np.int64))], ["wh2"]),
        helper.make_node("Unsqueeze", ["uh", w("axis1", values=np.array([1], np.int64))], ["uh1"]),
        helper.make_node("Add", ["wh2", "uh1"], ["sum"]),
        helper.make_node("Tanh", ["sum"], ["t"]),
        helper.make_node("MatMul", ["t", w("va", attention, 1)], ["score"]),
        helper.make_node("Squeeze", ["score", w("last", values=np.array([-1], np.int64))], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "h"], ["context"]),
        helper.make_node("MatMul", ["context", w("Wc", 2 * hidden, classes)], ["logits_raw"]),
        helper.make_node("Add", ["logits_raw", w("bc", classes, scale=0.1)], ["logits"]),
    ]
    graph = helper.make_graph(nodes, "attention_tagger",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "time"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "time", classes])],
                              w.tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def voice_filter() -> onnx.ModelProto:
    w, features, hidden, bins = Weights(1), 20, 24, 8
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        helper.make_node("LayerNormalization", ["x", w("gamma", features, scale=1.0), w("beta", features, scale=0.1)],
                         ["n"], axis=-1),
        helper.make_node("MatMul", ["n", w("Win", features, hidden)], ["p"]),
        helper.make_node("Relu", ["p"], ["r"]),
        helper.make_node("Transpose", ["r"], ["rt"], perm=[1, 0, 2]),
        helper.make_node("Slice", ["h0", w("s0", values=ints(0)), w("s1", values=ints(1)), w("a0", values=ints(0))],
                         ["h0a"]),
        helper.make_node("Slice", ["c0", "s0", "s1", "a0"], ["c0a"]),
        helper.make_node("Slice", ["h0", "s1", w("s2", values=ints(2)), "a0"], ["h0b"]),
        helper.make_node("Slice", ["c0", "s1", "s2", "a0"], ["c0b"]),
        helper.make_node("LSTM", ["rt", w("W1", 1, 4 * hidden, hidden), w("R1", 1, 4 * hidden, hidden),
                                  w("B1", 1, 8 * hidden, scale=0.1), "", "h0a", "c0a"], ["y1", "h1", "c1"],
                         hidden_size=hidden),
        helper.make_node("Squeeze", ["y1", w("one", values=ints(1))], ["y1s"]),
        helper.make_node("LSTM", ["y1s", w("W2", 1, 4 * hidden, hidden), w("R2", 1, 4 * hidden, hidden),
                                  w("B2", 1, 8 * hidden, scale=0.1), "", "h0b", "c0b"], ["y2", "h2", "c2"],
                         hidden_size=hidden),
        helper.make_node("Squeeze", ["y2", "one"], ["y2s"]),
        helper.make_node("Transpose", ["y2s"], ["y2t"], perm=[1, 0, 2]),
        helper.make_node("MatMul", ["y2t", w("Wout", hidden, bins)], ["m"]),
        helper.make_node("Sigmoid", ["m"], ["mask"]),
        helper.make_node("Concat", ["h1", "h2"], ["hN"], axis=0),
        helper.make_node("Concat", ["c1", "c2"], ["cN"], axis=0),
    ]
    state = ["layers", "batch", hidden]
    graph = helper.make_graph(
        nodes, "voice_filter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", features]),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, [2, "batch", hidden]),
         helper.make_tensor_value_info("c0", TensorProto.FLOAT, [2, "batch", hidden])],
        [helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "time", bins]),
         helper.make_tensor_value_info("hN", TensorProto.FLOAT, state),
         helper.make_tensor_value_info("cN", TensorProto.FLOAT, state)],
        w.tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main() -> None:
    for name, make in (("attention_tagger", attention_tagger), ("voice_filter", voice_filter)):
        model = make()
        onnx.checker.check_model(model, full_check=True)
        with tempfile.TemporaryDirectory() as scratch:
            source = Path(scratch) / f"{name}.onnx"
            onnx.save(model, source)
            quantize_dynamic(source, HERE / f"{name}_dyn.onnx", weight_type=QuantType.QInt8)
        ops = sorted({n.op_type for n in onnx.load(HERE / f"{name}_dyn.onnx").graph.node})
        print(name, (HERE / f"{name}_dyn.onnx").stat().st_size, "bytes:", " ".join(ops))


if __name__ == "__main__":
    main()
