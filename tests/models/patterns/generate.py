"""Rebuild, node for node, what keras2onnx, MXNet's mx2onnx and paddle2onnx emit around LSTM/GRU/RNN.

None of the three installs here (keras2onnx needs Keras 2 / TF <= 2.3, MXNet is retired, paddle2onnx needs
paddlepaddle), so their recurrent converters were read and their output rebuilt with onnx.helper:
- keras2onnx (onnx/keras-onnx @ 3b6da29, keras2onnx/ke2onnx/{lstm,gru,simplernn,common,main,embedding}.py and
  onnxconverter-common's apply_lstm/apply_gru): Keras weights transposed (LSTM ifco -> iofc) into initializers, Rb zero
  (GRU reset_after=True keeps its [2, 3H] bias), sequence_lens = ReduceSum(Cast(mask, int32), axes=[-1]) from the
  Embedding(mask_zero) / Masking mask, activations spelled out (HardSigmoid with alpha 0.2 / beta 0.5, linear as
  Affine with alpha 1), go_backwards as direction=reverse plus a ReverseSequence of the output, initial states
  Unsqueezed, bidirectional outputs Transposed and Reshaped / Flattened.
- mx2onnx (apache/mxnet @ b84609d, python/mxnet/onnx/mx2onnx/_op_translations/_op_translations_opset{12,13}.py,
  convert_RNN): W, R and B Sliced out of one flat parameter blob (the 1-layer offsets depend on Shape(data)),
  Split into gates, re-Concatenated in ONNX gate order and Reshaped; sequence_lens = Cast(Tile(T, N)); initial
  states = Mul(state, ConstantOfShape([D, N, H], 1)); GRU linear_before_reset=1; time-major data, Y Squeezed.
- paddle2onnx (PaddlePaddle/Paddle2ONNX @ 70b3dd3, paddle2onnx/mapper/nn/rnn.cc, RnnMapper): one op per layer;
  each weight Unsqueezed, Concatenated over directions and reordered by Slice + Concat on axis 1 (LSTM ifco ->
  iofc, GRU rzc -> zrc); initial states Sliced per layer out of PreState; Y Transposed [0, 2, 1, 3] and Reshaped
  [0, 0, -1] between layers; GRU linear_before_reset=1; paddle.nn's batch-major Transposes around it.

Weights are drawn from a seeded RNG in each framework's own layout. Run: python tests/models/patterns/generate.py
(writes <exporter>_<case>.onnx and manifest.json here).
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
SOURCES = {
    "keras2onnx": "github.com/onnx/keras-onnx@3b6da290 keras2onnx/ke2onnx/{lstm,gru,simplernn,common,main}.py",
    "mxnet": "github.com/apache/mxnet@b84609d3 python/mxnet/onnx/mx2onnx/_op_translations/_op_translations_opset13.py",
    "paddle2onnx": "github.com/PaddlePaddle/Paddle2ONNX@70b3dd35 paddle2onnx/mapper/nn/rnn.cc",
}
SIZES = {"batch": {"export": 2, "second": 3}, "time": {"export": 5, "second": 7}}
VOCAB = 12


class Graph:
    """Collects nodes and initializers; every op gets fresh output names."""

    def __init__(self, prefix: str, opset: int):
        self.prefix, self.opset = prefix, opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}/{hint}_{self.count}"

    def const(self, value, dtype=np.int64, hint: str = "const") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type: str, inputs, outputs: int | list[str] = 1, **attrs):
        names = outputs if isinstance(outputs, list) else [self.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.name(op_type + "_node"), **attrs))
        return names[0] if len(names) == 1 else names

    # ops whose axes moved from attributes to inputs (Squeeze/Unsqueeze/ReduceSum at 13, Slice at 10)
    def squeeze(self, x, axes):
        return self.op("Squeeze", [x, self.const(axes)]) if self.opset >= 13 else self.op("Squeeze", [x], axes=axes)

    def unsqueeze(self, x, axes):
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(axes)])
        return self.op("Unsqueeze", [x], axes=axes)

    def reduce_sum(self, x, axes, keepdims):
        if self.opset >= 13:
            return self.op("ReduceSum", [x, self.const(axes)], keepdims=keepdims)
        return self.op("ReduceSum", [x], axes=axes, keepdims=keepdims)

    def slice(self, x, axes, starts, ends):
        if self.opset >= 10:
            return self.op("Slice", [x, self.const(starts), self.const(ends), self.const(axes)])
        return self.op("Slice", [x], axes=axes, starts=starts, ends=ends)


def model(graph: Graph, inputs, outputs) -> onnx.ModelProto:
    """inputs: (name, elem type, dims with None for dynamic); outputs: names (types from shape inference) or, where
    inference cannot tell the rank, (name, elem type, dims)."""
    proto = helper.make_model(
        helper.make_graph(graph.nodes, graph.prefix, [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) if isinstance(o, tuple) else
                           helper.make_empty_tensor_value_info(o) for o in outputs], graph.initializers),
        opset_imports=[helper.make_opsetid("", graph.opset)],
        ir_version=max(4, helper.find_min_ir_version_for([helper.make_opsetid("", graph.opset)])),
        producer_name="tests/models/patterns/generate.py")
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    known = {v.name: v for v in inferred.graph.output}
    for out in proto.graph.output:
        if not out.type.HasField("tensor_type"):
            out.CopyFrom(known[out.name])
    onnx.checker.check_model(proto, full_check=True)
    return proto


def normal(rng, *shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# keras2onnx

IFCO_TO_IOFC = [0, 3, 1, 2]


def keras_weights(rng, cell: str, input_size: int, hidden: int, reset_after: bool = False):
    """Keras kernel [I, gH], recurrent_kernel [H, gH], bias ([gH], or [2, gH] for GRU reset_after) as keras2onnx
    turns them into ONNX W [gH, I], R [gH, H], B [2gH] for one direction."""
    gates = {"lstm": 4, "gru": 3, "rnn": 1}[cell]
    kernel, recurrent = normal(rng, input_size, gates * hidden), normal(rng, hidden, gates * hidden)
    bias = normal(rng, 2, gates * hidden) if reset_after else normal(rng, gates * hidden)
    W, R = kernel.T, recurrent.T
    if cell == "lstm":  # Keras gate order i, f, c, o -> ONNX i, o, f, c
        W, R, bias = (np.concatenate([np.split(t, 4)[k] for k in IFCO_TO_IOFC]) for t in (W, R, bias))
    B = bias.reshape(-1) if reset_after else np.concatenate([bias, np.zeros_like(bias)])
    return W, R, B


def keras_params(graph: Graph, rng, cell, input_size, hidden, directions=1, reset_after=False):
    per_direction = [keras_weights(rng, cell, input_size, hidden, reset_after) for _ in range(directions)]
    stacked = [np.stack(ts) for ts in zip(*per_direction, strict=True)]
    return [graph.const(t, np.float32, hint) for hint, t in zip("WRB", stacked, strict=True)]


def keras_activations(names: list[str]) -> dict:
    """keras2onnx's extract_activations: hard_sigmoid -> HardSigmoid(0.2, 0.5), linear -> Affine(1.0)."""
    onnx_names = {"sigmoid": "Sigmoid", "hard_sigmoid": "HardSigmoid", "tanh": "Tanh", "relu": "Relu",
                  "linear": "Affine", "softsign": "Softsign"}
    alphas = [{"hard_sigmoid": 0.2, "linear": 1.0}[n] for n in names if n in ("hard_sigmoid", "linear")]
    betas = [0.5 for n in names if n == "hard_sigmoid"]
    attrs = {"activations": [onnx_names[n] for n in names]}
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    return attrs


