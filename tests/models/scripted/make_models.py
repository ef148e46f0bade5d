"""Regenerate the TorchScript-scripted test models: `python tests/models/scripted/make_models.py` (from the repository
root).

Voice activity detectors shaped like the ones packages ship: a ``torch.jit.script``ed module whose forward branches
on an int ``sr`` (a graph input, int64 0-d), exported by the TorchScript exporter (`dynamo=False`, opset 16) as an
If whose branches return tensors of different ranks, each branch with weights of its own (Conv front end, LSTM,
Linear), the recurrent state passed in and out. ``sr_vad``: one If on sr, and an If on a size in the taken branch
(``squeeze`` where the length is 1: a rank that depends on the input's length). ``sr_nested``: Ifs on sr nested in
a branch (8000 / 16000 / anything else), and a frame size computed from sr. What was exported is written to
manifest.json next to this script, which tests/test_binding.py reads.
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
HIDDEN = 8


class SrVad(nn.Module):
    def __init__(self):
        super().__init__()
        self.front16 = nn.Conv1d(1, 4, 4, stride=4)
        self.front8 = nn.Conv1d(1, 4, 2, stride=2)
        self.rnn16 = nn.LSTM(4, HIDDEN, batch_first=True)
        self.rnn8 = nn.LSTM(4, HIDDEN, batch_first=True)
        self.out = nn.Linear(HIDDEN, 1)

    def forward(self, x, state, sr: int):
        if sr == 16000:
            y = self.front16(x.unsqueeze(1)).transpose(1, 2)
            h, (hn, cn) = self.rnn16(y, (state[0:1], state[1:2]))
            p = torch.sigmoid(self.out(h)).squeeze(2)  # [N, T]
            if p.shape[1] == 1:
                p = p.squeeze(1)  # [N]
        else:
            y = self.front8(x.unsqueeze(1)).transpose(1, 2)
            h, (hn, cn) = self.rnn8(y, (state[0:1], state[1:2]))
            p = torch.sigmoid(self.out(h))  # [N, T, 1]
        return p, torch.cat([hn, cn])


class SrNested(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj8 = nn.Linear(8, HIDDEN)
        self.proj16 = nn.Linear(16, HIDDEN)
        self.proj = nn.Linear(4, HIDDEN)
        self.rnn = nn.GRU(HIDDEN, HIDDEN, batch_first=True)

    def forward(self, x, state, sr: int):
        frame = sr // 1000
        frames = x.reshape(x.shape[0], -1, frame)  # [N, T, sr / 1000]
        if sr == 8000:
            y = self.proj8(frames)
        elif sr == 16000:  # scripted, an If nested in the else branch
            y = self.proj16(frames)
        else:
            y = self.proj(frames[:, :, :4])
        h, hn = self.rnn(y, state)
        if sr == 8000:
            return h.mean(2), hn  # [N, T]
        return h, hn  # [N, T, H]


CASES = {"sr_vad": (SrVad, {"input": {0: "batch", 1: "samples"}, "state": {1: "batch"}}, 64),
         "sr_nested": (SrNested, {"input": {0: "batch", 1: "samples"}, "state": {1: "batch"}}, 64)}


def main() -> None:
    warnings.simplefilter("ignore")
    manifest = {"generator": "tests/models/scripted/make_models.py", "python": platform.python_version(),
                "versions": {p: version(p) for p in ("torch", "onnx", "onnxruntime")}, "models": []}
    for name, (make, axes, samples) in CASES.items():
        torch.manual_seed(0)
        module = torch.jit.script(make().eval())
        args = (torch.randn(2, samples), torch.zeros(2 if name == "sr_vad" else 1, 2, HIDDEN), 16000)
        path = HERE / f"{name}.onnx"
        torch.onnx.export(module, args, path, dynamo=False, opset_version=16, input_names=["input", "state", "sr"],
                          output_names=["output", "stateN"], dynamic_axes=axes)
        model = onnx.load(path)
        ops = sorted({n.op_type for g in [model.graph] for n in g.node})
        manifest["models"].append({"file": path.name, "exporter": "torchscript (torch.jit.script)", "opset": 16,
                                   "dynamic_axes": axes, "main_graph_ops": ops})
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
