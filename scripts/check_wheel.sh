#!/usr/bin/env bash
# The wheel as a user gets it: built by README's command (Installation) against .venv's torch, installed into a fresh
# venv, and run there with no compiler on PATH (so a build on first use cannot happen): the wheel's prebuilt kernel
# loads, the first conversion of the bundled example takes under 5 s, the recurrent tests pass, and the kernel's tests
# pass under each kernel variant this CPU runs (ONNX2TORCH_RNN_CPU). CI runs it, then scripts/check_versions.sh with
# KERNEL_WHEEL set to the wheel it leaves in dist/ (its stable-ABI library under another torch).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m pip wheel --quiet --no-build-isolation --no-deps -w "$work/dist" .
wheel=$(ls "$work"/dist/*.whl)
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
mkdir -p dist && rm -f dist/onnx2torch_rnn-*.whl && cp "$wheel" dist/
.venv/bin/python -m venv "$work/venv"
# torch pinned as in .venv (constraints.txt: the CPU build on this machine's disk)
"$work/venv/bin/python" -m pip install --quiet -c constraints.txt "$wheel[test]" 2>&1 | { grep -v "^WARNING: Location" || true; }
cp -r tests examples pyproject.toml "$work/"  # the tests, away from this checkout's package
cd "$work"
(
export PATH="$work/venv/bin"  # python, pytest and ninja; no c++, g++, gcc or cc
unset CXX CC
for compiler in c++ g++ gcc cc; do
    if command -v "$compiler" > /dev/null; then echo "a compiler is on PATH: $compiler"; exit 1; fi
done
python - <<'PY'
import sys
import time

start = time.perf_counter()
import torch  # noqa: E402

import onnx2torch_rnn  # noqa: E402
from onnx2torch_rnn.recurrent import kernel  # noqa: E402

model = onnx2torch_rnn.convert("examples/bilstm_tagger.onnx")
model(torch.randint(0, 50, (4, 9)))
seconds = time.perf_counter() - start
print(f"import, first conversion of examples/bilstm_tagger.onnx and its first call: {seconds:.2f} s; kernel "
      f"variant {kernel.variant()} of {kernel.supported()}, from {kernel.library()}")
assert onnx2torch_rnn.__file__.startswith(sys.prefix), onnx2torch_rnn.__file__
for library in ("recurrent", "int8"):
    assert kernel.library(library) == str(kernel.prebuilt(kernel.variant(), library)), f"{library}: not the wheel's"
assert seconds < 5, f"the first conversion took {seconds:.2f} s"
PY
# the recurrent tests with the variant this CPU runs best; the kernel's own tests (against the Python path) with
# each other variant it runs
variants=($(python -c "from onnx2torch_rnn.recurrent import kernel; print(*kernel.supported())"))
for variant in "${variants[@]}"; do
    echo "kernel variant $variant:"
    files=(tests/test_kernel.py tests/test_quantized_kernel.py)
    [ "$variant" = "${variants[0]}" ] && files+=(tests/converters/test_recurrent.py tests/converters/test_recurrent_backend.py)
    ONNX2TORCH_RNN_CPU=$variant python -m pytest -n 2 -q -p no:cacheprovider "${files[@]}"
done
)
