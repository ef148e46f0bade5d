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
    program = torch.export.export(module, (torch.randn(2, 4, 5, 6),), dynamic_shapes={"x": dims})
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, shape in enumerate([(3, 4, 7, 2), (5, 4, 3, 9)]):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        np.testing.assert_allclose(program.module()(torch.from_numpy(x)).detach().numpy(), want, rtol=1e-4, atol=1e-5)


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
    program = torch.export.export(module, (torch.randn(2, 8, 4, 6),), dynamic_shapes={"x": dims})
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, shape in enumerate([(3, 8, 5, 2), (5, 8, 3, 9)]):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        np.testing.assert_allclose(program.module()(torch.from_numpy(x)).detach().numpy(), want, rtol=1e-4, atol=1e-5)


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
