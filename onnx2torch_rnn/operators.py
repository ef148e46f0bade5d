"""Generate operators.md from the registry: ``python -m onnx2torch_rnn.operators > operators.md``.

Each op's notes are its converter's docstring (first paragraph in the table, the rest under Details), so the
documentation cannot drift from the code; tests/test_operators.py fails when operators.md is stale.
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict

import onnx

from . import converters  # noqa: F401 - registers the built-in converters
from .registry import OperationKey, registered


def _schema_versions(domain: str, op_type: str) -> list[int]:
    return sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                   if s.name == op_type and s.domain == domain})


def _served(domain: str, op_type: str, versions: list[int]) -> str:
    """Which model opsets the registered versions serve, e.g. '7-18' or '7+'."""
    schema = _schema_versions(domain, op_type)
    newer = [v for v in schema if v > max(versions)]
    gaps = [v for v in schema if min(versions) < v < max(versions) and v not in versions]
    served = f"{min(versions)}-{newer[0] - 1}" if newer else f"{min(versions)}+"
    return served + (f" (not {', '.join(map(str, gaps))})" if gaps else "")


def markdown() -> str:
    families: dict[str, dict[tuple[str, str], list]] = defaultdict(dict)
    for key, converter in sorted(registered().items()):
        if converter.__module__.startswith(f"{__package__}.converters."):
            family = converter.__module__.rsplit(".", 1)[1]
            families[family].setdefault((key.domain, key.op_type), []).append((key, converter))
    lines = [
        "# Supported operators",
        "",
        "Generated from the converter registry by `python -m onnx2torch_rnn.operators > operators.md`; do not edit.",
        "`versions` are the ONNX since_versions with a converter; `opsets` the model opsets they serve.",
        "uint64 inputs are refused at conversion by every op without an exact uint64 computation in torch (order,",
        "division, reductions, products, Clip, CumSum, element gathers and scatters, Trilu, ReverseSequence, NonZero);",
        "checked to compute uint64 exactly: Reshape, Transpose, Concat, Slice, Gather, GatherND, Pad, Tile, Expand,",
        "TopK, Add, Sub, Mul, Equal, Where, BitShift, Cast.",
        "",
    ]
    details = []
    for family, ops in sorted(families.items()):
        title = (inspect.getdoc(sys.modules[f"{__package__}.converters.{family}"]) or family).splitlines()[0]
        lines += [f"## {title}", "", "| op | versions | opsets | notes |", "|---|---|---|---|"]
        for (domain, op_type), entries in sorted(ops.items()):
            versions = [key.version for key, _ in entries]
            doc = _doc(entries)
            summary, _, rest = doc.partition("\n\n")
            name = f"{domain}::{op_type}" if domain else op_type
            lines.append(f"| {name} | {', '.join(map(str, versions))} | {_served(domain, op_type, versions)} | "
                         f"{' '.join(summary.split())} |")
            if rest.strip():
                details += [f"### {name}", "", rest.strip(), ""]
        lines.append("")
    if details:
        lines += ["## Details", "", *details]
    return "\n".join(lines).rstrip() + "\n"


def _doc(entries: list[tuple[OperationKey, object]]) -> str:
    """The converters' docstrings, the newest version's first (its first paragraph is the table's summary)."""
    docs = list(dict.fromkeys(inspect.getdoc(converter) or "" for _, converter in reversed(entries)))
    return "\n\n".join(d for d in docs if d)


if __name__ == "__main__":
    sys.stdout.write(markdown())
