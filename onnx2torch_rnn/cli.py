"""The ``onnx2torch-rnn`` command line: ``ops`` (what a model needs), ``check`` (convert and compare with
onnxruntime, with a per-node bisect), ``convert`` (standalone PyTorch code) and ``to-onnx`` (a converted model, with
fine-tuned weights, back to ONNX)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import pickle
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .errors import ModuleRunError, Onnx2TorchError, OutputExistsError, ReferenceRuntimeError
from .loading import LoadedModel, load_model, parse_file, subgraphs
from .registry import normalize_domain, resolve


def _fail(message: str, code: int = 2) -> int:
    print(message, file=sys.stderr)
    return code


def ops(args: argparse.Namespace, bar: ProgressBar) -> int:
    """List the model's op types (subgraphs included) with counts and whether each has a converter. Exit 0 all
    have one, 1 some have none, 2 when the file is no ONNX model. The model is only parsed, so that a model that
    would not load (refused by the checker, external data missing) is listed too."""
    try:
        model = parse_file(args.model)
    except (Onnx2TorchError, FileNotFoundError) as error:
        return _fail(f"cannot read {args.model}: {error}")
    opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
    counts = Counter((normalize_domain(node.domain), node.op_type)
                     for graph in subgraphs(model.graph) for node in graph.node)
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


# ----------------------------------------------------------------------------------------------- progress and logs

class ProgressBar:
    """A one-line bar on ``stream`` for conversions that take a while; nothing when ``stream`` is not a terminal.

    It appears once ``delay`` seconds have passed (small models never show one) and redraws at most every 0.1 s.
    Used as a context manager around a conversion, it is erased when the conversion ends or fails.
    """

    def __init__(self, stream=None, label: str = "converting", delay: float = 0.5, width: int = 30):
        self.stream = sys.stderr if stream is None else stream
        self.label, self.delay, self.width = label, delay, width
        self.enabled = self.stream.isatty()
        self.start = time.monotonic()
        self.drawn_at: float | None = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info) -> None:
        self.clear()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.start < self.delay:
            return
        if self.drawn_at is not None and now - self.drawn_at < 0.1 and done < total:
            return
        filled = self.width * done // max(total, 1)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} nodes, "
                          f"{now - self.start:.1f} s")
        self.stream.flush()
        self.drawn_at = now
        if done == total:
            self.clear()

    def clear(self) -> None:
        """Erase the bar (before a log line, and when the conversion is done)."""
        if self.drawn_at is not None:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn_at = None


class _LogHandler(logging.StreamHandler):
    """--verbose: the builder's per-node lines on stderr, erasing the progress bar first."""

    def __init__(self, bar: ProgressBar):
        super().__init__(sys.stderr)
        self.bar = bar
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.bar.clear()
        super().emit(record)


@contextlib.contextmanager
def _verbose_logging(bar: ProgressBar) -> Iterator[None]:
    """--verbose: the library's per-node DEBUG lines on stderr for one run of ``main``; the package logger's level
    and handlers are as they were afterwards (a caller's own logging setup is left alone)."""
    logger = logging.getLogger("onnx2torch_rnn")
    handler, level = _LogHandler(bar), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# ----------------------------------------------------------------------------------------------- check

def _int_range(text: str) -> tuple[str, tuple[int, int]]:
    name, (low, sep, high) = _pair(text, lambda value: value.partition(":"))
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=LOW:HIGH, got {text!r}")
    return name, (int(low), int(high))


def _inputs(args: argparse.Namespace, loaded: LoadedModel) -> dict[str, np.ndarray]:
    from .checking import random_inputs

    if args.inputs:
        with np.load(args.inputs) as data:
            return {name: data[name] for name in data.files}
    return random_inputs(loaded, args.seed, dict(args.dim), dict(args.int_range))