def keras_sequence_lens(graph: Graph, mask: str) -> str:
    return graph.reduce_sum(graph.op("Cast", [mask], to=TensorProto.INT32), [-1], keepdims=0)


def keras_reverse_sequence(graph: Graph, x: str) -> str:
    """keras2onnx's reverse_sequence on batch-major [N, T, H]: lengths Expand(T, N) from Shape."""
    shape = graph.op("Shape", [x])
    batch = graph.op("Gather", [shape, graph.const([0])])
    steps = graph.op("Gather", [shape, graph.const([1])])
    lengths = graph.op("Expand", [steps, batch])
    return graph.op("Identity", [graph.op("ReverseSequence", [x, lengths], batch_axis=0, time_axis=1)])


def k2o_lstm_embedding_mask(rng):
    """Embedding(12, 4, mask_zero=True) -> LSTM(6) (Keras 2.2 default recurrent_activation hard_sigmoid) ->
    Dense(3); tokens fed as float, as keras2onnx's Embedding expects."""
    g, hidden = Graph("keras2onnx_lstm_embedding_mask", 11), 6
    mask = g.op("Not", [g.op("Equal", ["tokens", g.const([0.0], np.float32)])])
    embedded = g.op("Gather", [g.const(normal(rng, VOCAB, 4), np.float32, "embeddings"),
                               g.op("Cast", ["tokens"], to=TensorProto.INT32)])
    x = g.op("Transpose", [embedded], perm=[1, 0, 2])
    W, R, B = keras_params(g, rng, "lstm", 4, hidden)
    _, y_h, _ = g.op("LSTM", [x, W, R, B, keras_sequence_lens(g, mask), "", "", ""], 3, direction="forward",
                     hidden_size=hidden, **keras_activations(["hard_sigmoid", "tanh", "tanh"]))
    last = g.squeeze(y_h, [0])
    dense = g.op("Add", [g.op("MatMul", [last, g.const(normal(rng, hidden, 3), np.float32)]),
                         g.const(normal(rng, 3), np.float32)], ["scores"])
    return model(g, [("tokens", TensorProto.FLOAT, [None, None])], [dense]), {
        "pattern": "Embedding(mask_zero=True) -> LSTM(hard_sigmoid) -> Dense: sequence_lens = ReduceSum(Cast(mask))",
        "inputs": {"tokens": {"kind": f"tokens:{VOCAB}", "dims": ["batch", "time"]}}}


