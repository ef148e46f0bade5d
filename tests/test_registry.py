"""The converter registry: version resolution, duplicates, user converters, planning errors."""

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import onnx2torch_rnn
from onnx2torch_rnn import Converted, UnsupportedAttributeError, UnsupportedOperatorError, register_converter
from onnx2torch_rnn.builder import make_plan
from onnx2torch_rnn.loading import load_model
from onnx2torch_rnn.modules.common import Function
from onnx2torch_rnn.registry import registered, resolve, schema_for, static_inputs
from tests.helpers import check, initializers_to_inputs, make_model, registry_restored


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


def test_a_schema_registered_after_a_lookup_is_seen(registry):
    """A schema registered with onnx.defs after a lookup found none serves the op from then on: its since_version
    picks the converter, not the highest registered version (a cached miss hid it)."""
    registry("Later", [1, 2], domain="test.later")(lambda node, ctx: Converted(torch.nn.Identity(), node.inputs))
    assert schema_for("test.later", "Later", 3) is None and resolve("test.later", "Later", 3)[1] == 2
    tensor = onnx.defs.OpSchema.FormalParameter
    schema = onnx.defs.OpSchema("Later", "test.later", 1, inputs=[tensor("x", "T")], outputs=[tensor("y", "T")],
                                type_constraints=[("T", ["tensor(float)"], "")])
    onnx.defs.register_schema(schema)
    try:
        assert schema_for("test.later", "Later", 3).since_version == 1
        assert resolve("test.later", "Later", 3)[1] == 1
    finally:
        onnx.defs.deregister_schema("Later", 1, "test.later")


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


# ---- inputs declared static ------------------------------------------------------------------------------------------


def _scaled_model(scale_as_input: bool):
    """test.custom::Scale(x, factor): x times a factor that steers nothing but stands for a static input."""
    node = helper.make_node("Scale", ["x", "factor"], ["y"], domain="test.custom", name="scale_node")
    inputs = [("x", np.float32, [3])] + ([("factor", np.float32, [])] if scale_as_input else [])
    initializers = {} if scale_as_input else {"factor": np.array(3.0, np.float32)}
    return make_model([node], inputs, [("y", np.float32, [3])], initializers, extra_opsets={"test.custom": 1})


class _Scale(torch.nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x, factor=None):
        return x * (self.factor if factor is None else factor)


def test_a_declared_static_input_is_baked_when_known_and_read_at_run_time_otherwise(registry):
    @registry("Scale", 1, domain="test.custom", static=(1,))
    def convert(node, ctx):
        factor = ctx.static(node, 1)
        return Converted(_Scale(factor.scalar()), [node.input(0), factor.run_time])

    baked = onnx2torch_rnn.convert(_scaled_model(scale_as_input=False))
    assert baked.scale_node.factor == 3.0 and baked(torch.ones(3)).tolist() == [3.0] * 3
    run_time = onnx2torch_rnn.convert(_scaled_model(scale_as_input=True))
    assert run_time.scale_node.factor is None
    assert run_time(torch.ones(3), torch.tensor(2.0)).tolist() == [2.0] * 3


def test_reading_an_undeclared_input_as_static_names_the_node_and_input(registry):
    @registry("Scale", 1, domain="test.custom")
    def convert(node, ctx):
        factor = ctx.static(node, 1)
        return Converted(_Scale(factor.scalar()), [node.input(0), factor.run_time])

    with pytest.raises(onnx2torch_rnn.ConversionError, match=r"scale_node.*Scale.*input 1 as static without declar"):
        onnx2torch_rnn.convert(_scaled_model(scale_as_input=False))


def test_a_replacement_keeps_the_declaration_unless_it_gives_one(registry):
    original, version = resolve("", "Reshape", 17)

    @registry("Reshape", version, replace=True)
    def wrapper(node, ctx):  # calls the built-in, which reads the shape with ctx.static
        return original(node, ctx)

    assert static_inputs("", "Reshape", version) == {1}
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [("x", np.float32, [2, 3])],
                       [("y", np.float32, [3, 2])], {"shape": np.array([3, 2], np.int64)})
    assert onnx2torch_rnn.convert(model)(torch.zeros(2, 3)).shape == (3, 2)
    registry("Reshape", version, replace=True, static=())(wrapper)
    assert static_inputs("", "Reshape", version) == set()


