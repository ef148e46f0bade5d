"""Exported programs keep every symbolic dim dynamic: a model is exported at one size with all of its symbolic input
dims dynamic and run at two other sizes against onnxruntime, and compiles in one graph.

tests/models/cnn: torch.onnx's nn.Upsample(scale_factor=2) (nearest and bilinear, opsets 11 and 17) as Resize with
constant scales after a strided Conv, as text detectors are built: a whole scale of a symbolic size is the symbolic
2 * size (modules/nn.py resize_geometry), where it was float32 arithmetic on the size, which pinned it. And
BatchNormalization whose statistics are shared parameters (paddle2onnx's OCR models).
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper
from torch.export import Dim

import onnx2torch_rnn
from onnx2torch_rnn.modules.nn import floor_ratio
from tests.exporters.common import MODELS, read_manifest
from tests.helpers import check_file, make_model
from tests.recurrent_models import CountingBackend

CNN = MODELS / "cnn"
FILES = [entry["file"] for entry in read_manifest(CNN)["models"]]
EXPORTED = [f if "opset17" in f else pytest.param(f, marks=pytest.mark.slow) for f in FILES]  # opset 11: -m slow


@pytest.mark.compile
@pytest.mark.parametrize("file", EXPORTED)
def test_upsampling_cnn_exports_every_dim_dynamic(file):
    path = CNN / file
    module = onnx2torch_rnn.convert(path)
    # the strided Conv halves height and width, which the upsampling doubles back: even sizes
    dims = {0: Dim("batch"), 2: 2 * Dim("half_height"), 3: 2 * Dim("half_width")}
    program = torch.export.export(module, (torch.randn(2, 3, 16, 24),), dynamic_shapes={"x": dims})
    for seed, shape in enumerate([(3, 3, 10, 32), (5, 3, 40, 6)]):
        check_file(path, program.module(), shape, seed)


@pytest.mark.compile
@pytest.mark.parametrize("file", [FILES[1], pytest.param(FILES[3], marks=pytest.mark.slow)])
def test_upsampling_cnn_compiles_in_one_graph(file):
    path = CNN / file
    backend = CountingBackend("eager")
    compiled = torch.compile(onnx2torch_rnn.convert(path), fullgraph=True, backend=backend, dynamic=True)
    for seed, shape in enumerate([(5, 3, 16, 24), (6, 3, 10, 32)]):  # batch: not a channel count (duck sizing)
        check_file(path, compiled, shape, seed)
    assert backend.graphs == 1


@pytest.mark.compile
def _exported_matches_onnxruntime(model, module, dims: dict, example: tuple, shapes: list) -> None:
    """``module`` exported with input x's ``dims`` dynamic at the ``example`` shape runs at each of ``shapes`` as
    onnxruntime runs ``model``."""
    program = torch.export.export(module, (torch.randn(example),), dynamic_shapes={"x": dims})
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, shape in enumerate(shapes):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        np.testing.assert_allclose(program.module()(torch.from_numpy(x)).detach().numpy(), want, rtol=1e-4, atol=1e-5)


def test_batch_norm_with_shared_statistics_exports():
    """Statistics another node reads too (as paddle2onnx shares them between BatchNormalizations) are parameters of
    the GraphModule, which require grad: torch.export refuses batch_norm's gradient of them, so compiled they are
    applied as (x - mean) / sqrt(var + eps) * scale + b."""
    rng = np.random.default_rng(0)
    stats = {"scale": rng.standard_normal(4).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
             "mean": rng.standard_normal(4).astype(np.float32), "var": rng.random(4).astype(np.float32) + 0.5}
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "b", "mean", "var"], ["bn"], epsilon=1e-3),
             helper.make_node("BatchNormalization", ["bn", "scale", "b", "mean", "var"], ["y"], epsilon=1e-3)]
    model = make_model(nodes, [("x", np.float32, ["batch", 4, "height", "width"])], ["y"], stats)
    module = onnx2torch_rnn.convert(model)
    assert module.mean.requires_grad
    dims = {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}
    _exported_matches_onnxruntime(model, module, dims, (2, 4, 5, 6), [(3, 4, 7, 2), (5, 4, 3, 9)])


def _shape_slice(source: str, start: int, end: int, name: str) -> list:
    """paddle2onnx's ``shape(x)[start:end]``: Shape, Slice, and a round trip through int32."""
    return [helper.make_node("Shape", [source], [f"{name}_shape"]),
            helper.make_node("Slice", [f"{name}_shape", f"start{start}", f"end{end}", "axis0"], [f"{name}_i64"]),
            helper.make_node("Cast", [f"{name}_i64"], [f"{name}_i32"], to=TensorProto.INT32),
            helper.make_node("Cast", [f"{name}_i32"], [name], to=TensorProto.INT64)]