def k2o_gru_masking_backwards(rng):
    """Masking(0.0) -> GRU(5, reset_after=True, recurrent_activation='hard_sigmoid', go_backwards=True,
    return_sequences=True, return_state=True)."""
    g, hidden, features = Graph("keras2onnx_gru_masking_backwards", 13), 5, 4
    kept = g.op("Cast", [g.op("Not", [g.op("Equal", ["x", g.const([0.0], np.float32)])])], to=TensorProto.FLOAT)
    mask = g.op("Greater", [g.reduce_sum(kept, [-1], keepdims=0), g.const(0.0, np.float32)])
    step_kept = g.op("Cast", [g.op("Greater", [g.reduce_sum(kept, [-1], keepdims=1), g.const(0.0, np.float32)])],
                     to=TensorProto.FLOAT)
    masked = g.op("Mul", [step_kept, "x"])
    W, R, B = keras_params(g, rng, "gru", features, hidden, reset_after=True)
    y, y_h = g.op("GRU", [g.op("Transpose", [masked], perm=[1, 0, 2]), W, R, B, keras_sequence_lens(g, mask), ""],
                  2, direction="reverse", hidden_size=hidden, linear_before_reset=1,
                  **keras_activations(["hard_sigmoid", "tanh"]))
    sequence = g.op("Transpose", [g.squeeze(y, [1])], perm=[1, 0, 2])
    out = g.op("Identity", [keras_reverse_sequence(g, sequence)], ["sequence"])
    state = g.op("Identity", [g.squeeze(y_h, [0])], ["state"])
    return model(g, [("x", TensorProto.FLOAT, [None, None, features])], [out, state]), {
        "pattern": "Masking -> GRU(reset_after, hard_sigmoid, go_backwards): direction=reverse + ReverseSequence",
        "inputs": {"x": {"kind": "float_masked", "dims": ["batch", "time", features]}}}


