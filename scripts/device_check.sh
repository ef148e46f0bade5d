#!/usr/bin/env bash
# On a machine with a CUDA GPU (a lent one, for a few minutes): the CUDA tests, then the GPU bench (bench/gpu.py),
# in one go; prints one table at the end and writes it to bench/results/gpu.md ($OUT/gpu.md where OUT is set, as on
# the lent machine, whose files come back from there).
#
#   bash scripts/device_check.sh [bench/gpu.py options, e.g. --minutes 4 --sections train cells]
#
# PYTHON: the interpreter (default .venv/bin/python where there is one, else python3: a GPU image's, holding torch,
# onnx, onnxruntime and pytest); the package is this checkout's (PYTHONPATH). The native CPU kernel is not built
# (ONNX2TORCH_RNN_NATIVE=0 unless set): the GPU runs the Python path anyway, and the build would cost device time.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ONNX2TORCH_RNN_NATIVE="${ONNX2TORCH_RNN_NATIVE:-0}"
out="${OUT:-bench/results}"
mkdir -p "$out"
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

# the CUDA tests (test_devices.py's cases also run on CPU, which checks the cases themselves)
"$PYTHON" -m pytest -q -p no:cacheprovider -n 4 tests/test_devices.py tests/test_training.py::test_cuda_matches_cpu \
    2>&1 | tee "$out/tests.log"
tests_rc=${PIPESTATUS[0]}
summary=$(grep -E "[0-9]+ (passed|failed|error)" "$out/tests.log" | tail -n 1 | tr -d '=' | xargs)

"$PYTHON" bench/gpu.py --tests "${summary:-no summary} (pytest exit $tests_rc)" --out "$out/gpu.md" "$@" \
    > "$out/bench.log" 2>&1
bench_rc=$?
tail -n "$([ "$bench_rc" -eq 0 ] && echo 2 || echo 40)" "$out/bench.log"
echo
cat "$out/gpu.md"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