def check(args: argparse.Namespace, bar: ProgressBar) -> int:
    """Convert, run torch and onnxruntime on the same inputs, print per-output errors (and the first diverging
    node on a mismatch or with --bisect). Exit 0 ok, 1 mismatch (or the converted module fails), 2 when the model
    cannot be converted (or onnxruntime cannot run it). The model is parsed once: every step uses one LoadedModel."""
    from .builder import build
    from .checking import compare, runtime_inputs

    try:
        with bar:
            loaded = load_model(args.model, dequantize=args.dequantize, single_use=True,
                                constants=dict(args.constant))
            module = build(loaded, bar, fuse=args.fuse)
    except (Onnx2TorchError, FileNotFoundError) as error:
        return _fail(f"cannot convert {args.model}: {error}")
    inputs = _inputs(args, loaded)
    missing = [i.name for i in runtime_inputs(loaded.proto) if i.name not in inputs]
    if missing:
        return _fail(f"no value for input(s) {', '.join(missing)} in {args.inputs}")
    for name, value in inputs.items():
        span = f" in [{value.min()}, {value.max()}]" if value.size and np.issubdtype(value.dtype, np.integer) else ""
        print(f"input {name}: {value.dtype} {list(value.shape)}{span}")
    for node in module.graph.nodes:  # what recognition fused (--no-fuse converts every node as written)
        fused = node.meta.get("onnx", {})
        if "replaces" in fused:
            print(f"recognised: {fused['op_type']} from {len(fused['replaces'])} nodes, {fused['name']!r} on "
                  f"(pattern {fused['pattern']})")
    try:
        report = compare(loaded, inputs, rtol=args.rtol, atol=args.atol, module=module,
                         bisect=False if args.dequantize else True if args.bisect else None)
    except ReferenceRuntimeError as error:
        return _fail(f"onnxruntime cannot run {args.model}: {error}")
    except ModuleRunError as error:
        return _fail(f"the converted module fails where onnxruntime runs: {error}", 1)
    return _dequantized_report(report) if args.dequantize else _report(report, args)


def _report(report, args: argparse.Namespace) -> int:
    """Per-output errors, the verdict and the bisect's finding. Exit 0 when every output matches, else 1."""
    rows = [(o.name, str(list(o.shape)), o.dtype, f"{o.max_abs_error:.3g}", f"{o.max_rel_error:.3g}",
             "ok" if o.ok else f"MISMATCH {o.problem}".strip()) for o in report.outputs]
    _print_table(("output", "shape", "dtype", "max abs err", "max rel err", "status"), rows)
    worst = max((o.max_abs_error for o in report.outputs), default=0.0)
    verdict = "all outputs match" if report.ok else "MISMATCH"
    print(f"{verdict} onnxruntime (rtol {args.rtol:g}, atol {args.atol:g}); max abs difference {worst:.3g}")
    if report.bisected and report.divergence is not None:
        print(f"bisect: the outputs of {report.compared_nodes - 1} nodes match onnxruntime, then")
        print(report.divergence)
    elif report.bisected:
        print(f"bisect: the outputs of all {report.compared_nodes} compared nodes match onnxruntime (values inside "
              "If/Loop/Scan bodies and constants folded into modules are not compared)")
    return 0 if report.ok else 1


def _dequantized_report(report) -> int:
    """check --dequantize: the float model's distance to onnxruntime's quantized outputs, which is expected to be
    small and not zero (the quantized model rounds its weights' products and its activations; the float model does
    not). Exit 0 unless shapes or types differ."""
    rows = [(o.name, str(list(o.shape)), o.dtype, f"{o.max_abs_error:.3g}", f"{o.max_rel_error:.3g}",
             o.problem or "dequantized") for o in report.outputs]
    _print_table(("output", "shape", "dtype", "max abs diff", "max rel diff", "status"), rows)
    worst = max((o.max_abs_error for o in report.outputs), default=0.0)
    print(f"dequantized float model: max abs difference {worst:.3g} to onnxruntime's quantized outputs (a float "
          "model does not round like the quantized one: small, not zero, is expected)")
    return 1 if any(o.problem for o in report.outputs) else 0


# ----------------------------------------------------------------------------------------------- convert

