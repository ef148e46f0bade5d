"""Benchmark converted recurrent models against onnxruntime, in one process and one run.

    .venv/bin/python bench/run.py                  # the full suite: 592 single-node rows (about 9 minutes with
                                                   # --no-compile on 2 idle cores; compiling every case is slow)
    .venv/bin/python bench/run.py --suite quick    # 27 cases, both thread counts, for iteration (about 3 minutes)
    .venv/bin/python bench/run.py --suite int8     # issue #25's int8 rows: quantized test models + real int8 ones
    .venv/bin/python bench/run.py --suite real     # models that packages ship, fetched at bench time (real_models.py;
                                                   # --no-train skips the original-module rows there)
    options: --threads 1 2 (the default), --no-compile, --no-models, --no-train, --no-reexport, --no-conversion,
             --filter REGEX (cases whose name matches), --budget SECONDS (timing per variant and row),
             --out FILE (bench/results/<suite>.md),
             --busy (the quick suite's rows at 1 and 2 threads, idle and then while one spinning process per core
                     runs, case by case: bench/results/busy.md)

Run it on otherwise idle cores: timings are medians, but with 2 threads on 2 busy cores torch's OpenMP regions wait
for a descheduled thread (100x slowdowns seen; the recurrent kernel's own threads do not), while onnxruntime's thread
pool does not.

Every case is one ONNX model: a single LSTM/GRU/RNN node (the matrix: op, direction, hidden, sequence, batch, with
and without sequence_lens, plus one exact-path case per op: peepholes, clip, a non-default activation), a 2-layer
bidirectional LSTM exported by torch.onnx (made here), the bundled example tagger, dynamo's tagger, a PackedSequence
LSTM and dynamo's unrolled nn.RNN (tests/models/torch), and Keras models exported by tf2onnx (tests/models/keras, when
present; Loops of one cell step and unroll=True layers among them). For each case the
script converts the model, checks every output of the
converted module (eager and torch.compile'd) against onnxruntime (a mismatch fails the run: speed never trades
correctness), then times, interleaved round by round so that machine noise hits all of them alike:
- onnxruntime (default session options, intra-op threads = the torch thread count, inter-op 1),
- the converted module, eager and torch.compile'd (``dynamic=False``), under ``torch.no_grad()``,
- where recognition fused something, the model converted with ``fuse=False`` (every node as written),
- the GEMM floor: the same matmuls alone in torch (the input projection of all steps in one matmul, then one
  recurrent matmul per step and direction into a preallocated output): what any torch implementation pays.
It reports medians and ratios, then the conversion time and peak memory of a large model (a 4-layer bidirectional
LSTM, hidden 1024, built with onnx.helper) measured in a fresh process, and writes a markdown table.

Then a training step (forward, cross-entropy, backward, SGD) of the converted tagger against the original PyTorch
module it was exported from.

Targets (issue 10): every single-node row eager <= 1.0x onnxruntime, median <= 0.8x; the whole models with native
recurrent nodes (torch.onnx biLSTM, the tagger) <= 1.0x; compiled <= eager + 5%; a training step of the converted
tagger <= 1.1x the original module's; conversion <= 1 s per 100 MB of weights, peak memory <= 2x the weight bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import compare_arrays, random_inputs, runtime_inputs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
RECURRENT = tuple(GATES)
TARGET_EAGER, TARGET_MEDIAN, TARGET_COMPILED_OVER_EAGER, TARGET_TRAIN = 1.0, 0.8, 1.05, 1.1
TARGET_REEXPORT = 1.05  # the same nodes as the original: equal within the timing noise
SETTLE = 0.08  # seconds each turn runs untimed with several threads (see interleaved_medians)


# ---------------------------------------------------------------------------------------------------------------
# Cases

@dataclasses.dataclass(frozen=True)
class Config:
    """One recurrent node: X [T, B, I] with I = hidden unless given; outputs Y and Y_h."""

    op: str
    direction: str = "forward"
    hidden: int = 64
    seq: int = 16
    batch: int = 1
    input_size: int | None = None
    seq_lens: bool = False
    attrs: tuple = ()  # extra ONNX attributes, e.g. (("clip", 3.0),)
    peepholes: bool = False
    label: str = ""

    @property
    def name(self) -> str:
        extra = self.label or " ".join(f"{k}={v}" for k, v in self.attrs)
        return (f"{self.op} {self.direction[:3]} H{self.hidden} T{self.seq} B{self.batch}"
                + (" lens" if self.seq_lens else "") + (f" {extra}" if extra else ""))


@dataclasses.dataclass
class Case:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    # (T, B, I, H, gates, directions) of every recurrent node, for the GEMM floor; None when unknown
    matmuls: list[tuple[int, int, int, int, int, int]] | None


def recurrent_model(cfg: Config) -> Case:
    rng = np.random.default_rng(0)
    d = 2 if cfg.direction == "bidirectional" else 1
    g, h, i = GATES[cfg.op], cfg.hidden, cfg.input_size or cfg.hidden
    scale = 1 / np.sqrt(h)
    init = {"W": rng.uniform(-scale, scale, (d, g * h, i)), "R": rng.uniform(-scale, scale, (d, g * h, h)),
            "B": rng.uniform(-scale, scale, (d, 2 * g * h))}
    inputs = ["X", "W", "R", "B", "sequence_lens" if cfg.seq_lens else ""]
    if cfg.peepholes:
        init["P"] = rng.uniform(-scale, scale, (d, 3 * h))
        inputs += ["", "", "P"]
    node = helper.make_node(cfg.op, inputs, ["Y", "Y_h"], hidden_size=h, direction=cfg.direction, **dict(cfg.attrs))
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [cfg.seq, cfg.batch, i])]
    feeds = {"X": rng.standard_normal((cfg.seq, cfg.batch, i)).astype(np.float32)}
    if cfg.seq_lens:  # random lengths in [1, T], the first row full
        graph_inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [cfg.batch]))
        feeds["sequence_lens"] = rng.integers(1, cfg.seq + 1, cfg.batch).astype(np.int32)
        feeds["sequence_lens"][0] = cfg.seq
    graph = helper.make_graph(
        [node], "bench", graph_inputs,
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [cfg.seq, d, cfg.batch, h]),
         helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [d, cfg.batch, h])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in init.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return Case(cfg.name, model, feeds, [(cfg.seq, cfg.batch, i, h, g, d)])


def recurrent_matmuls(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list | None:
    """(T, B, I, H, gates, directions) of each LSTM/GRU/RNN node of the main graph, from shape inference with the
    feeds' shapes; None if some shape stays unknown."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for info in model.graph.input:
        if info.name in feeds:
            dims = info.type.tensor_type.shape.dim
            for dim, size in zip(dims, feeds[info.name].shape, strict=True):
                dim.Clear()
                dim.dim_value = size
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value or None for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input]}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    result = []
    for node in model.graph.node:
        if node.op_type not in RECURRENT:
            continue
        x, w, r = (shapes.get(name) for name in node.input[:3])
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        if not (x and w and r) or None in x + w + r:
            return None
        steps, batch = (x[1], x[0]) if layout else (x[0], x[1])
        result.append((steps, batch, x[2], r[2], GATES[node.op_type], w[0]))
    return result


