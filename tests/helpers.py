"""Shared test helpers: build small ONNX models, run onnxruntime, compare every output with the converted module;
pairwise parameter sets; converters replaced for one test; models and values several test modules use.

Test modules import from here (and from the other non-test modules of tests/), never from each other."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn import register_converter
from onnx2torch_rnn.checking import random_inputs, run_onnxruntime, run_torch
from onnx2torch_rnn.modules import quantized as q
from onnx2torch_rnn.recurrent import LoopedRecurrent, Recurrent, StackedRecurrent
from onnx2torch_rnn.registry import _CONVERTERS, _STATIC, resolve

Spec = tuple  # (name, element type as TensorProto int or numpy dtype, shape or None)


def _elem_type(dtype) -> int:
    if isinstance(dtype, int):
        return dtype
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def value_info(spec: Spec | str | onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    if isinstance(spec, onnx.ValueInfoProto):
        return spec
    if isinstance(spec, str):  # type left to shape inference
        return helper.make_empty_tensor_value_info(spec)
    name, dtype, shape = spec
    return helper.make_tensor_value_info(name, _elem_type(dtype), shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[Spec | onnx.ValueInfoProto],
    outputs: Sequence[Spec | str | onnx.ValueInfoProto],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
    extra_opsets: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """A model of ``nodes`` at the lowest IR version its opsets allow; outputs given as bare names get their types from
    shape inference."""
    graph = helper.make_graph(
        list(nodes),
        "test_graph",
        [value_info(s) for s in inputs],
        [value_info(s) for s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), name) for name, v in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    ir_version = min(10, helper.find_min_ir_version_for(opsets, ignore_unknown=True))  # onnxruntime reads IR <= 10
    if ir_version < 4:  # opset < 9: IR 3 lists every initializer among the graph inputs, as old exporters wrote it
        listed = {i.name for i in graph.input}
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                           for t in graph.initializer if t.name not in listed)
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    for out in model.graph.output:
        if not out.type.HasField("tensor_type") and out.name in known:
            out.CopyFrom(known[out.name])
    onnx.checker.check_model(model)
    return model


def initializers_to_inputs(model: onnx.ModelProto, names: Sequence[str] | None = None):
    """Move initializers (all, or ``names``) to graph inputs. Returns (new model, {name: array} to feed)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    moved = {}
    listed = {i.name for i in model.graph.input}  # below IR 4 initializers are graph inputs already
    for tensor in list(model.graph.initializer):
        if names is None or tensor.name in names:
            array = numpy_helper.to_array(tensor)
            moved[tensor.name] = array
            model.graph.initializer.remove(tensor)
            if tensor.name not in listed:
                model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, array.shape))
    return model, moved


def check(
    model: onnx.ModelProto,
    inputs: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    seed: int = 0,
    fuse: bool = True,
) -> torch.fx.GraphModule:
    """Convert ``model`` (``fuse``: with recognition), run it and onnxruntime on ``inputs`` (random if None), compare
    every output.

    Returns the converted module so tests can assert more (e.g. which modules were used).
    """
    feeds = random_inputs(model, seed) if inputs is None else dict(inputs)
    module = onnx2torch_rnn.convert(model, fuse=fuse)
    expected = run_onnxruntime(model, feeds)
    actual = run_torch(module, model, feeds)
    names = [o.name for o in model.graph.output]
    for name, want, got in zip(names, expected, actual, strict=True):
        if str(want.dtype) == "bfloat16":
            want = want.astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, strict=True, err_msg=f"output {name!r}")
    return module


def tensor_type(dtype) -> int:
    """TensorProto element type of a numpy dtype (np.float32 -> TensorProto.FLOAT)."""
    return _elem_type(dtype)


