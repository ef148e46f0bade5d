"""LSTM, GRU and RNN against onnxruntime, and against tests/rnn_reference.py where onnxruntime cannot run.

The attribute matrix is covered pairwise (every pair of values of any two factors appears in some case) rather than
as the full cartesian product, which keeps the file fast.
"""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn.errors import InvalidModelError, UnsupportedAttributeError
from onnx2torch_rnn.recurrent import OnnxGRU, OnnxLSTM, OnnxRNN
from tests.helpers import (
    TensorProto,
    check,
    fast_path_modules,
    helper,
    make_model,
    pairwise,
    run_onnxruntime,
    run_torch,
)
from tests.rnn_reference import reference, run_node

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"], "RNN": ["Y", "Y_h"]}
TORCH_MODULES = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN}


def build(op, *, direction="forward", steps=5, batch=3, input_size=4, hidden=3, bias=True, initial=False,
          lens=None, lens_const=False, peepholes=None, attrs=None, outputs=None, opset=14, weights_as_inputs=False,
          layout=0, dtype=np.float32, hidden_attr=True, seed=0):
    """A model with one recurrent node, and feeds for its run-time inputs."""
    rng = np.random.default_rng(seed)
    directions, gates = (2 if direction == "bidirectional" else 1), GATES[op]

    def rand(*shape, scale=0.6):
        return (scale * rng.standard_normal(shape)).astype(dtype)

    x_shape = [batch, steps, input_size] if layout else [steps, batch, input_size]
    state_shape = [batch, directions, hidden] if layout else [directions, batch, hidden]
    values = {"X": rand(*x_shape, scale=1.0), "W": rand(directions, gates * hidden, input_size),
              "R": rand(directions, gates * hidden, hidden)}
    if bias:
        values["B"] = rand(directions, 2 * gates * hidden)
    if lens is not None:
        values["L"] = np.asarray(lens, np.int32)
    if initial:
        values["h0"] = rand(*state_shape, scale=1.0)
        if op == "LSTM":
            values["c0"] = rand(*state_shape, scale=1.0)
    if peepholes is not None:
        values["P"] = rand(directions, 3 * hidden) if peepholes == "random" else np.zeros((directions, 3 * hidden),
                                                                                         dtype)
    slots = ["X", "W", "R", "B", "L", "h0", "c0", "P"]
    node_inputs = [name if name in values else "" for name in slots]
    while node_inputs[-1] == "":
        node_inputs.pop()
    outputs = OUTPUTS[op] if outputs is None else outputs
    attributes = {"direction": direction, **(attrs or {})}
    if hidden_attr:
        attributes["hidden_size"] = hidden
    if layout:
        attributes["layout"] = layout
    node = helper.make_node(op, node_inputs, outputs, **attributes)

    constant = {"W", "R", "B", "P"} if not weights_as_inputs else set()
    if lens_const:
        constant.add("L")
    initializers = {k: v for k, v in values.items() if k in constant}
    inputs = [(k, v.dtype, list(v.shape)) for k, v in values.items() if k not in constant]
    y_shape = [batch, steps, directions, hidden] if layout else [steps, directions, batch, hidden]
    shapes = {"Y": y_shape, "Y_h": state_shape, "Y_c": state_shape}
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    typed_outputs = [(name, elem, shapes[OUTPUTS[op][i]]) for i, name in enumerate(outputs) if name]
    model = make_model([node], inputs, typed_outputs, initializers, opset=opset)
    feeds = {k: v for k, v in values.items() if k not in constant}
    return model, feeds


def all_values(model, feeds):
    return {**{t.name: numpy_helper.to_array(t) for t in model.graph.initializer}, **feeds}


# Activation sets: (direction 0, direction 1, alpha, beta). Lower-case names test onnxruntime's case rules.
ACTIVATION_SETS = {
    "LSTM": {
        "default": None,
        "lower": (["sigmoid", "TANH", "tanh"], ["SIGMOID", "tanh", "Tanh"], None, None),
        "mixed1": (["HardSigmoid", "LeakyRelu", "ScaledTanh"], ["Sigmoid", "Softsign", "Elu"], [0.3, 0.2, 0.7],
                   [0.4, 1.3]),
        "mixed2": (["sigmoid", "tanh", "Affine"], ["HardSigmoid", "Softplus", "ThresholdedRelu"], [0.9, 0.25, 0.05],
                   [0.1]),
    },
    "GRU": {
        "default": None,
        "lower": (["SIGMOID", "tanh"], ["sigmoid", "TANH"], None, None),
        "mixed1": (["HardSigmoid", "Softsign"], ["Sigmoid", "LeakyRelu"], [0.3, 0.15], [0.45]),
        "mixed2": (["sigmoid", "Elu"], ["HardSigmoid", "ScaledTanh"], [0.5, 0.2, 1.1], [0.5, 0.9]),
    },
    "RNN": {
        "default": None,
        "relu": (["Relu"], ["Relu"], None, None),
        "mixed1": (["Relu"], ["Tanh"], None, None),
        "mixed2": (["LeakyRelu"], ["Softsign"], [0.2], None),
        "mixed3": (["Affine"], ["ThresholdedRelu"], [0.5, 0.1], [0.2]),
    },
}