def test_the_plan_carries_each_node_s_static_inputs():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    model = make_model(nodes, [("x", np.float32, [2, 3])], [("y", np.float32, [3, 2])],
                       {"shape": np.array([3, 2], np.int64)})
    loaded = load_model(model)
    plan = make_plan(loaded.proto.graph, loaded.opsets)
    assert [step.static_inputs for step in plan.steps] == [{1}, set()]


def test_every_declared_static_input_is_an_input_of_the_schema():
    """A declaration covers all versions of a converter (in earlier ones the value may be an attribute): each index
    names an input of the op in some version it is registered for."""
    inputs, declared = {}, {}
    for key in registered():
        schema = schema_for(key.domain, key.op_type, key.version)
        if schema is None or schema.since_version != key.version:
            continue
        formal = schema.inputs
        variadic = bool(formal) and formal[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        op = (key.domain, key.op_type)
        inputs[op] = max(inputs.get(op, 0), 10**6 if variadic else len(formal))
        declared.setdefault(op, set()).update(static_inputs(key.domain, key.op_type, key.version))
    assert declared[("", "Slice")] == {1, 2, 3, 4}
    for op, indices in declared.items():
        assert all(index < inputs[op] for index in indices), (op, indices)


# Built-in ops, each with one static input: (op, opset, inputs, values (index of the static one first), attributes)
_STATIC_CASES = {
    "Reshape": (17, ["x", "s"], {"s": np.array([3, 2], np.int64)}, {}),
    "Squeeze": (17, ["x1", "s"], {"s": np.array([0], np.int64)}, {}),
    "Unsqueeze": (17, ["x", "s"], {"s": np.array([0], np.int64)}, {}),
    "Expand": (17, ["x", "s"], {"s": np.array([2, 2, 3], np.int64)}, {}),
    "Tile": (17, ["x", "s"], {"s": np.array([2, 1], np.int64)}, {}),
    "Slice": (17, ["x", "s", "ends"], {"s": np.array([1], np.int64), "ends": np.array([2], np.int64)}, {}),
    "Split": (17, ["x", "s"], {"s": np.array([2, 1], np.int64)}, {"axis": 1}),
    "TopK": (17, ["x", "s"], {"s": np.array([2], np.int64)}, {}),
    "CumSum": (17, ["x", "s"], {"s": np.array(1, np.int64)}, {}),
    "Trilu": (17, ["x", "s"], {"s": np.array(1, np.int64)}, {}),
    "ReduceSum": (17, ["x", "s"], {"s": np.array([1], np.int64)}, {}),
    "Pad": (17, ["x", "s"], {"s": np.array([0, 1, 1, 0], np.int64)}, {}),
    "Clip": (17, ["x", "s"], {"s": np.array(0.0, np.float32)}, {}),
    "Upsample": (9, ["x", "s"], {"s": np.array([1.0, 2.0], np.float32)}, {}),
    "Resize": (17, ["x", "", "s"], {"s": np.array([1.0, 2.0], np.float32)}, {}),
    "ConstantOfShape": (17, ["s"], {"s": np.array([2, 3], np.int64)}, {}),
}
_OUTPUTS = {"Split": ["y", "y2"], "TopK": ["y", "y2"]}


@pytest.mark.parametrize("run_time", [False, True], ids=["constant", "run-time"])
@pytest.mark.parametrize("op", list(_STATIC_CASES))
def test_builtin_static_inputs_are_baked_when_constant_and_read_at_run_time_otherwise(op, run_time):
    """The input declared static (``s``) is baked into the module when it is a constant, a run-time input of the
    module otherwise; both compute what onnxruntime computes."""
    opset, inputs, values, attributes = _STATIC_CASES[op]
    version = resolve("", op, opset)[1]
    assert inputs.index("s") in static_inputs("", op, version)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "x1": np.arange(3, dtype=np.float32).reshape(1, 3)}
    feeds = {name: value for name, value in feeds.items() if name in inputs}
    node = helper.make_node(op, inputs, _OUTPUTS.get(op, ["y"]), name="node", **attributes)
    model = make_model([node], [(name, value.dtype, value.shape) for name, value in feeds.items()],
                       _OUTPUTS.get(op, ["y"]), values, opset)
    if run_time:
        model, moved = initializers_to_inputs(model, ["s"])
        feeds.update(moved)
    gm = check(model, feeds)
    calls = [n for n in gm.graph.nodes if n.op == "call_module" and n.meta["onnx"]["name"] == "node"]
    if not feeds:  # every input constant: the node is folded
        assert not calls
        return
    assert len(calls) == 1
    assert ("s" in calls[0].meta["onnx_values"]["inputs"]) == run_time
