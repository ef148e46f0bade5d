"""torch.onnx LSTM autoencoders (tests/models/autoencoder: the encoder's last state repeated over time as the
decoder's input, TorchScript exporter, opsets 14 and 17): the repeat's Tile and Expand read sizes of a shape value
(ConstantOfShape(Shape(repeats))), which shape arithmetic gives as ints, so the model exports with dynamic batch
and time and compiles in one graph; the exported program runs at two other sizes, against onnxruntime."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import onnx2torch_rnn
from tests.exporters.common import MODELS, read_manifest
from tests.helpers import check_file
from tests.recurrent_models import CountingBackend

HERE = MODELS / "autoencoder"
FILES = [entry["file"] for entry in read_manifest(HERE)["models"]]
EXPORTED = [f if "1layer" in f else pytest.param(f, marks=pytest.mark.slow) for f in FILES]  # 2 layers: -m slow


@pytest.mark.compile
@pytest.mark.parametrize("file", EXPORTED)
def test_autoencoder_exports_with_dynamic_batch_and_time(file):
    path = HERE / file
    module = onnx2torch_rnn.convert(path)
    check_file(path, module, (2, 5, 6), seed=0)
    program = torch.export.export(module, (torch.randn(2, 5, 6),),
                                  dynamic_shapes={"x": {0: Dim("batch"), 1: Dim("time")}})
    for batch, time in ((3, 9), (5, 2)):
        check_file(path, program.module(), (batch, time, 6), seed=batch)


@pytest.mark.compile
def test_autoencoder_compiles_in_one_graph():
    path = HERE / FILES[0]
    backend = CountingBackend("eager")
    compiled = torch.compile(onnx2torch_rnn.convert(path), fullgraph=True, backend=backend, dynamic=True)
    for batch, time in ((3, 5), (4, 9)):
        check_file(path, compiled, (batch, time, 6), seed=time)
    assert backend.graphs == 1