def activation_attrs(op, key, direction):
    entry = ACTIVATION_SETS[op][key]
    if entry is None:
        return {}
    first, second, alpha, beta = entry
    attrs = {"activations": first + second if direction == "bidirectional" else first}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    return attrs


def expect_fast(op, case) -> bool:
    if case["weights"] == "inputs" or case["clip"] is not None:
        return False
    entry = ACTIVATION_SETS[op][case["acts"]]
    names = [] if entry is None else entry[0] + (entry[1] if case["direction"] == "bidirectional" else [])
    if op == "LSTM":
        return case["acts"] in ("default", "lower") and case["input_forget"] == 0 and case["peepholes"] != "random"
    if op == "GRU":
        return case["acts"] in ("default", "lower") and case["lbr"] == 1
    return len(set(names)) <= 1 and set(names) <= {"Tanh", "Relu"}


COMMON_FACTORS = {
    "direction": ["forward", "reverse", "bidirectional"],
    "bias": [True, False],
    "initial": [False, True],
    "lens": [None, "mixed", "mixed-const", "full", "full-const"],
    "clip": [None, 0.8],
    "hidden": [1, 3],
    "batch": [1, 3],
    "weights": ["initializers", "inputs"],
}
OP_FACTORS = {
    "LSTM": {"acts": list(ACTIVATION_SETS["LSTM"]), "peepholes": [None, "random", "zeros"], "input_forget": [0, 1],
             "opset": [7, 14, 22, 25],
             "outputs": [["Y", "Y_h", "Y_c"], ["Y"], ["", "Y_h"], ["", "", "Y_c"], ["Y", "", "Y_c"]]},
    "GRU": {"acts": list(ACTIVATION_SETS["GRU"]), "lbr": [0, 1], "opset": [7, 14, 22, 25],
            "outputs": [["Y", "Y_h"], ["Y"], ["", "Y_h"]]},
    "RNN": {"acts": list(ACTIVATION_SETS["RNN"]), "opset": [7, 14, 22, 25],
            "outputs": [["Y", "Y_h"], ["Y"], ["", "Y_h"]]},
}
MATRIX = [(op, i, case) for op in OP_FACTORS for i, case in enumerate(pairwise({**COMMON_FACTORS, **OP_FACTORS[op]}))]


def build_case(op, case, seed=0):
    steps, batch = case.get("steps", 5), case["batch"]
    lens = None
    if case["lens"] is not None:
        lens = [steps] * batch if case["lens"].startswith("full") else ([min(2, steps), steps, 0, 1] * batch)[:batch]
    attrs = activation_attrs(op, case["acts"], case["direction"])
    if case["clip"] is not None:
        attrs["clip"] = case["clip"]
    if op == "LSTM" and case["input_forget"]:
        attrs["input_forget"] = 1
    if op == "GRU" and case["lbr"]:
        attrs["linear_before_reset"] = 1
    return build(op, direction=case["direction"], steps=steps, batch=batch, hidden=case["hidden"], bias=case["bias"],
                 input_size=case.get("input_size", 4), initial=case["initial"], lens=lens,
                 lens_const=case["lens"] is not None and "const" in case["lens"],
                 peepholes=case.get("peepholes"), attrs=attrs, outputs=case["outputs"], opset=case["opset"],
                 weights_as_inputs=case["weights"] == "inputs", seed=seed)


def case_id(param):
    op, index, _ = param
    return f"{op}-{index}"


@pytest.mark.parametrize("param", MATRIX, ids=case_id)
def test_matrix_against_onnxruntime(param):
    op, _, case = param
    model, feeds = build_case(op, case)
    module = check(model, feeds)
    fast = fast_path_modules(module)
    assert len(fast) == int(expect_fast(op, case)), (case, module)
    assert all(type(m) is TORCH_MODULES[op] for m in fast)


@pytest.mark.parametrize("param", MATRIX, ids=case_id)
def test_reference_matches_onnxruntime(param):
    """The numpy reference (used for layout=1 and float64) is itself checked on every layout-0 float32 case."""
    op, _, case = param
    model, feeds = build_case(op, case, seed=1)
    expected = run_onnxruntime(model, feeds)
    actual = run_node(model.graph.node[0], all_values(model, feeds))
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, strict=True)


def random_cases(op, count, seed):
    rng = random.Random(seed)
    factors = {**COMMON_FACTORS, **OP_FACTORS[op], "steps": [1, 2, 7], "input_size": [1, 5]}
    return [{name: rng.choice(values) for name, values in factors.items()} for _ in range(count)]


SWEEP = [(op, i, case) for op in OP_FACTORS for i, case in enumerate(random_cases(op, 60, seed=1))]


@pytest.mark.slow
@pytest.mark.parametrize("param", SWEEP, ids=case_id)
def test_random_sweep(param):
    """A larger random sample of the same matrix, also varying steps and input size; the reference checked too."""
    op, index, case = param
    model, feeds = build_case(op, case, seed=100 + index)
    module = check(model, feeds)
    assert len(fast_path_modules(module)) == int(expect_fast(op, case))
    for want, got in zip(run_onnxruntime(model, feeds), run_node(model.graph.node[0], all_values(model, feeds)),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, strict=True)


def test_pairwise_covers_every_pair():
    factors = {**COMMON_FACTORS, **OP_FACTORS["LSTM"]}
    cases = [c for op, _, c in MATRIX if op == "LSTM"]
    for a, b in itertools.combinations(factors, 2):
        seen = {(repr(c[a]), repr(c[b])) for c in cases}
        assert len(seen) == len(factors[a]) * len(factors[b]), (a, b)


