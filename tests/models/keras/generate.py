"""Generate the tf2onnx test models in this folder from Keras 3, tf_keras and tf.compat.v1 graphs.

Needs TensorFlow, which the tests never import: run it from a separate environment, e.g.

    python3 -m venv /tmp/tfenv
    /tmp/tfenv/bin/pip install tensorflow-cpu==2.19.1 tf-keras==2.19.0 tf2onnx==1.17.0
    /tmp/tfenv/bin/python tests/models/keras/generate.py [case ...]

Named cases (e.g. ``unrolled_lstm_seq``) regenerate only those models of every flavour and keep the manifest's other
entries: tf2onnx names nodes after TensorFlow's function counters, so a model regenerated is not byte-identical.

Each flavour runs in its own process (tf_keras and the v1 cells need TF_USE_LEGACY_KERAS=1 before TensorFlow is
imported). Keras 3 models go through ``tf2onnx.convert.from_function`` on the model's call (tf2onnx's ``from_keras``
targets tf_keras), tf_keras models through ``tf2onnx.convert.from_keras``, and TF1 ``dynamic_rnn`` graphs (built
with ``tf.compat.v1.disable_v2_behavior()``, frozen) through ``tf2onnx.convert.from_graph_def``. Every weight is
redrawn from a seeded normal distribution so that biases are not zero. Writes ``<flavour>_<name>.onnx`` and
``manifest.json`` (versions, and per model the layers, opset, inputs and the recurrent ops / control flow emitted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLAVOURS = ("keras3", "tf_keras", "tf_v1")
FEATURES, VOCAB = 5, 12

# Inputs: (name, kind, size). "features": [batch, time, FEATURES] float; "masked_features": the same with some
# all-zero steps (keras.layers.Masking); "tokens": [batch, time] int32 in [0, VOCAB), 0 = padding; "state":
# [batch, size] float; "steps": [batch, size, FEATURES] float, a fixed number of steps (unroll=True needs one).
X, TOKENS = [("x", "features", 0)], [("x", "tokens", 0)]
X6, X7 = [("x", "steps", 6)], [("x", "steps", 7)]


def _stacked(L, x):
    y = L.LSTM(6, return_sequences=True)(L.LSTM(8, return_sequences=True)(x[0]))
    return L.Dense(3)(L.GRU(4)(y))


# name -> (opset, inputs, what the Keras model is, its construction from (keras.layers, inputs, keras))
SPECS = {
    "lstm_seq": (13, X, "LSTM(8, return_sequences=True)",
                 lambda L, x, k: L.LSTM(8, return_sequences=True)(x[0])),
    "lstm_state": (15, X, "LSTM(6, return_sequences=True, return_state=True)",
                   lambda L, x, k: L.LSTM(6, return_sequences=True, return_state=True)(x[0])),
    "lstm_last_nobias": (17, X, "LSTM(5, use_bias=False)", lambda L, x, k: L.LSTM(5, use_bias=False)(x[0])),
    "lstm_initial_state": (17, [*X, ("h0", "state", 6), ("c0", "state", 6)],
                           "LSTM(6, return_sequences=True)(x, initial_state=[h0, c0])",
                           lambda L, x, k: L.LSTM(6, return_sequences=True)(x[0], initial_state=list(x[1:]))),
    "lstm_relu": (17, X, "LSTM(5, activation='relu', return_sequences=True)",
                  lambda L, x, k: L.LSTM(5, activation="relu", return_sequences=True)(x[0])),
    "lstm_hard_sigmoid": (17, X, "LSTM(6, recurrent_activation='hard_sigmoid', return_sequences=True)",
                          lambda L, x, k: L.LSTM(6, recurrent_activation="hard_sigmoid", return_sequences=True)(x[0])),
    "lstm_go_backwards": (17, X, "LSTM(6, go_backwards=True, return_sequences=True)",
                          lambda L, x, k: L.LSTM(6, go_backwards=True, return_sequences=True)(x[0])),
    "gru_reset_after": (17, X, "GRU(8, return_sequences=True), reset_after=True",
                        lambda L, x, k: L.GRU(8, return_sequences=True)(x[0])),
    "gru_reset_before": (18, X, "GRU(8, reset_after=False, return_sequences=True)",
                         lambda L, x, k: L.GRU(8, reset_after=False, return_sequences=True)(x[0])),
    "gru_last_state": (15, X, "GRU(6, return_state=True)", lambda L, x, k: L.GRU(6, return_state=True)(x[0])),
    "gru_go_backwards": (13, X, "GRU(6, go_backwards=True)", lambda L, x, k: L.GRU(6, go_backwards=True)(x[0])),
    "gru_hard_sigmoid": (17, X, "GRU(6, recurrent_activation='hard_sigmoid', return_sequences=True)",
                         lambda L, x, k: L.GRU(6, recurrent_activation="hard_sigmoid", return_sequences=True)(x[0])),
    "simple_rnn": (15, X, "SimpleRNN(8, return_sequences=True)",
                   lambda L, x, k: L.SimpleRNN(8, return_sequences=True)(x[0])),
    "simple_rnn_relu_last": (17, X, "SimpleRNN(6, activation='relu')",
                             lambda L, x, k: L.SimpleRNN(6, activation="relu")(x[0])),
    "bi_lstm_concat": (17, X, "Bidirectional(LSTM(6, return_sequences=True))",
                       lambda L, x, k: L.Bidirectional(L.LSTM(6, return_sequences=True))(x[0])),
    "bi_gru_sum": (15, X, "Bidirectional(GRU(5, return_sequences=True), merge_mode='sum')",
                   lambda L, x, k: L.Bidirectional(L.GRU(5, return_sequences=True), merge_mode="sum")(x[0])),
    "bi_rnn_last": (18, X, "Bidirectional(SimpleRNN(4))", lambda L, x, k: L.Bidirectional(L.SimpleRNN(4))(x[0])),
    "stacked": (17, X, "LSTM(8, return_sequences=True) -> LSTM(6, return_sequences=True) -> GRU(4) -> Dense(3)",
                lambda L, x, k: _stacked(L, x)),
    "embedding_mask_lstm": (17, TOKENS, f"Embedding({VOCAB}, 4, mask_zero=True) -> LSTM(6)",
                            lambda L, x, k: L.LSTM(6)(L.Embedding(VOCAB, 4, mask_zero=True)(x[0]))),
    "masking_gru": (15, [("x", "masked_features", 0)], "Masking(0.0) -> GRU(6, return_sequences=True)",
                    lambda L, x, k: L.GRU(6, return_sequences=True)(L.Masking(0.0)(x[0]))),
    "tagger": (17, TOKENS,
               f"Embedding({VOCAB}, 4, mask_zero=True) -> Bidirectional(LSTM(5, return_sequences=True)) -> Dense(3)",
               lambda L, x, k: L.Dense(3)(L.Bidirectional(L.LSTM(5, return_sequences=True))(
                   L.Embedding(VOCAB, 4, mask_zero=True)(x[0])))),
    # at inference recurrent dropout multiplies h by ones_like(h) (tf_keras), dropout x by ones_like(x)
    "lstm_recurrent_dropout": (17, X, "LSTM(6, recurrent_dropout=0.2, return_sequences=True)",
                               lambda L, x, k: L.LSTM(6, recurrent_dropout=0.2, return_sequences=True)(x[0])),
    "bi_gru_dropout": (15, X, "Bidirectional(GRU(5, dropout=0.1, recurrent_dropout=0.3))",
                       lambda L, x, k: L.Bidirectional(L.GRU(5, dropout=0.1, recurrent_dropout=0.3))(x[0])),
    # mixed precision: float32 weights cast to float16 in the Loop body, the cell computed in float16
    "bi_lstm_float16": (17, X, "Bidirectional(LSTM(6, return_sequences=True, dtype='mixed_float16'))",
                        lambda L, x, k: L.Bidirectional(L.LSTM(6, return_sequences=True, dtype="mixed_float16"))(x[0])),
    "gru_float16": (17, X, "GRU(5, return_sequences=True, dtype='mixed_float16')",
                    lambda L, x, k: L.GRU(5, return_sequences=True, dtype="mixed_float16")(x[0])),
    "custom_cell": (17, X, "RNN(MinimalRNNCell(6), return_sequences=True), an own cell",
                    lambda L, x, k: L.RNN(minimal_cell(k)(6), return_sequences=True)(x[0])),
    # unroll=True: the exporter sees T copies of the cell step (passes/unrolled.py)
    "unrolled_lstm_seq": (17, X6, "LSTM(5, return_sequences=True, unroll=True)",
                          lambda L, x, k: L.LSTM(5, return_sequences=True, unroll=True)(x[0])),
    "unrolled_lstm_state": (15, X6, "LSTM(4, return_sequences=True, return_state=True, unroll=True)",
                            lambda L, x, k: L.LSTM(4, return_sequences=True, return_state=True, unroll=True)(x[0])),
    "unrolled_gru_reset_after": (17, X7, "GRU(5, return_sequences=True, unroll=True), reset_after=True",
                                 lambda L, x, k: L.GRU(5, return_sequences=True, unroll=True)(x[0])),
    "unrolled_gru_reset_before": (13, X6, "GRU(5, reset_after=False, return_sequences=True, unroll=True)",
                                  lambda L, x, k: L.GRU(5, reset_after=False, return_sequences=True,
                                                        unroll=True)(x[0])),
    "unrolled_simple_rnn": (15, X6, "SimpleRNN(5, return_sequences=True, unroll=True)",
                            lambda L, x, k: L.SimpleRNN(5, return_sequences=True, unroll=True)(x[0])),
    "unrolled_simple_rnn_relu_last": (17, X7, "SimpleRNN(4, activation='relu', unroll=True)",
                                      lambda L, x, k: L.SimpleRNN(4, activation="relu", unroll=True)(x[0])),
    "unrolled_lstm_go_backwards": (17, X6, "LSTM(5, go_backwards=True, return_sequences=True, unroll=True)",
                                   lambda L, x, k: L.LSTM(5, go_backwards=True, return_sequences=True,
                                                          unroll=True)(x[0])),
    "unrolled_bi_gru_concat": (17, X6, "Bidirectional(GRU(4, return_sequences=True, unroll=True))",
                               lambda L, x, k: L.Bidirectional(L.GRU(4, return_sequences=True, unroll=True))(x[0])),
    "unrolled_stacked": (17, X6, "LSTM(6, return_sequences=True, unroll=True) -> GRU(4, unroll=True)",
                         lambda L, x, k: L.GRU(4, unroll=True)(L.LSTM(6, return_sequences=True, unroll=True)(x[0]))),
}


def minimal_cell(keras):
    """A cell tf2onnx cannot match to an ONNX op: h = tanh(x K + h R) * sigmoid(h G) + b."""

    class MinimalRNNCell(keras.layers.Layer):
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units, self.state_size = units, units

        def build(self, input_shape):
            self.kernel = self.add_weight(shape=(input_shape[-1], self.units), name="kernel")
            self.recurrent = self.add_weight(shape=(self.units, self.units), name="recurrent")
            self.gate = self.add_weight(shape=(self.units, self.units), name="gate")
            self.bias = self.add_weight(shape=(self.units,), name="bias")

        def call(self, inputs, states):
            h = states[0]
            ops = keras.ops if hasattr(keras, "ops") else keras.backend
            out = ops.tanh(ops.dot(inputs, self.kernel) + ops.dot(h, self.recurrent))
            out = out * ops.sigmoid(ops.dot(h, self.gate)) + self.bias
            return out, [out]

    return MinimalRNNCell


# tf.compat.v1 graphs (dynamic_rnn over v1 cells, frozen): name -> (opset, inputs, what it is, cells, options).
# Inputs as above, plus "lengths": [batch] int32 sequence_length in [1, time].
V1_SPECS = {
    "lstm_peepholes": (15, X, "dynamic_rnn(LSTMCell(5, use_peepholes=True))",
                       lambda rc: rc.LSTMCell(5, use_peepholes=True), {}),
    "lstm_cell_clip": (13, X, "dynamic_rnn(LSTMCell(5, cell_clip=0.5))", lambda rc: rc.LSTMCell(5, cell_clip=0.5), {}),
    "lstm_projection": (17, X, "dynamic_rnn(LSTMCell(6, num_proj=3))", lambda rc: rc.LSTMCell(6, num_proj=3), {}),
    "gru_cell": (17, X, "dynamic_rnn(GRUCell(5))", lambda rc: rc.GRUCell(5), {}),
    "basic_rnn_cell": (13, X, "dynamic_rnn(BasicRNNCell(5))", lambda rc: rc.BasicRNNCell(5), {}),
    "bi_gru_cell": (15, X, "bidirectional_dynamic_rnn(GRUCell(4), GRUCell(4)), outputs concatenated",
                    lambda rc: rc.GRUCell(4), {"bidirectional": True}),
    "lstm_sequence_length": (15, [*X, ("lengths", "lengths", 0)],
                             "dynamic_rnn(BasicLSTMCell(4), sequence_length=lengths), final h too",
                             lambda rc: rc.BasicLSTMCell(4), {"lengths": True}),
    "multi_cell": (17, X, "dynamic_rnn(MultiRNNCell([LSTMCell(5), GRUCell(4)]))",
                   lambda rc: rc.MultiRNNCell([rc.LSTMCell(5), rc.GRUCell(4)]), {}),
}


def keras_models(flavour: str, tf, tf2onnx, np, cases):
    """(name, opset, inputs, description, converter, ModelProto) for each Keras spec among ``cases`` (None: all)."""
    if flavour == "tf_keras":
        import tf_keras as keras
    else:
        import keras
    for name, (opset, input_specs, description, build) in SPECS.items():
        if cases is not None and name not in cases:
            continue
        keras.utils.set_random_seed(0)
        rng = np.random.default_rng(zlib.crc32(f"{flavour}/{name}".encode()))
        keras_inputs, signature = [], []
        for input_name, kind, units in input_specs:
            shape, dtype = {"features": ((None, FEATURES), "float32"), "masked_features": ((None, FEATURES), "float32"),
                            "tokens": ((None,), "int32"), "state": ((units,), "float32"),
                            "steps": ((units, FEATURES), "float32")}[kind]
            keras_inputs.append(keras.Input(shape, dtype=dtype, name=input_name))
            signature.append(tf.TensorSpec((None, *shape), dtype, name=input_name))
        model = keras.Model(keras_inputs, build(keras.layers, keras_inputs, keras))
        for weight in model.weights:  # non-zero biases; scale keeps activations away from saturation
            weight.assign(rng.normal(0.0, 0.5, tuple(weight.shape)).astype("float32"))
        if flavour == "tf_keras":
            proto, _ = tf2onnx.convert.from_keras(model, input_signature=signature, opset=opset)
            converter = "tf2onnx.convert.from_keras"
        else:
            @tf.function(input_signature=signature)
            def call(*args, model=model):
                return model(list(args) if len(args) > 1 else args[0])

            proto, _ = tf2onnx.convert.from_function(call, input_signature=signature, opset=opset)
            converter = "tf2onnx.convert.from_function(tf.function(model))"
        yield name, opset, input_specs, description, converter, proto


def tf_v1_models(tf, tf2onnx, np, cases):
    """The V1_SPECS in TF1 graph mode (tf.compat.v1.disable_v2_behavior), frozen, through from_graph_def."""
    v1 = tf.compat.v1
    v1.disable_v2_behavior()
    for name, (opset, input_specs, description, make_cell, options) in V1_SPECS.items():
        if cases is not None and name not in cases:
            continue
        rng = np.random.default_rng(zlib.crc32(f"tf_v1/{name}".encode()))
        graph = tf.Graph()
        with graph.as_default():
            x = v1.placeholder(tf.float32, [None, None, FEATURES], name="x")
            lengths = v1.placeholder(tf.int32, [None], name="lengths") if options.get("lengths") else None
            outputs = []
            if options.get("bidirectional"):
                (fw, bw), _ = v1.nn.bidirectional_dynamic_rnn(make_cell(v1.nn.rnn_cell), make_cell(v1.nn.rnn_cell), x,
                                                              dtype=tf.float32)
                outputs.append(tf.identity(tf.concat([fw, bw], -1), name="y"))
            else:
                y, state = v1.nn.dynamic_rnn(make_cell(v1.nn.rnn_cell), x, sequence_length=lengths, dtype=tf.float32)
                outputs.append(tf.identity(y, name="y"))
                if lengths is not None:
                    outputs.append(tf.identity(state.h, name="h"))
            with v1.Session(graph=graph) as session:
                session.run(v1.global_variables_initializer())
                for variable in v1.global_variables():
                    variable.load(rng.normal(0.0, 0.5, variable.shape.as_list()).astype("float32"), session)
                names = [o.name.split(":")[0] for o in outputs]
                frozen = v1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), names)
        inputs = ["x:0"] + (["lengths:0"] if lengths is not None else [])
        proto, _ = tf2onnx.convert.from_graph_def(frozen, input_names=inputs, output_names=[n + ":0" for n in names],
                                                  opset=opset)
        yield name, opset, input_specs, description, "tf2onnx.convert.from_graph_def (frozen TF1 graph)", proto


def generate(flavour: str, manifest_part: Path, cases: list[str] | None) -> None:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if flavour != "keras3":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported
    import numpy as np
    import onnx
    import tensorflow as tf
    import tf2onnx

    models = (tf_v1_models(tf, tf2onnx, np, cases) if flavour == "tf_v1" else
              keras_models(flavour, tf, tf2onnx, np, cases))
    dims = {"features": ["batch", "time", FEATURES], "masked_features": ["batch", "time", FEATURES],
            "tokens": ["batch", "time"], "state": ["batch"], "lengths": ["batch"], "steps": ["batch"]}
    kinds = {"features": "float", "masked_features": "float_masked", "tokens": f"tokens:{VOCAB}", "state": "float",
             "lengths": "lengths", "steps": "float"}
    sizes = {"state": lambda u: [u], "steps": lambda u: [u, FEATURES]}
    entries = []
    for name, opset, input_specs, description, converter, proto in models:
        path = HERE / f"{flavour}_{name}.onnx"
        onnx.save(proto, path)
        ops = sorted({n.op_type for n in proto.graph.node} & {"LSTM", "GRU", "RNN", "Loop", "Scan"})
        entries.append({
            "file": path.name, "case": name, "exporter": f"tf2onnx ({flavour})", "pattern": description,
            "opset": opset, "emitted": ops, "bytes": path.stat().st_size,
            "inputs": {n + (":0" if flavour == "tf_v1" else ""): {
                "kind": kinds[k], "dims": dims[k] + sizes.get(k, lambda u: [])(u)} for n, k, u in input_specs},
            "settings": {"converter": converter, "opset": opset, "input_signature": "batch dynamic (None), time fixed"
                         if any(k == "steps" for _, k, _ in input_specs) else "batch and time dynamic (None)"},
        })
        print(path.name, ops, path.stat().st_size, flush=True)
    versions = {"tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__, "onnx": onnx.__version__,
                "numpy": np.__version__, "python": sys.version.split()[0]}
    if flavour == "keras3":
        import keras
        versions["keras3"] = keras.__version__
    else:
        import tf_keras
        versions["tf_keras"] = tf_keras.__version__
    manifest_part.write_text(json.dumps({"versions": versions, "models": entries}))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:  # child process: one flavour
        generate(sys.argv[2], Path(sys.argv[3]), sys.argv[5:] if sys.argv[4] == "some" else None)
        return
    cases = sys.argv[1:]
    unknown = set(cases) - set(SPECS) - set(V1_SPECS)
    if unknown:
        raise SystemExit(f"unknown cases: {sorted(unknown)}")
    manifest = {"generated_by": "tests/models/keras/generate.py", "versions": {},
                "sizes": {"batch": {"export": 2, "second": 3}, "time": {"export": 5, "second": 7}}, "models": []}
    kept = json.loads((HERE / "manifest.json").read_text())["models"] if cases else []
    with tempfile.TemporaryDirectory() as tmp:
        for flavour in FLAVOURS:
            part = Path(tmp) / f"{flavour}.json"
            subprocess.run([sys.executable, __file__, "--child", flavour, str(part), "some" if cases else "all",
                            *cases], check=True)
            data = json.loads(part.read_text())
            manifest["versions"].update(data["versions"])
            new = {entry["file"]: entry for entry in data["models"]}
            old = [e for e in kept if e["exporter"] == f"tf2onnx ({flavour})"]
            manifest["models"] += [new.pop(e["file"], e) for e in old] + list(new.values())
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
