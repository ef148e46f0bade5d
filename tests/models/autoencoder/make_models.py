"""Regenerate the LSTM autoencoder test models: `python tests/models/autoencoder/make_models.py` (from the repository
root).

An encoder LSTM whose last hidden state is repeated over time (``h[-1].unsqueeze(1).repeat(1, T, 1)``) as the input
of a decoder LSTM, exported by the TorchScript exporter (`dynamo=False`) at opsets 14 and 17, batch and time dynamic.
torch.onnx writes the repeat as Tile by a Concat of sizes read from Shape, after an Expand to
ConstantOfShape(Shape(repeats)): sizes of a shape value. What was exported is written to manifest.json next to this
script, which tests/test_autoencoder.py reads.
"""

from __future__ import annotations

import json
import platform
import warnings
from importlib.metadata import version
from pathlib import Path

import onnx
import torch
from torch import nn

HERE = Path(__file__).parent
FEATURES, HIDDEN = 6, 8
OPSETS = (14, 17)


class Autoencoder(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.encoder = nn.LSTM(FEATURES, HIDDEN, num_layers=layers, batch_first=True)
        self.decoder = nn.LSTM(HIDDEN, FEATURES, batch_first=True)

    def forward(self, x):
        _, (h, _) = self.encoder(x)
        repeated = h[-1].unsqueeze(1).repeat(1, x.shape[1], 1)
        y, _ = self.decoder(repeated)
        return y


def main() -> None:
    warnings.simplefilter("ignore")
    manifest = {"generator": "tests/models/autoencoder/make_models.py", "python": platform.python_version(),
                "versions": {p: version(p) for p in ("torch", "onnx", "onnxruntime")}, "models": []}
    for layers in (1, 2):
        for opset in OPSETS:
            torch.manual_seed(layers)
            path = HERE / f"lstm_autoencoder_{layers}layer_opset{opset}.onnx"
            axes = {"x": {0: "batch", 1: "time"}, "y": {0: "batch", 1: "time"}}
            torch.onnx.export(Autoencoder(layers).eval(), (torch.randn(2, 5, FEATURES),), path, dynamo=False,
                              opset_version=opset, input_names=["x"], output_names=["y"], dynamic_axes=axes)
            ops = sorted({n.op_type for n in onnx.load(path).graph.node})
            manifest["models"].append({"file": path.name, "exporter": "torchscript", "opset": opset,
                                       "encoder_layers": layers, "dynamic_axes": axes, "ops": ops})
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