# --- activations ---------------------------------------------------------------------------------------------

ALL_ACTIVATIONS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
                   "Elu", "Softsign", "Softplus"]


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("name", ALL_ACTIVATIONS)
@pytest.mark.parametrize("params", [False, True], ids=["defaults", "alpha-beta"])
def test_each_activation(op, name, params):
    """Each function in every role of a bidirectional node, with onnxruntime's defaults or given alpha/beta."""
    default = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}[op]
    attrs = {"activations": [name] * len(default) + default}  # the second direction keeps the defaults
    if params:
        attrs["activation_alpha"] = [0.7, 0.4, 1.3]
        attrs["activation_beta"] = [0.3, 0.6, 0.2]
    model, feeds = build(op, direction="bidirectional", attrs=attrs, initial=True, lens=[5, 2, 0])
    check(model, feeds)


def test_alpha_beta_consumed_in_list_order():
    """[HardSigmoid, LeakyRelu, ScaledTanh] with alpha [.3, .2, .7]: HardSigmoid .3, LeakyRelu .2, ScaledTanh .7;
    the second direction finds the lists exhausted and takes onnxruntime's defaults."""
    attrs = {"activations": ["HardSigmoid", "LeakyRelu", "ScaledTanh", "HardSigmoid", "LeakyRelu", "Elu"],
             "activation_alpha": [0.3, 0.2, 0.7], "activation_beta": [0.4, 1.5]}
    model, feeds = build("LSTM", direction="bidirectional", attrs=attrs)
    module = check(model, feeds)
    assert "HardSigmoid(0.3, 0.4), LeakyRelu(0.2), ScaledTanh(0.7, 1.5) | HardSigmoid(0.2, 0.5), LeakyRelu(0.01), " \
           "Elu(1)" in str(module)


def test_rnn_two_names_for_one_direction_use_the_first():
    model, feeds = build("RNN", attrs={"activations": ["Relu", "Tanh"]})
    module = check(model, feeds)
    assert "activations=[Relu]" in str(module)


def test_thresholded_relu_is_strict_at_the_threshold():
    """ThresholdedRelu is x if x > alpha else 0: a pre-activation equal to alpha gives 0."""
    model, feeds = build("RNN", attrs={"activations": ["ThresholdedRelu"], "activation_alpha": [0.5]}, hidden=1,
                         batch=1, input_size=1, bias=False)
    feeds["X"] = np.array([[[0.5]], [[0.25]], [[1.0]], [[0.5]], [[-3.0]]], np.float32)
    model.graph.ClearField("initializer")
    model.graph.initializer.extend([numpy_helper.from_array(np.ones((1, 1, 1), np.float32), "W"),
                                    numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "R")])
    module = check(model, feeds)
    np.testing.assert_array_equal(run_torch(module, model, feeds)[0].ravel(), [0, 0, 1, 0, 0])


@pytest.mark.parametrize("clip", [0.0, -1.0, 0.3])
def test_rnn_clip_as_onnxruntime(clip):
    """onnxruntime's RNN clamps to [-0, 0] for clip=0 and does not clip for a negative value."""
    model, feeds = build("RNN", attrs={"clip": clip}, lens=[5, 2, 0], initial=True)
    check(model, feeds)


def test_softplus_overflows_like_onnxruntime():
    """log(1 + exp(x)) is inf past float32 overflow in onnxruntime; F.softplus would return x."""
    model, feeds = build("RNN", attrs={"activations": ["Softplus"]}, hidden=1, batch=1, input_size=1, bias=False)
    feeds["X"] = np.array([[[-200.0]], [[-20.0]], [[10.0]], [[90.0]], [[200.0]]], np.float32)
    W = numpy_helper.from_array(np.ones((1, 1, 1), np.float32), "W")
    R = numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "R")
    model.graph.ClearField("initializer")
    model.graph.initializer.extend([W, R])
    module = check(model, feeds)
    assert np.isinf(run_torch(module, model, feeds)[0][3]).all()  # x = 90


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_lstm_gru_names_case_insensitive(op):
    names = ["SIGMOID", "tanh", "TaNh"][: 3 if op == "LSTM" else 2]
    model, feeds = build(op, attrs={"activations": names, "clip": 2.0})
    check(model, feeds)


# --- layout 1, float64, float16: against the reference and by equivalence ---------------------------------------

def transposed_layout0_model(model):
    """The layout=1 node as Transpose + layout-0 node + Transpose (onnxruntime can run it)."""
    node = model.graph.node[0]
    layout0 = onnx.NodeProto()
    layout0.CopyFrom(node)
    layout0.ClearField("attribute")
    layout0.attribute.extend(a for a in node.attribute if a.name != "layout")
    nodes, renamed = [], {}
    for index, name in enumerate(node.input):
        if name and index in (0, 5, 6):  # X, initial_h, initial_c: batch-major -> time/direction-major
            nodes.append(helper.make_node("Transpose", [name], [name + "_t"], perm=[1, 0, 2]))
            renamed[index] = name + "_t"
    for index, name in renamed.items():
        layout0.input[index] = name
    for index, name in enumerate(node.output):
        if name:
            layout0.output[index] = name + "_t"
            perm = [2, 0, 1, 3] if index == 0 else [1, 0, 2]
            nodes.append(helper.make_node("Transpose", [name + "_t"], [name], perm=perm))
    graph = helper.make_graph([layout0, *nodes], "layout0", model.graph.input, model.graph.output,
                              model.graph.initializer)
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


