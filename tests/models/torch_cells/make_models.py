"""Regenerate the torch.onnx models of nn.LSTMCell / nn.GRUCell / nn.RNNCell: `python
tests/models/torch_cells/make_models.py` (from the repository root).

These cells have no ONNX symbolic: torch.onnx writes each call as Gemm + Add + Split + Sigmoid / Tanh (or Relu) + Mul /
Add. Two uses: a streaming step (x [N, I], the states passed in and returned: VAD, denoisers, decoders) and a Python
loop over time (``for t in range(T): h, c = cell(x[:, t], (h, c))``, the outputs stacked), which the exporter unrolls
over the export's T. Each case is exported by the TorchScript exporter (`dynamo=False`, opset 17) and the dynamo
exporter (`dynamo=True`); only the batch axis is dynamic. What was exported is written to manifest.json next to this
script, which tests/test_torch_cells.py reads. Named cases (`make_models.py lstm_step_stacked_state`) regenerate only
those models and keep the manifest's other entries.
"""

from __future__ import annotations

import json
import platform
import sys
import warnings
import zlib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import onnx
import torch
from torch import nn

HERE = Path(__file__).parent
FEATURES, HIDDEN, STEPS, BATCH = 6, 8, 5, 2
CELLS = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "rnn_tanh": nn.RNNCell, "rnn_relu": nn.RNNCell}


def make_cell(kind: str, bias: bool) -> nn.Module:
    extra = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    return CELLS[kind](FEATURES, HIDDEN, bias=bias, **extra)


class Streaming(nn.Module):
    """One step per call: forward(x [N, I], h [N, H][, c]) -> the new h[, c]."""

    def __init__(self, kind: str, bias: bool = True):
        super().__init__()
        self.kind, self.cell = kind, make_cell(kind, bias)

    def forward(self, x, h, c=None):
        return self.cell(x, (h, c)) if self.kind == "lstm" else self.cell(x, h)


class TimeLoop(nn.Module):
    """The cell over every step of x in a Python loop, the hs stacked: forward(x[, h, c]) -> (y, h_n[, c_n]); without
    given states, zeros made inside forward."""

    def __init__(self, kind: str, bias: bool = True, batch_first: bool = False):
        super().__init__()
        self.kind, self.batch_first, self.cell = kind, batch_first, make_cell(kind, bias)

    def forward(self, x, h=None, c=None):
        axis = 1 if self.batch_first else 0
        if h is None:
            h = x.new_zeros(x.shape[1 - axis], HIDDEN)
            c = x.new_zeros(x.shape[1 - axis], HIDDEN)
        ys = []
        for t in range(x.shape[axis]):
            step = x[:, t] if self.batch_first else x[t]
            if self.kind == "lstm":
                h, c = self.cell(step, (h, c))
            else:
                h = self.cell(step, h)
            ys.append(h)
        y = torch.stack(ys, axis)
        return (y, h, c) if self.kind == "lstm" else (y, h)


class StackedStates(nn.Module):
    """Silero VAD's decoder step: the LSTM states stacked in one input [2, N, H] and one output, the new h also read by
    a head (ReLU, a 1x1 Conv1d, a sigmoid): forward(x [N, I], state) -> (probability [N, 1], the new state)."""

    def __init__(self):
        super().__init__()
        self.cell, self.head = make_cell("lstm", True), nn.Conv1d(HIDDEN, 1, 1)

    def forward(self, x, state):
        h, c = self.cell(x, (state[0], state[1]))
        return torch.sigmoid(self.head(torch.relu(h).unsqueeze(-1))).squeeze(1), torch.stack([h, c])


class WrittenOutGRU(nn.Module):
    """A GRU cell written out as a decoder step writes it by hand: two Linears, gates sliced out, torch's equations
    (the reset applied to h's product and its bias: linear_before_reset)."""

    def __init__(self, inputs: int):
        super().__init__()
        self.ih, self.hh = nn.Linear(inputs, 3 * HIDDEN), nn.Linear(HIDDEN, 3 * HIDDEN)

    def forward(self, x, h):
        gi, gh = self.ih(x), self.hh(h)
        r = torch.sigmoid(gi[:, :HIDDEN] + gh[:, :HIDDEN])
        z = torch.sigmoid(gi[:, HIDDEN:2 * HIDDEN] + gh[:, HIDDEN:2 * HIDDEN])
        n = torch.tanh(gi[:, 2 * HIDDEN:] + r * gh[:, 2 * HIDDEN:])
        return (1 - z) * n + z * h


