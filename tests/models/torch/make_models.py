"""Regenerate the torch.onnx test models: `python tests/models/torch/make_models.py` (from the repository root).

Each case is a small PyTorch module (hidden size 8-12) exported by the TorchScript exporter (`dynamo=False`) at one or
more opsets in 14-20 and, where it exports, by the dynamo exporter (`dynamo=True`, onnxscript). Dynamic axes are
named after the entries of ``SIZES`` (export size, second size the tests also run). What was exported, with which
versions and settings, and which exports failed, is written to manifest.json next to this script; the tests read it.

float16 models: a `.half()` module exported as is (float16 LSTM nodes); float32 exports rewritten by
onnxconverter-common's `convert_float_to_float16(keep_io_types=True)` (Cast nodes at the graph inputs and outputs,
float16 GRU; or, with LSTM in its op_block_list, Casts to float32 and back around each LSTM node); and float16 weight
initializers each Cast to float32 in front of the LSTM (written with onnx.helper). onnxconverter-common is needed
only here (`pip install --no-deps onnxconverter-common`), never by the tests.
"""

from __future__ import annotations

import json
import platform
import re
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

HERE = Path(__file__).parent
FEATURES, HIDDEN = 6, 8
# dynamic axis -> (size at export, second size the tests run); distinct export sizes keep the axes apart
SIZES = {"batch": (2, 3), "time": (5, 7), "src_time": (6, 4), "tgt_time": (4, 6), "width": (10, 14)}
RNNS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}
RNN_OPS = ("LSTM", "GRU", "RNN")


def _flat(y, state):
    return (y, *state) if isinstance(state, tuple) else (y, state)


class Recurrent(nn.Module):
    """One nn.LSTM / nn.GRU / nn.RNN; optional explicit initial states; returns (y, h_n[, c_n])."""

    def __init__(self, kind: str, **kwargs):
        super().__init__()
        self.kind, self.rnn = kind, RNNS[kind](FEATURES, HIDDEN, **kwargs)

    def forward(self, x, h0=None, c0=None):
        if h0 is None:
            return _flat(*self.rnn(x))
        return _flat(*self.rnn(x, (h0, c0) if self.kind == "lstm" else h0))


class Packed(nn.Module):
    """pack_padded_sequence -> recurrent module -> pad_packed_sequence (batch first)."""

    def __init__(self, kind: str, enforce_sorted: bool, **kwargs):
        super().__init__()
        self.enforce_sorted, self.rnn = enforce_sorted, RNNS[kind](FEATURES, HIDDEN, batch_first=True, **kwargs)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=self.enforce_sorted)
        y, state = self.rnn(packed)
        return _flat(pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])[0], state)