LAYOUT_CASES = [
    ("LSTM", "bidirectional", {}, True), ("LSTM", "reverse", {"clip": 0.5}, True),
    ("LSTM", "forward", {"input_forget": 1}, False),
    ("GRU", "bidirectional", {"linear_before_reset": 1}, True), ("GRU", "reverse", {}, True),
    ("RNN", "bidirectional", {}, True), ("RNN", "forward", {"activations": ["Relu"]}, False),
]


@pytest.mark.parametrize(("op", "direction", "attrs", "with_lens"), LAYOUT_CASES)
def test_layout1(op, direction, attrs, with_lens):
    model, feeds = build(op, direction=direction, attrs=attrs, layout=1, initial=True, opset=14,
                         lens=[5, 0, 3] if with_lens else None, peepholes="random" if "clip" in attrs else None)
    module = onnx2torch_rnn.convert(model)
    actual = run_torch(module, model, feeds)
    expected = run_node(model.graph.node[0], all_values(model, feeds))
    equivalent = run_onnxruntime(transposed_layout0_model(model), feeds)
    for got, want, want_ort in zip(actual, expected, equivalent, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, strict=True)
        np.testing.assert_allclose(got, want_ort, rtol=1e-4, atol=1e-5, strict=True)


@pytest.mark.parametrize(("op", "attrs", "fast"), [
    ("LSTM", {}, True), ("LSTM", {"clip": 0.5}, False), ("GRU", {"linear_before_reset": 1}, True),
    ("GRU", {}, False), ("RNN", {}, True), ("RNN", {"activations": ["Softsign", "Elu"]}, False),
])
@pytest.mark.parametrize("layout", [0, 1])
def test_float64_against_reference(op, attrs, fast, layout):
    model, feeds = build(op, direction="bidirectional", attrs=attrs, layout=layout, initial=True, lens=[5, 0, 3],
                         peepholes="random" if "clip" in attrs else None, dtype=np.float64)
    module = onnx2torch_rnn.convert(model)
    assert len(fast_path_modules(module)) == int(fast)
    actual = run_torch(module, model, feeds)
    expected = run_node(model.graph.node[0], all_values(model, feeds))
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, strict=True)


HALF_CASES = [("LSTM", {}), ("LSTM", {"input_forget": 1, "clip": 1.0}), ("GRU", {}),
              ("GRU", {"linear_before_reset": 1}), ("RNN", {}), ("RNN", {"activations": ["Elu", "Softsign"]})]


@pytest.mark.parametrize(("op", "attrs"), HALF_CASES)
def test_float16_against_onnxruntime(op, attrs):
    """onnxruntime has no float16 kernel for these ops but runs float16 models by casting the node to float32 and
    back; we compute the same way. Tolerance: one float16 unit in the last place."""
    model, feeds = build(op, direction="bidirectional", attrs=attrs, initial=True, lens=[5, 0, 3], dtype=np.float16)
    check(model, feeds, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("op", "attrs"), HALF_CASES)
def test_bfloat16_computed_in_float32(op, attrs):
    """onnxruntime cannot run bfloat16 for these ops at all: compare with the float32 model it runs on the same
    bfloat16-rounded values, whose result rounded to bfloat16 must equal ours up to one bfloat16 unit."""
    model, feeds = build(op, direction="bidirectional", attrs=attrs, initial=True, lens=[5, 0, 3], opset=22)
    rounded = {k: (torch.from_numpy(np.array(v)).bfloat16().float().numpy() if v.dtype == np.float32 else v)
               for k, v in all_values(model, feeds).items()}
    bf16_model = onnx.ModelProto()
    bf16_model.CopyFrom(model)
    for tensor in bf16_model.graph.initializer:
        value = rounded[tensor.name]
        tensor.CopyFrom(helper.make_tensor(tensor.name, TensorProto.BFLOAT16, value.shape, value.ravel().tolist()))
    for info in (*bf16_model.graph.input, *bf16_model.graph.output):
        if info.type.tensor_type.elem_type == TensorProto.FLOAT:
            info.type.tensor_type.elem_type = TensorProto.BFLOAT16
    module = onnx2torch_rnn.convert(bf16_model)
    args = [torch.from_numpy(rounded[i.name]) for i in bf16_model.graph.input]
    args = [a.bfloat16() if a.is_floating_point() else a for a in args]
    with torch.no_grad():
        actual = module(*args)
    float_model = onnx.ModelProto()
    float_model.CopyFrom(model)
    float_model.graph.ClearField("initializer")
    float_model.graph.initializer.extend(numpy_helper.from_array(rounded[t.name], t.name)
                                         for t in model.graph.initializer)
    expected = run_onnxruntime(float_model, {k: rounded[k] for k in feeds})
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == torch.bfloat16
        want = torch.from_numpy(want).bfloat16().float().numpy()
        np.testing.assert_allclose(got.float().numpy(), want, rtol=8e-3, atol=8e-3, strict=True)