def k2o_gru_embedding_mask(rng):
    """Embedding(12, 4, mask_zero=True) -> GRU(6, return_sequences=True) with tf.keras 2 defaults (sigmoid,
    reset_after=True): default activations, so the ONNX GRU is exact on nn.GRU, lengths computed at run time."""
    g, hidden = Graph("keras2onnx_gru_embedding_mask", 13), 6
    mask = g.op("Not", [g.op("Equal", ["tokens", g.const([0.0], np.float32)])])
    embedded = g.op("Gather", [g.const(normal(rng, VOCAB, 4), np.float32, "embeddings"),
                               g.op("Cast", ["tokens"], to=TensorProto.INT32)])
    W, R, B = keras_params(g, rng, "gru", 4, hidden, reset_after=True)
    y, _ = g.op("GRU", [g.op("Transpose", [embedded], perm=[1, 0, 2]), W, R, B, keras_sequence_lens(g, mask), ""],
                2, direction="forward", hidden_size=hidden, linear_before_reset=1,
                **keras_activations(["sigmoid", "tanh"]))
    out = g.op("Transpose", [g.squeeze(y, [1])], ["sequence"], perm=[1, 0, 2])
    return model(g, [("tokens", TensorProto.FLOAT, [None, None])], [out]), {
        "pattern": "Embedding(mask_zero=True) -> GRU(reset_after=True): run-time sequence_lens on the nn.GRU path",
        "inputs": {"tokens": {"kind": f"tokens:{VOCAB}", "dims": ["batch", "time"]}}}


def k2o_bi_simplernn_linear(rng):
    """Bidirectional(SimpleRNN(4, activation='linear', return_sequences=True)), merge_mode='concat'."""
    g, hidden, features = Graph("keras2onnx_bi_simplernn_linear", 9), 4, 3
    W, R, B = keras_params(g, rng, "rnn", features, hidden, directions=2)
    y, _ = g.op("RNN", [g.op("Transpose", ["x"], perm=[1, 0, 2]), W, R, B, "", ""], 2, direction="bidirectional",
                hidden_size=hidden, **keras_activations(["linear", "linear"]))
    out = g.op("Reshape", [g.op("Transpose", [y], perm=[2, 0, 1, 3]), g.const([0, 0, 2 * hidden])], ["y"])
    return model(g, [("x", TensorProto.FLOAT, [None, None, features])], [out]), {
        "pattern": "Bidirectional(SimpleRNN(linear)): activations Affine(alpha=1), Y Transpose + Reshape",
        "inputs": {"x": {"kind": "float", "dims": ["batch", "time", features]}}}


def k2o_lstm_initial_state(rng):
    """LSTM(5, activation='relu', return_sequences=True, return_state=True)(x, initial_state=[h0, c0])."""
    g, hidden, features = Graph("keras2onnx_lstm_initial_state", 12), 5, 4
    W, R, B = keras_params(g, rng, "lstm", features, hidden)
    y, y_h, y_c = g.op("LSTM", [g.op("Transpose", ["x"], perm=[1, 0, 2]), W, R, B, "", g.unsqueeze("h0", [0]),
                                g.unsqueeze("c0", [0]), ""], 3, direction="forward", hidden_size=hidden,
                       **keras_activations(["sigmoid", "relu", "relu"]))
    out = g.op("Transpose", [g.squeeze(y, [1])], ["y"], perm=[1, 0, 2])
    h, c = g.op("Squeeze", [y_h], ["h"], axes=[0]), g.op("Squeeze", [y_c], ["c"], axes=[0])
    inputs = [("x", TensorProto.FLOAT, [None, None, features]), ("h0", TensorProto.FLOAT, [None, hidden]),
              ("c0", TensorProto.FLOAT, [None, hidden])]
    return model(g, inputs, [out, h, c]), {
        "pattern": "LSTM(relu) with initial_state (Unsqueeze) and return_state (Squeeze)",
        "inputs": {"x": {"kind": "float", "dims": ["batch", "time", features]},
                   "h0": {"kind": "float", "dims": ["batch", hidden]},
                   "c0": {"kind": "float", "dims": ["batch", hidden]}}}


