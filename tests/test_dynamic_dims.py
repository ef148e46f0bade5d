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
from onnx import helper
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