# --- fast path ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("op", "kwargs", "fast"), [
    ("LSTM", {}, True),
    ("LSTM", {"peepholes": "zeros"}, True),
    ("LSTM", {"peepholes": "random"}, False),
    ("LSTM", {"attrs": {"input_forget": 1}}, False),
    ("LSTM", {"attrs": {"clip": 10.0}}, False),
    ("LSTM", {"attrs": {"activations": ["Sigmoid", "Tanh", "Relu"] * 2}}, False),
    ("LSTM", {"weights_as_inputs": True}, False),
    ("GRU", {"attrs": {"linear_before_reset": 1}}, True),
    ("GRU", {}, False),
    ("GRU", {"attrs": {"linear_before_reset": 1, "activations": ["Sigmoid", "Relu"] * 2}}, False),
    ("RNN", {"attrs": {"activations": ["Relu", "Relu"]}}, True),
    ("RNN", {"attrs": {"activations": ["Tanh", "Relu"]}}, False),
    ("RNN", {"attrs": {"activations": ["Sigmoid", "Sigmoid"]}}, False),
])
def test_fast_path_only_where_exact(op, kwargs, fast):
    model, feeds = build(op, direction="bidirectional", initial=True, lens=[5, 0, 2], **kwargs)
    module = check(model, feeds)
    assert len(fast_path_modules(module)) == int(fast)
    assert ("path=fast" if fast else "path=exact") in str(module)


def test_all_full_constant_lengths_need_no_packing():
    model, feeds = build("LSTM", lens=[5, 5, 5], lens_const=True)
    module = check(model, feeds)
    assert "sequence_lens=[5, 5, 5]" in str(module)


def test_all_rows_empty():
    """onnxruntime's GRU returns early when no row has a step; every op gives zeros."""
    for op in ("LSTM", "GRU", "RNN"):
        check(*build(op, direction="bidirectional", initial=True, lens=[0, 0], batch=2))


def test_single_step():
    for op in ("LSTM", "GRU", "RNN"):
        check(*build(op, direction="bidirectional", steps=1, lens=[1, 0, 1], initial=True))


def test_module_prints_readably():
    model, _ = build("GRU", direction="reverse", attrs={"clip": 3.0, "activations": ["HardSigmoid", "Tanh"]})
    text = str(onnx2torch_rnn.convert(model))
    for part in ("OnnxGRU(", "hidden_size=3", "direction='reverse'", "layout=0",
                 "activations=[HardSigmoid(0.2, 0.5), Tanh]", "clip=3", "linear_before_reset=0", "path=exact"):
        assert part in text, text


# --- versions, hidden_size ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("op", "opset", "attrs"), [
    ("LSTM", 1, {}), ("LSTM", 6, {"output_sequence": 1}), ("GRU", 1, {}), ("GRU", 3, {"linear_before_reset": 1}),
    ("GRU", 6, {"output_sequence": 0}), ("RNN", 1, {"output_sequence": 1}), ("RNN", 6, {}),
])
def test_versions_before_7(op, opset, attrs):
    """onnxruntime has no kernel before version 7 and the semantics did not change: compare with opset 7."""
    model, feeds = build(op, direction="bidirectional", initial=True, lens=[5, 0, 2], attrs=attrs, opset=opset)
    module = onnx2torch_rnn.convert(model)
    model7, _ = build(op, direction="bidirectional", initial=True, lens=[5, 0, 2], opset=7,
                      attrs={k: v for k, v in attrs.items() if k != "output_sequence"})
    for got, want in zip(run_torch(module, model, feeds), run_onnxruntime(model7, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, strict=True)


def test_gru1_without_direction_is_forward():
    """GRU-1's schema default for direction is the typo 'foward'; the intended forward is used."""
    model, feeds = build("GRU", opset=1)
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != "direction"]
    node.ClearField("attribute")
    node.attribute.extend(kept)
    module = onnx2torch_rnn.convert(model)
    model7, _ = build("GRU", opset=7)
    for got, want in zip(run_torch(module, model, feeds), run_onnxruntime(model7, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, strict=True)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("weights_as_inputs", [False, True])
def test_hidden_size_inferred_from_r(op, weights_as_inputs):
    model, feeds = build(op, hidden_attr=False, weights_as_inputs=weights_as_inputs)
    with_size, _ = build(op, weights_as_inputs=weights_as_inputs)  # onnxruntime needs hidden_size
    module = onnx2torch_rnn.convert(model)
    for got, want in zip(run_torch(module, model, feeds), run_onnxruntime(with_size, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, strict=True)


# --- gradients ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("op", "attrs", "fast"), [
    ("LSTM", {}, True), ("LSTM", {"clip": 5.0}, False), ("GRU", {"linear_before_reset": 1}, True),
    ("GRU", {}, False), ("RNN", {}, True), ("RNN", {"activations": ["Softsign", "Elu"]}, False),
])
def test_gradients_reach_every_parameter(op, attrs, fast):
    model, feeds = build(op, direction="bidirectional", attrs=attrs, initial=True, lens=[5, 0, 3],
                         peepholes="random" if op == "LSTM" and not fast else None)
    module = onnx2torch_rnn.convert(model)
    assert len(fast_path_modules(module)) == int(fast)
    outputs = module(*(torch.from_numpy(v) for v in feeds.values()))
    sum(o.square().sum() for o in outputs).backward()
    parameters = dict(module.named_parameters())
    assert len(parameters) >= (4 if fast else 3)
    for name, parameter in parameters.items():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize(("op", "attrs"), [("LSTM", {}), ("GRU", {"linear_before_reset": 1}), ("RNN", {})])
