"""The ONNX backend node test cases for LSTM, GRU and RNN, generated from onnx's own case code.

The onnx wheel no longer ships their data, so each ``export_*`` function of onnx.backend.test.case.node.{lstm, gru,
rnn} is run with its ``expect`` captured: that gives the node, the inputs and the outputs onnx's numpy reference
expects. The converted module must reproduce them, and onnxruntime's outputs where it can run the case.
"""

from __future__ import annotations

import importlib

import numpy as np
import onnx
import pytest
from onnx import helper

import onnx2torch_rnn
from tests.helpers import run_onnxruntime, run_torch


def _backend_cases() -> list[tuple[str, onnx.ModelProto, dict, list]]:
    cases = []
    for op in ("LSTM", "GRU", "RNN"):
        module = importlib.import_module(f"onnx.backend.test.case.node.{op.lower()}")
        captured: list = []
        original = module.expect

        def expect(node, inputs, outputs, name, captured=captured, **kwargs):
            captured.append((node, inputs, outputs, name, kwargs))

        module.expect = expect
        try:
            np.random.seed(0)  # the case code draws weights from the global generator
            case_class = getattr(module, op)
            for attribute in sorted(vars(case_class)):
                if attribute.startswith("export"):
                    getattr(case_class, attribute)()
        finally:
            module.expect = original
        for node, inputs, outputs, name, kwargs in captured:
            input_names = [n for n in node.input if n]
            output_names = [n for n in node.output if n]
            graph = helper.make_graph(
                [node], name,
                [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                 for n, a in zip(input_names, inputs, strict=True)],
                [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                 for n, a in zip(output_names, outputs, strict=True)])
            opsets = kwargs.get("opset_imports") or [helper.make_opsetid("", onnx.defs.get_schema(op).since_version)]
            model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
            onnx.checker.check_model(model)
            cases.append((name, model, dict(zip(input_names, inputs, strict=True)), list(outputs)))
    return cases


CASES = _backend_cases()


def test_every_backend_case_was_found():
    names = {name for name, *_ in CASES}
    assert len(CASES) >= 18
    for expected in ("test_lstm_with_peepholes", "test_lstm_batchwise", "test_gru_seq_length",
                     "test_gru_bidirectional", "test_rnn_seq_length", "test_simple_rnn_batchwise"):
        assert expected in names, sorted(names)


@pytest.mark.parametrize(("name", "model", "feeds", "expected"), CASES, ids=[c[0] for c in CASES])
def test_backend_case(name, model, feeds, expected):
    module = onnx2torch_rnn.convert(model)
    actual = run_torch(module, model, feeds)
    for got, want in zip(actual, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, strict=True, err_msg=name)
    if not any(a.name == "layout" and a.i == 1 for a in model.graph.node[0].attribute):  # onnxruntime rejects it
        for got, want in zip(actual, run_onnxruntime(model, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, strict=True, err_msg=name)
