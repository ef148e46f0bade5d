"""allocator.py: the first inference call of a converted graph keeps malloc's freed memory for the next calls (glibc
gave an 8 MiB block back to the OS after each call and faulted its pages in again on the next)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from onnx2torch_rnn import allocator

ROOT = Path(__file__).resolve().parents[1]

# minor page faults per call of tanh(a + b) on two 8 MiB results, before and after a converted graph's first call
PROBE = """
import resource
import numpy as np, torch
from onnx import helper
import onnx2torch_rnn
from tests.helpers import make_model

def faults(fn, calls=10):
    fn(), fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls

a, b = torch.randn(64, 1, 512), torch.randn(1, 64, 512)
nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Tanh", ["s"], ["y"])]
model = make_model(nodes, [("a", np.float32, [64, 1, 512]), ("b", np.float32, [1, 64, 512])],
                   [("y", np.float32, [64, 64, 512])])
module = onnx2torch_rnn.convert(model)
with torch.no_grad():
    plain = faults(lambda: torch.tanh(a + b))
    converted = faults(lambda: module(a, b))
    print(plain, converted, faults(lambda: torch.tanh(a + b)))
"""


def _probe(**env) -> list[float]:
    clean = {k: v for k, v in os.environ.items() if not allocator.user_tuned_by(k) and k != allocator.OPT_OUT}
    result = subprocess.run([sys.executable, "-c", PROBE], env={**clean, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=True)
    return [float(n) for n in result.stdout.split()]


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_memory_is_kept_after_the_first_inference_call():
    plain, converted, after = _probe()
    assert plain > 1000  # glibc's defaults: about 2 x 2048 pages a call
    assert converted < 50 and after < 50  # process-wide from the first converted call on


@pytest.mark.parametrize("name, value", [("ONNX2TORCH_RNN_KEEP_MEMORY", "0"), ("MALLOC_ARENA_MAX", "2"),
                                         ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"),
                                         ("LD_PRELOAD", "libjemalloc.so.2")])
def test_a_user_who_tuned_malloc_keeps_it(monkeypatch, name, value):
    for key in [k for k in os.environ if allocator.user_tuned_by(k) or k == allocator.OPT_OUT]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(allocator.OPT_OUT, "1")
    assert not allocator.user_tuned()
    monkeypatch.setenv(name, value)
    assert allocator.user_tuned()