def test_gradients_reach_weights_given_as_inputs(op, attrs):
    model, feeds = build(op, direction="bidirectional", attrs=attrs, weights_as_inputs=True, lens=[5, 0, 3])
    module = onnx2torch_rnn.convert(model)
    args = {k: torch.from_numpy(v).requires_grad_(v.dtype == np.float32) for k, v in feeds.items()}
    outputs = module(*(args[i.name] for i in model.graph.input))
    sum(o.square().sum() for o in outputs).backward()
    for name in ("W", "R", "B"):
        grad = args[name].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


# --- errors ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("op", "attrs", "attribute"), [
    ("LSTM", {"activations": ["Sigmoid", "Tanh", "Bogus"]}, "activations"),
    ("RNN", {"activations": ["tanh"]}, "activations"),  # case-sensitive, like onnxruntime
    ("GRU", {"activations": ["Sigmoid", "Tanh", "Tanh"]}, "activations"),  # wrong count
    ("LSTM", {"clip": 0.0}, "clip"),
    ("GRU", {"clip": -1.0}, "clip"),
    ("LSTM", {"direction": "Forward"}, "direction"),
])
def test_refused_attributes(op, attrs, attribute):
    model, _ = build(op, attrs=attrs)
    with pytest.raises(UnsupportedAttributeError, match=attribute):
        onnx2torch_rnn.convert(model)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime refuses the same models
        run_onnxruntime(model, {})


def test_bad_layout_refused():
    model, _ = build("LSTM", layout=1)
    model.graph.node[0].attribute[-1].i = 2
    with pytest.raises(UnsupportedAttributeError, match="layout"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("name", ["foo", "layout"])
def test_unknown_attribute_refused(name):
    """An attribute the schema of this version does not have (layout before version 14) is refused."""
    model, _ = build("GRU", opset=7)
    model.graph.node[0].attribute.append(helper.make_attribute(name, 1))
    with pytest.raises((InvalidModelError, UnsupportedAttributeError), match=name):  # the checker or the converter
        onnx2torch_rnn.convert(model)


def test_hidden_size_mismatch_refused():
    """hidden_size=4 with R of hidden size 3: R does not have the node's shape."""
    model, _ = build("LSTM")
    next(a for a in model.graph.node[0].attribute if a.name == "hidden_size").i = 4
    with pytest.raises(InvalidModelError, match=r"input W \('W'\) must have shape \[1, 16, 4\], got \[1, 12, 4\]"):
        onnx2torch_rnn.convert(model)
    next(a for a in model.graph.node[0].attribute if a.name == "hidden_size").i = 0
    with pytest.raises(UnsupportedAttributeError, match="hidden_size"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("attrs", [{}, {"clip": 9.0}], ids=["fast", "exact"])
@pytest.mark.parametrize("lens", [[6, 1, 1], [-1, 2, 2]])
def test_lengths_out_of_range_raise_at_run_time(op, attrs, lens):
    if op == "GRU" and not attrs:
        attrs = {"linear_before_reset": 1}
    model, feeds = build(op, attrs=attrs, lens=lens)
    module = onnx2torch_rnn.convert(model)
    with pytest.raises(ValueError, match=r"sequence_lens values must lie in \[0, 5\]"):
        run_torch(module, model, feeds)
    constant, _ = build(op, attrs=attrs, lens=lens, lens_const=True)
    module = onnx2torch_rnn.convert(constant)
    with pytest.raises(ValueError, match=r"sequence_lens values must lie in \[0, 5\]"):
        module(torch.from_numpy(feeds["X"]))


# ---- per-step mask (not an ONNX input: the input of recurrent nodes fused from Keras' masked layers) -------------
MASK_MODULES = {"LSTM": OnnxLSTM, "GRU": OnnxGRU, "RNN": OnnxRNN}


def masked_module(op, direction, layout, mask_output, fast, dtype=torch.float32, seed=0):
    """A module with a mask input, its weights as (W, R, B) numpy arrays, and random X, initial states and mask
    (every pattern: rows masked at the start, in the middle, at the end, wholly, not at all)."""
    rng = np.random.default_rng(seed)
    directions, gates, hidden, steps, batch, size = (2 if direction == "bidirectional" else 1), GATES[op], 3, 6, 5, 4
    weights = {k: rng.standard_normal(shape) * 0.6 for k, shape in
               (("W", (directions, gates * hidden, size)), ("R", (directions, gates * hidden, hidden)),
                ("B", (directions, 2 * gates * hidden)))}
    attrs = {"linear_before_reset": 1} if op == "GRU" and fast else {}
    if not fast:
        attrs["clip"] = 2.5
    module = MASK_MODULES[op](hidden_size=hidden, direction=direction, layout=layout, mask_output=mask_output,
                              dtype=dtype, **attrs, **{k: torch.tensor(v, dtype=dtype) for k, v in weights.items()})
    assert module.fast == fast
    mask = np.ones((steps, batch), bool)
    mask[:2, 0] = mask[2:4, 1] = mask[4:, 2] = mask[:, 3] = False
    if layout:
        mask = mask.T
    x = rng.standard_normal((batch, steps, size) if layout else (steps, batch, size))
    state = rng.standard_normal((batch, directions, hidden) if layout else (directions, batch, hidden))
    return module, weights, attrs, x, state, mask


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize(("layout", "mask_output", "fast"), [(0, "zero", True), (1, "hold", False),
                                                             (0, "hold", False), (1, "zero", True)])
def test_mask_against_reference(op, direction, layout, mask_output, fast):
    module, weights, attrs, x, state, mask = masked_module(op, direction, layout, mask_output, fast)
    states = {"initial_h": state, **({"initial_c": -state} if op == "LSTM" else {})}
    expected = reference(op, x, **weights, **states, direction=direction, layout=layout, mask=mask,
                         mask_output=mask_output, **attrs)
    args = {k: torch.tensor(v, dtype=torch.float32) for k, v in states.items()}
    got = module(torch.tensor(x, dtype=torch.float32), mask=torch.tensor(mask), **args)
    torch._dynamo.reset()  # a fresh module per case: no recompile limit across cases
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")(torch.tensor(x, dtype=torch.float32),
                                                                           mask=torch.tensor(mask), **args)
    for want, eager, traced in zip(expected, got, compiled, strict=False):
        np.testing.assert_allclose(eager.detach().numpy(), want.astype(np.float32), rtol=1e-4, atol=1e-5, strict=True)
        np.testing.assert_allclose(traced.detach().numpy(), want.astype(np.float32), rtol=1e-4, atol=1e-5,
                                   strict=True)


@pytest.mark.parametrize(("op", "fast"), [("LSTM", True), ("GRU", False)])
def test_mask_gradients(op, fast):
    module, _, _, x, state, mask = masked_module(op, "bidirectional", 0, "hold", fast, dtype=torch.float64)
    X, h0 = (torch.tensor(v, requires_grad=True) for v in (x, state))
    torch.autograd.gradcheck(lambda X, h0: module(X, initial_h=h0, mask=torch.tensor(mask)), (X, h0))


def test_mask_required_and_refused():
    module, _, _, x, _, mask = masked_module("RNN", "forward", 0, "zero", True)
    with pytest.raises(ValueError, match="takes a mask"):
        module(torch.tensor(x, dtype=torch.float32))
    with pytest.raises(ValueError, match="bool tensor"):
        module(torch.tensor(x, dtype=torch.float32), mask=torch.tensor(mask[:-1]))
    plain = OnnxRNN(hidden_size=3, W=torch.zeros(1, 3, 4), R=torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="takes no mask"):
        plain(torch.tensor(x, dtype=torch.float32), mask=torch.tensor(mask))
    with pytest.raises(ValueError, match="either sequence_lens or a mask"):
        module(torch.tensor(x, dtype=torch.float32), sequence_lens=torch.tensor([1, 2, 3, 4, 5]),
               mask=torch.tensor(mask))


# ---- input validation (recurrent/validation.py): at conversion where shapes are static, else at run time ---------

def replace_initializer(model, name, array):
    for tensor in model.graph.initializer:
        if tensor.name == name:
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(array), name))


