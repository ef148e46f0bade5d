"""checking.py: generated inputs (index-aware integer ranges), compare() and the per-node divergence bisect."""

import operator

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from onnx2torch_rnn import ModuleRunError, ReferenceRuntimeError, loading, shape_arithmetic
from onnx2torch_rnn.checking import compare, index_ranges, random_inputs, run_onnxruntime
from tests.helpers import make_model, perturbed

RNG = np.random.default_rng(0)


def _chain(opset=17):
    """x -> Mul(w) -> Add(b) -> Tanh -> Relu, with named nodes."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="scale"),
             helper.make_node("Add", ["m", "b"], ["a"], name="shift"),
             helper.make_node("Tanh", ["a"], ["t"], name="squash"),
             helper.make_node("Relu", ["t"], ["y"], name="clip")]
    init = {"w": RNG.standard_normal((4,)).astype(np.float32), "b": RNG.standard_normal((4,)).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, ["batch", 4])], ["y"], init, opset=opset)


def _lstm(sequence_lens_input=True, layout=0):
    hidden, gates = 3, 4
    init = {"W": RNG.standard_normal((1, gates * hidden, 2)).astype(np.float32),
            "R": RNG.standard_normal((1, gates * hidden, hidden)).astype(np.float32)}
    x_shape = ["batch", "time", 2] if layout else ["time", "batch", 2]
    node = helper.make_node("LSTM", ["X", "W", "R", "", "lens"], ["Y", "Y_h"], hidden_size=hidden, layout=layout,
                            name="lstm")
    return make_model([node], [("X", np.float32, x_shape), ("lens", np.int32, ["batch"])], ["Y", "Y_h"], init,
                      opset=14)


# ----------------------------------------------------------------------------------------------- inputs

def test_gather_indices_get_the_table_size_through_casts_and_reshapes():
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["ids64", "axes"], ["ids2"]),
             helper.make_node("Gather", ["table", "ids2"], ["y"], axis=0),
             helper.make_node("Add", ["other", "other"], ["z"])]
    init = {"table": np.zeros((7, 2), np.float32), "axes": np.array([0], np.int64)}
    model = make_model(nodes, [("ids", np.int32, ["n"]), ("other", np.int64, [3])], ["y", "z"], init)
    assert index_ranges(model) == {"ids": (0, 7)}
    feeds = random_inputs(model, seed=1, dims={"n": 500})
    assert feeds["ids"].min() == 0 and feeds["ids"].max() == 6
    assert feeds["other"].max() < 4  # no use that tells a range: the default [0, 4)


def test_gather_on_another_axis_and_on_a_runtime_value_of_known_shape():
    nodes = [helper.make_node("Gather", ["data", "i"], ["y"], axis=1),
             helper.make_node("GatherElements", ["data", "j"], ["z"], axis=0)]
    model = make_model(nodes, [("data", np.float32, [5, "width"]), ("i", np.int64, [2]), ("j", np.int64, [1, 2])],
                       ["y", "z"])
    assert index_ranges(model, {"width": 9}) == {"i": (0, 9), "j": (0, 5)}


@pytest.mark.parametrize("layout", [0, 1])
def test_sequence_lens_are_between_1_and_the_sequence_length(layout):
    model = _lstm(layout=layout)
    assert index_ranges(model, {"time": 6, "batch": 50}) == {"lens": (1, 7)}
    feeds = random_inputs(model, dims={"time": 6, "batch": 50})
    assert feeds["lens"].min() >= 1 and feeds["lens"].max() == 6
    if layout == 0:  # onnxruntime runs layout 0 only
        assert compare(model, feeds).ok


def test_explicit_ranges_win():
    model = _lstm()
    feeds = random_inputs(model, dims={"time": 6, "batch": 40}, int_ranges={"lens": (2, 3)})
    assert set(feeds["lens"].tolist()) == {2}
    feeds = random_inputs(model, dims={"time": 6, "batch": 40}, default_int_range=(5, 6))
    assert set(feeds["lens"].tolist()) == {5}  # an explicit default applies to every integer input


# ----------------------------------------------------------------------------------------------- compare

def test_compare_is_public_and_bisects_only_on_request_when_outputs_match():
    model = _chain()
    report = onnx2torch_rnn.compare(model, dims={"batch": 2})
    assert report.ok and not report.bisected and report.divergence is None
    assert [o.name for o in report.outputs] == ["y"] and report.outputs[0].shape == (2, 4)
    report = compare(model, dims={"batch": 2}, bisect=True)
    assert report.ok and report.bisected and report.compared_nodes == 4 and report.divergence is None


@pytest.mark.parametrize("culprit", ["scale", "shift", "squash"])
def test_bisect_names_the_first_diverging_node(culprit):
    model = _chain()
    op_type = {n.name: n.op_type for n in model.graph.node}[culprit]
    with perturbed(op_type, culprit):
        report = compare(model, dims={"batch": 3})  # automatic on a mismatch
    assert not report.ok and report.bisected
    d = report.divergence
    assert (d.node, d.op_type, d.folded) == (culprit, op_type, False)
    assert d.index == [n.name for n in model.graph.node].index(culprit)
    assert [o.name for o in d.outputs] == [model.graph.node[d.index].output[0]] and not d.outputs[0].ok
    assert d.outputs[0].max_abs_error > 1e-3
    assert all(i.matches in (True, None) for i in d.inputs)  # everything before it agreed
    assert d.inputs[0].shape == (3, 4) and d.inputs[0].dtype == "float32"
    text = str(d)
    assert f"{op_type} node {culprit!r}" in text and "DIFFERS" in text


def test_bisect_reports_attributes_and_constant_inputs():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first"),
             helper.make_node("Gemm", ["r", "w", "c"], ["y"], name="dense", alpha=0.5, transB=1)]
    init = {"w": RNG.standard_normal((5, 4)).astype(np.float32), "c": np.zeros(5, np.float32)}
    model = make_model(nodes, [("x", np.float32, [2, 4])], ["y"], init)
    with perturbed("Gemm", "dense"):
        d = compare(model).divergence
    assert d.node == "dense" and d.attributes == {"alpha": "0.5", "transB": "1"}
    assert [(i.name, i.shape, i.matches) for i in d.inputs] == [("r", (2, 4), True), ("w", (5, 4), None),
                                                               ("c", (5,), None)]
    assert "attributes: alpha=0.5, transB=1" in str(d)


def test_a_wrong_dtype_is_a_divergence():
    with perturbed("Tanh", "squash", fn=lambda y: y.double()):
        d = compare(_chain(), dims={"batch": 2}).divergence
    assert d.node == "squash" and "dtype float64" in d.outputs[0].problem


def test_a_wrong_folded_constant_is_found_where_the_module_reads_it():
    nodes = [helper.make_node("Add", ["w0", "w1"], ["w"], name="fold"),  # initializers only: folded
             helper.make_node("Mul", ["x", "w"], ["y"], name="use")]
    init = {"w0": np.float32([1, 2, 3]), "w1": np.float32([3, 4, 5])}
    model = make_model(nodes, [("x", np.float32, [3])], ["y"], init)
    with perturbed("Add", "fold"):
        report = compare(model)
    d = report.divergence
    assert (d.node, d.folded) == ("fold", True) and "folded to a constant at conversion" in str(d)


def test_recurrent_outputs_map_to_their_onnx_names():
    model = _lstm()
    feeds = random_inputs(model, dims={"time": 4, "batch": 2})
    with perturbed("LSTM", "lstm", fn=lambda outputs: (outputs[0], outputs[1] + 1), opset=14):
        report = compare(model, feeds)
    assert [o.ok for o in report.outputs] == [True, False]
    d = report.divergence
    assert d.node == "lstm" and [(o.name, o.ok) for o in d.outputs] == [("Y", True), ("Y_h", False)]
    assert [(i.name, i.shape) for i in d.inputs] == [("X", (4, 2, 2)), ("W", (1, 12, 2)), ("R", (1, 12, 3)),
                                                     ("lens", (2,))]


def test_nodes_with_subgraphs_are_compared_as_a_whole():
    then_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "then", [],
                                    [helper.make_tensor_value_info("n", TensorProto.FLOAT, [2])])
    else_branch = helper.make_graph([helper.make_node("Abs", ["x"], ["b"])], "else", [],
                                    [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("If", ["c"], ["i"], then_branch=then_branch, else_branch=else_branch, name="branch"),
             helper.make_node("Exp", ["i"], ["y"], name="exp")]
    model = make_model(nodes, [("c", np.bool_, []), ("x", np.float32, [2])], ["y"])
    feeds = {"c": np.array(True), "x": np.float32([1.0, -2.0])}
    report = compare(model, feeds, bisect=True)
    assert report.ok and report.compared_nodes == 2
    with perturbed("If", "branch"):
        d = compare(model, feeds).divergence
    assert d.node == "branch" and [i.name for i in d.inputs] == ["c"]
    assert d.attributes == {"then_branch": "<graph 'then': 1 nodes>", "else_branch": "<graph 'else': 1 nodes>"}


def _expand_to_twice_the_batch():
    """y = row [1, 6] expanded to [2 * N, 6], with N = Shape(x)[0:1]: the Expand reads its shape as ints."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"], name="slice"),
             helper.make_node("Mul", ["n", "two"], ["n2"], name="twice"),
             helper.make_node("Concat", ["n2", "six"], ["target"], name="concat", axis=0),
             helper.make_node("Expand", ["row", "target"], ["y"], name="expand")]
    init = {"zero": np.array([0]), "one": np.array([1]), "two": np.array([2]), "six": np.array([6]),
            "row": RNG.standard_normal((1, 6)).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, ["N", 6])], ["y"], init)