class DecoderStep(nn.Module):
    """A seq2seq decoder's step: two cells in turn (the second reads the first's new h), every state passed in and
    returned, log-probabilities from the second's h: forward(x, h1, [c1,] h2[, c2]) -> (logp, the new states)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "gru":
            self.first, self.second = WrittenOutGRU(FEATURES), WrittenOutGRU(HIDDEN)
        else:
            self.first, self.second = nn.LSTMCell(FEATURES, HIDDEN), nn.LSTMCell(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, 5)

    def forward(self, x, a, b, c=None, d=None):  # GRU: h1, h2; LSTM: h1, c1, h2, c2
        if self.kind == "gru":
            h1 = self.first(x, a)
            h2 = self.second(h1, b)
            return torch.log_softmax(self.out(h2), -1), h1, h2
        h1, c1 = self.first(x, (a, b))
        h2, c2 = self.second(h1, (c, d))
        return torch.log_softmax(self.out(h2), -1), h1, c1, h2, c2


class CRNN(nn.Module):
    """A text recogniser's head: a Conv1d over the image's columns, then a BiLSTM of two nn.LSTMCells stepped in Python
    over its 20 columns (the backward one from the last, its hs put back in order), then a Linear:
    forward(image [N, 3, 20]) -> log-probabilities [20, N, 5]."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv1d(3, FEATURES, 3, padding=1), nn.Linear(2 * HIDDEN, 5)
        self.forward_cell, self.backward_cell = make_cell("lstm", True), make_cell("lstm", True)

    def forward(self, image):
        x = self.conv(image).permute(2, 0, 1)  # [T, N, F]
        directions = []
        steps = x.shape[0]
        for cell, order in ((self.forward_cell, range(steps)), (self.backward_cell, range(steps - 1, -1, -1))):
            h = c = x.new_zeros(x.shape[1], HIDDEN)
            hs = {}
            for t in order:
                h, c = cell(x[t], (h, c))
                hs[t] = h
            directions.append(torch.stack([hs[t] for t in range(x.shape[0])]))
        return self.fc(torch.cat(directions, -1)).log_softmax(-1)


@dataclass
class Case:
    name: str
    pattern: str
    module: nn.Module
    inputs: dict[str, list]  # name -> dims ("batch" is the dynamic axis)
    outputs: list[str]
    dynamo: bool = True  # also exported by dynamo (the CRNN: TorchScript only; dynamo's copy is 460 kB)


def cases() -> list[Case]:
    found = []
    for kind in CELLS:
        states = ["h", "c"][: 2 if kind == "lstm" else 1]
        finals = [f"{s}_n" for s in states]
        given = {s: ["batch", HIDDEN] for s in states}
        found.append(Case(f"{kind}_step", f"{kind} cell, one step per call", Streaming(kind),
                          {"x": ["batch", FEATURES], **given}, finals))
        found.append(Case(f"{kind}_loop", f"{kind} cell over time, time-major", TimeLoop(kind),
                          {"x": [STEPS, "batch", FEATURES], **given}, ["y", *finals]))
        found.append(Case(f"{kind}_loop_bf", f"{kind} cell over time, batch-first", TimeLoop(kind, batch_first=True),
                          {"x": ["batch", STEPS, FEATURES], **given}, ["y", *finals]))
    found.append(Case("lstm_step_nobias", "lstm cell, one step per call, bias=False", Streaming("lstm", bias=False),
                      {"x": ["batch", FEATURES], "h": ["batch", HIDDEN], "c": ["batch", HIDDEN]}, ["h_n", "c_n"]))
    found.append(Case("gru_loop_nobias", "gru cell over time, time-major, bias=False", TimeLoop("gru", bias=False),
                      {"x": [STEPS, "batch", FEATURES], "h": ["batch", HIDDEN]}, ["y", "h_n"]))
    for kind in ("lstm", "gru"):
        states = ["h_n", "c_n"][: 2 if kind == "lstm" else 1]
        found.append(Case(f"{kind}_loop_bf_zeros", f"{kind} cell over time, batch-first, zero states made inside",
                          TimeLoop(kind, batch_first=True), {"x": ["batch", STEPS, FEATURES]}, ["y", *states]))
    found.append(Case("lstm_step_stacked_state", "lstm cell, one step per call, states stacked in one input and output "
                      "(silero VAD's decoder)", StackedStates(),
                      {"x": ["batch", FEATURES], "state": [2, "batch", HIDDEN]}, ["probability", "state_n"]))
    found.append(Case("gru2_decoder_step", "decoder step: two GRU cells written out (Linear, gate slices, sigmoid, "
                      "tanh)", DecoderStep("gru"), {"x": ["batch", FEATURES], "h1": ["batch", HIDDEN],
                                           "h2": ["batch", HIDDEN]}, ["logp", "h1_n", "h2_n"]))
    found.append(Case("lstm2_decoder_step", "decoder step: two nn.LSTMCells in turn", DecoderStep("lstm"),
                      {"x": ["batch", FEATURES], **{s: ["batch", HIDDEN] for s in ("h1", "c1", "h2", "c2")}},
                      ["logp", "h1_n", "c1_n", "h2_n", "c2_n"]))
    found.append(Case("bilstm_crnn", "CRNN: Conv1d, a BiLSTM of two nn.LSTMCells stepped over 20 columns, Linear",
                      CRNN(), {"image": ["batch", 3, 20]}, ["logp"], dynamo=False))
    return found