def file_case(name: str, path: Path, dims: dict[str, int]) -> Case | None:
    """``dims``: sizes of symbolic dims by name, or by position as "0", "1", ... of the first input's dims (tf2onnx
    names them unk__N)."""
    if not path.exists():
        return None
    model = onnx.load(str(path))
    first = model.graph.input[0].type.tensor_type.shape.dim
    dims = {(first[int(k)].dim_param if k.isdigit() else k): v for k, v in dims.items()}
    feeds = random_inputs(model, seed=0, dims=dims)
    return Case(name, model, feeds, recurrent_matmuls(model, feeds))


def torch_exported_case(hidden: int = 256, layers: int = 2, steps: int = 64, batch: int = 8) -> Case:
    """A multi-layer bidirectional LSTM tagger exported by torch.onnx (TorchScript exporter), made here."""
    import io

    torch.manual_seed(0)

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=layers, bidirectional=True, batch_first=True)
            self.classify = torch.nn.Linear(2 * hidden, 16)

        def forward(self, x):
            return self.classify(self.lstm(x)[0])

    buffer = io.BytesIO()
    x = torch.randn(batch, steps, hidden)
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice, LSTM batch-size advice
        warnings.simplefilter("ignore")
        torch.onnx.export(Tagger().eval(), (x,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["tags"], dynamic_axes={"x": {0: "batch", 1: "time"}})
    model = onnx.load_from_string(buffer.getvalue())
    feeds = {"x": x.numpy()}
    return Case(f"torch.onnx {layers}-layer biLSTM H{hidden} T{steps} B{batch}", model, feeds,
                recurrent_matmuls(model, feeds))


def model_cases() -> list[Case]:
    tagger = ROOT / "examples" / "bilstm_tagger.onnx"
    cases = [torch_exported_case(), file_case("examples/bilstm_tagger.onnx T16 B1", tagger, {"batch": 1, "time": 16}),
             file_case("examples/bilstm_tagger.onnx T64 B8", tagger, {"batch": 8, "time": 64})]
    exported = ROOT / "tests" / "models" / "torch"
    cases += [file_case("torch.onnx dynamo tagger T16 B1", exported / "dynamo_tagger.onnx", {"0": 1, "1": 16}),
              file_case("torch.onnx PackedSequence 2-layer LSTM T16 B4",
                        exported / "ts_packed_lstm_l2_unsorted_op19.onnx", {"batch": 4, "time": 16}),
              # dynamo unrolls nn.RNN over the export length (5 steps): MatMul/Add/Relu per step and direction
              file_case("torch.onnx dynamo unrolled 2-layer bi nn.RNN T5 B1",
                        exported / "dynamo_rnn_relu_l2_bi_bf.onnx", {"0": 1, "1": 5})]
    keras = ROOT / "tests" / "models" / "keras"
    cases += [file_case(f"Keras {path.stem} T64 B8", path, {"0": 8, "1": 64})
              for path in (keras / "tf_keras_stacked.onnx", keras / "keras3_bi_lstm_concat.onnx",
                           # tf2onnx's Loops of one cell step (masking, GRU reset_after=False, SimpleRNN)
                           keras / "tf_keras_masking_gru.onnx", keras / "keras3_gru_reset_before.onnx",
                           keras / "keras3_simple_rnn.onnx")]
    # Keras unroll=True: one cell step per time step written out (6 steps), recognised by unrolled_cells
    cases += [file_case(f"Keras {path.stem} T6 B1", path, {"0": 1})
              for path in (keras / "tf_keras_unrolled_stacked.onnx", keras / "keras3_unrolled_bi_gru_concat.onnx")]
    return [c for c in cases if c is not None]


def suite(name: str) -> list[Config]:
    ops = [("LSTM", ()), ("GRU", (("linear_before_reset", 1),)), ("GRU", (("linear_before_reset", 0),)), ("RNN", ())]
    exact = [Config("LSTM", peepholes=True, label="peepholes"), Config("LSTM", attrs=(("clip", 3.0),)),
             Config("GRU", attrs=(("linear_before_reset", 1), ("clip", 3.0))),
             Config("RNN", attrs=(("activations", ["Sigmoid"]),), label="activations=Sigmoid")]
    if name == "quick":
        configs = [Config(op, hidden=h, seq=t, batch=b, attrs=attrs)
                   for op, attrs in ops for h, t, b in ((64, 16, 1), (256, 128, 8))]
        configs += [Config("LSTM", "bidirectional", 256, 128, 8), Config("LSTM", hidden=256, seq=128, batch=8,
                                                                          seq_lens=True)]
        return configs + [dataclasses.replace(c, hidden=256, seq=128, batch=8) for c in exact]
    configs = [Config(op, direction, hidden, seq, batch, None, seq_lens, attrs)
               for op, attrs in ops for direction in ("forward", "bidirectional") for hidden in (64, 256, 512)
               for seq in (16, 128) for batch in (1, 8, 32) for seq_lens in (False, True)]
    return configs + [dataclasses.replace(c, hidden=h, seq=128, batch=8) for c in exact for h in (64, 256)]


# ---------------------------------------------------------------------------------------------------------------
# Timing

def gemm_floor(matmuls: list[tuple[int, int, int, int, int, int]]) -> Callable[[], None]:
    """The matmuls a recurrent layer cannot avoid: X·Wᵀ for all steps, then one H·Rᵀ per step and direction."""
    work = []
    for steps, batch, input_size, hidden, gates, directions in matmuls:
        x = torch.randn(steps * batch, input_size)
        w = torch.randn(input_size, directions * gates * hidden)
        r = torch.randn(directions, hidden, gates * hidden)
        h = torch.randn(directions, batch, hidden)
        out = torch.empty(directions, batch, gates * hidden)
        work.append((steps, x, w, r, h, out))

    def run():
        for steps, x, w, r, h, out in work:
            x @ w
            for _ in range(steps):
                if r.shape[0] == 1:
                    torch.mm(h[0], r[0], out=out[0])
                else:
                    torch.bmm(h, r, out=out)
    return run


def interleaved_medians(fns: dict[str, Callable[[], object]], budget: float, rounds: int = 3,
                        max_samples: int = 300, settle: float = 0.0) -> dict[str, float]:
    """Median seconds per call of each function. The functions take turns, ``rounds`` times, each running for
    ``budget / rounds`` seconds (at least once) per turn, so that machine noise hits all of them alike. Each turn
    first runs its function for ``settle`` seconds untimed: with several threads, the previous turn's thread pool
    still spins for tens of milliseconds (onnxruntime's by default, OpenMP's too) and takes a core from this one."""
    samples = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(rounds):
        for key, fn in fns.items():
            start = time.perf_counter()
            while time.perf_counter() - start < settle:
                fn()
            start = time.perf_counter()
            for _ in range(max_samples // rounds):
                t0 = time.perf_counter()
                fn()
                samples[key].append(time.perf_counter() - t0)
                if samples[key][-1] + t0 - start >= budget / rounds:
                    break
    return {k: statistics.median(v) for k, v in samples.items()}


def _outputs(value) -> list[np.ndarray]:
    return [t.detach().numpy() for t in (value if isinstance(value, tuple | list) else [value])]


def check(case: Case, label: str, actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    names = [o.name for o in case.model.graph.output]
    for name, got, want in zip(names, actual, expected, strict=True):
        result = compare_arrays(name, got, want, rtol=1e-4, atol=1e-5)
        if not result.ok:
            raise AssertionError(f"{case.name} ({label}): output {name} differs from onnxruntime: {result}")


def bench_case(case: Case, threads: list[int], compiled: bool, budget: float) -> list[dict]:
    module = onnx2torch_rnn.convert(case.model)
    # where recognition fused something, the same model converted as written: what the fusion gains
    fused = any("replaces" in n.meta.get("onnx", {}) for n in module.graph.nodes)
    literal = onnx2torch_rnn.convert(case.model, fuse=False) if fused else None
    recurrent = [m for m in module.modules() if hasattr(m, "fast") and hasattr(m, "cell")]
    path = "fast" if all(m.fast for m in recurrent) else "exact"
    names = [i.name for i in runtime_inputs(case.model)]
    args = [torch.from_numpy(case.feeds[k]) for k in names]
    sessions = {}
    for n in threads:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = n, 1
        sessions[n] = ort.InferenceSession(case.model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    expected = sessions[threads[0]].run(None, case.feeds)
    with torch.no_grad():
        check(case, "eager", _outputs(module(*args)), expected)
        if literal is not None:
            check(case, "fuse=False", _outputs(literal(*args)), expected)
        if compiled:
            start = time.perf_counter()
            compiled_module = torch.compile(module, dynamic=False)
            check(case, "compiled", _outputs(compiled_module(*args)), expected)
            compile_seconds = time.perf_counter() - start
    floor = gemm_floor(case.matmuls) if case.matmuls else None
    rows = []
    for n in threads:
        torch.set_num_threads(n)
        fns = {"ort": lambda s=sessions[n]: s.run(None, case.feeds), "eager": lambda: module(*args)}
        if compiled:
            fns["compiled"] = lambda: compiled_module(*args)
        if literal is not None:
            fns["literal"] = lambda: literal(*args)
        if floor is not None:
            fns["floor"] = floor
        with torch.no_grad():
            row = interleaved_medians(fns, budget, settle=SETTLE if n > 1 else 0.0)
        row.update(config=case.name, threads=n, path=path)
        if compiled:
            row["compile_s"] = compile_seconds
        rows.append(row)
        print(format_progress(row), flush=True)
    return rows


def format_progress(r: dict) -> str:
    text = (f"{r['config']:<52} t{r['threads']} {r['path']:<5} ort {r['ort'] * 1e3:9.3f} ms  "
            f"eager {r['eager'] / r['ort']:5.2f}x")
    if "compiled" in r:
        text += f"  compiled {r['compiled'] / r['ort']:5.2f}x"
    if "literal" in r:
        text += f"  fuse=False {r['literal'] / r['ort']:5.2f}x"
    if "floor" in r:
        text += f"  floor {r['floor'] / r['ort']:5.2f}x"
    return text


# ---------------------------------------------------------------------------------------------------------------
# Conversion time and peak memory of a large model, in a fresh process

def large_lstm(path: Path, layers: int = 4, hidden: int = 1024, input_size: int = 1024) -> int:
    """Write a stacked bidirectional LSTM (layer l reads the [T, N, 2H] concatenation of layer l-1) to ``path``;
    return the weight bytes."""
    rng = np.random.default_rng(0)
    nodes, inits, x, size, total = [], [], "X", input_size, 0
    for layer in range(layers):
        for name, shape in (("W", (2, 4 * hidden, size)), ("R", (2, 4 * hidden, hidden)), ("B", (2, 8 * hidden))):
            array = rng.standard_normal(shape, dtype=np.float32) * 0.05
            inits.append(numpy_helper.from_array(array, f"{name}{layer}"))
            total += array.nbytes
        nodes += [helper.make_node("LSTM", [x, f"W{layer}", f"R{layer}", f"B{layer}"], [f"Y{layer}"],
                                   hidden_size=hidden, direction="bidirectional"),
                  helper.make_node("Transpose", [f"Y{layer}"], [f"T{layer}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"T{layer}", "shape"], [f"X{layer + 1}"])]
        x, size = f"X{layer + 1}", 2 * hidden
    inits.append(numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), "shape"))
    graph = helper.make_graph(nodes, "large", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                             ["T", "N", input_size])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["T", "N", 2 * hidden])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return total


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _measure_conversion(path: str) -> None:
    """Child process: convert ``path`` once, print seconds and peak RSS growth (bytes) as JSON."""
    before = _rss_kib("VmRSS")
    start = time.perf_counter()
    module = onnx2torch_rnn.convert(path)
    seconds = time.perf_counter() - start
    peak = _rss_kib("VmHWM")
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    print(json.dumps({"seconds": seconds, "peak_bytes": (peak - before) * 1024, "param_bytes": params}))


def conversion_benchmark() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "large_lstm.onnx"
        weight_bytes = large_lstm(path)
        runs = [json.loads(subprocess.run([sys.executable, __file__, "--measure-conversion", str(path)],
                                          check=True, capture_output=True, text=True).stdout.splitlines()[-1])
                for _ in range(3)]
    result = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    result.update(weight_bytes=weight_bytes, file_bytes=weight_bytes)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Report

def _ratio(ratio: float, target: float) -> str:
    return f"**{ratio:.2f}**" if ratio > target else f"{ratio:.2f}"


def markdown(rows: list[dict], compiled: bool) -> str:
    header = ["case", "thr", "path", "onnxruntime ms", "eager ms", "eager/ort"]
    if compiled:
        header += ["compiled ms", "compiled/eager"]
    header += ["GEMM floor ms", "floor/ort", "eager/floor", "fuse=False/ort"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["config"], str(r["threads"]), r["path"], f"{r['ort'] * 1e3:.3f}", f"{r['eager'] * 1e3:.3f}",
                 _ratio(r["eager"] / r["ort"], TARGET_EAGER)]
        if compiled:
            cells += [f"{r['compiled'] * 1e3:.3f}", _ratio(r["compiled"] / r["eager"], TARGET_COMPILED_OVER_EAGER)]
        if "floor" in r:
            cells += [f"{r['floor'] * 1e3:.3f}", f"{r['floor'] / r['ort']:.2f}", f"{r['eager'] / r['floor']:.2f}"]
        else:
            cells += ["-", "-", "-"]
        cells.append(f"{r['literal'] / r['ort']:.2f}" if "literal" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict], compiled: bool) -> str:
    """One line per op (single nodes) or for the models, and thread count; then all single nodes per thread count,
    whose median has its own target."""
    lines = ["| group | rows | median eager/ort | worst eager/ort | eager > 1.0 | median compiled/eager | "
             "compiled > 1.05x eager | median floor/ort |", "|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        op = r["config"].split()[0]
        kind = op if op in RECURRENT else "models"
        groups.setdefault(f"{kind}, {r['threads']} thread(s)", []).append(r)
        if kind != "models":
            groups.setdefault(f"all single nodes, {r['threads']} thread(s)", []).append(r)
    for key, group in sorted(groups.items(), key=lambda item: item[0].startswith("all")):
        eager = [r["eager"] / r["ort"] for r in group]
        median = statistics.median(eager)
        cells = [key, str(len(group)), _ratio(median, TARGET_MEDIAN) if key.startswith("all") else f"{median:.2f}",
                 f"{max(eager):.2f}", str(sum(e > TARGET_EAGER for e in eager))]
        if compiled:
            over = [r["compiled"] / r["eager"] for r in group]
            cells += [f"{statistics.median(over):.2f}", str(sum(c > TARGET_COMPILED_OVER_EAGER for c in over))]
        else:
            cells += ["-", "-"]
        floors = [r["floor"] / r["ort"] for r in group if "floor" in r]
        cells.append(f"{statistics.median(floors):.2f}" if floors else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The round trip: onnxruntime on the model that to_onnx writes, against onnxruntime on the original

def _example_dims(case: Case) -> dict[str, int]:
    """Each symbolic dim at its size in the case's inputs, at least 2 so that it stays dynamic (an unrolled model
    reads the number of steps it was exported with)."""
    dims = {}
    for info in case.model.graph.input:
        if info.name in case.feeds:
            for dim, size in zip(info.type.tensor_type.shape.dim, np.shape(case.feeds[info.name]), strict=False):
                if dim.dim_param:
                    dims[dim.dim_param] = max(int(size), 2)
    return dims


def reexport_rows(cases: list[Case], threads: list[int], budget: float) -> list[dict]:
    rows = []
    for case in cases:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "reexported.onnx"
            # checked against the module
            onnx2torch_rnn.to_onnx(onnx2torch_rnn.convert(case.model), path, dims=_example_dims(case))
            reexported = onnx.load(str(path))
        for n in threads:
            options = ort.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = n, 1
            sessions = {name: ort.InferenceSession(model.SerializeToString(), options,
                                                   providers=["CPUExecutionProvider"])
                        for name, model in (("original", case.model), ("reexported", reexported))}
            runs = {k: lambda s=s, feeds=case.feeds: s.run(None, feeds) for k, s in sessions.items()}
            row = interleaved_medians(runs, budget, settle=SETTLE if n > 1 else 0.0)
            row.update(config=case.name, threads=n)
            rows.append(row)
            print(f"{case.name:<52} t{n} original in ort {row['original'] * 1e3:8.3f} ms  to_onnx's "
                  f"{row['reexported'] / row['original']:5.2f}x", flush=True)
    return rows


def reexport_markdown(rows: list[dict]) -> str:
    lines = ["| model (onnxruntime) | thr | original ms | to_onnx's ms | to_onnx's/original |", "|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['threads']} | {r['original'] * 1e3:.3f} | {r['reexported'] * 1e3:.3f} | "
              f"{_ratio(r['reexported'] / r['original'], TARGET_REEXPORT)} |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# A training step of the converted tagger against the original PyTorch module

def train_step_rows(threads: list[int], budget: float, shapes=((1, 16), (8, 64))) -> list[dict]:
    sys.path.insert(0, str(ROOT / "examples"))
    from make_examples import BiLSTMTagger  # the module bilstm_tagger.onnx was exported from

    torch.manual_seed(0)  # as make_examples.py: the same weights as the bundled model
    original = BiLSTMTagger()
    converted = onnx2torch_rnn.convert(ROOT / "examples" / "bilstm_tagger.onnx")
    tokens = torch.randint(0, 50, (2, 7))
    with torch.no_grad():  # the same function, or the comparison means nothing
        torch.testing.assert_close(converted(tokens), original(tokens), rtol=1e-4, atol=1e-5)
    rows = []
    for batch, steps in shapes:  # the number of steps each takes differs: the weights part after the first shape
        tokens = torch.randint(0, 50, (batch, steps))
        tags = torch.randint(0, 5, (batch, steps))
        steps_of = {}
        for name, module in (("original", original), ("converted", converted)):
            optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)

            def step(module=module, optimizer=optimizer, tokens=tokens, tags=tags):
                optimizer.zero_grad()
                scores = module(tokens)
                torch.nn.functional.cross_entropy(scores.reshape(-1, scores.shape[-1]), tags.reshape(-1)).backward()
                optimizer.step()
            steps_of[name] = step
        for n in threads:
            torch.set_num_threads(n)
            row = interleaved_medians(steps_of, budget, settle=SETTLE if n > 1 else 0.0)
            row.update(config=f"train step: examples/bilstm_tagger.onnx T{steps} B{batch}", threads=n)
            rows.append(row)
            print(f"{row['config']:<52} t{n} original {row['original'] * 1e3:8.3f} ms  converted "
                  f"{row['converted'] / row['original']:5.2f}x", flush=True)
    return rows


def train_markdown(rows: list[dict]) -> str:
    lines = ["| case | thr | original module ms | converted ms | converted/original (target <= 1.1) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['threads']} | {r['original'] * 1e3:.3f} | {r['converted'] * 1e3:.3f} | "
              f"{_ratio(r['converted'] / r['original'], TARGET_TRAIN)} |" for r in rows]
    return "\n".join(lines)


def conversion_markdown(c: dict) -> str:
    mb = c["weight_bytes"] / 1e6
    return ("| model | weights MB | conversion s | s per 100 MB (target <= 1) | peak memory MB | peak / weights "
            "(target <= 2) |\n|---|---|---|---|---|---|\n"
            f"| 4-layer bidirectional LSTM, hidden 1024 | {mb:.0f} | {c['seconds']:.2f} | "
            f"{c['seconds'] / mb * 100:.2f} | {c['peak_bytes'] / 1e6:.0f} | "
            f"{c['peak_bytes'] / c['weight_bytes']:.2f} |")


# ---------------------------------------------------------------------------------------------------------------
# A busy machine: the quick suite while other processes keep every core busy

TARGET_BUSY = 1.3  # under load, 2 threads <= 1.3x our 1 thread and <= 1.3x onnxruntime's 2 threads


@contextlib.contextmanager
def spinning(count: int):
    """``count`` processes, each keeping a core busy (as a web server, a DataLoader or CI jobs next to the model)."""
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"  # ends with this process
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]
    try:
        time.sleep(0.3)  # let them start
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def thread_turns(case: Case, budget: float, rounds: int = 10) -> dict[str, float]:
    """Median ms of the converted module (eager, no grad) and onnxruntime at 1 and 2 threads, in short turns that
    take their turn ``rounds`` times, so that a load that comes and goes (other users) hits all four alike."""
    module = onnx2torch_rnn.convert(case.model)
    args = [torch.from_numpy(case.feeds[i.name]) for i in runtime_inputs(case.model)]
    variants = {"eager1": (1, lambda: module(*args)), "eager2": (2, lambda: module(*args))}
    for n in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = n, 1
        session = ort.InferenceSession(case.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        variants[f"ort{n}"] = n, lambda s=session: s.run(None, case.feeds)
    samples = {key: [] for key in variants}
    with torch.no_grad():
        check(case, "eager", _outputs(module(*args)), variants["ort1"][1]())
        for _ in range(rounds):
            for key, (threads, fn) in variants.items():
                torch.set_num_threads(threads)
                fn()  # untimed: the first call after a change of threads
                start = time.perf_counter()
                while key == "eager1" and time.perf_counter() - start < SETTLE:  # onnxruntime's 2 threads spin on
                    fn()
                start = time.perf_counter()
                while time.perf_counter() - start < budget / rounds:
                    t0 = time.perf_counter()
                    fn()
                    samples[key].append(time.perf_counter() - t0)
    return {key: statistics.median(v) for key, v in samples.items()}


def busy_rows(cases: list[Case], budget: float) -> list[dict]:
    """Each case at 1 and 2 threads (eager and onnxruntime, see thread_turns), idle and then while os.cpu_count()
    processes spin: the two phases of a case follow each other, so that both see the same machine (other users'
    load included)."""
    rows = []
    threads = torch.get_num_threads()
    for case in cases:
        row = {"config": case.name}
        for phase, load in (("idle", contextlib.nullcontext()), ("busy", spinning(os.cpu_count() or 1))):
            with load:
                row.update({f"{phase} {key}": value for key, value in thread_turns(case, budget).items()})
        print(f"{case.name:<52} idle 2/1 thr {row['idle eager2'] / row['idle eager1']:5.2f}  busy 2/1 thr "
              f"{row['busy eager2'] / row['busy eager1']:5.2f}  busy eager/ort 2 thr "
              f"{row['busy eager2'] / row['busy ort2']:5.2f}", flush=True)
        rows.append(row)
    torch.set_num_threads(threads)
    return rows


def busy_markdown(rows: list[dict]) -> str:
    lines = ["| case | idle eager 1 thr ms | 2 thr ms | ort 2 thr ms | eager/ort 2 thr | busy eager 1 thr ms | "
             "2 thr ms | ort 2 thr ms | eager 2/1 thr | eager/ort 2 thr |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['idle eager1'] * 1e3:.3f} | {r['idle eager2'] * 1e3:.3f} | "
                     f"{r['idle ort2'] * 1e3:.3f} | {r['idle eager2'] / r['idle ort2']:.2f} | "
                     f"{r['busy eager1'] * 1e3:.3f} | {r['busy eager2'] * 1e3:.3f} | {r['busy ort2'] * 1e3:.3f} | "
                     f"{_ratio(r['busy eager2'] / r['busy eager1'], TARGET_BUSY)} | "
                     f"{_ratio(r['busy eager2'] / r['busy ort2'], TARGET_BUSY)} |")
    over = sum(r["busy eager2"] > TARGET_BUSY * min(r["busy eager1"], r["busy ort2"]) for r in rows)
    lines += ["", f"{over} of {len(rows)} rows past a busy target ({TARGET_BUSY}x)."]
    return "\n".join(lines)


def busy_main(args) -> int:
    """--busy: the quick suite's single nodes and whole models, idle and under load; writes bench/results/busy.md."""
    cases = [recurrent_model(c) for c in suite("quick")] + (model_cases() if args.models else [])
    cases = [c for c in cases if re.search(args.filter, c.name)]
    load_before = os.getloadavg()
    rows = busy_rows(cases, args.budget or 0.5)
    text = (f"torch {torch.__version__}, onnxruntime {ort.__version__}, {machine()}; load averages (1, 5, 15 min) "
            f"{' '.join(f'{v:.1f}' for v in load_before)} before (other users), "
            f"{' '.join(f'{v:.1f}' for v in os.getloadavg())} after (ours included). Busy: "
            f"{os.cpu_count()} spinning processes, one per core. Ratios past {TARGET_BUSY} in bold.\n\n"
            + busy_markdown(rows))
    out = args.out or HERE / "results" / "busy.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(text)
    print(f"written to {out}")
    return 0


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=["quick", "full", "real", "int8"], default="full",
                        help="real: the models that public packages ship (bench/real_models.py); int8: the quantized "
                        "test models and the real int8 ones (bench/int8_models.py)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile'd timings")
    parser.add_argument("--no-models", dest="models", action="store_false", help="skip the whole-model cases")
    parser.add_argument("--no-train", dest="train", action="store_false", help="skip the training-step rows")
    parser.add_argument("--no-reexport", dest="reexport", action="store_false",
                        help="skip onnxruntime on the models that to_onnx writes back")
    parser.add_argument("--no-conversion", dest="conversion", action="store_false",
                        help="skip the large-model conversion benchmark")
    parser.add_argument("--filter", default="", help="only cases whose name matches this regular expression")
    parser.add_argument("--budget", type=float, default=None, help="seconds of timing per variant and row")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--busy", action="store_true",
                        help="the quick suite (1 and 2 threads), idle and while one spinning process per core runs")
    parser.add_argument("--measure-conversion", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_conversion:
        _measure_conversion(args.measure_conversion)
        return 0
    if args.busy:
        return busy_main(args)
    if args.suite == "real":
        from real_models import run_suite

        return run_suite(args.threads, args.compile, args.train, args.filter, args.budget, args.out)
    if args.suite == "int8":
        from int8_models import run_suite

        return run_suite(args.threads, args.budget, args.filter, args.out)
    budget = args.budget or (0.15 if args.suite == "full" else 0.5)
    out = args.out or HERE / "results" / f"{args.suite}.md"
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    threads_max = torch.get_num_threads()
    cases = (recurrent_model(c) for c in suite(args.suite))
    rows, models = [], model_cases() if args.models else []
    for case in list(cases) + models:
        if re.search(args.filter, case.name):
            rows += bench_case(case, args.threads, args.compile, budget)
    train = train_step_rows(args.threads, budget) if args.train else []
    native = [c for c in models if c.name.startswith(("torch.onnx", "examples")) and re.search(args.filter, c.name)]
    reexport = reexport_rows(native, args.threads, budget) if args.reexport else []
    torch.set_num_threads(threads_max)
    conversion = conversion_benchmark() if args.conversion else None
    minutes = (time.perf_counter() - started) / 60
    text = [f"Benchmark ({args.suite} suite, {len(rows)} rows, {minutes:.1f} min): torch {torch.__version__}, "
            f"onnxruntime {ort.__version__}, Python {platform.python_version()}, {machine()}, load average "
            f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after (more than 0 means other processes shared "
            "the cores: with 2 threads torch's OpenMP regions then stall while onnxruntime's pool does not).",
            "Times are medians per call; ratios past their target in bold (eager/ort: 1.0, and a median of 0.8 over "
            "the single nodes; compiled/eager: 1.05; training step: 1.1; to_onnx's model: 1.05, noise). path: the "
            "module's training path (fast: nn.LSTM/GRU/RNN weights); inference runs the native kernel either way. "
            "floor = the same matmuls alone in torch. fuse=False: the model converted as written, where recognition "
            "fused something.", "", summary(rows, args.compile), "",
            markdown(rows, args.compile)]
    if train:
        text += ["", train_markdown(train)]
    if reexport:
        text += ["", reexport_markdown(reexport)]
    if conversion:
        text += ["", conversion_markdown(conversion)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")
    print("\n".join(text[:5]))
    if train:
        print(train_markdown(train))
    if reexport:
        print(reexport_markdown(reexport))
    if conversion:
        print(conversion_markdown(conversion))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
