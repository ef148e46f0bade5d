#!/usr/bin/env bash
# Run the test suite on another Python and/or torch than .venv's (Python 3.11, torch 2.13.0 CPU from constraints.txt).
# CI runs  bash scripts/check_versions.sh 3.13 2.14.1  (the highest of both that pyproject allows); before widening
# pyproject's ranges, e.g.:  bash scripts/check_versions.sh 3.13 2.15.0
# Creates .venv-py<PYTHON>-torch<TORCH> once (python<PYTHON> from PATH or pyenv; torch from the package index: the
# CUDA build, with its nvidia-* wheels, about 5 GB), builds the native kernel and runs pytest (extra arguments go to pytest).
# KERNEL_WHEEL=dist/onnx2torch_rnn-...whl (CI: the one scripts/check_wheel.sh built with .venv's torch): the kernel's
# prebuilt libraries come from that wheel, put into the checkout's kernel folder for the run (where an in-place build
# would put them), and both (PyTorch's stable ABI) must load from there, not be built here: one wheel for every
# torch from its stable ABI on.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=${1:?usage: check_versions.sh PYTHON_VERSION TORCH_VERSION [pytest args...]}
torch_version=${2:?usage: check_versions.sh PYTHON_VERSION TORCH_VERSION [pytest args...]}
shift 2
venv=".venv-py${python_version}-torch${torch_version}"
if [ ! -x "$venv/bin/python" ]; then
    pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}  # pyenv's own build of that version, else python<PYTHON> from PATH
    installed=$(ls "$pyenv_root/versions" 2>/dev/null | grep "^${python_version}\.[0-9]*$" | sort -V | tail -1 || true)
    python=${installed:+$pyenv_root/versions/$installed/bin/python}
    python=${python:-python${python_version}}
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==${torch_version}" -e '.[test]'
fi
"$venv/bin/python" -c "import sys, torch, onnx, onnxruntime, numpy; print('python', sys.version.split()[0], '| torch', torch.__version__, '| onnx', onnx.__version__, '| onnxruntime', onnxruntime.__version__, '| numpy', numpy.__version__)"
kernel_folder=onnx2torch_rnn/recurrent/kernel
if [ -n "${KERNEL_WHEEL:-}" ]; then
    trap 'rm -f "$kernel_folder"/*.so' EXIT
    unzip -q -o "$KERNEL_WHEEL" "$kernel_folder/*.so"
fi
"$venv/bin/python" - <<'PY'
import os
from onnx2torch_rnn.recurrent import kernel
print('native recurrent kernel:', kernel.variant() if kernel.load() else 'NOT built (the Python path will run)',
      *(f'{library}: {kernel.library(library)}' for library in ('recurrent', 'int8')))
if os.environ.get('KERNEL_WHEEL'):
    for library in ('recurrent', 'int8'):
        assert kernel.library(library) == str(kernel.prebuilt(kernel.variant(), library)), \
            f"the wheel's {library} library did not load"
PY
"$venv/bin/python" -m pytest -n 2 -q "$@"