def check_file(path, run, shape: Sequence[int], seed: int = 0) -> None:
    """``run`` (a converted module, an exported program's module, a compiled one) on a random float32 input ``x`` of
    ``shape`` against onnxruntime on the one-input model file ``path``."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    (want,) = run_onnxruntime(onnx.load(str(path)), {"x": x})
    np.testing.assert_allclose(run(torch.from_numpy(x)).detach().numpy(), want, rtol=1e-4, atol=1e-5)


def check_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rtol=1e-4, atol=1e-5):
    """Like ``check`` for cases onnxruntime refuses: onnx's reference evaluator is the oracle."""
    from onnx.reference import ReferenceEvaluator

    expected = ReferenceEvaluator(model).run(None, dict(feeds))
    module = onnx2torch_rnn.convert(model)
    actual = run_torch(module, model, feeds)
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, strict=True)
    return module


def weighted_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence, weights: Mapping[str, np.ndarray], opset: int,
                   kind: str = "initializer", outputs: Sequence = ("y",), seed: int = 0):
    """A model whose ``weights`` are initializers or graph inputs (``kind="input"``). Returns (model, feeds)."""
    as_inputs = kind == "input"
    specs = list(inputs)
    if as_inputs:
        specs += [(name, value.dtype, value.shape) for name, value in weights.items()]
    model = make_model(nodes, specs, list(outputs), None if as_inputs else weights, opset)
    feeds = random_inputs(model, seed)
    feeds.update(weights if as_inputs else {})
    return model, feeds


# ---- pairwise parameter sets ------------------------------------------------------------------------------------


def pairwise(factors: dict[str, list], seed: int = 0) -> list[dict]:
    """Greedy all-pairs selection: every pair of values of any two factors appears in at least one case."""
    names = list(factors)

    def pair(a, i, b, j):  # a pair of (factor, value index), in factor order
        return (a, i, b, j) if names.index(a) < names.index(b) else (b, j, a, i)

    uncovered = {pair(a, i, b, j) for a, b in itertools.combinations(names, 2)
                 for i in range(len(factors[a])) for j in range(len(factors[b]))}
    rng, cases = random.Random(seed), []
    while uncovered:
        a, i, b, j = rng.choice(sorted(uncovered))
        case = {a: i, b: j}
        for name in rng.sample(names, len(names)):
            if name not in case:  # the value completing the most uncovered pairs with the factors chosen so far
                case[name] = max(range(len(factors[name])), key=lambda v, name=name: (
                    sum(pair(n, case[n], name, v) in uncovered for n in case), rng.random()))
        uncovered -= {pair(a, case[a], b, case[b]) for a, b in itertools.combinations(names, 2)}
        cases.append({name: factors[name][case[name]] for name in names})
    return cases


def parametrize_pairwise(**factors: list):
    """``pytest.mark.parametrize`` over the pairwise cases of ``factors`` instead of their full product: every value
    of every factor still runs, and with every value of each other factor."""
    return pytest.mark.parametrize(list(factors), [tuple(case.values()) for case in pairwise(factors)])


# ---- converters replaced for one test (the registry fixture in conftest.py restores them) -----------------------


@contextlib.contextmanager
def registry_restored():
    """Converters registered or replaced inside the block are undone when it ends."""
    saved, static = dict(_CONVERTERS), dict(_STATIC)
    try:
        yield
    finally:
        _CONVERTERS.clear()
        _CONVERTERS.update(saved)
        _STATIC.clear()
        _STATIC.update(static)


class Then(torch.nn.Module):
    """``fn`` applied to what ``module`` returns."""

    def __init__(self, module, fn):
        super().__init__()
        self.module, self.fn = module, fn

    def forward(self, *inputs, **named):
        return self.fn(self.module(*inputs, **named))


@contextlib.contextmanager
def perturbed(op_type, node_name, fn=lambda y: y * 1.01 + 0.01, opset=17):
    """Inside the block, node ``node_name`` computes ``fn`` of its right output (its op's converter is replaced)."""
    original, version = resolve("", op_type, opset)

    def convert(node, ctx):
        result = original(node, ctx)
        if node.name != node_name:
            return result
        return dataclasses.replace(result, module=Then(result.module, fn))

    with registry_restored():
        register_converter(op_type, version, replace=True)(convert)
        yield


