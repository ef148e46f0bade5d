"""The command line: ops and check, with their exit codes."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper

from onnx2torch_rnn.cli import main
from tests.helpers import make_model

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "bilstm_tagger.onnx"


def test_ops_lists_counts_and_exits_1_when_something_is_unsupported(tmp_path, capsys):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Mystery", ["b"], ["y"], domain="test.custom")]
    model = make_model(nodes, [("x", np.float32, [2])], [("y", np.float32, [2])], extra_opsets={"test.custom": 1})
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["ops", str(tmp_path / "m.onnx")]) == 1
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    assert ["Relu", "2", "17", "yes"] in rows and ["test.custom::Mystery", "1", "1", "NO"] in rows
    assert "2 op types, 3 nodes, 1 unsupported" in out


def test_check_passes_on_the_bundled_example(capsys):
    assert main(["check", str(EXAMPLE), "--dim", "batch=2", "--dim", "time=5"]) == 0
    out = capsys.readouterr().out
    assert "input tokens: int64 [2, 5]" in out and "all outputs match onnxruntime" in out


def test_check_exit_codes_for_unconvertible_models(tmp_path, capsys):
    model = make_model([helper.make_node("Mystery", ["x"], ["y"], domain="test.custom", name="odd")],
                       [("x", np.float32, [2])], [("y", np.float32, [2])], extra_opsets={"test.custom": 1})
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["check", str(tmp_path / "m.onnx")]) == 2
    assert "test.custom::Mystery" in capsys.readouterr().err


def test_check_exits_1_on_a_mismatch(tmp_path, capsys):
    from onnx2torch_rnn import Converted, register_converter
    from onnx2torch_rnn.modules.common import Function
    from onnx2torch_rnn.registry import _CONVERTERS, OperationKey

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [4])], ["y"])
    onnx.save(model, tmp_path / "m.onnx")
    key = OperationKey("", "Relu", 14)
    original = _CONVERTERS[key]
    try:
        register_converter("Relu", 14, replace=True)(lambda node, ctx: Converted(Function(torch.abs), node.inputs))
        assert main(["check", str(tmp_path / "m.onnx")]) == 1
    finally:
        _CONVERTERS[key] = original
    assert "MISMATCH" in capsys.readouterr().out


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "onnx2torch-rnn"
    result = subprocess.run([str(script), "ops", str(EXAMPLE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "LSTM" in result.stdout