@pytest.mark.compile
@pytest.mark.parametrize("opset", [12, 13, 14])
def test_reshape_chain_from_computed_shapes_exports(opset):
    """paddle2onnx's SVTR attention (ch_PP-OCRv4_rec) reshapes by targets computed from the Shape of an earlier
    Reshape's output. Reshape before opset 14 gives no rank to an output whose target is computed, so that Shape
    could not be read as sizes: the target was a tensor, read with .item() under export, and the program failed a
    run-time assertion (``Ne(u0, 0)``) at another size. Loading declares those ranks (loading.py)."""
    consts = {"start0": np.array([0]), "start1": np.array([1]), "end1": np.array([1]), "end2": np.array([2]),
              "axis0": np.array([0]), "minus1": np.array([-1]), "zero": np.array([0]), "heads": np.array([2]),
              "depth": np.array([4]), "width": np.array([8])}
    nodes = [*_shape_slice("x", 0, 2, "lead"),
             helper.make_node("Concat", ["lead", "minus1"], ["flat_shape"], axis=0),
             helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),  # (N, 8, H*W)
             helper.make_node("Transpose", ["flat"], ["tokens"], perm=[0, 2, 1]),
             *_shape_slice("tokens", 1, 2, "count"),
             helper.make_node("Concat", ["zero", "count", "heads", "depth"], ["split_shape"], axis=0),
             helper.make_node("Reshape", ["tokens", "split_shape"], ["split"]),  # (N, H*W, 2, 4)
             helper.make_node("Softmax", ["split"], ["attention"], axis=-1),
             *_shape_slice("attention", 1, 2, "again"),
             helper.make_node("Concat", ["zero", "again", "width"], ["merge_shape"], axis=0),
             helper.make_node("Reshape", ["attention", "merge_shape"], ["y"])]  # (N, H*W, 8)
    model = make_model(nodes, [("x", np.float32, ["batch", 8, "height", "width"])],
                       [("y", np.float32, ["batch", None, 8])], consts, opset)
    module = onnx2torch_rnn.convert(model)
    dims = {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}
    _exported_matches_onnxruntime(model, module, dims, (2, 8, 4, 6), [(3, 8, 5, 2), (5, 8, 3, 9)])


@pytest.mark.compile
@pytest.mark.parametrize("op", ["Tanh", "Sigmoid"])
def test_onnxruntime_activation_of_a_large_tensor_exports(op):
    """Upstream of a dynamic quantizer Tanh and Sigmoid are MLAS's (text2tashkeel's int8 BiLSTM attention). Eager
    computes a large tensor in chunks; exported, the chunk count pinned the size (``input_ids.size()[1] == 12``), and
    eager with grad enabled wrote into views of split. Compiled code now takes the tensor whole, eager joins the
    chunks out of place."""
    nodes = [helper.make_node(op, ["x"], ["y"]), helper.make_node("DynamicQuantizeLinear", ["y"], ["q", "s", "z"])]
    outputs = [("q", TensorProto.UINT8, ["batch", 70_000]), ("s", TensorProto.FLOAT, []),
               ("z", TensorProto.UINT8, [])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["batch", 70_000])], outputs)
    module = onnx2torch_rnn.convert(model)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    program = torch.export.export(module, (torch.randn(2, 70_000),), dynamic_shapes={"x": {0: Dim("batch")}})
    for seed, batch in enumerate([3, 5]):  # 210_000 and 350_000 elements: chunked in eager (2 and 3 chunks)
        x = (np.random.default_rng(seed).standard_normal((batch, 70_000)) * 4).astype(np.float32)
        want = session.run(None, {"x": x})
        for run in (program.module(), module):  # module: eager, grad enabled
            for got, expected in zip(run(torch.from_numpy(x)), want, strict=True):
                np.testing.assert_array_equal(got.detach().numpy(), expected)


