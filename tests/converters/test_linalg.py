"""MatMul, Gemm, Einsum against onnxruntime, with weights as initializers and as graph inputs."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from tests.helpers import check, check_reference, helper, make_model, weighted_model

RNG = np.random.default_rng(0)


def _linears(module) -> int:
    return sum(isinstance(sub, nn.Linear) for sub in module.modules())


@pytest.mark.parametrize("opset", [7, 9, 13, 25])
@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)), ((3, 4), (4,)), ((2, 3, 4), (1, 4, 2)),
])
@pytest.mark.parametrize("weights", ["initializer", "input"])
def test_matmul(opset, a_shape, b_shape, weights):
    model, feeds = weighted_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", np.float32, a_shape)],
                                  {"b": RNG.standard_normal(b_shape).astype(np.float32)}, opset, weights)
    module = check(model, feeds)
    assert _linears(module) == (weights == "initializer" and len(b_shape) == 2)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_matmul_dtypes(dtype):
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", dtype, (2, 3, 4)), ("b", dtype, (4, 2))],
                       ["y"], opset=13)
    check(model)


def test_matmul_shared_weight_stays_one_parameter():
    nodes = [helper.make_node("MatMul", ["a", "w"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["y"])]
    model = make_model(nodes, [("a", np.float32, (3, 4))], ["y"], {"w": RNG.standard_normal((4, 4)).astype(np.float32)})
    module = check(model)
    assert _linears(module) == 0
    assert len(list(module.parameters())) == 1


GEMM_CASES = [  # (attributes, A shape, B shape, C shape or None)
    ({}, (3, 4), (4, 5), (5,)),
    ({"alpha": 0.5, "beta": 2.0}, (3, 4), (4, 5), (1, 5)),
    ({"transB": 1}, (3, 4), (5, 4), (5,)),
    ({"transA": 1}, (4, 3), (4, 5), (5,)),
    ({"transA": 1, "transB": 1, "alpha": 1.5}, (4, 3), (5, 4), (3, 5)),
    ({"beta": 0.5}, (3, 4), (4, 5), (3, 5)),
    ({}, (3, 4), (4, 5), (3, 1)),
    ({"beta": -1.0}, (3, 4), (4, 5), (1,)),
    ({}, (3, 4), (4, 5), ()),
    ({"alpha": 2.0}, (3, 4), (4, 5), None),
    ({"transB": 1}, (3, 4), (5, 4), None),
]


@pytest.mark.parametrize(("opset", "attributes", "a_shape", "b_shape", "c_shape"),
                         [(opset, *case) for opset in (7, 9, 11, 13, 25) for case in GEMM_CASES
                          if case[3] is not None or opset >= 11])  # C is optional from opset 11
@pytest.mark.parametrize("weights", ["initializer", "input"])
def test_gemm(opset, attributes, a_shape, b_shape, c_shape, weights):
    initializers = {"b": RNG.standard_normal(b_shape).astype(np.float32)}
    if c_shape is not None:
        initializers["c"] = RNG.standard_normal(c_shape).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "b", "c"] if c_shape is not None else ["a", "b"], ["y"], **attributes)
    model, feeds = weighted_model([node], [("a", np.float32, a_shape)], initializers, opset, weights)
    module = check(model, feeds)
    bias_like = c_shape is None or (int(np.prod(c_shape)) in (1, b_shape[0] if attributes.get("transB") else b_shape[1])
                                    and (len(c_shape) < 2 or c_shape[0] == 1))
    assert _linears(module) == (weights == "initializer" and not attributes.get("transA") and bias_like)


def test_gemm_linear_parameters_train():
    """The nn.Linear that Gemm becomes carries alpha/beta folded into trainable parameters."""
    model = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=2.0, beta=3.0)],
                       [("a", np.float32, (3, 4))], ["y"],
                       {"b": RNG.standard_normal((4, 5)).astype(np.float32),
                        "c": RNG.standard_normal(5).astype(np.float32)}, 13)
    module = check(model)
    assert sorted(name.rsplit(".", 1)[-1] for name, _ in module.named_parameters()) == ["bias", "weight"]


@pytest.mark.parametrize("opset", [12, 25])
@pytest.mark.parametrize(("equation", "shapes"), [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij", [(3, 4)]),
    ("ba", [(3, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("i,i", [(4,), (4,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii->i", [(3, 3)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij , jk -> ik", [(3, 4), (4, 5)]),
    ("Ab,bC->AC", [(3, 4), (4, 5)]),
    ("ij->", [(3, 4)]),
])
def test_einsum(opset, equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    model = make_model([helper.make_node("Einsum", names, ["y"], equation=equation)],
                       [(n, np.float32, s) for n, s in zip(names, shapes, strict=True)], ["y"], opset=opset)
    check(model)


def test_einsum_opset_28():
    """onnxruntime stops at opset 25; opset 28 (bfloat16 added) is checked against onnx's reference evaluator."""
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")],
                       [("a", np.float32, (2, 3, 4)), ("b", np.float32, (2, 4, 5))], ["y"], opset=28)
    check_reference(model, {"a": RNG.standard_normal((2, 3, 4)).astype(np.float32),
                            "b": RNG.standard_normal((2, 4, 5)).astype(np.float32)})


def test_einsum_int64():
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")],
                       [("a", np.int64, (3, 4)), ("b", np.int64, (4, 5))], ["y"], opset=12)
    check(model)
