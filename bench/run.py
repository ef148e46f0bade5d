"""Benchmark converted recurrent models against onnxruntime, in one process and one run.

    .venv/bin/python bench/run.py [--suite quick|full] [--threads 1 2] [--compile] [--out bench/results/latest.md]

For each configuration: build the ONNX model, convert it, check the converted outputs against onnxruntime (the run
fails on a mismatch: speed never trades correctness), then time onnxruntime, the converted module (eager, and
torch.compile'd with --compile) and the GEMM floor (the same matmuls alone: one input projection for all steps plus
one recurrent matmul per step), with the same thread count for torch and onnxruntime. Reports medians and ratios
as a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import compare_arrays

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


@dataclasses.dataclass(frozen=True)
class Config:
    op: str
    direction: str = "forward"
    hidden: int = 64
    seq: int = 16
    batch: int = 1
    input_size: int = 64
    seq_lens: bool = False
    attrs: tuple = ()  # extra ONNX attributes, e.g. (("clip", 5.0),)
    peepholes: bool = False
    label: str = ""

    @property
    def name(self) -> str:
        extra = self.label or ", ".join(f"{k}={v}" for k, v in self.attrs)
        return (f"{self.op} {self.direction[:3]} H{self.hidden} T{self.seq} B{self.batch}"
                + (" lens" if self.seq_lens else "") + (f" {extra}" if extra else ""))


def recurrent_model(cfg: Config) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    d = 2 if cfg.direction == "bidirectional" else 1
    g, h, i = GATES[cfg.op], cfg.hidden, cfg.input_size
    scale = 1 / np.sqrt(h)
    init = {"W": rng.uniform(-scale, scale, (d, g * h, i)), "R": rng.uniform(-scale, scale, (d, g * h, h)),
            "B": rng.uniform(-scale, scale, (d, 2 * g * h))}
    inputs = ["X", "W", "R", "B", "sequence_lens" if cfg.seq_lens else ""]
    if cfg.peepholes:
        init["P"] = rng.uniform(-scale, scale, (d, 3 * h))
        inputs += ["", "", "P"]
    outputs = ["Y", "Y_h"]
    node = helper.make_node(cfg.op, inputs, outputs, hidden_size=h, direction=cfg.direction, **dict(cfg.attrs))
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [cfg.seq, cfg.batch, i])]
    feeds = {"X": rng.standard_normal((cfg.seq, cfg.batch, i)).astype(np.float32)}
    if cfg.seq_lens:
        graph_inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [cfg.batch]))
        feeds["sequence_lens"] = rng.integers(1, cfg.seq + 1, cfg.batch).astype(np.int32)
        feeds["sequence_lens"][0] = cfg.seq
    graph = helper.make_graph(
        [node], "bench", graph_inputs,
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [cfg.seq, d, cfg.batch, h]),
         helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [d, cfg.batch, h])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in init.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, feeds


def median_seconds(fn, budget: float = 1.0, min_runs: int = 5, max_runs: int = 200) -> float:
    fn()  # warm-up (and compilation)
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < budget and len(times) < max_runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_floor(cfg: Config) -> callable:
    """The matmuls a recurrent layer cannot avoid: X·Wᵀ for all steps, then one H·Rᵀ per step and direction."""
    d = 2 if cfg.direction == "bidirectional" else 1
    g = GATES[cfg.op]
    x = torch.randn(cfg.seq * cfg.batch, cfg.input_size)
    w = torch.randn(cfg.input_size, d * g * cfg.hidden)
    r = torch.randn(d, cfg.hidden, g * cfg.hidden)
    h = torch.randn(d, cfg.batch, cfg.hidden)

    def run():
        with torch.no_grad():
            x @ w
            for _ in range(cfg.seq):
                torch.bmm(h, r)
    return run


def bench_one(cfg: Config, threads: int, compiled: bool) -> dict:
    model, feeds = recurrent_model(cfg)
    torch.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    module = onnx2torch_rnn.convert(model).eval()
    args = [torch.from_numpy(feeds[k]) for k in feeds]
    expected = session.run(None, feeds)
    with torch.no_grad():
        actual = [t.numpy() for t in module(*args)]
    for name, got, want in zip(("Y", "Y_h"), actual, expected, strict=True):
        result = compare_arrays(name, got, want, rtol=1e-4, atol=1e-5)
        if not result.ok:
            raise AssertionError(f"{cfg.name}: output {name} differs from onnxruntime: {result}")

    def torch_run(m=module):
        with torch.no_grad():
            m(*args)

    row = {"config": cfg.name, "threads": threads,
           "ort": median_seconds(lambda: session.run(None, feeds)),
           "eager": median_seconds(torch_run),
           "floor": median_seconds(gemm_floor(cfg))}
    if compiled:
        compiled_module = torch.compile(module, dynamic=False)
        row["compiled"] = median_seconds(lambda: torch_run(compiled_module))
    return row


def suite(name: str) -> list[Config]:
    exact = [Config("LSTM", peepholes=True, label="peepholes"), Config("LSTM", attrs=(("clip", 3.0),)),
             Config("GRU", attrs=(("linear_before_reset", 0),), label="lbr=0"),
             Config("RNN", attrs=(("activations", ["Sigmoid"]),), label="Sigmoid")]
    if name == "quick":
        base = [Config(op, attrs=attrs) for op, attrs in
                [("LSTM", ()), ("GRU", (("linear_before_reset", 1),)), ("RNN", ())]]
        sizes = [dict(hidden=64, seq=16, batch=1), dict(hidden=256, seq=128, batch=8)]
        configs = [dataclasses.replace(c, **s) for c in base for s in sizes]
        configs += [dataclasses.replace(configs[1], direction="bidirectional"),
                    dataclasses.replace(configs[1], seq_lens=True)]
        return configs + [dataclasses.replace(c, hidden=256, seq=128, batch=8) for c in exact]
    configs = []
    for op, attrs in [("LSTM", ()), ("GRU", (("linear_before_reset", 1),)), ("GRU", (("linear_before_reset", 0),)),
                      ("RNN", ())]:
        for direction in ("forward", "bidirectional"):
            for hidden in (64, 256, 512):
                for seq in (16, 128):
                    for batch in (1, 8, 32):
                        for seq_lens in (False, True):
                            configs.append(Config(op, direction, hidden, seq, batch, hidden, seq_lens, attrs))
    return configs + exact


def markdown(rows: list[dict], compiled: bool) -> str:
    header = ["config", "threads", "onnxruntime ms", "eager ms", "eager/ort"]
    if compiled:
        header += ["compiled ms", "compiled/ort"]
    header += ["GEMM floor ms", "eager/floor"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["config"], str(r["threads"]), f"{r['ort'] * 1e3:.3f}", f"{r['eager'] * 1e3:.3f}",
                 f"{r['eager'] / r['ort']:.2f}"]
        if compiled:
            cells += [f"{r['compiled'] * 1e3:.3f}", f"{r['compiled'] / r['ort']:.2f}"]
        cells += [f"{r['floor'] * 1e3:.3f}", f"{r['eager'] / r['floor']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=["quick", "full"], default="quick")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd modules")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "latest.md")
    args = parser.parse_args(argv)
    rows = []
    for cfg in suite(args.suite):
        for threads in args.threads:
            rows.append(bench_one(cfg, threads, args.compile))
            r = rows[-1]
            print(f"{r['config']:<45} t{threads}  ort {r['ort'] * 1e3:8.3f} ms  eager {r['eager'] * 1e3:8.3f} ms  "
                  f"ratio {r['eager'] / r['ort']:.2f}", flush=True)
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads max"
    text = (f"Benchmark ({args.suite} suite), torch {torch.__version__}, onnxruntime {ort.__version__}, "
            f"{machine}, Python {platform.python_version()}\n\n{markdown(rows, args.compile)}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