def k2o_bi_gru_reset_before(rng):
    """Bidirectional(GRU(4, activation='softsign', reset_after=False)), merge_mode='concat', last state only."""
    g, hidden, features = Graph("keras2onnx_bi_gru_reset_before", 10), 4, 3
    W, R, B = keras_params(g, rng, "gru", features, hidden, directions=2)
    _, y_h = g.op("GRU", [g.op("Transpose", ["x"], perm=[1, 0, 2]), W, R, B, "", ""], 2, direction="bidirectional",
                  hidden_size=hidden, linear_before_reset=0,
                  **keras_activations(["sigmoid", "softsign", "sigmoid", "softsign"]))
    out = g.op("Flatten", [g.op("Transpose", [y_h], perm=[1, 0, 2])], ["y"], axis=1)
    return model(g, [("x", TensorProto.FLOAT, [None, None, features])], [out]), {
        "pattern": "Bidirectional(GRU(softsign, reset_after=False)): linear_before_reset=0, Y_h Transpose + Flatten",
        "inputs": {"x": {"kind": "float", "dims": ["batch", "time", features]}}}


# ---------------------------------------------------------------------------------------------------------------
# MXNet mx2onnx

MX_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
# MXNet gate order (i f c o / r z n) -> ONNX (i o f c / z r h): the order Concat takes the Split pieces in
MX_TO_ONNX = {"lstm": [0, 3, 1, 2], "gru": [1, 0, 2], "rnn_tanh": [0], "rnn_relu": [0]}


def mx_param_blob(rng, mode, layers, directions, input_size, hidden):
    """MXNet's fused RNN parameter vector: every layer's and direction's i2h then h2h weight, then their biases
    (the same order and gate layout as torch's nn.LSTM/GRU/RNN)."""
    gh, weights, biases = MX_GATES[mode] * hidden, [], []
    for layer in range(layers):
        for _ in range(directions):
            weights += [normal(rng, gh, input_size if layer == 0 else hidden * directions), normal(rng, gh, hidden)]
            biases += [normal(rng, gh), normal(rng, gh)]
    return np.concatenate([t.reshape(-1) for t in weights + biases])