def convert(args: argparse.Namespace, bar: ProgressBar) -> int:
    """Write OUTDIR/model.py and OUTDIR/weights.pt (and OUTDIR/model.pt2 with --pt2). Exit 0 ok, 1 when --pt2 was
    asked for and torch.export failed (the code is written), 2 when nothing could be written."""
    from . import codegen
    from .checking import runtime_inputs

    outdir = Path(args.output)
    try:
        with bar:
            loaded = load_model(args.model, dequantize=args.dequantize, single_use=True,
                                constants=dict(args.constant))
            module = codegen.write(loaded, outdir, force=args.force, progress=bar, fuse=args.fuse)
    except OutputExistsError as error:
        return _fail(f"{error.path} exists; pass --force to overwrite it")
    except (Onnx2TorchError, FileNotFoundError) as error:
        return _fail(f"cannot convert {args.model}: {error}")
    lines = len((outdir / codegen.CODE_FILE).read_text().splitlines())
    size = (outdir / codegen.WEIGHTS_FILE).stat().st_size
    print(f"wrote {outdir / codegen.CODE_FILE} ({lines} lines: class Model, def load) and "
          f"{outdir / codegen.WEIGHTS_FILE} ({_bytes(size)}); checked: load() rebuilds the converted module")
    if not args.pt2:
        return 0
    import torch

    inputs = _inputs(args, loaded)
    proto_inputs = runtime_inputs(loaded.proto)
    example = tuple(torch.from_numpy(np.array(inputs[i.name])) for i in proto_inputs)
    dynamic = {position: {axis: d.dim_param for axis, d in enumerate(i.type.tensor_type.shape.dim)
                          if not d.HasField("dim_value")}
               for position, i in enumerate(proto_inputs)}
    try:
        note, custom_ops = codegen.export_program(module, example, dynamic, outdir / codegen.PROGRAM_FILE)
    except RuntimeError as error:
        return _fail(f"--pt2: no program saved: {error}", 1)
    after = " after `import onnx2torch_rnn` (it calls the library's recurrent op)" if custom_ops else ""
    print(f"wrote {outdir / codegen.PROGRAM_FILE} (torch.export, {note}); load it with torch.export.load{after}")
    return 0


def _bytes(size: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


# ----------------------------------------------------------------------------------------------- to-onnx

def to_onnx(args: argparse.Namespace, bar: ProgressBar) -> int:
    """Convert MODEL, load --weights (a state_dict saved with torch.save), write it back to ONNX with to_onnx.
    Exit 0 written, 1 refused (torch cannot export it, or onnxruntime's outputs differ: nothing written), 2 when
    the model cannot be converted or the weights do not fit it."""
    import torch

    from .builder import build
    from .onnx_export import to_onnx as write_onnx
    from .signature import recorded

    try:
        with bar:
            loaded = load_model(args.model, dequantize=args.dequantize, single_use=True,
                                constants=dict(args.constant))
            module = build(loaded, bar, fuse=args.fuse)
    except (Onnx2TorchError, FileNotFoundError) as error:
        return _fail(f"cannot convert {args.model}: {error}")
    try:
        if args.weights:
            module.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True))
    except (OSError, RuntimeError, pickle.UnpicklingError) as error:  # what torch.load and load_state_dict raise
        return _fail(f"cannot load {args.weights} into the model converted from {args.model}: {error}")
    symbolic = {spec.symbol(axis) for spec in recorded(module).inputs
                for axis, d in enumerate(spec.dims or ()) if not isinstance(d, int)}
    try:
        summary = write_onnx(module, args.output, dims=dict(args.dim), dynamic=symbolic - set(args.static),
                             opset=args.opset, check=not args.no_check, keep_bound=args.keep_bound)
    except Onnx2TorchError as error:
        return _fail(f"not written: {error}", 1)
    dynamic = ", ".join(summary.dynamic_dims) or "none"
    print(f"wrote {summary.path} (opset {summary.opset}, {summary.recurrent_nodes} LSTM/GRU/RNN nodes, dynamic dims: "
          f"{dynamic})")
    if summary.checked_shapes:
        shapes = " and ".join(str(s) for s in summary.checked_shapes)
        print(f"checked: onnxruntime matches the module at input shapes {shapes}; max abs difference "
              f"{summary.max_abs_error:.3g}")
    return 0


# ----------------------------------------------------------------------------------------------- plumbing

def _pair(text: str, convert_value):
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, convert_value(value)


