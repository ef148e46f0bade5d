"""Binding graph inputs to constants at conversion (``convert(model, constants={"sr": 16000})``, binding.py): the
TorchScript-scripted VADs of tests/models/scripted branch on an int64 ``sr`` with branches of different ranks (as
the silero VADs do). Bound, the untaken branches and their weights are gone, and the model matches onnxruntime (fed
that ``sr``), compiles in one graph, exports with dynamic batch and length (run at two other sizes) and trains every
weight it keeps; ``to_onnx`` leaves the bound input out or keeps it. Unbound, eager runs both rates and compiling
says how to bind.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from torch.export import Dim

import onnx2torch_rnn
from onnx2torch_rnn import InvalidModelError
from onnx2torch_rnn.cli import main
from tests.exporters.common import MODELS
from tests.recurrent_models import CountingBackend

SCRIPTED = MODELS / "scripted"
# model, the rates to bind, the state's first dim, and the length dim: what torch.export needs of it (the Conv
# front end reads at least 8 samples; sr_nested frames the samples by sr / 1000)
CASES = [("sr_vad", 16000, 2), ("sr_vad", 8000, 2), ("sr_nested", 8000, 1), ("sr_nested", 16000, 1),
         ("sr_nested", 4000, 1)]
COMPILED = [CASES[0], CASES[2], *(pytest.param(*case, marks=pytest.mark.slow) for case in CASES[1:2] + CASES[3:])]


def _feeds(name: str, batch: int, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, samples, generator=generator),
            torch.randn(2 if name == "sr_vad" else 1, batch, 8, generator=generator))


def _reference(name: str, sr: int, args) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(SCRIPTED / f"{name}.onnx", providers=["CPUExecutionProvider"])
    return session.run(None, {"input": args[0].numpy(), "state": args[1].numpy(), "sr": np.array(sr)})


def _expect(outputs, expected) -> None:
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-4, atol=1e-5)


def _samples(name: str, sr: int):
    return Dim("samples", min=8, max=4096) if name == "sr_vad" else sr // 1000 * Dim("frames", min=2, max=512)


@pytest.mark.parametrize("name, sr, _", CASES)
def test_unbound_model_runs_every_rate_in_eager(name, sr, _):
    module = onnx2torch_rnn.convert(SCRIPTED / f"{name}.onnx")
    for batch, samples in ((2, 64), (3, 16)):
        args = _feeds(name, batch, samples, seed=samples)
        _expect(module(*args, torch.tensor(sr)), _reference(name, sr, args))


def test_unbound_model_says_how_to_bind_when_compiled():
    module = onnx2torch_rnn.convert(SCRIPTED / "sr_vad.onnx")
    args = (*_feeds("sr_vad", 2, 64, 0), torch.tensor(16000))
    message = r"rank 1 in then_branch and 3 in else_branch.*graph input\(s\) 'sr'.*constants=\{'sr': \.\.\.\}"
    with pytest.raises(Exception, match=message):
        torch.compile(module, fullgraph=True, backend="eager")(*args)
    with pytest.raises(Exception, match=message):
        torch.export.export(module, args)


@pytest.mark.compile
@pytest.mark.parametrize("name, sr, state_rows", COMPILED)
def test_bound_model_compiles_exports_and_trains(name, sr, state_rows):
    path = SCRIPTED / f"{name}.onnx"
    module = onnx2torch_rnn.convert(path, constants={"sr": sr})
    unbound = onnx2torch_rnn.convert(path)
    assert sum(p.numel() for p in module.parameters()) < sum(p.numel() for p in unbound.parameters())
    assert list(onnx2torch_rnn.signature.recorded(module).inputs)[-1].name == "state"  # sr is no input
    args = _feeds(name, 3, 64, seed=0)  # batch 3: not the state's 2 rows, which compile would unify it with
    _expect(module(*args), _reference(name, sr, args))

    backend = CountingBackend("eager")
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=True)
    for batch, samples in ((3, 64), (4, 128)):
        feeds = _feeds(name, batch, samples, seed=batch)
        _expect(compiled(*feeds), _reference(name, sr, feeds))
    assert backend.graphs == 1

    batch = Dim("batch", min=2, max=64)
    program = torch.export.export(module, args, dynamic_shapes={"input": {0: batch, 1: _samples(name, sr)},
                                                                  "state": {1: batch}})
    for batch_size, samples in ((2, 128), (5, 32)):
        feeds = _feeds(name, batch_size, samples, seed=samples)
        _expect(program.module()(*feeds), _reference(name, sr, feeds))

    loss = sum(output.sum() for output in module(*args))
    loss.backward()
    assert [n for n, p in module.named_parameters() if p.grad is None or not p.grad.abs().sum()] == []


@pytest.mark.parametrize("keep", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_to_onnx_leaves_the_bound_input_out_or_keeps_it(tmp_path, keep):
    pytest.importorskip("onnxscript")
    module = onnx2torch_rnn.convert(SCRIPTED / "sr_vad.onnx", constants={"sr": 8000})
    args = _feeds("sr_vad", 3, 64, seed=1)
    path = tmp_path / f"keep_{keep}.onnx"
    summary = onnx2torch_rnn.to_onnx(module, path, dims={"samples": 40}, keep_bound=keep)
    assert summary.checked_shapes
    model = onnx.load(path)
    names = [i.name for i in model.graph.input]
    assert names == (["input", "state", "sr"] if keep else ["input", "state"])
    assert [n.op_type for n in model.graph.node if n.op_type == "If"] == []
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {"input": args[0].numpy(), "state": args[1].numpy(), **({"sr": np.array(8000)} if keep else {})}
    for got, want in zip(session.run(None, feeds), _reference("sr_vad", 8000, args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cli_binds_with_constant(tmp_path, capsys):
    path = str(SCRIPTED / "sr_nested.onnx")
    assert main(["check", path, "--constant", "sr=16000", "--dim", "samples=64", "--bisect"]) == 0
    assert "all outputs match" in capsys.readouterr().out
    assert main(["convert", path, "--constant", "sr=8000", "-o", str(tmp_path / "code")]) == 0
    assert main(["check", path, "--constant", "rate=8000"]) == 2
    assert "not run-time inputs of the model (input, state, sr)" in capsys.readouterr().err


@pytest.mark.parametrize("constants, message", [
    ({"rate": 16000}, r"names \['rate'\], which are not run-time inputs of the model \(input, state, sr\)"),
    ({"sr": 16000.5}, r"constants\['sr'\] is float64; input 'sr' is int64"),
    ({"sr": [16000]}, r"constants\['sr'\] has shape \[1\]; input 'sr' is declared \[\]"),
    ({"sr": True}, r"constants\['sr'\] is bool; input 'sr' is int64"),
])
def test_binding_refuses_what_the_input_cannot_hold(constants, message):
    with pytest.raises(InvalidModelError, match=message):
        onnx2torch_rnn.convert(SCRIPTED / "sr_vad.onnx", constants=constants)