def test_shape_arithmetic_is_compared_where_a_module_reads_it(monkeypatch):
    """The sizes a module reads as ints are compared as the ONNX value they stand for; the values on the way (Shape,
    Slice, Mul) have no fx node of their own."""
    model = _expand_to_twice_the_batch()
    report = compare(model, dims={"N": 3}, bisect=True)
    assert report.ok and report.compared_nodes == 2  # concat (read as ints by the Expand) and expand
    wrong = {**shape_arithmetic.ARITHMETIC, "Mul": operator.add}  # 3 + 2 sizes where 3 * 2 are due
    monkeypatch.setattr(shape_arithmetic, "ARITHMETIC", wrong)
    d = compare(model, dims={"N": 3}).divergence
    assert (d.node, d.outputs[0].ok, d.outputs[0].max_abs_error) == ("concat", False, 1)  # [5, 6], not [6, 6]


def test_bisect_needs_the_graph_module():
    with pytest.raises(TypeError, match="GraphModule"):
        compare(_chain(), dims={"batch": 1}, module=torch.nn.ReLU(), bisect=True)


def test_external_data_models_are_bisected_beside_their_data(tmp_path):
    model = _chain()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    with perturbed("Tanh", "squash"):
        d = compare(tmp_path / "m.onnx", dims={"batch": 2}).divergence
    assert d.node == "squash"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.data", "m.onnx"]  # the temporary copy is gone