class Tagger(nn.Module):
    """Sequence tagger: Embedding -> 2-layer BiLSTM -> Linear."""

    def __init__(self, vocabulary=20, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, FEATURES)
        self.lstm = nn.LSTM(FEATURES, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
        self.classify = nn.Linear(2 * HIDDEN, tags)

    def forward(self, tokens):
        return self.classify(self.lstm(self.embed(tokens))[0])


class CRNN(nn.Module):
    """Text-line recogniser: Conv -> ReLU -> MaxPool -> columns as time steps -> BiLSTM -> Linear -> log_softmax."""

    def __init__(self, height=8, channels=4, classes=7):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.lstm = nn.LSTM(channels * height // 2, HIDDEN, bidirectional=True)
        self.classify = nn.Linear(2 * HIDDEN, classes)

    def forward(self, image):  # [batch, 1, height, width] -> [width / 2, batch, classes]
        features = self.conv(image).flatten(1, 2).permute(2, 0, 1)
        return self.classify(self.lstm(features)[0]).log_softmax(-1)


class Seq2Seq(nn.Module):
    """LSTM encoder-decoder: the encoder's final (h, c) is the decoder's initial state."""

    def __init__(self, target_features=5):
        super().__init__()
        self.encoder = nn.LSTM(FEATURES, HIDDEN, num_layers=2, batch_first=True)
        self.decoder = nn.LSTM(target_features, HIDDEN, num_layers=2, batch_first=True)
        self.project = nn.Linear(HIDDEN, target_features)

    def forward(self, source, target):
        _, state = self.encoder(source)
        return self.project(self.decoder(target, state)[0])


class AudioGRU(nn.Module):
    """Keyword spotter over MFCC-like frames: LayerNorm -> 3-layer GRU -> last step -> Linear."""

    def __init__(self, features=13, classes=4):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.gru = nn.GRU(features, 12, num_layers=3, batch_first=True, dropout=0.1)
        self.classify = nn.Linear(12, classes)

    def forward(self, frames):
        return self.classify(self.gru(self.norm(frames))[0][:, -1])


@dataclass
class Case:
    name: str
    pattern: str  # what the model shows, for the README table
    make: Callable[[], nn.Module]
    inputs: dict[str, tuple[str, tuple]]  # name -> (kind, dims); kinds: float, half, int:<high>, lengths[_sorted]
    outputs: list[str]
    opsets: tuple[int, ...]  # TorchScript exporter opsets
    dynamo: bool = True  # also try the dynamo exporter
    float16: str | None = None  # None, "convert", "convert_block_rnn" or "weights" (see to_float16)


def seq(batch_first: bool) -> tuple:
    return ("batch", "time", FEATURES) if batch_first else ("time", "batch", FEATURES)


def rec(kind: str, batch_first=False, layers=1, **kwargs) -> Callable[[], nn.Module]:
    return lambda: Recurrent(kind, batch_first=batch_first, num_layers=layers, **kwargs)


def states(kind: str, layers: int, directions: int) -> dict:
    dims = ("float", (layers * directions, "batch", HIDDEN))
    return {"h0": dims, "c0": dims} if kind == "lstm" else {"h0": dims}


X, X_BF = {"x": ("float", seq(False))}, {"x": ("float", seq(True))}
LSTM_OUT, OUT = ["y", "h_n", "c_n"], ["y", "h_n"]

CASES = [
    Case("lstm", "nn.LSTM, 1 layer", rec("lstm"), X, LSTM_OUT, (14,)),
    Case("lstm_l2_bi_bf", "nn.LSTM, 2 layers, bidirectional, batch_first",
         rec("lstm", True, 2, bidirectional=True), X_BF, LSTM_OUT, tuple(range(14, 21))),
    Case("lstm_l3", "nn.LSTM, 3 layers", rec("lstm", layers=3), X, LSTM_OUT, (20,)),
    Case("lstm_l2_bi_h0c0", "nn.LSTM, 2 layers, bidirectional, batch_first, explicit h0/c0",
         rec("lstm", True, 2, bidirectional=True), {**X_BF, **states("lstm", 2, 2)}, LSTM_OUT, (15,)),
    Case("lstm_bi_nobias", "nn.LSTM, bidirectional, bias=False", rec("lstm", bidirectional=True, bias=False), X,
         LSTM_OUT, (16,)),
    Case("lstm_l3_bi_dropout", "nn.LSTM, 3 layers, bidirectional, dropout=0.25 (eval)",
         rec("lstm", layers=3, bidirectional=True, dropout=0.25), X, LSTM_OUT, (18,)),
    Case("gru", "nn.GRU, 1 layer", rec("gru"), X, OUT, (14,)),
    Case("gru_l2_bi_bf", "nn.GRU, 2 layers, bidirectional, batch_first", rec("gru", True, 2, bidirectional=True),
         X_BF, OUT, (19,)),
    Case("gru_l3_h0_dropout", "nn.GRU, 3 layers, explicit h0, dropout=0.2 (eval)",
         rec("gru", layers=3, dropout=0.2), {**X, **states("gru", 3, 1)}, OUT, (16,)),
    Case("gru_bi_nobias", "nn.GRU, bidirectional, bias=False", rec("gru", bidirectional=True, bias=False), X, OUT,
         (20,)),
    Case("rnn_tanh", "nn.RNN (tanh), 1 layer", rec("rnn"), X, OUT, (14,)),
    Case("rnn_relu_l2_bi_bf", "nn.RNN (relu), 2 layers, bidirectional, batch_first",
         rec("rnn", True, 2, bidirectional=True, nonlinearity="relu"), X_BF, OUT, (18,)),
    Case("rnn_l3_h0_nobias", "nn.RNN (tanh), 3 layers, explicit h0, bias=False",
         rec("rnn", layers=3, bias=False), {**X, **states("rnn", 3, 1)}, OUT, (20,)),
    Case("packed_lstm_bi_sorted", "PackedSequence (enforce_sorted=True), bidirectional nn.LSTM",
         lambda: Packed("lstm", True, bidirectional=True),
         {**X_BF, "lengths": ("lengths_sorted", ("batch",))}, LSTM_OUT, (17,)),
    Case("packed_lstm_l2_unsorted", "PackedSequence (enforce_sorted=False), 2-layer nn.LSTM",
         lambda: Packed("lstm", False, num_layers=2), {**X_BF, "lengths": ("lengths", ("batch",))}, LSTM_OUT, (19,)),
    Case("packed_gru_bi_unsorted", "PackedSequence (enforce_sorted=False), bidirectional nn.GRU",
         lambda: Packed("gru", False, bidirectional=True), {**X_BF, "lengths": ("lengths", ("batch",))}, OUT, (15,)),
    Case("packed_rnn_relu_sorted", "PackedSequence (enforce_sorted=True), nn.RNN (relu)",
         lambda: Packed("rnn", True, nonlinearity="relu"), {**X_BF, "lengths": ("lengths_sorted", ("batch",))}, OUT,
         (20,)),
    Case("tagger", "Embedding + 2-layer BiLSTM + Linear (sequence tagger)", Tagger,
         {"tokens": ("int:20", ("batch", "time"))}, ["scores"], (17,)),
    Case("crnn", "Conv2d + MaxPool + BiLSTM + Linear (CRNN)", CRNN,
         {"image": ("float", ("batch", 1, 8, "width"))}, ["log_probs"], (18,)),
    Case("seq2seq", "2-layer LSTM encoder-decoder passing (h, c)", Seq2Seq,
         {"source": ("float", ("batch", "src_time", FEATURES)), "target": ("float", ("batch", "tgt_time", 5))},
         ["prediction"], (16,)),
    Case("audio_gru", "LayerNorm + 3-layer GRU over audio frames + Linear", AudioGRU,
         {"frames": ("float", ("batch", "time", 13))}, ["logits"], (19,)),
    Case("lstm_half", "float16 nn.LSTM (.half()), float16 LSTM nodes", lambda: Recurrent("lstm").half(),
         {"x": ("half", seq(False))}, LSTM_OUT, (17,)),
    Case("gru_bi_fp16", "float16 via onnxconverter-common (keep_io_types): Cast at inputs/outputs, float16 GRU",
         rec("gru", True, bidirectional=True), X_BF, OUT, (18,), dynamo=False, float16="convert"),
    Case("lstm_l2_fp16_blocked", "float16 graph with Casts to float32 around the LSTM nodes (onnxconverter-common, "
         "LSTM blocked)", rec("lstm", layers=2), X, LSTM_OUT, (17,), dynamo=False, float16="convert_block_rnn"),
    Case("lstm_bi_fp16_weights", "float16 weight initializers, each Cast to float32 in front of the LSTM",
         rec("lstm", True, bidirectional=True), X_BF, LSTM_OUT, (20,), dynamo=False, float16="weights"),
]


def examples(case: Case, sizes: dict[str, int]) -> tuple[torch.Tensor, ...]:
    """Example inputs: named axes at their export size unless ``sizes`` says otherwise."""
    generator = torch.Generator().manual_seed(0)
    sizes = {name: sizes.get(name, export) for name, (export, _) in SIZES.items()}

    def example(kind: str, dims: tuple) -> torch.Tensor:
        shape = [sizes[d] if isinstance(d, str) else d for d in dims]
        if kind in ("float", "half"):
            x = torch.randn(shape, generator=generator)
            return x.half() if kind == "half" else x
        if kind.startswith("int:"):
            return torch.randint(0, int(kind[4:]), shape, generator=generator)
        lengths = torch.randint(1, sizes["time"] + 1, shape, generator=generator)
        lengths[0] = sizes["time"]
        return lengths.sort(descending=True).values if kind == "lengths_sorted" else lengths.flip(0)

    return tuple(example(kind, dims) for kind, dims in case.inputs.values())


def dynamic_axes(case: Case) -> dict:
    axes = {name: {i: d for i, d in enumerate(dims) if isinstance(d, str)} for name, (_, dims) in case.inputs.items()}
    return {name: a for name, a in axes.items() if a}


def export_torchscript(case: Case, module: nn.Module, args: tuple, opset: int, path: Path) -> dict:
    settings = {"dynamo": False, "opset_version": opset, "do_constant_folding": True,
                "input_names": list(case.inputs), "output_names": case.outputs, "dynamic_axes": dynamic_axes(case)}
    torch.onnx.export(module, args, path, **settings)
    return settings


def export_dynamo(case: Case, module: nn.Module, args: tuple, path: Path) -> dict:
    # Dim.AUTO: the exporter keeps a dimension dynamic where it can and specialises it where it must (which axes
    # really stay dynamic is checked afterwards: see dynamic_axes_that_work).
    shapes = tuple({i: torch.export.Dim.AUTO for i, d in enumerate(dims) if isinstance(d, str)}
                   for _, dims in case.inputs.values())
    torch.onnx.export(module, args, path, dynamo=True, input_names=list(case.inputs), output_names=case.outputs,
                      dynamic_shapes=shapes, external_data=False, optimize=True)
    return {"dynamo": True, "optimize": True, "dynamic_shapes": "Dim.AUTO on every named axis",
            "input_names": list(case.inputs), "output_names": case.outputs}


def to_float16(path: Path, mode: str) -> dict:
    """Rewrite a float32 export: "convert" / "convert_block_rnn" with onnxconverter-common, "weights": every float
    initializer stored as float16 and Cast to float32 where it is used (half the file, float32 arithmetic)."""
    model = onnx.load(path)
    if mode == "weights":
        graph = model.graph
        casts = []
        for tensor in graph.initializer:
            if tensor.data_type == onnx.TensorProto.FLOAT:
                half = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor).astype(np.float16), tensor.name)
                tensor.CopyFrom(half)
                casts.append(onnx.helper.make_node("Cast", [tensor.name], [tensor.name + "_float32"],
                                                   to=onnx.TensorProto.FLOAT))
        renamed = {c.input[0]: c.output[0] for c in casts}
        for node in graph.node:
            node.input[:] = [renamed.get(name, name) for name in node.input]
        nodes = casts + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.checker.check_model(model)
        onnx.save(model, path)
        return {"float16": "float initializers stored as float16, each Cast to float32 before use (onnx.helper)"}
    from onnxconverter_common import float16

    block = float16.DEFAULT_OP_BLOCK_LIST + (["LSTM", "GRU", "RNN"] if mode == "convert_block_rnn" else [])
    model = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=block)
    onnx.save(model, path)
    return {"onnxconverter_common.float16.convert_float_to_float16": {
        "keep_io_types": True,
        "op_block_list": "DEFAULT_OP_BLOCK_LIST" + (" + LSTM, GRU, RNN" if mode == "convert_block_rnn" else "")}}