def _dim(source: str, axis: int, name: str) -> list:
    """``shape(source)[axis:axis + 1]``, a 1-d value."""
    return [helper.make_node("Shape", [source], [f"{name}_shape"]),
            helper.make_node("Gather", [f"{name}_shape", f"at{axis}"], [name], axis=0)]


_AT = {f"at{axis}": np.array([axis]) for axis in range(4)}


def _pad_to_multiple(mode: str) -> tuple:
    """Swin's and text detectors' padding of height and width to a multiple of 4: (4 - size % 4) % 4 at the end."""
    nodes = [*_dim("x", 2, "height"), *_dim("x", 3, "width")]
    for name in ("height", "width"):
        nodes += [helper.make_node("Mod", [name, "four"], [f"{name}_rest"]),
                  helper.make_node("Sub", ["four", f"{name}_rest"], [f"{name}_missing"]),
                  helper.make_node("Mod", [f"{name}_missing", "four"], [f"{name}_pad"])]
    nodes += [helper.make_node("Concat", ["zeros6", "height_pad", "width_pad"], ["pads"], axis=0),
              helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)]
    consts = {**_AT, "four": np.array([4]), "zeros6": np.zeros(6, np.int64)}
    inputs = [("x", np.float32, ["batch", 3, "height", "width"])]
    shapes = [{"x": (2, 3, 5, 6)}, {"x": (5, 3, 8, 10)}, {"x": (4, 3, 7, 9)}]
    return nodes, inputs, consts, {"x": {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}}, shapes


def _one_hot_of_width() -> tuple:
    """A one-hot row per label, as wide as ``x``'s rows (depth from Shape)."""
    nodes = [*_dim("x", 1, "depth"), helper.make_node("OneHot", ["labels", "depth", "off_on"], ["hot"], axis=-1),
             helper.make_node("Add", ["x", "hot"], ["y"])]
    consts = {**_AT, "off_on": np.array([0.0, 1.0], np.float32)}
    inputs = [("x", np.float32, ["batch", "classes"]), ("labels", np.int64, ["batch"])]
    batch, classes = Dim("batch"), Dim("classes")
    shapes = [{"x": (2, 5), "labels": (2,)}, {"x": (3, 9), "labels": (3,)}, {"x": (6, 2), "labels": (6,)}]
    return nodes, inputs, consts, {"x": {0: batch, 1: classes}, "labels": {0: batch}}, shapes


def _causal_mask_with_past() -> tuple:
    """A decoder's mask over past and new positions: lower triangle shifted by the past length (S - T)."""
    nodes = [*_dim("scores", 1, "new"), *_dim("scores", 2, "total"),
             helper.make_node("Sub", ["total", "new"], ["past"]),
             helper.make_node("Squeeze", ["past", "axis0"], ["k"]),
             helper.make_node("Trilu", ["scores", "k"], ["y"], upper=0)]
    consts = {**_AT, "axis0": np.array([0])}
    inputs = [("scores", np.float32, ["batch", "new", "total"])]
    shapes = [{"scores": (2, 3, 5)}, {"scores": (3, 2, 9)}, {"scores": (4, 6, 6)}]
    return nodes, inputs, consts, {"scores": {0: Dim("batch"), 1: Dim("new"), 2: Dim("total")}}, shapes


