#!/usr/bin/env bash
# Create .venv (once) and install onnx2torch-rnn with its test extra into it.
# torch is pinned by constraints.txt to the CPU build this machine has locally; pyproject allows a range.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
# Build the native recurrent kernel now (about 20 s, once per machine and checkout) rather than at the first conversion.
.venv/bin/python -c "from onnx2torch_rnn.recurrent import kernel; print('native recurrent kernel:', kernel.variant() if kernel.load() else 'NOT built (the Python path will run)')"