def example(case: Case) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn([BATCH if d == "batch" else d for d in dims], generator=generator)
                 for dims in case.inputs.values())


def export(case: Case, dynamo: bool, path: Path) -> dict:
    names = list(case.inputs)
    if dynamo:
        shapes = tuple({dims.index("batch"): torch.export.Dim.AUTO} for dims in case.inputs.values())
        torch.onnx.export(case.module, example(case), path, dynamo=True, input_names=names,
                          output_names=case.outputs, dynamic_shapes=shapes, external_data=False, optimize=True)
        return {"dynamo": True, "optimize": True, "dynamic_shapes": "Dim.AUTO on batch"}
    axes = {name: {dims.index("batch"): "batch"} for name, dims in case.inputs.items()}
    torch.onnx.export(case.module, example(case), path, dynamo=False, opset_version=17, input_names=names,
                      output_names=case.outputs, dynamic_axes=axes, do_constant_folding=True)
    return {"dynamo": False, "opset_version": 17, "dynamic_axes": "batch", "do_constant_folding": True}


def main(names: list[str]):
    warnings.filterwarnings("ignore")
    unknown = set(names) - {case.name for case in cases()}
    if unknown:
        raise SystemExit(f"unknown cases: {sorted(unknown)}")
    kept = [m for m in json.loads((HERE / "manifest.json").read_text())["models"] if m["case"] not in names] \
        if names else []
    for old in HERE.glob("*.onnx"):
        if not names or old.name not in {m["file"] for m in kept}:
            old.unlink()
    models = list(kept)
    for case in (c for c in cases() if not names or c.name in names):
        torch.manual_seed(zlib.crc32(case.name.encode()))
        for parameter in case.module.parameters():  # torch's default init, reseeded per case
            nn.init.uniform_(parameter, -0.5, 0.5)
        case.module.eval()
        for dynamo in (False, True)[:1 + case.dynamo]:
            path = HERE / f"{'dynamo' if dynamo else 'ts'}_{case.name}.onnx"
            settings = export(case, dynamo, path)
            model = onnx.load(path)
            models.append({"file": path.name, "case": case.name, "pattern": case.pattern,
                           "exporter": "dynamo" if dynamo else "torchscript",
                           "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                           "inputs": case.inputs, "outputs": case.outputs, "settings": settings})
    versions = {package: version(package) for package in ("torch", "onnx", "onnxscript", "onnxruntime")}
    versions["python"] = platform.python_version()
    manifest = {"generated_by": "tests/models/torch_cells/make_models.py", "versions": versions,
                "features": FEATURES, "hidden": HIDDEN, "steps": STEPS, "models": models}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(models)} models, {sum((HERE / m['file']).stat().st_size for m in models) / 1e3:.0f} kB")


if __name__ == "__main__":
    main(sys.argv[1:])