def assert_fused_trains_like_literal(path, x: np.ndarray, *others: np.ndarray) -> tuple[torch.nn.Module,
                                                                                          torch.nn.Module]:
    """The model at ``path`` converted with recognition and as written (fuse=False) gives the same loss (the sum of
    its squared outputs) and the same gradient at its inputs ``x`` and ``others`` (its further inputs, in order);
    returns the two modules (fused, literal)."""
    losses, grads, modules = [], [], []
    for fuse in (True, False):
        module = onnx2torch_rnn.convert(path, fuse=fuse)
        given = [torch.from_numpy(a).requires_grad_() for a in (x, *others)]
        outputs = module(*given)
        loss = sum(o.square().sum() for o in (outputs if isinstance(outputs, tuple) else (outputs,)))
        loss.backward()
        losses.append(loss.item())
        grads.append([g.grad for g in given])
        modules.append(module)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for fused, literal in zip(*grads, strict=True):
        torch.testing.assert_close(fused, literal, rtol=1e-4, atol=1e-6)
    return modules[0], modules[1]


# ---- models and values that several test modules use ----------------------------------------------------------


def cnn(dtype=np.float32, seed: int = 0) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> MaxPool -> Flatten -> Gemm, with a symbolic batch."""
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return rng.standard_normal(shape).astype(dtype)

    nodes = [helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n"],
                              name="bn", epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    init = {"conv_w": rand(4, 3, 3, 3), "conv_b": rand(4), "bn_scale": rand(4), "bn_bias": rand(4),
            "bn_mean": rand(4), "bn_var": np.abs(rand(4)) + 0.5, "fc_w": rand(10, 64), "fc_b": rand(10)}
    return make_model(nodes, [("x", dtype, ["batch", 3, 8, 8])], ["y"], init)


def fast_path_modules(module: torch.nn.Module) -> list[torch.nn.RNNBase]:
    """The nn.LSTM / nn.GRU / nn.RNN inside a converted module (recurrent nodes on the fast path)."""
    return [m for m in module.modules() if isinstance(m, torch.nn.RNNBase)]


def recurrent_modules(module: torch.nn.Module) -> list[Recurrent]:
    """The OnnxLSTM / OnnxGRU / OnnxRNN modules of a converted module (one per recurrent node, either path)."""
    return [m for m in module.modules() if isinstance(m, Recurrent)]


def looped(module: torch.nn.Module) -> list[LoopedRecurrent]:
    """The LoopedRecurrent modules (a recognised Loop, Scan or unrolled cell each) of a converted module."""
    return [m for m in module.modules() if isinstance(m, LoopedRecurrent)]


def stacks(module: torch.nn.Module) -> list[StackedRecurrent]:
    return [m for m in module.modules() if isinstance(m, StackedRecurrent)]


def literal_ops(module: torch.fx.GraphModule) -> list[str]:
    """The ONNX op types of the converted module's nodes that are not fused."""
    return [n.meta["onnx"]["op_type"] for n in module.graph.nodes if "onnx" in n.meta and "pattern" not in n.meta[
        "onnx"]]


CONV_CASES = [  # (attributes, x shape, w shape, bias): Conv and ConvInteger
    ({}, (1, 4, 6, 7), (6, 4, 3, 3), True),
    ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, (2, 4, 7, 8), (6, 4, 3, 3), True),
    ({"strides": [2, 1], "pads": [0, 1, 2, 1]}, (1, 4, 7, 8), (6, 4, 3, 3), True),
    ({"dilations": [2, 1], "group": 2}, (1, 4, 7, 8), (6, 2, 3, 3), True),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 4, 7, 8), (6, 4, 4, 3), True),
    ({"auto_pad": "SAME_LOWER"}, (1, 4, 7, 8), (6, 4, 4, 3), False),
    ({"auto_pad": "SAME_LOWER", "strides": [3, 2]}, (1, 4, 7, 8), (6, 4, 2, 3), True),
    ({"auto_pad": "VALID", "strides": [2, 2]}, (1, 4, 7, 8), (6, 4, 3, 3), True),
    ({"strides": [2], "dilations": [2], "pads": [2, 1]}, (2, 3, 11), (5, 3, 3), True),
    ({"strides": [1, 2, 1], "pads": [1, 0, 1, 0, 1, 1]}, (1, 2, 4, 5, 6), (3, 2, 2, 3, 3), True),
    ({"group": 4, "pads": [1, 1, 1, 1]}, (1, 4, 6, 6), (4, 1, 3, 3), False),
    ({"kernel_shape": [3, 3], "pads": [1, 2, 1, 2]}, (1, 4, 6, 7), (6, 4, 3, 3), False),
]

