"""Regenerate the CNN test models: `python tests/models/cnn/make_models.py` (from the repository root).

Small text-detector-shaped CNNs (a strided Conv, an upsampling back by 2, a skip Add, a Conv head), exported by the
TorchScript exporter (`dynamo=False`) at opsets 11 and 17 with batch, height and width dynamic: nn.Upsample
(scale_factor=2) in nearest and bilinear mode becomes Resize with constant scales [1, 1, 2, 2]. What was exported is
written to manifest.json next to this script, which tests/test_dynamic_dims.py reads.
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
OPSETS = (11, 17)


class Detector(nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.down = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode=mode)
        self.head = nn.Conv2d(4, 1, 1)

    def forward(self, x):
        skip = torch.relu(self.stem(x))
        return torch.sigmoid(self.head(skip + self.up(torch.relu(self.down(skip)))))


def main() -> None:
    warnings.simplefilter("ignore")
    manifest = {"generator": "tests/models/cnn/make_models.py", "python": platform.python_version(),
                "versions": {p: version(p) for p in ("torch", "onnx", "onnxruntime")}, "models": []}
    for mode in ("nearest", "bilinear"):
        for opset in OPSETS:
            torch.manual_seed(0)
            path = HERE / f"upsample_{mode}_opset{opset}.onnx"
            axes = {"x": {0: "batch", 2: "height", 3: "width"}}
            torch.onnx.export(Detector(mode).eval(), (torch.randn(2, 3, 16, 24),), path, dynamo=False,
                              opset_version=opset, input_names=["x"], output_names=["y"], dynamic_axes=axes)
            ops = sorted({n.op_type for n in onnx.load(path).graph.node})
            manifest["models"].append({"file": path.name, "exporter": "torchscript", "opset": opset, "mode": mode,
                                       "dynamic_axes": axes, "ops": ops})
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