def redeclare_input(model, name, elem_type, shape):
    for info in model.graph.input:
        if info.name == name:
            info.CopyFrom(helper.make_tensor_value_info(name, elem_type, shape))


# (op, direction, input, bad shape, the expected shape in the message); the node has hidden 3, input size 4, batch 3
BAD_WEIGHTS = [
    ("LSTM", "forward", "W", (2, 12, 4), "[1, 12, 4]"),  # a second direction the node does not have
    ("GRU", "bidirectional", "W", (2, 8, 4), "[2, 9, 4]"),
    ("RNN", "forward", "R", (1, 3, 2), "[1, 3, 3]"),
    ("LSTM", "bidirectional", "B", (2, 12), "[2, 24]"),
    ("RNN", "reverse", "B", (1, 6, 1), "[1, 6]"),
    ("LSTM", "forward", "P", (1, 12), "[1, 9]"),
]


@pytest.mark.parametrize(("op", "direction", "name", "shape", "expected"), BAD_WEIGHTS)
def test_constant_weights_of_wrong_shape_refused(op, direction, name, shape, expected):
    model, feeds = build(op, direction=direction, peepholes="random" if name == "P" else None)
    replace_initializer(model, name, np.ones(shape, np.float32))
    message = rf"{op} node '{op}_0': input {name} \('{name}'\) must have shape {re.escape(expected)}, got "
    with pytest.raises(InvalidModelError, match=message + re.escape(str(list(shape)))):
        onnx2torch_rnn.convert(model)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime refuses them too
        run_onnxruntime(model, feeds)


# graph inputs whose declared shapes contradict the node: (op, input, declared shape, expected shape, layout)
BAD_DECLARED = [
    ("LSTM", "X", [5, 3, 6], "[5, 3, 4]", 0),  # X's feature size is not W's input size
    ("GRU", "X", [3, 5, 2], "[3, 5, 4]", 1),
    ("LSTM", "h0", [2, 3, 3], "[1, 3, 3]", 0),
    ("LSTM", "c0", [1, 4, 3], "[1, 3, 3]", 0),
    ("RNN", "h0", [3, 1, 2], "[3, 1, 3]", 1),
    ("GRU", "L", [4], "[3]", 0),
    ("RNN", "X", [5, 3], None, 0),  # rank 2
]


