"""MXNet mx2onnx's RNN export (tests/models/patterns/mxnet_*.onnx, rebuilt node for node by generate.py there).

mx2onnx Slices W, R and B out of one flat parameter blob, Splits them into gates, Concatenates them in ONNX order
and Reshapes them; sequence_lens = Cast(Tile(T, N)); initial states = Mul(state, ConstantOfShape([D, N, H], 1)).
Each model must match onnxruntime, compute what MXNet's layer computes (an nn.LSTM/GRU/RNN holding the blob's
tensors: MXNet's gate layout is torch's) and train. With two layers every offset is a constant: the blob folds into
the weights of real nn.LSTM/GRU/RNN modules. One layer reads the W slice's end from Shape(data): see
test_one_layer_weights_fold.
"""

import numpy as np
import onnx
import pytest
import torch

from onnx2torch_rnn import convert
from onnx2torch_rnn.checking import runtime_inputs
from tests.exporters.common import (
    MODELS,
    assert_fast_path,
    assert_weights_are_parameters,
    backward,
    compare_with_onnxruntime,
    framework_reference,
    manifest_input_sets,
    read_manifest,
)
from tests.helpers import recurrent_modules

FOLDER = MODELS / "patterns"
MANIFEST = read_manifest(FOLDER)
ENTRIES = {e["file"]: e for e in MANIFEST["models"] if e["exporter"] == "mxnet"}
ONE_LAYER = sorted(f for f, e in ENTRIES.items() if e["reference"]["layers"] == 1)
TWO_LAYERS = sorted(f for f, e in ENTRIES.items() if e["reference"]["layers"] == 2)


def _convert(file):
    model = onnx.load(str(FOLDER / file))
    return model, convert(model), manifest_input_sets(FOLDER, ENTRIES[file], MANIFEST["sizes"])


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_mxnet_pattern(file):
    model, module, input_sets = _convert(file)
    for feeds in input_sets:
        compare_with_onnxruntime(module, model, feeds)
        expected = framework_reference(model, ENTRIES[file], feeds)
        with torch.no_grad():
            actual = module(*(torch.from_numpy(feeds[i.name]) for i in runtime_inputs(model)))
        for want, got in zip(expected, actual, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    backward(module, model, input_sets[0])
    blob = ENTRIES[file]["reference"]["parameters"]
    trained = [p for m in recurrent_modules(module) for p in m.parameters()]
    if not trained:  # weights sliced at run time: the gradient reaches the blob itself
        trained = [p for p in module.parameters() if p.numel() == len(onnx.numpy_helper.to_array(
            next(t for t in model.graph.initializer if t.name == blob)))]
    assert trained
    for param in trained:
        assert param.grad is not None and bool(param.grad.abs().sum() > 0)


@pytest.mark.parametrize("file", TWO_LAYERS)
def test_two_layer_blob_folds_into_torch_modules(file):
    """Slice/Split/Concat/Reshape of the blob run once at conversion: the weights are parameters of nn.LSTM/GRU/RNN
    modules and the blob itself is gone; the run-time Tile(T, N) lengths and Mul(state, ones) states remain."""
    model, module, _ = _convert(file)
    assert_fast_path(module, model)
    assert_weights_are_parameters(module)
    sizes = {p.numel() for p in module.parameters()}
    blob = next(t for t in model.graph.initializer if t.name == ENTRIES[file]["reference"]["parameters"])
    assert int(np.prod(blob.dims)) not in sizes


@pytest.mark.parametrize("file", ONE_LAYER)
def test_one_layer_weights_fold(file):
    """mx2onnx slices W up to Mul(g*H, Split(Shape(data))[2]): the input size is a dim the model declares static,
    so the slicing is evaluated at conversion and the input's declared dims are checked at run time."""
    model, module, _ = _convert(file)
    assert_weights_are_parameters(module)
    assert_fast_path(module, model)
