"""keras2onnx's recurrent export (tests/models/patterns/keras2onnx_*.onnx, rebuilt node for node by generate.py).

keras2onnx computes sequence_lens at run time as ReduceSum(Cast(mask, int32)) from the Embedding(mask_zero) or
Masking mask, spells the activations out (HardSigmoid with alpha 0.2 / beta 0.5, linear as Affine with alpha 1),
writes go_backwards as direction=reverse plus a ReverseSequence, and Unsqueezes initial states. Each model must
match onnxruntime on padded inputs (rows of every length, 0 included) and train, its weights parameters of the
recurrent module.
"""

import onnx
import pytest

from onnx2torch_rnn.recurrent.cells import Activation
from tests.exporters.common import (
    MODELS,
    assert_weights_are_parameters,
    check_exported,
    manifest_input_sets,
    read_manifest,
)
from tests.helpers import recurrent_modules

FOLDER = MODELS / "patterns"
MANIFEST = read_manifest(FOLDER)
ENTRIES = {e["file"]: e for e in MANIFEST["models"] if e["exporter"] == "keras2onnx"}
# what each model's recurrent module must run: the exact cell loop with the activations keras2onnx spelled out, or
# nn.GRU where they are the defaults
EXPECTED = {
    "lstm_embedding_mask": (False, "HardSigmoid(0.2, 0.5)"),
    "gru_masking_backwards": (False, "HardSigmoid(0.2, 0.5)"),
    "gru_embedding_mask": (True, None),
    "bi_simplernn_linear": (False, "Affine(1, 0)"),
    "lstm_initial_state": (False, "Relu"),
    "bi_gru_reset_before": (False, "Softsign"),
}


def test_every_case_has_expectations():
    assert sorted(EXPECTED) == sorted(e["case"] for e in ENTRIES.values())


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_keras2onnx_pattern(file):
    entry = ENTRIES[file]
    input_sets = manifest_input_sets(FOLDER, entry, MANIFEST["sizes"])
    module = check_exported(FOLDER / file, input_sets)
    assert_weights_are_parameters(module)
    (recurrent,) = recurrent_modules(module)
    fast, activation = EXPECTED[entry["case"]]
    assert recurrent.fast == fast
    if activation is not None:
        assert activation in {repr(a) for role in recurrent.config.activations for a in role}
    model = onnx.load(str(FOLDER / file))
    node = next(n for n in model.graph.node if n.op_type in ("LSTM", "GRU", "RNN"))
    if len(node.input) > 4 and node.input[4]:  # sequence_lens computed from the mask at run time
        assert recurrent.sequence_lens is None


def test_hard_sigmoid_is_not_torch_hardsigmoid():
    """HardSigmoid(0.2, 0.5) is clamp(0.2 x + 0.5, 0, 1), not F.hardsigmoid's x / 6 + 0.5."""
    import torch

    x = torch.tensor([-3.0, -1.0, 0.0, 1.0, 2.0])
    assert torch.equal(Activation("HardSigmoid", 0.2, 0.5)(x), torch.clamp(0.2 * x + 0.5, 0, 1))
    assert not torch.allclose(Activation("HardSigmoid", 0.2, 0.5)(x), torch.nn.functional.hardsigmoid(x))
