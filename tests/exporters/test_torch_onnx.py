"""Models written by torch.onnx's TorchScript exporter (``dynamo=False``) at opsets 14-20.

The models and their manifest come from tests/models/torch/make_models.py. Each converts, matches onnxruntime on two
random input sets and on other batch/sequence sizes, trains, and every LSTM/GRU/RNN node takes the fast path.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from tests.exporters.common import (
    MODELS,
    assert_fast_path,
    assert_weights_are_parameters,
    check_exported,
    has_float16,
    manifest_input_sets,
    read_manifest,
)
from tests.helpers import recurrent_modules

FOLDER = MODELS / "torch"
MANIFEST = read_manifest(FOLDER)
ENTRIES = [m for m in MANIFEST["models"] if m["exporter"] == "torchscript"]


def by_case(name: str) -> list[dict]:
    return [m for m in ENTRIES if m["case"] == name]


@pytest.mark.parametrize("entry", ENTRIES, ids=[m["file"].removesuffix(".onnx") for m in ENTRIES])
def test_converts_matches_onnxruntime_and_trains(entry):
    sets = manifest_input_sets(FOLDER, entry, MANIFEST["sizes"])
    assert len(sets) == 3, "the TorchScript exports keep batch and time dynamic"
    module = check_exported(FOLDER / entry["file"], sets)
    assert_fast_path(module, onnx.load(FOLDER / entry["file"]))
    assert_weights_are_parameters(module)


def test_model_set_covers_opsets_14_to_20():
    assert {m["opset"] for m in ENTRIES} == set(range(14, 21))
    assert {m["opset"] for m in by_case("lstm_l2_bi_bf")} == set(range(14, 21))


@pytest.mark.parametrize("entry", [m for m in ENTRIES if m["case"].startswith("packed_")], ids=lambda m: m["case"])
def test_packed_sequence_lengths_reach_the_recurrent_op_at_run_time(entry):
    model = onnx.load(FOLDER / entry["file"])
    ops = {node.op_type for node in model.graph.node}
    unsorted = "unsorted" in entry["case"]
    assert {"TopK", "ScatterElements"} <= ops if unsorted else not {"TopK", "ScatterElements"} & ops
    sets = manifest_input_sets(FOLDER, entry, MANIFEST["sizes"], seed=1)
    time = sets[-1]["x"].shape[1]
    sets.append({**sets[-1], "lengths": np.minimum(sets[-1]["lengths"], time - 2)})  # every row shorter than x
    module = check_exported(FOLDER / entry["file"], sets)
    for m in recurrent_modules(module):
        assert m.sequence_lens is None  # lengths are an input of the graph: read at run time, not baked in


@pytest.mark.parametrize("case", ["lstm_half", "gru_bi_fp16", "lstm_l2_fp16_blocked", "lstm_bi_fp16_weights"])
def test_float16_models_train_in_float32(case):
    (entry,) = by_case(case)
    model = onnx.load(FOLDER / entry["file"])
    assert has_float16(model)
    module = check_exported(FOLDER / entry["file"], manifest_input_sets(FOLDER, entry, MANIFEST["sizes"]))
    assert_fast_path(module, model)
    for m in recurrent_modules(module):  # computed in float32 like onnxruntime; trained in float32
        assert {p.dtype for p in m.parameters()} == {torch.float32}


def test_float16_weights_cast_to_float32_are_folded_into_the_lstm():
    (entry,) = by_case("lstm_bi_fp16_weights")
    model = onnx.load(FOLDER / entry["file"])
    halves = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16}
    assert {n.input[0] for n in model.graph.node if n.op_type == "Cast"} >= halves
    module = check_exported(FOLDER / entry["file"], manifest_input_sets(FOLDER, entry, MANIFEST["sizes"]))
    assert_weights_are_parameters(module)
    (lstm,) = recurrent_modules(module)
    # W, R and B are the only weights: all of them are now the nn.LSTM's parameters
    assert sum(p.numel() for p in lstm.parameters()) == sum(
        np.prod(t.dims) for t in model.graph.initializer if t.name in halves)