def first_line(error: Exception) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    summary = text.split("## Exception summary", 1)[-1].strip().splitlines()
    cause = re.sub(r"^<class '(\w+\.)*(\w+)'>", r"\2", summary[0]) if summary else ""
    return f"{type(error).__name__}: {cause}"[:300]


def matches_torch(module: nn.Module, path: Path, args: tuple, tolerance: float) -> bool:
    """Does onnxruntime's result on ``args`` match the PyTorch module's?"""
    import onnxruntime

    with torch.no_grad():
        expected = module(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # an axis that does not work fails a Reshape: expected, not worth a log line
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    try:
        actual = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)})
    except Exception:
        return False
    return all(a.shape == tuple(e.shape) and np.allclose(a.astype(np.float32), e.float().numpy(), rtol=tolerance,
                                                         atol=tolerance) for a, e in zip(actual, expected, strict=True))


def dynamic_axes_that_work(case: Case, module: nn.Module, path: Path) -> list[str]:
    """The named axes along which the export really is dynamic: onnxruntime at the second size of that axis (the
    others at export size) matches PyTorch. The dynamo exporter may leave an input axis symbolic yet specialise the
    graph to its export size (e.g. a Reshape to the export's sequence length)."""
    # float16 weights or arithmetic: compare loosely (this only tells which axes work)
    tolerance = 1e-2 if case.float16 or any(p.dtype == torch.float16 for p in module.parameters()) else 1e-4
    if not matches_torch(module, path, examples(case, {}), tolerance):
        raise AssertionError(f"{path.name}: onnxruntime does not match PyTorch at the export sizes")
    named = {d for _, dims in case.inputs.values() for d in dims if isinstance(d, str)}
    return sorted(axis for axis in named
                  if matches_torch(module, path, examples(case, {axis: SIZES[axis][1]}), tolerance))


