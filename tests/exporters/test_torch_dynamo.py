"""Models written by torch.onnx's dynamo exporter (``dynamo=True``, onnxscript; its default opset).

The models and their manifest come from tests/models/torch/make_models.py. The exporter writes one LSTM/GRU node per
layer (fast path here) but unrolls nn.RNN into MatMul/Add/Tanh over the export's sequence length (recognition makes
each layer one recurrent module again, the layers one stack: tests/test_unrolled_cells.py); PackedSequence does not
export (the manifest records the error).
"""

from __future__ import annotations

import onnx
import pytest

from tests.exporters.common import (
    MODELS,
    assert_fast_path,
    assert_weights_are_parameters,
    check_exported,
    manifest_input_sets,
    read_manifest,
)
from tests.helpers import recurrent_modules

FOLDER = MODELS / "torch"
MANIFEST = read_manifest(FOLDER)
ENTRIES = [m for m in MANIFEST["models"] if m["exporter"] == "dynamo"]
UNROLLED_LAYERS = {"rnn_tanh": 1, "rnn_relu_l2_bi_bf": 2, "rnn_l3_h0_nobias": 3}


@pytest.mark.parametrize("entry", ENTRIES, ids=[m["file"].removesuffix(".onnx") for m in ENTRIES])
def test_converts_matches_onnxruntime_and_trains(entry):
    module = check_exported(FOLDER / entry["file"], manifest_input_sets(FOLDER, entry, MANIFEST["sizes"]))
    assert_weights_are_parameters(module)
    model = onnx.load(FOLDER / entry["file"])
    if entry["case"].startswith("rnn_"):  # unrolled: no RNN node, one recognised module per layer (one stack)
        assert entry["recurrent_nodes"] == 0 and len(recurrent_modules(module)) == UNROLLED_LAYERS[entry["case"]]
        ops = {node.op_type for node in model.graph.node}
        assert "MatMul" in ops and ops & {"Tanh", "Relu"}
        assert all(m.fast for m in recurrent_modules(module))
    else:
        assert entry["recurrent_nodes"] > 0
        assert_fast_path(module, model)


def test_packed_sequence_does_not_export():
    failed = {f["case"] for f in MANIFEST["failures"] if f["exporter"] == "dynamo"}
    packed = {m["case"] for m in MANIFEST["models"] if m["case"].startswith("packed_")}
    assert packed and failed == packed
