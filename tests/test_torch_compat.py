"""torch_compat.py: each private torch API agrees with its public fallback, and the package works on the fallbacks."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import onnx2torch_rnn
from onnx2torch_rnn import codegen, torch_compat
from tests.control_flow_models import loop_model
from tests.helpers import cnn
from tests.recurrent_models import inputs, recurrent_model


@pytest.mark.parametrize("rnn", [nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2),
                                 nn.GRU(3, 4, bias=False), nn.RNN(3, 4, num_layers=2)], ids=type)
def test_fallbacks_read_what_the_private_apis_do(rnn, monkeypatch):
    private = (torch_compat.flat_weight_names(rnn), dict(torch_compat.parameter_dict(rnn)))
    monkeypatch.setattr(torch_compat, "_HAS_TENSOR_DICTS", False)
    monkeypatch.delattr(rnn, "_flat_weights_names")
    assert (torch_compat.flat_weight_names(rnn), dict(torch_compat.parameter_dict(rnn))) == private


def test_fx_builtins_fallback_is_this_torch_s_table():
    assert torch_compat.fx_builtin_imports() == torch_compat._FX_BUILTINS_FALLBACK, "update the fallback table"


@pytest.mark.parametrize("op, path", [("LSTM", "fast"), ("GRU", "exact")])
def test_recurrent_modules_run_on_the_fallbacks(op, path, monkeypatch):
    model = recurrent_model(op, "bidirectional", path, lens=True)
    feeds = inputs(batch=3, steps=5, lens=True)
    expected = onnx2torch_rnn.convert(model)(*feeds)
    monkeypatch.setattr(torch_compat, "_HAS_TENSOR_DICTS", False)
    actual = onnx2torch_rnn.convert(model)(*feeds)
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=0, atol=0, strict=True)


def test_codegen_writes_the_same_code_on_the_fallbacks(tmp_path, monkeypatch):
    codegen.write(cnn(), tmp_path / "private")
    monkeypatch.setattr(torch_compat, "_HAS_TENSOR_DICTS", False)
    monkeypatch.setattr(torch_compat, "fx", SimpleNamespace(graph=SimpleNamespace()))  # fx itself needs the table
    codegen.write(cnn(), tmp_path / "public")
    assert (tmp_path / "public" / "model.py").read_text() == (tmp_path / "private" / "model.py").read_text()
    assert torch.equal(torch.load(tmp_path / "public" / "weights.pt")["conv.weight"],
                       torch.load(tmp_path / "private" / "weights.pt")["conv.weight"])


def test_without_while_loop_a_loop_says_why_it_cannot_compile(monkeypatch):
    model = loop_model(17, "M", "")
    args = (torch.randn(6, 2, 3) * 0.3, torch.randn(2, 3) * 0.3, torch.tensor(4))
    module = onnx2torch_rnn.convert(model)
    expected = module(*args)
    monkeypatch.setattr(torch_compat, "while_loop", None)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=re.escape(f"Loop cannot be compiled in one graph: torch {torch.__version__}")):
        torch.compile(module, fullgraph=True, backend="eager")(*args)
    for want, got in zip(expected, onnx2torch_rnn.convert(model)(*args), strict=True):  # eager needs none of it
        assert torch.equal(want, got)


def test_is_zero_reads_sizes_tracing_cannot_know():
    """A size read from a value (unbacked) is taken as not 0, and the exported program checks that at run time."""
    class Sized(nn.Module):
        def forward(self, n):
            size = n.item()
            return torch.zeros(5 if torch_compat.is_zero(size) else size)

    program = torch.export.export(Sized(), (torch.tensor(2),)).module()
    assert program(torch.tensor(3)).shape == (3,)
    with pytest.raises(Exception, match="Ne"):
        program(torch.tensor(0))
    assert torch_compat.is_zero(0) and not torch_compat.is_zero(3)