# ---- quantized models -------------------------------------------------------------------------------------------

QUANTIZED_MODULES = (q.QuantizeLinear, q.DequantizeLinear, q.DynamicQuantizeLinear, q.MatMulInteger, q.ConvInteger,
                     q.QLinearMatMul, q.QLinearConv, q.DynamicQuantizeMatMul, q.MatMulIntegerToFloat, q.QLinearAdd,
                     q.QLinearMul, q.QLinearLookup, q.QLinearGlobalAveragePool, q.QLinearConcat, q.QGemm)


def assert_float_only(module: torch.nn.Module) -> None:
    """No quantized module and no integer tensor (beyond scalars) left: what dequantize=True promises."""
    left = [name for name, m in module.named_modules() if isinstance(m, QUANTIZED_MODULES)]
    assert not left, f"quantized modules left: {left}"
    assert not [name for name, b in module.named_buffers() if not b.is_floating_point() and b.numel() > 1]


def integers(dtype, shape, low=None, high=None, *, rng: np.random.Generator) -> np.ndarray:
    """Uniform integers of ``dtype`` in [low, high] (default: the type's whole range)."""
    info = np.iinfo(dtype)
    return rng.integers(info.min if low is None else low, (info.max if high is None else high) + 1,
                        shape).astype(dtype)


def floats(shape, scale: float = 1.0, *, rng: np.random.Generator) -> np.ndarray:
    """Random floats that also hit the rounding ties of ``scale`` (exact multiples of scale / 2) and extremes."""
    values = rng.standard_normal(shape).astype(np.float32) * 100 * scale
    flat = values.reshape(-1)
    ties = (rng.integers(-400, 400, flat.size) + 0.5).astype(np.float32) * np.float32(scale)
    flat[::3] = ties[::3]
    return values


def single_node(op, inputs, feeds, initializers, opset, outputs=("y",), domain="", **attributes):
    """A one-node model over ``inputs`` (names in order, '' for absent); values in ``initializers`` are
    initializers, the others graph inputs fed from ``feeds``. ``outputs`` are names (typed by shape inference) or
    (name, type, shape) specs. Returns (model, feeds)."""
    names = [o if isinstance(o, str) else o[0] for o in outputs]
    node = helper.make_node(op, list(inputs), names, domain=domain, **attributes)
    specs = [(name, value.dtype, value.shape) for name, value in feeds.items()]
    extra = {"com.microsoft": 1} if domain else None
    model = make_model([node], specs, list(outputs), initializers, opset, extra)
    return model, feeds


__all__ = ["CONV_CASES", "TensorProto", "assert_float_only", "check", "check_file", "check_reference", "cnn",
           "fast_path_modules", "floats", "helper", "initializers_to_inputs", "integers", "make_model", "pairwise",
           "parametrize_pairwise", "perturbed", "random_inputs", "recurrent_modules", "registry_restored",
           "run_onnxruntime", "run_torch", "single_node", "tensor_type", "weighted_model"]


def sigmoid_before_first_tanh(body: onnx.GraphProto) -> None:
    """A near-miss for cell recognition: a Sigmoid inserted before the body's first Tanh (tanh(sigmoid(.)) is no
    activation of an affine form, so the cell must not be recognised)."""
    tanh = next(n for n in body.node if n.op_type == "Tanh")
    body.node.insert(list(body.node).index(tanh), onnx.helper.make_node("Sigmoid", [tanh.input[0]], ["extra_sigmoid"]))
    tanh.input[0] = "extra_sigmoid"


class OpSpy:
    """torch.ops.onnx2torch_rnn, recording which ops the modules call (monkeypatched over a module's op namespace)."""

    def __init__(self):
        self.called = set()

    def __getattr__(self, name):
        self.called.add(name)
        return getattr(torch.ops.onnx2torch_rnn, name)
