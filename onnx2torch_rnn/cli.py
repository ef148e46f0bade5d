"""The ``onnx2torch-rnn`` command line: ``ops`` (what a model needs) and ``check`` (convert and compare)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np
import onnx

from .checking import random_inputs
from .errors import Onnx2TorchError
from .registry import normalize_domain, resolve


def _load(path: str) -> onnx.ModelProto:
    return onnx.load(path, load_external_data=False)


def ops(args: argparse.Namespace) -> int:
    """List the model's op types (subgraphs included) with counts and whether each has a converter."""
    model = _load(args.model)
    opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
    counts: Counter = Counter()

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            counts[(normalize_domain(node.domain), node.op_type)] += 1
            for attribute in node.attribute:
                for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                    walk(sub)

    walk(model.graph)
    rows, missing = [], 0
    for (domain, op_type), count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        opset = opsets.get(domain)
        supported = opset is not None and resolve(domain, op_type, opset) is not None
        missing += not supported
        name = f"{domain}::{op_type}" if domain else op_type
        rows.append((name, str(count), str(opset), "yes" if supported else "NO"))
    _print_table(("op", "count", "opset", "supported"), rows)
    print(f"{len(counts)} op types, {sum(counts.values())} nodes, {missing} unsupported")
    return 1 if missing else 0


def check(args: argparse.Namespace) -> int:
    """Convert, run torch and onnxruntime on the same inputs, print per-output errors. Exit 0 ok, 1 mismatch,
    2 when the model cannot be converted."""
    from . import convert
    from .checking import compare

    try:
        module = convert(args.model)
    except Onnx2TorchError as error:
        print(f"cannot convert {args.model}: {error}", file=sys.stderr)
        return 2
    dims = dict(_pair(text, int) for text in args.dim)
    if args.inputs:
        with np.load(args.inputs) as data:
            inputs = {name: data[name] for name in data.files}
    else:
        inputs = random_inputs(args.model, args.seed, dims)
    for name, value in inputs.items():
        print(f"input {name}: {value.dtype} {list(value.shape)}")
    report = compare(args.model, inputs, rtol=args.rtol, atol=args.atol, module=module)
    rows = [(o.name, str(list(o.shape)), o.dtype, f"{o.max_abs_error:.3g}", f"{o.max_rel_error:.3g}",
             "ok" if o.ok else f"MISMATCH {o.problem}".strip()) for o in report.outputs]
    _print_table(("output", "shape", "dtype", "max abs err", "max rel err", "status"), rows)
    worst = max((o.max_abs_error for o in report.outputs), default=0.0)
    verdict = "all outputs match" if report.ok else "MISMATCH"
    print(f"{verdict} onnxruntime (rtol {args.rtol:g}, atol {args.atol:g}); max abs difference {worst:.3g}")
    return 0 if report.ok else 1


def _pair(text: str, convert_value):
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, convert_value(value)


def _print_table(header, rows) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onnx2torch-rnn", description="Import ONNX models into PyTorch.")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("ops", help="list a model's ops and whether each is supported (exit 1 if any is not)")
    p.add_argument("model")
    p.set_defaults(run=ops)

    p = commands.add_parser("check", help="convert and compare every output with onnxruntime")
    p.add_argument("model")
    p.add_argument("--inputs", help=".npz file with one array per graph input (default: random)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="size of a symbolic dimension")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=check)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