def entry(case: Case, exporter: str, path: Path, settings: dict, module: nn.Module) -> dict:
    model = onnx.load(path)
    return {"file": path.name, "case": case.name, "exporter": exporter, "pattern": case.pattern,
            "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "inputs": {name: {"kind": kind, "dims": list(dims)} for name, (kind, dims) in case.inputs.items()},
            "dynamic_axes": dynamic_axes_that_work(case, module, path),
            "outputs": case.outputs, "recurrent_nodes": sum(n.op_type in RNN_OPS for n in model.graph.node),
            "bytes": path.stat().st_size, "settings": settings}


def readme(manifest: dict) -> str:
    """README.md: how the models were made, and one row per case."""
    versions = ", ".join(f"{k} {v}" for k, v in manifest["versions"].items())
    sizes = ", ".join(f"{k} {v['export']} (tests also {v['second']})" for k, v in manifest["sizes"].items())
    dynamo_opset = next(m["opset"] for m in manifest["models"] if m["exporter"] == "dynamo")
    lines = [
        "# torch.onnx test models",
        "",
        "Generated by `python tests/models/torch/make_models.py` (do not edit; it also writes this file and",
        "manifest.json, which the tests in tests/exporters/test_torch_onnx.py and test_torch_dynamo.py read).",
        f"Versions: {versions}.",
        "",
        "- TorchScript exporter: `torch.onnx.export(..., dynamo=False, opset_version=N, dynamic_axes=...,",
        "  do_constant_folding=True)`; file `ts_<case>_op<N>.onnx`.",
        "- dynamo exporter: `torch.onnx.export(..., dynamo=True, dynamic_shapes=Dim.AUTO on every named axis,",
        "  optimize=True)` at its default opset; file `dynamo_<case>.onnx`.",
        f"- Named axes, export size: {sizes}. Hidden size 8 (12 in audio_gru), 6 input features.",
        "- `dynamic` lists the axes along which onnxruntime matches PyTorch at another size (checked when generated):",
        "  the dynamo exporter leaves the time axis of sequence-first inputs symbolic but specialises the graph to the",
        "  export length (Reshape to [5, -1, D*H]), and unrolls nn.RNN over the export length.",
        "",
        f"| case | pattern | TorchScript opsets | dynamo (opset {dynamo_opset}) |",
        "|---|---|---|---|",
    ]
    for case in CASES:
        mine = [m for m in manifest["models"] if m["case"] == case.name]
        opsets = ", ".join(str(m["opset"]) for m in mine if m["exporter"] == "torchscript")
        dynamo = [m for m in mine if m["exporter"] == "dynamo"]
        failed = [f["error"] for f in manifest["failures"] if f["case"] == case.name]
        if dynamo:
            m = dynamo[0]
            nodes = m["recurrent_nodes"]
            how = "unrolled into MatMul/Add" if nodes == 0 else f"{nodes} recurrent node{'s' * (nodes > 1)}"
            cell = f"{how}; dynamic: {', '.join(m['dynamic_axes'])}"
        else:
            cell = f"fails in torch.export: {failed[0]}" if failed else "(a rewritten float32 export)"
        ts_dynamic = ", ".join(next(m["dynamic_axes"] for m in mine if m["exporter"] == "torchscript"))
        lines.append(f"| {case.name} | {case.pattern} | {opsets} (dynamic: {ts_dynamic}) | {cell} |")
    return "\n".join(lines) + "\n"