@pytest.mark.parametrize(("op", "name", "declared", "expected", "layout"), BAD_DECLARED)
def test_declared_input_shapes_of_wrong_shape_refused(op, name, declared, expected, layout):
    model, _ = build(op, initial=True, lens=[5, 5, 5], layout=layout)
    elem = TensorProto.INT32 if name == "L" else TensorProto.FLOAT
    redeclare_input(model, name, elem, declared)
    onnx_name = {"h0": "initial_h", "c0": "initial_c", "L": "sequence_lens"}.get(name, name)
    requirement = "must have 3 dimensions" if expected is None else f"must have shape {re.escape(expected)}"
    with pytest.raises(InvalidModelError, match=rf"{op} node '{op}_0': input {onnx_name} \('{name}'\) {requirement}"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("as_input", [True, False])
def test_sequence_lens_must_be_int32(as_input):
    """The spec's type for sequence_lens is int32 only (onnxruntime refuses int64 too)."""
    model, _ = build("LSTM", lens=[5, 2, 0], lens_const=not as_input)
    if as_input:
        redeclare_input(model, "L", TensorProto.INT64, [3])
    else:
        replace_initializer(model, "L", np.array([5, 2, 0], np.int64))
    with pytest.raises(InvalidModelError, match=r"LSTM node 'LSTM_0': input sequence_lens \('L'\) must be int32, "
                                                r"got int64"):
        onnx2torch_rnn.convert(model)


# wrong tensors passed at run time to a node with symbolic dims: (input, value, message)
BAD_RUNTIME = [
    ("X", np.ones((5, 3), np.float32), "X must have 3 dimensions, got shape [5, 3]"),
    ("X", np.ones((5, 3, 6), np.float32), "X must have shape [5, 3, 4], got [5, 3, 6]"),
    ("W", np.ones((1, 12, 4), np.float32), "W must have shape [2, 12, 4], got [1, 12, 4]"),
    ("R", np.ones((2, 12, 4), np.float32), "R must have shape [2, 12, 3], got [2, 12, 4]"),
    ("B", np.ones((2, 12), np.float32), "B must have shape [2, 24], got [2, 12]"),
    ("h0", np.ones((2, 4, 3), np.float32), "initial_h must have shape [2, 3, 3], got [2, 4, 3]"),
    ("c0", np.ones((1, 3, 3), np.float32), "initial_c must have shape [2, 3, 3], got [1, 3, 3]"),
    ("L", np.array([5, 5], np.int32), "sequence_lens must have shape [3], got [2]"),
    ("L", np.array([5., 5., 5.], np.float32), "sequence_lens must be int32 or int64, got float32"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD_RUNTIME, ids=lambda v: v if isinstance(v, str) else "")
def test_wrong_inputs_at_run_time_named(name, value, message):
    """Inputs with symbolic shapes pass conversion; at run time the native kernel (inference) and the Python path
    (autograd, or ONNX2TORCH_RNN_NATIVE=0) refuse them with the same message."""
    model, feeds = build("LSTM", direction="bidirectional", initial=True, lens=[5, 2, 0], weights_as_inputs=True)
    for info in model.graph.input:  # every dim symbolic: nothing to check at conversion
        for k, dim in enumerate(info.type.tensor_type.shape.dim):
            dim.dim_param = f"{info.name}_{k}"
    module = onnx2torch_rnn.convert(model)
    args = {k: torch.from_numpy(v) for k, v in {**feeds, name: value}.items()}
    ordered = [args[i.name] for i in model.graph.input]
    errors = []
    for grad in (False, True):
        ordered[0].requires_grad_(grad and ordered[0].dtype == torch.float32)
        with pytest.raises(ValueError) as caught:
            module(*ordered)
        errors.append(str(caught.value))
    assert errors[0].splitlines()[0] == errors[1] == message, errors


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("attrs", [{}, {"clip": 5.0}], ids=["fast", "exact"])
@pytest.mark.parametrize(("direction", "layout"), [("forward", 0), ("bidirectional", 0), ("reverse", 1)])
def test_zero_length_sequence(op, attrs, direction, layout):
    """T = 0: Y [0, D, N, H] and zero final states, initial states or not, on the native kernel (inference) and the
    Python path (autograd), against the reference, which onnxruntime confirms where it can: its GRU aborts on
    T = 0, its LSTM leaves Y_c (bidirectional: Y_h too) uninitialised, and it rejects layout 1."""
    if op == "GRU" and not attrs:
        attrs = {"linear_before_reset": 1}
    model, feeds = build(op, steps=0, direction=direction, attrs=attrs, initial=True, layout=layout)
    expected = run_node(model.graph.node[0], all_values(model, feeds))
    if op != "GRU" and direction == "forward" and not layout:
        for want, ort in zip(expected[:2], run_onnxruntime(model, feeds)[:2], strict=True):  # Y, Y_h
            np.testing.assert_allclose(want, ort, strict=True)
    module = onnx2torch_rnn.convert(model)
    for grad in (False, True):
        args = [torch.from_numpy(feeds[i.name]).requires_grad_(grad) for i in model.graph.input]
        for got, want in zip(module(*args), expected, strict=True):
            np.testing.assert_allclose(got.detach().numpy(), want, strict=True)
