"""The int8 suite: issue #25's speed rows, against onnxruntime at the same thread count, eager.

    .venv/bin/python bench/run.py --suite int8 [--threads 1] [--filter REGEX] [--budget S]

Rows: every committed quantized test model (tests/models/quantized, onnxruntime's quantization tool on the float test
models: quantize_dynamic and quantize_static in QDQ and QOperator formats) at its export sizes, then the real int8
models of the real-model suite (real_models.py, fetched at bench time; skipped without the network). Each is
converted, checked against onnxruntime (a model that differs beyond 1e-4 is marked and the run exits 1) and timed
interleaved with onnxruntime (default session options) in one process. The target: median eager/ort <= 1.5 over all
rows, none over 3.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from pathlib import Path

import onnxruntime as ort
import torch
from real_models import REAL_MODELS, _mismatches, _session, bench_model, fetch
from run import ROOT, interleaved_medians, machine

import onnx2torch_rnn

sys.path.insert(0, str(ROOT))
from tests.exporters.common import manifest_input_sets, read_manifest

FOLDER = ROOT / "tests" / "models" / "quantized"


def test_model_rows(threads: list[int], budget: float, pattern: str) -> list[dict]:
    rows = []
    for entry in read_manifest(FOLDER)["models"]:
        if not re.search(pattern, entry["file"]):
            continue
        path = FOLDER / entry["file"]
        feeds = manifest_input_sets(FOLDER, entry, entry["sizes"])[0]
        module = onnx2torch_rnn.convert(path).eval()
        for n in threads:
            torch.set_num_threads(n)
            session = _session(path, n)
            args = [torch.from_numpy(feeds[i.name]) for i in session.get_inputs()]
            with torch.inference_mode():
                mismatch = _mismatches(session, module(*args), session.run(None, feeds))
                fns = {"ort": lambda s=session, f=feeds: s.run(None, f), "eager": lambda m=module, a=args: m(*a)}
                row = interleaved_medians(fns, budget)
            row.update(config=entry["file"].removesuffix(".onnx"), threads=n, mismatch="; ".join(mismatch))
            rows.append(row)
            print(f"{row['config']:<42} t{n} ort {row['ort'] * 1e6:8.1f} us  eager {row['eager'] * 1e6:8.1f} us  "
                  f"{row['eager'] / row['ort']:5.2f}x{' DIFFERS: ' + row['mismatch'] if mismatch else ''}", flush=True)
    return rows


def run_suite(threads: list[int], budget: float | None, pattern: str, out: Path | None) -> int:
    budget, out = budget or 0.3, out or ROOT / "bench" / "results" / "int8.md"
    started, load_before, threads_max = time.perf_counter(), os.getloadavg()[0], torch.get_num_threads()
    rows = test_model_rows(threads, budget, pattern)
    for model in REAL_MODELS:
        if "int8" in model.name and re.search(pattern, model.name) and (path := fetch(model)) is not None:
            rows += [dict(r, config=f"{r['config']} (real)") for r in bench_model(model, path, threads, False, budget)]
    torch.set_num_threads(threads_max)
    minutes = (time.perf_counter() - started) / 60
    text = [f"int8 suite ({len(rows)} rows, {minutes:.1f} min): torch {torch.__version__}, onnxruntime "
            f"{ort.__version__}, {machine()}, load average {load_before:.1f} before and "
            f"{os.getloadavg()[0]:.1f} after. Medians per call, interleaved with onnxruntime in one process.", "",
            "| threads | rows | median eager/ort (target <= 1.5) | worst (target <= 3) |", "|---|---|---|---|"]
    for n in threads:
        ratios = [r["eager"] / r["ort"] for r in rows if r["threads"] == n]
        if ratios:
            text.append(f"| {n} | {len(ratios)} | {statistics.median(ratios):.2f} | {max(ratios):.2f} |")
    text += ["", "| model | thr | onnxruntime us | eager us | eager/ort |", "|---|---|---|---|---|"]
    text += [f"| {r['config']}{' (DIFFERS: ' + r['mismatch'] + ')' if r['mismatch'] else ''} | {r['threads']} | "
             f"{r['ort'] * 1e6:.1f} | {r['eager'] * 1e6:.1f} | {r['eager'] / r['ort']:.2f} |" for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 1 if any(r["mismatch"] for r in rows) else 0
