"""bench/gpu.py (the GPU bench, issue 27) runs: its --smoke sizes on CPU, every section, no row failing. The timings
mean nothing here; this keeps the script from rotting between the sessions that have a GPU for it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_bench_smoke_runs_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "gpu.md"
    assert bench.main(["--smoke", "--device", "cpu", "--out", str(out), "--tests", "7 passed"]) == 0
    table = out.read_text()
    for section in ("tests", "train", "cell train", "cell infer", "infer", "curve"):
        assert f"| {section} |" in table, section
    for precision in ("float32", "bfloat16"):
        assert f"| {precision} |" in table, precision
    assert "failed" not in table and "skipped" not in table
