"""The converter registry: version resolution, duplicates, user converters, planning errors."""

import numpy as np
import pytest
import torch
from onnx import helper

import onnx2torch_rnn
from onnx2torch_rnn import Converted, UnsupportedAttributeError, UnsupportedOperatorError, register_converter
from onnx2torch_rnn.modules.common import Function
from onnx2torch_rnn.registry import resolve
from tests.helpers import make_model, registry_restored


def test_a_version_serves_every_opset_until_the_schema_changes():
    # Relu's schema versions are 6, 13, 14: opset 7..12 resolve to 6, 13 to 13, 14.. to 14.
    assert resolve("", "Relu", 7)[1] == 6
    assert resolve("", "Relu", 12)[1] == 6
    assert resolve("", "Relu", 13)[1] == 13
    assert resolve("", "Relu", 22)[1] == 14
    assert resolve("ai.onnx", "Relu", 22)[1] == 14


def test_registering_a_key_twice_needs_replace():
    with pytest.raises(ValueError, match="already registered"):
        register_converter("Relu", 14)(lambda node, ctx: None)


class _Halves(torch.nn.Module):
    def forward(self, x):
        return x[: x.shape[0] // 2], x[x.shape[0] // 2 :]


@pytest.fixture
def halves(registry):
    """A custom op test.custom::Halves-1, registered for the test."""
    @registry("Halves", 1, domain="test.custom")
    def convert(node, ctx):
        """Test op: splits the first axis in two halves."""
        return Converted(_Halves(), node.inputs)


def test_custom_domain_converter_and_outputs_resolved_per_value(halves):
    node = helper.make_node("Halves", ["x"], ["", "second"], domain="test.custom", name="h")
    model = make_model([node], [("x", np.float32, [4])], [("second", np.float32, [2])],
                       extra_opsets={"test.custom": 3})
    gm = onnx2torch_rnn.convert(model)
    assert gm(torch.arange(4.0)).tolist() == [2.0, 3.0]


def test_registrations_inside_registry_restored_are_undone():
    original = resolve("", "Relu", 14)
    with registry_restored():
        register_converter("Relu", 14, replace=True)(lambda node, ctx: None)
        register_converter("Fresh", 1, domain="test.custom")(lambda node, ctx: None)
        assert resolve("", "Relu", 14) != original and resolve("test.custom", "Fresh", 1) is not None
    assert resolve("", "Relu", 14) == original and resolve("test.custom", "Fresh", 1) is None


def test_replacing_a_builtin_is_explicit_and_takes_effect(registry):
    @registry("Relu", 14, replace=True)
    def negate(node, ctx):
        return Converted(Function(torch.neg), node.inputs)

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [2])], ["y"])
    assert onnx2torch_rnn.convert(model)(torch.tensor([1.0, -2.0])).tolist() == [-1.0, 2.0]


def test_all_unsupported_operators_are_reported_at_once():
    nodes = [
        helper.make_node("NoSuchOp", ["x"], ["a"], domain="test.custom", name="first"),
        helper.make_node("NoSuchOp", ["a"], ["b"], domain="test.custom", name="second"),
        helper.make_node("OtherOp", ["b"], ["y"], domain="test.custom", name="third"),
    ]
    model = make_model(nodes, [("x", np.float32, [2])], [("y", np.float32, [2])], extra_opsets={"test.custom": 1})
    with pytest.raises(UnsupportedOperatorError) as info:
        onnx2torch_rnn.convert(model)
    assert info.value.missing == {("test.custom", "NoSuchOp", 1): ["first", "second"],
                                  ("test.custom", "OtherOp", 1): ["third"]}
    assert "first" in str(info.value) and "third" in str(info.value)


def test_an_attribute_the_converter_does_not_read_is_an_error(halves):
    node = helper.make_node("Halves", ["x"], ["a", "b"], domain="test.custom", name="h", surprise=3)
    model = make_model([node], [("x", np.float32, [4])], [("a", np.float32, [2])], extra_opsets={"test.custom": 1})
    with pytest.raises(UnsupportedAttributeError, match=r"Halves node 'h': attribute surprise=3"):
        onnx2torch_rnn.convert(model)


def test_an_unknown_attribute_of_a_standard_op_is_an_invalid_model():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [2])], ["y"])
    model.graph.node[0].attribute.append(helper.make_attribute("surprise", 3))
    with pytest.raises(onnx2torch_rnn.InvalidModelError, match="surprise"):
        onnx2torch_rnn.convert(model)