def _print_table(header, rows) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", type=lambda t: _pair(t, int),
                   help="size of a symbolic dimension (default 3)")
    p.add_argument("--int-range", action="append", default=[], metavar="NAME=LOW:HIGH", type=_int_range,
                   help="integer input NAME drawn from [LOW, HIGH) (default: from its use, e.g. Gather indices "
                        "below the table size, else [0, 4))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", "-v", action="store_true",
                   help="log each node (converter, module, fast/exact path of recurrent nodes) and each recognised "
                        "recurrence (the nodes it replaces)")
    _fuse_option(p)
    _constant_option(p)
    p.add_argument("--dequantize", action="store_true",
                   help="convert a quantized model to the float model it approximates (float weights, no quantized "
                        "activations), for fine-tuning; check reports its distance to onnxruntime's quantized outputs")


def _constant(text: str) -> tuple[str, object]:
    """NAME=VALUE, the value a JSON number, bool or (nested) list: 16000, 0.5, [1, 2]."""
    def parse(value: str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE with a number or a list as VALUE, got {text!r}") \
                from None
    return _pair(text, parse)


def _constant_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--constant", action="append", default=[], metavar="NAME=VALUE", type=_constant,
                   help="bind graph input NAME to VALUE (a number or a JSON list), as callers always pass it: the "
                        "module no longer takes it, and what it decides is folded (an If on it becomes the branch "
                        "taken)")


def _fuse_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-fuse", dest="fuse", action="store_false",
                   help="convert every node as written: do not recognise recurrences that the exporter spelled out "
                        "(e.g. per-layer nodes with glue) as one recurrent module")


def main(argv: list[str] | None = None) -> int:
    """The entry point: parse the command line and run the command, with --verbose logging for this run only."""
    args = _parser().parse_args(argv)
    bar = ProgressBar()
    with (_verbose_logging(bar) if getattr(args, "verbose", False) else contextlib.nullcontext(),
          warnings.catch_warnings()):
        # the command is the program here: torch's notices of its own deprecations (torch.onnx's) are not for its user
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return args.run(args, bar)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx2torch-rnn", description="Import ONNX models into PyTorch.")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("ops", help="list a model's ops and whether each is supported (exit 1 if any is not)")
    p.add_argument("model")
    p.set_defaults(run=ops)

    p = commands.add_parser("check", help="convert and compare every output with onnxruntime")
    p.add_argument("model")
    p.add_argument("--inputs", help=".npz file with one array per graph input (default: random)")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--bisect", action="store_true",
                   help="compare every intermediate value and name the first diverging node (automatic on mismatch)")
    _input_options(p)
    p.set_defaults(run=check)

    p = commands.add_parser("convert", help="write standalone PyTorch code: OUTDIR/model.py and OUTDIR/weights.pt")
    p.add_argument("model")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR")
    p.add_argument("--force", action="store_true", help="overwrite the files of an existing OUTDIR")
    p.add_argument("--pt2", action="store_true",
                   help="also save a torch.export program (OUTDIR/model.pt2), traced on random inputs "
                        "(--dim, --int-range, --seed); symbolic dims are exported as dynamic where torch allows")
    _input_options(p)
    p.set_defaults(run=convert, inputs=None)

    p = commands.add_parser("to-onnx", help="write the converted model (with --weights: fine-tuned) back to ONNX, "
                                            "checked against onnxruntime")
    p.add_argument("model")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx")
    p.add_argument("--weights", metavar="STATE_DICT.pt",
                   help="weights to load first: torch.save(model.state_dict(), ...) of the converted model")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", type=lambda t: _pair(t, int),
                   help="example size of a symbolic dimension (default 4)")
    p.add_argument("--static", action="append", default=[], metavar="NAME",
                   help="export this symbolic dimension at its example size instead of dynamic")
    p.add_argument("--opset", type=int,
                   help="ONNX opset (default: the model's, at most torch.onnx's: 20 in torch 2.13)")
    p.add_argument("--no-check", action="store_true", help="skip the check against onnxruntime")
    p.add_argument("--verbose", "-v", action="store_true", help="log each node's converter")
    p.add_argument("--dequantize", action="store_true", help="write the float model of a quantized one")
    _fuse_option(p)
    _constant_option(p)
    p.add_argument("--keep-bound", action="store_true",
                   help="keep the inputs bound with --constant in the written model (unused) instead of leaving "
                        "them out")
    p.set_defaults(run=to_onnx)

    return parser


if __name__ == "__main__":
    sys.exit(main())
