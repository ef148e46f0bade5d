"""The command line: ops, check (with the bisect, progress and --verbose) and convert, with their exit codes."""

import io
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from onnx2torch_rnn import codegen, loading
from onnx2torch_rnn.cli import ProgressBar, main
from tests.helpers import cnn, make_model, perturbed

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


def test_check_exits_1_on_a_mismatch(tmp_path, capsys, registry):
    from onnx2torch_rnn import Converted
    from onnx2torch_rnn.modules.common import Function

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [4])], ["y"])
    onnx.save(model, tmp_path / "m.onnx")
    registry("Relu", 14, replace=True)(lambda node, ctx: Converted(Function(torch.abs), node.inputs))
    assert main(["check", str(tmp_path / "m.onnx")]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "onnx2torch-rnn"
    result = subprocess.run([str(script), "ops", str(EXAMPLE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "LSTM" in result.stdout


# ----------------------------------------------------------------------------------------------- check: more

def test_check_bisect_on_request(capsys):
    assert main(["check", str(EXAMPLE), "--bisect", "--dim", "time=4"]) == 0
    out = capsys.readouterr().out
    assert "all outputs match" in out and "bisect: the outputs of all 3 compared nodes match onnxruntime" in out


def test_check_mismatch_names_the_diverging_node(capsys):
    with perturbed("Transpose", "/lstm/Transpose_1"):
        assert main(["check", str(EXAMPLE), "--dim", "batch=2", "--dim", "time=5", "--no-fuse"]) == 1
    out = capsys.readouterr().out
    # 7 nodes: with the Concat of the zero states' shape, which the module reads as ints
    assert "MISMATCH" in out and "bisect: the outputs of 7 nodes match onnxruntime, then\n" in out
    assert "first divergence: Transpose node '/lstm/Transpose_1'" in out
    assert "attributes: perm=[0, 2, 1, 3]" in out
    assert "input  /lstm/LSTM_output_0: float32 [5, 2, 2, 32] (matches)" in out


def test_exit_2_names_every_unsupported_op_and_its_nodes(tmp_path, capsys):
    nodes = [helper.make_node("Mystery", ["x"], ["a"], domain="test.custom", name="first_odd"),
             helper.make_node("Mystery", ["a"], ["b"], domain="test.custom", name="second_odd"),
             helper.make_node("Enigma", ["b"], ["y"], domain="test.custom", name="third_odd")]
    model = make_model(nodes, [("x", np.float32, [2])], [("y", np.float32, [2])], extra_opsets={"test.custom": 1})
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["check", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "2 unsupported operator(s)" in err
    assert "test.custom::Mystery (opset 1): nodes 'first_odd', 'second_odd'" in err
    assert "test.custom::Enigma (opset 1): nodes 'third_odd'" in err


def test_exit_2_names_the_node_with_an_unsupported_attribute(tmp_path, capsys):
    node = helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=2, activations=["Sigmoid", "Nope", "Tanh"],
                            name="odd_lstm")
    init = {"W": np.zeros((1, 8, 3), np.float32), "R": np.zeros((1, 8, 2), np.float32)}
    onnx.save(make_model([node], [("X", np.float32, [4, 1, 3])], ["Y"], init, opset=14), tmp_path / "m.onnx")
    assert main(["check", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "LSTM node 'odd_lstm'" in err and "activations" in err


def test_int_ranges_inputs_file_and_seed(tmp_path, capsys):
    assert main(["check", str(EXAMPLE), "--int-range", "tokens=3:5", "--dim", "batch=4"]) == 0
    assert "input tokens: int64 [4, 3] in [3, 4]" in capsys.readouterr().out
    assert main(["check", str(EXAMPLE), "--dim", "batch=9", "--dim", "time=9"]) == 0
    assert "input tokens: int64 [9, 9] in [0, 49]" in capsys.readouterr().out  # the embedding table has 50 rows
    np.savez(tmp_path / "in.npz", tokens=np.array([[1, 2, 3]], np.int64))
    assert main(["check", str(EXAMPLE), "--inputs", str(tmp_path / "in.npz")]) == 0
    assert "input tokens: int64 [1, 3] in [1, 3]" in capsys.readouterr().out
    np.savez(tmp_path / "wrong.npz", other=np.zeros(3))
    assert main(["check", str(EXAMPLE), "--inputs", str(tmp_path / "wrong.npz")]) == 2
    assert "no value for input(s) tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["check", str(EXAMPLE), "--int-range", "tokens=3"])


def test_check_mismatch_inside_a_fused_recurrence_names_the_fused_node(capsys):
    with perturbed("LSTM", "/lstm/LSTM_1"):  # the second layer, converted inside the 2-layer fusion
        assert main(["check", str(EXAMPLE), "--dim", "batch=2", "--dim", "time=5"]) == 1
    out = capsys.readouterr().out
    assert "recognised: 2-layer LSTM from 35 nodes, '/lstm/LSTM' on (pattern stacked_layers)" in out
    assert "bisect: the outputs of 1 nodes match onnxruntime, then\n" in out
    assert "first divergence: Transpose node '/lstm/Transpose_3' (#35 in graph order)\n" in out
    assert "computed by the fused 2-layer LSTM '/lstm/LSTM' (35 nodes, pattern stacked_layers) (fuse=False" in out


def test_verbose_names_the_fusions_and_no_fuse_converts_as_written(capsys):
    assert main(["check", str(EXAMPLE), "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "fused 35 nodes into 2-layer LSTM '/lstm/LSTM' (pattern stacked_layers): '/lstm/Shape', " in err
    assert "2-layer LSTM-1 node '/lstm/LSTM' -> pattern stacked_layers: StackedRecurrent(layers=2" in err
    assert "LSTM-14" not in err


def test_verbose_shows_converters_and_recurrent_paths_without_a_bar_off_a_terminal(capsys):
    assert main(["check", str(EXAMPLE), "--verbose", "--no-fuse"]) == 0
    err = capsys.readouterr().err
    lstm_lines = [line for line in err.splitlines() if line.startswith("LSTM-14")]
    assert len(lstm_lines) == 2 and all("-> converters.recurrent.lstm: OnnxLSTM(" in line for line in lstm_lines)
    assert all("path=fast" in line for line in lstm_lines)
    assert "Constant-13 node '/lstm/Constant' -> converters.elementwise.constant: folded" in err
    assert "\r" not in err and "converting" not in err  # stderr is not a terminal here


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_draws_on_a_terminal_only():
    stream = FakeTerminal()
    bar = ProgressBar(stream, delay=0.0)
    bar(1, 4)
    assert stream.getvalue().startswith("\rconverting [#######.......................] 1/4 nodes")
    bar(2, 4)  # within 0.1 s of the last draw: skipped
    assert stream.getvalue().count("\r") == 1
    bar(4, 4)  # the last node is always drawn, then the line is erased
    assert "4/4 nodes" in stream.getvalue() and stream.getvalue().endswith("\r\x1b[K")
    quiet = io.StringIO()
    ProgressBar(quiet, delay=0.0)(1, 1)
    assert quiet.getvalue() == ""
    slow = FakeTerminal()
    ProgressBar(slow, delay=60.0)(1, 2)  # a short conversion never shows a bar
    assert slow.getvalue() == ""


# ----------------------------------------------------------------------------------------------- convert

def test_convert_writes_code_that_reproduces_the_module(tmp_path, capsys):
    out = tmp_path / "tagger"
    assert main(["convert", str(EXAMPLE), "-o", str(out)]) == 0
    assert "checked: load() rebuilds the converted module" in capsys.readouterr().out
    model = codegen.load_generated(out).load()
    tokens = torch.randint(0, 50, (2, 6))
    torch.testing.assert_close(model(tokens), onnx2torch_rnn.convert(EXAMPLE)(tokens), rtol=0, atol=0)
    assert main(["convert", str(EXAMPLE), "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"{out} exists; pass --force to overwrite it\n"
    assert main(["convert", str(EXAMPLE), "-o", str(out), "--force"]) == 0


def test_convert_pt2(tmp_path, capsys):
    onnx.save(cnn(), tmp_path / "cnn.onnx")
    assert main(["convert", str(tmp_path / "cnn.onnx"), "-o", str(tmp_path / "out"), "--pt2", "--dim", "batch=2"]) == 0
    assert "model.pt2 (torch.export, dynamic dims: batch); load it with torch.export.load\n" in capsys.readouterr().out
    program = torch.export.load(tmp_path / "out" / "model.pt2")
    x = torch.randn(5, 3, 8, 8)
    torch.testing.assert_close(program.module()(x), codegen.load_generated(tmp_path / "out").load()(x))


def test_convert_pt2_failure_is_reported_and_exits_1(tmp_path, capsys):
    def branch(op, name, shape):  # branches of different ranks: no torch.cond
        return helper.make_graph([helper.make_node(op, ["x", "axes"][: 1 + (op == "Unsqueeze")], [name])], name, [],
                                 [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)])

    nodes = [helper.make_node("If", ["c"], ["r"], then_branch=branch("Neg", "n", [2]),
                              else_branch=branch("Unsqueeze", "a", [1, 2])),
             helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0)]
    model = make_model(nodes, [("c", np.bool_, []), ("x", np.float32, [2])], [("y", np.float32, [])],
                       {"axes": np.int64([0])})
    onnx.save(model, tmp_path / "if.onnx")
    assert main(["convert", str(tmp_path / "if.onnx"), "-o", str(tmp_path / "out"), "--pt2"]) == 1
    captured = capsys.readouterr()
    assert "wrote" in captured.out and (tmp_path / "out" / "model.py").exists()
    assert not (tmp_path / "out" / "model.pt2").exists()
    assert captured.err.startswith("--pt2: no program saved: torch.export failed with static shapes: ")
    assert len(captured.err.splitlines()) == 1


def test_convert_exit_2_when_the_model_cannot_be_converted(tmp_path, capsys):
    model = make_model([helper.make_node("Mystery", ["x"], ["y"], domain="test.custom", name="odd")],
                       [("x", np.float32, [2])], [("y", np.float32, [2])], extra_opsets={"test.custom": 1})
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out")]) == 2
    assert "test.custom::Mystery (opset 1): nodes 'odd'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_check_run_time_failures(tmp_path, capsys):
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", np.float32, [4])], ["y"]),
              tmp_path / "m.onnx")
    np.savez(tmp_path / "bad.npz", x=np.zeros(3, np.float32))  # a shape onnxruntime refuses
    assert main(["check", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "onnxruntime cannot run" in capsys.readouterr().err

    def broken(y):
        raise RuntimeError("boom")

    with perturbed("Relu", "r", fn=broken):
        assert main(["check", str(tmp_path / "m.onnx")]) == 1
    assert "the converted module fails where onnxruntime runs: RuntimeError: boom" in capsys.readouterr().err


QUANTIZED = Path(__file__).resolve().parent / "models" / "quantized" / "ts_crnn_op18_qop_u8s8.onnx"


def test_check_dequantize_reports_the_distance_to_the_quantized_model(capsys):
    assert main(["check", str(QUANTIZED), "--dim", "batch=2", "--dim", "width=6"]) == 0
    assert "all outputs match onnxruntime" in capsys.readouterr().out
    assert main(["check", str(QUANTIZED), "--dequantize", "--dim", "batch=2", "--dim", "width=6"]) == 0
    out = capsys.readouterr().out
    assert "dequantized float model: max abs difference" in out and "bisect" not in out
    difference = float(out.split("max abs difference ")[1].split()[0])
    assert 0 < difference < 0.1


def test_convert_dequantize_writes_the_float_model(tmp_path, capsys):
    assert main(["convert", str(QUANTIZED), "-o", str(tmp_path / "out"), "--dequantize"]) == 0
    code = (tmp_path / "out" / "model.py").read_text()
    assert "QLinear" not in code and "QuantizeLinear" not in code and "Conv2d(" in code
    state = torch.load(tmp_path / "out" / "weights.pt")
    assert all(t.is_floating_point() for name, t in state.items() if t.dim() > 1)


# ----------------------------------------------------------------------------------------------- one load, typed errors

def _weighted_chain(path):
    """x -> Mul(w) -> Tanh -> Relu with a weight large enough to be read into a tensor at load (not left in the
    proto), so onnxruntime must be given the model as it was on disk."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="scale"),
             helper.make_node("Tanh", ["m"], ["t"], name="squash"),
             helper.make_node("Relu", ["t"], ["y"], name="clip")]
    w = np.random.default_rng(0).standard_normal((1, 1200)).astype(np.float32)
    assert w.size > loading.SKELETON_MAX_ELEMENTS
    onnx.save(make_model(nodes, [("x", np.float32, ["batch", 1200])], ["y"], {"w": w}), path)
    return path


def test_check_bisect_parses_the_model_once(tmp_path, monkeypatch, capsys):
    parsed = []
    parse, load = loading._parse, onnx.load_model

    def counted_parse(data, where):
        parsed.append(where)
        return parse(data, where)

    def counted_load(*args, **kwargs):
        parsed.append(args[0] if args else kwargs)
        return load(*args, **kwargs)

    monkeypatch.setattr(loading, "_parse", counted_parse)
    monkeypatch.setattr(onnx, "load", counted_load)
    monkeypatch.setattr(onnx, "load_model", counted_load)
    path = _weighted_chain(tmp_path / "m.onnx")
    assert main(["check", str(path), "--bisect"]) == 0
    assert "bisect: the outputs of all 3 compared nodes match onnxruntime" in capsys.readouterr().out
    assert parsed == [str(path)]
    parsed.clear()
    with perturbed("Tanh", "squash"):
        assert main(["check", str(path)]) == 1
    assert "first divergence: Tanh node 'squash'" in capsys.readouterr().out
    assert parsed == [str(path)]


def test_check_missing_model_exits_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "absent.onnx")]) == 2
    assert capsys.readouterr().err == f"cannot convert {tmp_path / 'absent.onnx'}: no ONNX model at " \
                                      f"{str(tmp_path / 'absent.onnx')!r}\n"


def test_check_exits_2_when_onnxruntime_is_not_installed(tmp_path, monkeypatch, capsys):
    path = _weighted_chain(tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err == f"onnxruntime cannot run {path}: onnxruntime is not installed (pip install " \
                                      "onnxruntime, or this package's 'test' extra)\n"


def test_check_dequantize_exits_1_when_a_dtype_differs(tmp_path, capsys):
    path = _weighted_chain(tmp_path / "m.onnx")
    with perturbed("Relu", "clip", fn=lambda y: y.double()):
        assert main(["check", str(path), "--dequantize"]) == 1
    out = capsys.readouterr().out
    assert "dtype float64 != onnxruntime's float32" in out and "bisect" not in out


def test_ops_exits_2_when_the_model_cannot_be_read(tmp_path, capsys):
    assert main(["ops", str(tmp_path / "absent.onnx")]) == 2
    assert capsys.readouterr().err.startswith(f"cannot read {tmp_path / 'absent.onnx'}: no ONNX model at ")
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xff not a model")
    assert main(["ops", str(tmp_path / "junk.onnx")]) == 2
    assert "is not a serialized ONNX model" in capsys.readouterr().err


def test_ops_lists_a_model_that_would_not_load(tmp_path, capsys):
    onnx.save(onnx.load(_weighted_chain(tmp_path / "m.onnx")), tmp_path / "m.onnx", save_as_external_data=True,
              location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()  # convert() refuses it; ops only reads the graph
    assert main(["check", str(tmp_path / "m.onnx")]) == 2
    assert "external data file 'm.data' not found" in capsys.readouterr().err
    assert main(["ops", str(tmp_path / "m.onnx")]) == 0
    assert "3 op types, 3 nodes, 0 unsupported" in capsys.readouterr().out


def test_verbose_logging_lasts_one_run_and_leaves_the_logger_as_it_was(tmp_path, capsys):
    path = _weighted_chain(tmp_path / "m.onnx")
    logger = logging.getLogger("onnx2torch_rnn")
    handlers = list(logger.handlers)
    logger.setLevel(logging.WARNING)  # a caller's own setting
    try:
        for _ in range(2):  # the same lines each time
            assert main(["check", str(path), "--verbose"]) == 0
            assert "Tanh-13 node 'squash' -> converters." in capsys.readouterr().err
            assert (logger.level, logger.handlers) == (logging.WARNING, handlers)
        assert main(["check", str(tmp_path / "absent.onnx"), "--verbose"]) == 2  # a failed run restores it too
        assert (logger.level, logger.handlers) == (logging.WARNING, handlers)
        capsys.readouterr()
        assert main(["check", str(path)]) == 0
        assert capsys.readouterr().err == ""
    finally:
        logger.setLevel(logging.NOTSET)


def test_to_onnx_exit_2_when_the_model_cannot_be_converted(tmp_path, capsys):
    model = make_model([helper.make_node("Mystery", ["x"], ["y"], domain="test.custom", name="odd")],
                       [("x", np.float32, [2])], [("y", np.float32, [2])], extra_opsets={"test.custom": 1})
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["to-onnx", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cannot convert {tmp_path / 'm.onnx'}: 1 unsupported operator(s)") and "'odd'" in err
    assert not (tmp_path / "out.onnx").exists()