def main():
    warnings.filterwarnings("ignore")
    for old in HERE.glob("*.onnx"):
        old.unlink()
    models, failures = [], []
    for case in CASES:
        torch.manual_seed(zlib.crc32(case.name.encode()))
        module = case.make().eval()
        args = examples(case, {})
        for opset in case.opsets:
            path = HERE / f"ts_{case.name}_op{opset}.onnx"
            settings = export_torchscript(case, module, args, opset, path)
            if case.float16:
                settings.update(to_float16(path, case.float16))
            models.append(entry(case, "torchscript", path, settings, module))
        if case.dynamo:
            path = HERE / f"dynamo_{case.name}.onnx"
            try:
                settings = export_dynamo(case, module, args, path)
            except Exception as error:
                path.unlink(missing_ok=True)
                failures.append({"case": case.name, "exporter": "dynamo", "pattern": case.pattern,
                                 "error": first_line(error)})
                continue
            models.append(entry(case, "dynamo", path, settings, module))
    versions = {package: version(package) for package in ("torch", "onnx", "onnxscript", "onnxruntime")}
    versions["onnxconverter-common"] = version("onnxconverter-common")
    versions["python"] = platform.python_version()
    manifest = {"generated_by": "tests/models/torch/make_models.py", "versions": versions,
                "sizes": {name: {"export": a, "second": b} for name, (a, b) in SIZES.items()},
                "models": models, "failures": failures}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (HERE / "README.md").write_text(readme(manifest))
    total = sum(m["bytes"] for m in models)
    print(f"{len(models)} models, {total / 1e3:.0f} kB; {len(failures)} exports failed")
    for failure in failures:
        print(f"  {failure['exporter']} {failure['case']}: {failure['error']}")


if __name__ == "__main__":
    main()
