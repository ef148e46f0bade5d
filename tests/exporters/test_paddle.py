"""paddle2onnx's RNN export (tests/models/patterns/paddle2onnx_*.onnx, rebuilt node for node by generate.py there).

paddle2onnx writes one LSTM/GRU per layer; each weight of paddle's WeightList is Unsqueezed, Concatenated over
directions and reordered by Slice + Concat on the gate axis; initial states are Sliced per layer out of PreState
(given, or zeros built from Shape(x)); Y is Transposed [0, 2, 1, 3] and Reshaped [0, 0, -1] between layers; GRU has
linear_before_reset=1. Each model must match onnxruntime, compute what paddle's layer computes (an nn.LSTM/GRU
holding the same tensors: paddle's gate layout is torch's) and train, its reordered weights folded into parameters
of real nn.LSTM/nn.GRU modules.
"""

import numpy as np
import onnx
import pytest
import torch

from onnx2torch_rnn.checking import runtime_inputs
from tests.exporters.common import (
    MODELS,
    assert_fast_path,
    assert_weights_are_parameters,
    check_exported,
    framework_reference,
    manifest_input_sets,
    read_manifest,
)

FOLDER = MODELS / "patterns"
MANIFEST = read_manifest(FOLDER)
ENTRIES = {e["file"]: e for e in MANIFEST["models"] if e["exporter"] == "paddle2onnx"}


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_paddle2onnx_pattern(file):
    entry = ENTRIES[file]
    model = onnx.load(str(FOLDER / file))
    input_sets = manifest_input_sets(FOLDER, entry, MANIFEST["sizes"])
    module = check_exported(FOLDER / file, input_sets)
    assert_fast_path(module, model)
    assert_weights_are_parameters(module)
    initializers = {t.name for t in model.graph.initializer}
    assert not {name for name, _ in module.named_parameters()} & initializers  # all folded into the modules
    directions = 2 if entry["reference"]["bidirectional"] else 1
    for feeds in input_sets:
        y, *finals = framework_reference(model, entry, feeds)
        with torch.no_grad():
            actual = module(*(torch.from_numpy(feeds[i.name]) for i in runtime_inputs(model)))
        # paddle2onnx's State outputs are the last layer's states only
        for want, got in zip([y, *(f[-directions:] for f in finals)], actual, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