def mx_take(g: Graph, blob: str, start: str, end: str, mode: str, shape: str, pieces: int) -> str:
    """Slice [start, end) of the blob, Split it into pieces (per gate, twice that for a bias), Concat them in ONNX
    gate order and Reshape: mx2onnx's recipe for each of W, R and B."""
    flat = g.op("Slice", [blob, start, end])
    order = MX_TO_ONNX[mode]
    if pieces > 1:
        parts = g.op("Split", [flat], pieces, axis=0) if g.opset >= 13 else g.op("Split", [flat], pieces)
        parts = [parts] if isinstance(parts, str) else parts
        gates = len(order)
        flat = g.op("Concat", [parts[k + gates * half] for half in range(pieces // gates) for k in order], axis=0)
    return g.op("Reshape", [flat, shape])


def mxnet_rnn(rng, case: str, mode: str, layers: int, bidirectional: bool, input_size: int, hidden: int,
              dynamic: bool, state_inputs: bool, opset: int = 13):
    """mx2onnx's convert_RNN for the supported layouts (1 layer, 1 bidirectional LSTM layer, 2 layers with
    input size = hidden size)."""
    g = Graph(f"mxnet_{case}", opset)
    dims = [None if dynamic else SIZES["time"]["export"], None if dynamic else SIZES["batch"]["export"]]
    directions = 2 if bidirectional else 1
    gates = MX_GATES[mode]
    blob = g.const(mx_param_blob(rng, mode, layers, directions, input_size, hidden), np.float32, "rnn_parameters")
    one = g.const([1])
    state_size = g.const([hidden])
    shape = g.op("Shape", ["data"])
    seq_length, batch_size, in_size = g.op("Split", [shape], 3)
    ones = g.op("ConstantOfShape", [g.op("Concat", [g.const([directions]), batch_size, state_size], axis=0)],
                value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
    states = ["state", "state_cell"] if mode == "lstm" else ["state"]
    if not state_inputs:  # a gluon layer's begin_state: zeros of batch 1, broadcast by the Mul
        states = [g.const(np.zeros((layers * directions, 1, hidden)), np.float32, s) for s in states]
    initial = [g.op("Mul", [s, ones]) for s in states]
    lengths = g.op("Cast", [g.op("Tile", [seq_length, batch_size])], to=TensorProto.INT32)
    squeeze = (lambda x, out: g.op("Squeeze", [x, one], [out])) if opset >= 13 else (
        lambda x, out: g.op("Squeeze", [x], [out], axes=[1]))
    gh = gates * hidden
    w_shape, b_shape = g.const([1, gh, hidden]), g.const([1, 2 * gh])
    attrs = {"hidden_size": hidden}
    attrs |= {"linear_before_reset": 1} if mode == "gru" else {}
    attrs |= {"activations": [{"rnn_tanh": "Tanh", "rnn_relu": "Relu"}[mode]]} if mode.startswith("rnn") else {}
    op_type = {"lstm": "LSTM", "gru": "GRU"}.get(mode, "RNN")
    outputs = 3 if mode == "lstm" else 2
    if layers == 1:
        w_size = g.op("Mul", [g.const([gh]), in_size])  # the W slice's end depends on Shape(data)
        w_dims = g.op("Concat", [one, g.const([gh]), in_size], axis=0)
        offset, per_direction = g.const([0]), []
        for _ in range(directions):
            w_end = g.op("Add", [offset, w_size])
            r_end = g.op("Add", [w_end, g.const([gh * hidden])])
            per_direction.append([mx_take(g, blob, offset, w_end, mode, w_dims, gates),
                                  mx_take(g, blob, w_end, r_end, mode, w_shape, gates)])
            offset = r_end
        for d in range(directions):
            b_end = g.op("Add", [offset, g.const([2 * gh])])
            per_direction[d].append(mx_take(g, blob, offset, b_end, mode, b_shape, 2 * gates))
            offset = b_end
        W, R, B = (ts[0] if directions == 1 else g.op("Concat", list(ts), axis=0)
                   for ts in zip(*per_direction, strict=True))
        direction = {"direction": "bidirectional"} if bidirectional else {}
        y, *states_out = g.op(op_type, ["data", W, R, B, lengths, *initial], outputs, **attrs, **direction)
        if bidirectional:  # [T, 2, N, H] -> [T, N, 2H]
            out_shape = g.op("Concat", [seq_length, batch_size, g.const([-1])], axis=0)
            out = g.op("Reshape", [g.op("Transpose", [y], perm=[0, 2, 1, 3]), out_shape], ["out"])
            out = ("out", TensorProto.FLOAT, [*dims, 2 * hidden])
        else:
            out = squeeze(y, "out")
        state_names = [g.op("Identity", [s], [n]) for s, n in zip(states_out, ["h_n", "c_n"], strict=False)]
    else:  # two layers, input size = hidden size: every offset is a constant
        square = gh * hidden
        weights_end = g.const([4 * square])
        initial = [g.op("Split", [s], 2, axis=0) for s in initial]
        x, finals = "data", []
        for layer in range(2):
            w_start, r_start = g.const([2 * layer * square]), g.const([(2 * layer + 1) * square])
            r_end = g.const([(2 * layer + 2) * square])
            b_start = g.op("Add", [weights_end, g.const([2 * gh * layer])])
            b_end = g.op("Add", [b_start, g.const([2 * gh])])
            W = mx_take(g, blob, w_start, r_start, mode, w_shape, gates)
            R = mx_take(g, blob, r_start, r_end, mode, w_shape, gates)
            B = mx_take(g, blob, b_start, b_end, mode, b_shape, 2 * gates)
            y, *layer_states = g.op(op_type, [x, W, R, B, lengths, *(s[layer] for s in initial)], outputs, **attrs)
            x = squeeze(y, "out" if layer else g.name("layer0_out"))
            finals.append(layer_states)
        state_names = [g.op("Concat", list(s), [n], axis=0) for s, n in zip(zip(*finals, strict=True), ["h_n", "c_n"],
                                                                            strict=False)]
        out = x
    inputs = [("data", TensorProto.FLOAT, [*dims, input_size])]
    state_dims = [layers * directions, dims[1], hidden]
    if state_inputs:
        inputs += [(s, TensorProto.FLOAT, state_dims) for s in ["state", "state_cell"][: len(initial)]]
    spec = {"data": {"kind": "float", "dims": ["time", "batch", input_size]}}
    spec |= {s: {"kind": "float", "dims": [layers * directions, "batch", hidden]} for s, *_ in inputs[1:]}
    reference = {"mode": mode, "layers": layers, "bidirectional": bidirectional, "input_size": input_size,
                 "hidden_size": hidden, "parameters": blob, "time_major": True}
    return model(g, inputs, [out, *state_names]), {
        "pattern": f"gluon.rnn {mode}, {layers} layer(s){', bidirectional' if bidirectional else ''}, "
                   f"{'dynamic' if dynamic else 'static'} shapes, begin_state "
                   f"{'given as inputs' if state_inputs else 'zeros'}",
        "inputs": spec, "reference": reference}


# ---------------------------------------------------------------------------------------------------------------
# paddle2onnx

PADDLE_REFORM = {"LSTM": [(0, 1), (3, 4), (1, 3)], "GRU": [(1, 2), (0, 1), (2, 3)]}  # ifco -> iofc, rzc -> zrc


def paddle_rnn(rng, case: str, mode: str, layers: int, bidirectional: bool, input_size: int, hidden: int,
               state_inputs: bool, opset: int):
    """paddle.nn.LSTM / GRU (time_major=False) as paddle2onnx's RnnMapper writes it."""
    g = Graph(f"paddle2onnx_{case}", opset)
    directions = 2 if bidirectional else 1
    gh = (4 if mode == "LSTM" else 3) * hidden
    weights, biases = [], []  # paddle's WeightList: every weight (per layer, direction: ih, hh), then every bias
    for layer in range(layers):
        for d in range(directions):
            size = input_size if layer == 0 else hidden * directions
            tag = f"{mode.lower()}_l{layer}{'_reverse' if d else ''}"
            weights += [g.const(normal(rng, gh, size), np.float32, f"{tag}.weight_ih"),
                        g.const(normal(rng, gh, hidden), np.float32, f"{tag}.weight_hh")]
            biases += [g.const(normal(rng, gh), np.float32, f"{tag}.bias_ih"),
                       g.const(normal(rng, gh), np.float32, f"{tag}.bias_hh")]

    def reform(x: str) -> str:  # Slice gate blocks on axis 1 and Concat them in ONNX order
        return g.op("Concat", [g.slice(x, [1], [a * hidden], [b * hidden]) for a, b in PADDLE_REFORM[mode]], axis=1)

    x = g.op("Transpose", ["x"], perm=[1, 0, 2])
    state_names = ["h0", "c0"] if mode == "LSTM" else ["h0"]
    if state_inputs:
        prestate = state_names
    else:  # paddle.full([L * D, batch, H], 0.0) with batch from paddle.shape(x)
        batch = g.slice(g.op("Shape", ["x"]), [0], [0], [1])
        dims = g.op("Concat", [g.const([layers * directions]), batch, g.const([hidden])], axis=0)
        prestate = [g.op("ConstantOfShape", [dims], value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))
                    for _ in state_names]
    for layer in range(layers):
        per = 2 * directions
        w, b = weights[layer * per:(layer + 1) * per], biases[layer * per:(layer + 1) * per]
        w, b = [g.unsqueeze(t, [0]) for t in w], [g.unsqueeze(t, [0]) for t in b]
        W, R, Wb, Rb = (reform(g.op("Concat", ts[k::2], axis=0)) for ts, k in ((w, 0), (w, 1), (b, 0), (b, 1)))
        B = g.op("Concat", [Wb, Rb], axis=1)
        initial = [g.slice(s, [0], [layer * directions], [(layer + 1) * directions]) for s in prestate]
        attrs = {"linear_before_reset": 1} if mode == "GRU" else {}
        y, *finals = g.op(mode, [x, W, R, B, "", *initial], 3 if mode == "LSTM" else 2,
                          direction="bidirectional" if bidirectional else "forward", hidden_size=hidden, **attrs)
        x = g.op("Reshape", [g.op("Transpose", [y], perm=[0, 2, 1, 3]), g.const([0, 0, -1])])
    out = g.op("Transpose", [x], ["y"], perm=[1, 0, 2])
    states = [g.op("Identity", [s], [n]) for s, n in zip(finals, ["h_n", "c_n"], strict=False)]
    inputs = [("x", TensorProto.FLOAT, [None, None, input_size])]
    spec = {"x": {"kind": "float", "dims": ["batch", "time", input_size]}}
    if state_inputs:
        inputs += [(s, TensorProto.FLOAT, [layers * directions, None, hidden]) for s in state_names]
        spec |= {s: {"kind": "float", "dims": [layers * directions, "batch", hidden]} for s in state_names}
    reference = {"mode": mode.lower(), "layers": layers, "bidirectional": bidirectional, "input_size": input_size,
                 "hidden_size": hidden, "weights": weights + biases, "time_major": False}
    return model(g, inputs, [out, *states]), {
        "pattern": f"paddle.nn.{mode}, {layers} layer(s){', bidirectional' if bidirectional else ''}, initial "
                   f"states {'given' if state_inputs else 'zeros (Shape -> ConstantOfShape)'}",
        "inputs": spec, "reference": reference}


CASES = {
    "keras2onnx": {
        "lstm_embedding_mask": k2o_lstm_embedding_mask,
        "gru_masking_backwards": k2o_gru_masking_backwards,
        "gru_embedding_mask": k2o_gru_embedding_mask,
        "bi_simplernn_linear": k2o_bi_simplernn_linear,
        "lstm_initial_state": k2o_lstm_initial_state,
        "bi_gru_reset_before": k2o_bi_gru_reset_before,
    },
    "mxnet": {
        "lstm_static": lambda rng: mxnet_rnn(rng, "lstm_static", "lstm", 1, False, 6, 5, False, False),
        "lstm_dynamic_states": lambda rng: mxnet_rnn(rng, "lstm_dynamic_states", "lstm", 1, False, 6, 5, True, True),
        "lstm_bidirectional": lambda rng: mxnet_rnn(rng, "lstm_bidirectional", "lstm", 1, True, 6, 4, True, False),
        "lstm_2layer": lambda rng: mxnet_rnn(rng, "lstm_2layer", "lstm", 2, False, 5, 5, True, False),
        "gru_opset12": lambda rng: mxnet_rnn(rng, "gru_opset12", "gru", 1, False, 6, 5, True, True, opset=12),
        "gru_2layer": lambda rng: mxnet_rnn(rng, "gru_2layer", "gru", 2, False, 4, 4, True, True),
        "rnn_relu_2layer": lambda rng: mxnet_rnn(rng, "rnn_relu_2layer", "rnn_relu", 2, False, 4, 4, True, False),
    },
    "paddle2onnx": {
        "lstm_2layer_bidirectional": lambda rng: paddle_rnn(rng, "lstm_2layer_bidirectional", "LSTM", 2, True, 5, 4,
                                                            False, 11),
        "gru_opset9": lambda rng: paddle_rnn(rng, "gru_opset9", "GRU", 1, False, 5, 6, True, 9),
        "gru_2layer_bidirectional": lambda rng: paddle_rnn(rng, "gru_2layer_bidirectional", "GRU", 2, True, 4, 3,
                                                           True, 13),
        "lstm_states": lambda rng: paddle_rnn(rng, "lstm_states", "LSTM", 1, False, 4, 5, True, 15),
    },
}


def main() -> None:
    entries = []
    for exporter, cases in CASES.items():
        for case, make in cases.items():
            rng = np.random.default_rng(zlib.crc32(f"{exporter}/{case}".encode()))
            proto, entry = make(rng)
            path = HERE / f"{proto.graph.name.replace('/', '_')}.onnx"
            onnx.save(proto, path)
            ops = sorted({n.op_type for n in proto.graph.node} & {"LSTM", "GRU", "RNN", "Loop", "Scan"})
            entries.append({"file": path.name, "case": case, "exporter": exporter,
                            "opset": proto.opset_import[0].version, "emitted": ops, "bytes": path.stat().st_size,
                            "source": SOURCES[exporter], **entry})
            print(path.name, ops, path.stat().st_size)
    manifest = {"generated_by": "tests/models/patterns/generate.py", "sizes": SIZES,
                "versions": {"onnx": onnx.__version__, "numpy": np.__version__, "python": sys.version.split()[0]},
                "sources": SOURCES, "models": entries}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
