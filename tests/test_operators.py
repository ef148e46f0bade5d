"""operators.md is generated from the registry and must be current; every converter documents itself."""

import inspect
from pathlib import Path

from onnx2torch_rnn.operators import markdown
from onnx2torch_rnn.registry import registered

ROOT = Path(__file__).resolve().parents[1]


def test_operators_md_is_current():
    assert (ROOT / "operators.md").read_text() == markdown(), (
        "operators.md is stale: run `python -m onnx2torch_rnn.operators > operators.md`"
    )


def test_every_builtin_converter_has_a_docstring():
    undocumented = sorted({key.op_type for key, converter in registered().items()
                           if converter.__module__.startswith("onnx2torch_rnn.") and not inspect.getdoc(converter)})
    assert undocumented == []
