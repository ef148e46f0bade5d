"""ONNX's conformance suite: every node test case of the installed onnx, run through ``convert()``.

onnx builds its node cases in memory (``onnx.backend.test.loader.load_node_model_tests``: a model, inputs and the
outputs its reference expects, with the case's rtol/atol). Each case runs as onnx's runner runs it: ``prepare`` then
``run`` on a ``onnx.backend.base.Backend`` over ``convert()``, compared by the runner's ``assert_similar_outputs``.

A case whose model uses an op (at its opset) with no registered converter is skipped as not claimed. Every claimed
case passes or is listed in ``conformance_excluded.txt`` with its reason. A listed refusal must be refused with that
message; the other listed cases are strict xfails of their kind's exception. So a listed case that starts passing
fails, and so does one that fails otherwise than its reason says.
"""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx.backend.base import Backend, BackendRep
from onnx.backend.test.loader import load_node_model_tests
from onnx.backend.test.runner import Runner

import onnx2torch_rnn
from onnx2torch_rnn.builder import make_plan
from onnx2torch_rnn.errors import Onnx2TorchError, UnsupportedOperatorError
from onnx2torch_rnn.registry import normalize_domain

EXCLUDED_FILE = Path(__file__).with_name("conformance_excluded.txt")


class NoTorchTypeError(TypeError):
    """A case's input has no torch dtype (strings), so the adapter cannot feed it."""


# the first word of a reason says how the case fails: the exception it must raise
EXPECTED_FAILURE = {"refused": Onnx2TorchError, "differs": AssertionError, "random": AssertionError,
                    "unfed": NoTorchTypeError, "uncomparable": TypeError}


def _to_torch(value):
    """A runner input (array, numpy scalar, sequence as a list, absent optional as None) as the module takes it."""
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(_to_torch(v) for v in value)
    array = np.asarray(value)
    if array.dtype == ml_dtypes.bfloat16:  # numpy has no bfloat16: ml_dtypes' bits, reinterpreted
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    try:
        return torch.from_numpy(array.copy())
    except TypeError as error:
        raise NoTorchTypeError(str(error)) from None


def _to_numpy(value):
    if isinstance(value, tuple | list):
        return [_to_numpy(v) for v in value]
    value = value.detach()
    if value.dtype == torch.bfloat16:
        return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return value.numpy()


class TorchRep(BackendRep):
    def __init__(self, model: onnx.ModelProto):
        self.module = onnx2torch_rnn.convert(model)
        self.single_output = len(model.graph.output) == 1  # then the module returns it alone, even a sequence

    def run(self, inputs, **kwargs):
        with torch.no_grad():
            result = self.module(*[_to_torch(x) for x in inputs])
        return [_to_numpy(r) for r in ([result] if self.single_output else result)]


class TorchBackend(Backend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)  # onnx's checker
        return TorchRep(model)

    @classmethod
    def supports_device(cls, device):
        return device == "CPU"


@functools.cache
def node_cases() -> dict[str, onnx.backend.test.case.test_case.TestCase]:
    np.random.seed(0)  # some cases draw their data from the global generator: the same data in every worker
    with warnings.catch_warnings():  # the reference's own overflows and divisions by zero, on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        return {case.name: case for case in load_node_model_tests()}


def claimed(model: onnx.ModelProto) -> bool:
    """Every op of the model, subgraphs included, has a converter at the model's opset of its domain."""
    try:
        make_plan(model.graph, {normalize_domain(o.domain): o.version for o in model.opset_import})
    except UnsupportedOperatorError:
        return False
    return True


@functools.cache
def excluded() -> dict[str, str]:
    """Case name -> reason, from the exclusion list (``name: reason`` lines, ``#`` comments)."""
    entries = {}
    for line in EXCLUDED_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, reason = (part.strip() for part in line.split(":", 1))
            assert name not in entries, f"{name} is listed twice"
            entries[name] = reason
    return entries


def run_case(case) -> None:
    """What onnx's runner does for a node case (``Runner._add_model_test.run_node``)."""
    rep = TorchBackend.prepare(case.model, "CPU")
    for inputs, expected in case.data_sets:
        outputs = rep.run([onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in inputs])
        expected = [onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in expected]
        Runner.assert_similar_outputs(expected, outputs, rtol=case.rtol, atol=case.atol)


def _params():
    reasons = excluded()
    for name in sorted(node_cases()):
        kind = reasons.get(name, "").split(":", 1)[0]
        marks = [] if kind in ("", "refused") else [
            pytest.mark.xfail(raises=EXPECTED_FAILURE[kind], strict=True, reason=reasons[name])]
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_node_case(name):
    case = node_cases()[name]
    if not claimed(case.model):
        pytest.skip("op not claimed")
    reason = excluded().get(name, "")
    if reason.startswith("refused:"):
        with pytest.raises(Onnx2TorchError, match=re.escape(reason.removeprefix("refused:").strip())):
            run_case(case)
    else:
        run_case(case)


def test_exclusions_are_claimed_cases():
    """A listed case exists and is claimed (else it would be skipped, not xfail), and its reason has a known kind."""
    cases = node_cases()
    for name, reason in excluded().items():
        assert name in cases, f"{name} is listed but is no node case of onnx {onnx.__version__}"
        assert claimed(cases[name].model), f"{name} is listed but its ops are not claimed"
        assert reason.split(":", 1)[0] in EXPECTED_FAILURE, f"{name}: reason {reason!r} has no known kind"