def _position_ids() -> tuple:
    """torch.onnx's position ids: CumSum of ones of the input's shape, minus one."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                              value=helper.make_tensor("one", TensorProto.INT64, [1], [1])),
             helper.make_node("CumSum", ["ones", "axis1"], ["counts"]),
             helper.make_node("Sub", ["counts", "one"], ["positions"]),
             helper.make_node("Cast", ["positions"], ["float_positions"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "float_positions"], ["y"])]
    consts = {"axis1": np.array(1), "one": np.array(1)}
    shapes = [{"x": (2, 5)}, {"x": (3, 9)}, {"x": (5, 2)}]
    return nodes, [("x", np.float32, ["batch", "time"])], consts, {"x": {0: Dim("batch"), 1: Dim("time")}}, shapes


SIZED_BY_SHAPE = {"pad_constant": lambda: _pad_to_multiple("constant"), "pad_edge": lambda: _pad_to_multiple("edge"),
                  "pad_reflect": lambda: _pad_to_multiple("reflect"), "one_hot": _one_hot_of_width,
                  "trilu": _causal_mask_with_past, "cumsum": _position_ids}


@pytest.mark.compile
@pytest.mark.parametrize("case", list(SIZED_BY_SHAPE))
def test_sizes_computed_from_shape_stay_symbolic(case):
    """Pad's pads, OneHot's depth and Trilu's k computed from Shape are read as sizes (ints), not as tensors whose
    .item() gives unbacked symbols: exported at one size, the program runs at two others, and compiled with
    dynamic shapes the model is one graph."""
    nodes, inputs, consts, dims, shapes = SIZED_BY_SHAPE[case]()
    model = make_model(nodes, inputs, ["y"], consts, 14)
    module = onnx2torch_rnn.convert(model)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def feeds(sizes, seed):
        rng = np.random.default_rng(seed)
        return {name: (rng.standard_normal(shape).astype(np.float32) if name != "labels"
                       else rng.integers(0, sizes["x"][1], shape)) for name, shape in sizes.items()}

    example = feeds(shapes[0], 0)
    program = torch.export.export(module, tuple(torch.from_numpy(v) for v in example.values()), dynamic_shapes=dims)
    backend = CountingBackend("eager")
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=True)
    for seed, sizes in enumerate(shapes[1:], 1):
        values = feeds(sizes, seed)
        (want,) = session.run(None, values)
        for run in (program.module(), compiled):
            got = run(*(torch.from_numpy(v) for v in values.values()))
            np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-6, atol=1e-6)
    assert backend.graphs == 1


RESIZE_TO_SHAPE = [("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_floor"),
                   ("linear", "half_pixel", "round_prefer_floor"), ("linear", "align_corners", "round_prefer_floor"),
                   ("cubic", "pytorch_half_pixel", "round_prefer_floor")]


@pytest.mark.compile
@pytest.mark.parametrize(("mode", "coordinates", "nearest"), RESIZE_TO_SHAPE)
def test_resize_to_the_shape_of_another_tensor_stays_symbolic(mode, coordinates, nearest):
    """A feature pyramid's Resize to the size of a skip connection (sizes = Shape(skip)): the sizes are read as
    ints, and the scale as float32 out / in computed from them, so every size stays dynamic (the ratio need not be
    whole); was .tolist() of the sizes tensor, unbacked under export."""
    nodes = [helper.make_node("Shape", ["skip"], ["sizes"]),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["up"], mode=mode,
                              coordinate_transformation_mode=coordinates, nearest_mode=nearest),
             helper.make_node("Add", ["up", "skip"], ["y"])]
    inputs = [("x", np.float32, ["batch", 4, "h", "w"]), ("skip", np.float32, ["batch", 4, "height", "width"])]
    model = make_model(nodes, inputs, ["y"], opset=13)
    module = onnx2torch_rnn.convert(model)
    batch = Dim("batch")
    dims = {"x": {0: batch, 2: Dim("h"), 3: Dim("w")}, "skip": {0: batch, 2: Dim("height"), 3: Dim("width")}}
    example = (torch.randn(2, 4, 5, 6), torch.randn(2, 4, 10, 9))
    program = torch.export.export(module, example, dynamic_shapes=dims)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, (x_shape, skip_shape) in enumerate([((3, 4, 7, 3), (3, 4, 14, 8)), ((5, 4, 9, 8), (5, 4, 6, 8))]):
        rng = np.random.default_rng(seed)
        feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
                 "skip": rng.standard_normal(skip_shape).astype(np.float32)}
        (want,) = session.run(None, feeds)
        got = program.module()(*(torch.from_numpy(v) for v in feeds.values()))
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [0.5, 1.5, 0.375, 1 / 3, 0.7, 0.1, 3.7, 0.123456])
def test_floor_ratio_is_onnxruntimes_output_size(scale):
    """floor_ratio's (n * p) // q is int(float32(n) * scale) in float32 (onnxruntime's output size of Resize by
    scales) for every n up to its limit: every n below 2**20 (also the first one past a limit there), and 4096
    samples up to a larger limit (a scale float32 holds as p / q, q a power of 2)."""
    p, q, limit = floor_ratio(scale)
    n = np.arange(min(limit + 2, 2**20), dtype=np.int64)
    n = np.concatenate([n, np.random.default_rng(0).integers(0, limit + 1, 4096), [limit]])
    onnxruntime_sizes = (n.astype(np.float32) * np.float32(scale)).astype(np.int64)
    inside = n <= limit
    np.testing.assert_array_equal(n[inside] * p // q, onnxruntime_sizes[inside])
    assert limit >= 2**20 - 1 or (n * p // q != onnxruntime_sizes)[~inside].any()


RESIZE_BY_SCALES = [("linear", "half_pixel", "round_prefer_floor", [1, 1, 1 / 3, 0.7]),
                    *(pytest.param(*case, marks=pytest.mark.slow) for case in [
                        ("linear", "half_pixel", "round_prefer_floor", [1, 1, 0.5, 1.5]),
                        ("nearest", "asymmetric", "floor", [1, 1, 0.5, 1.5]),
                        ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 1 / 3, 0.7]),
                        ("linear", "align_corners", "round_prefer_floor", [1, 1, 1 / 3, 0.7]),
                        ("cubic", "pytorch_half_pixel", "round_prefer_floor", [1, 1, 0.5, 1.5])])]


@pytest.mark.compile
@pytest.mark.parametrize(("mode", "coordinates", "nearest", "scales"), RESIZE_BY_SCALES)
def test_resize_by_fractional_scales_stays_symbolic(mode, coordinates, nearest, scales):
    """Resize by a scale that is no whole number: onnxruntime's size int(float32(n) * scale) is (n * p) // q for
    the sizes floor_ratio proves (was float32 arithmetic on the size, which pinned it). Export asks for a Dim with
    those bounds (outputs of 2 or more and the proven limit) and says which; within them the program runs at
    other sizes as onnxruntime does."""
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode,
                              coordinate_transformation_mode=coordinates, nearest_mode=nearest)]
    model = make_model(nodes, [("x", np.float32, ["batch", 2, "h", "w"])], ["y"],
                       {"scales": np.array(scales, np.float32)}, opset=13)
    module = onnx2torch_rnn.convert(model)
    example = (2, 2, 9, 6)
    with pytest.raises(torch._dynamo.exc.UserError, match=r"Suggested fixes:\n  h = Dim\('h', min=\d+, max=\d+\)"):
        torch.export.export(module, (torch.randn(example),),
                            dynamic_shapes={"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}})
    dims = {0: Dim("batch"), 2: Dim("h", min=6, max=10_000), 3: Dim("w", min=6, max=10_000)}
    _exported_matches_onnxruntime(model, module, dims, example, [(3, 2, 7, 11), (1, 2, 20, 6)])