def test_a_loaded_model_from_bytes_is_bisected_in_its_data_folder(tmp_path):
    model = _chain()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    loaded = loading.load_model((tmp_path / "m.onnx").read_bytes(), base_dir=tmp_path)
    with perturbed("Tanh", "squash"):
        d = compare(loaded, dims={"batch": 2}).divergence
    assert d.node == "squash"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.data", "m.onnx"]


def test_compare_parses_a_path_once(tmp_path, monkeypatch):
    parsed = []
    parse = loading._parse
    monkeypatch.setattr(loading, "_parse", lambda data, where: parsed.append(where) or parse(data, where))
    init = {"w": RNG.standard_normal((1, 1200)).astype(np.float32)}  # read into a tensor at load
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="scale"), helper.make_node("Relu", ["m"], ["y"])]
    onnx.save(make_model(nodes, [("x", np.float32, [2, 1200])], ["y"], init), tmp_path / "m.onnx")
    report = compare(tmp_path / "m.onnx", bisect=True)
    assert report.ok and report.compared_nodes == 2 and parsed == [str(tmp_path / "m.onnx")]


def test_onnxruntime_failures_are_reference_runtime_errors():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [4])], ["y"])
    with pytest.raises(ReferenceRuntimeError, match="INVALID_ARGUMENT") as error:
        compare(model, {"x": np.zeros(3, np.float32)})
    assert type(error.value.__cause__).__module__.startswith("onnxruntime")
    with pytest.raises(ReferenceRuntimeError, match="x"):
        run_onnxruntime(model, {})  # a missing input


def test_module_failures_are_module_run_errors():
    def broken(y):
        raise ValueError("boom")

    with perturbed("Tanh", "squash", fn=broken), pytest.raises(ModuleRunError, match=r"^ValueError: boom$") as error:
        compare(_chain(), dims={"batch": 2})
    assert isinstance(error.value.__cause__, ValueError)


def test_equal_nans_and_infinities_match():
    from onnx2torch_rnn.checking import compare_arrays

    expected = np.float32([np.nan, np.inf, -np.inf, 1.0])
    assert compare_arrays("y", expected.copy(), expected, 1e-4, 1e-5).ok
    assert not compare_arrays("y", np.float32([0.0, np.inf, -np.inf, 1.0]), expected, 1e-4, 1e-5).ok
    assert not compare_arrays("y", np.float32([np.nan, np.inf, np.inf, 1.0]), expected, 1e-4, 1e-5).ok
