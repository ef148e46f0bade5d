"""Back to ONNX: ``to_onnx`` writes a converted (and fine-tuned) module as a drop-in replacement of its model.

The trip: torch.export (non-strict) with the dims that the original model leaves symbolic dynamic (``Dim.AUTO``:
torch finds the relations between them itself) -> torch.onnx.export of that program, the recurrent op translated
back into native LSTM/GRU/RNN nodes -> the original's interface and opset (onnx_rewrite) -> onnxruntime against the
module at two shapes -> the file, written whole or not at all.

A module that torch cannot export is refused with the ONNX node whose module failed (or whose module pinned a
dynamic dim to one size); an exported model whose outputs differ from the module's is refused with the output.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import fx, nn

from .checking import DEFAULT_INT_RANGE, _numpy, compare_arrays, index_ranges
from .codegen import quiet_torch
from .errors import ExportError
from .modules.control_flow import If
from .modules.quantized import INTEGER_OPS
from .onnx_rewrite import has_half_precision, lower_opset, opset_of, restore_interface
from .recurrent import masked_onnx, onnx_translation_table, steps_read
from .signature import OnnxSignature, example_inputs, recorded

DEFAULT_SIZE = 4  # example size of a dynamic dim that the caller does not set
HALF_TOLERANCE = 1e-3  # least rtol and atol where the model computes in float16/bfloat16 (one unit in the last place)
EXTERNAL_DATA_BYTES = 1 << 30  # weights beyond this go to "<file>.data" next to the model (protobuf stops at 2 GB)


@dataclass
class ExportSummary:
    path: Path
    opset: int
    dynamic_dims: list[str]  # names of the dims exported as dynamic
    checked_shapes: list[list[list[int]]]  # per checked input set, the input shapes (empty when not checked)
    max_abs_error: float  # over every output of every checked set
    recurrent_nodes: int  # LSTM/GRU/RNN nodes in the written model


def to_onnx(module: nn.Module, path: str | os.PathLike, example_inputs: Sequence[torch.Tensor] | None = None, *,
            dims: Mapping[str, int] | None = None, dynamic: bool | Collection[str] = True, opset: int | None = None,
            check: bool = True, rtol: float = 1e-4, atol: float = 1e-5, keep_bound: bool = False) -> ExportSummary:
    """Write ``module`` (made by ``convert``, then trained or not) to ``path`` as an ONNX model that replaces the
    original: its input and output names, dtypes and dims, native LSTM/GRU/RNN nodes for the recurrent layers, the
    module's current weights.

    - ``example_inputs`` (in the module's input order) are traced; by default they are made from the recorded input
      specs, each symbolic dim of size ``dims[name]`` (names as in the original model; default 4, or the steps that
      an unrolled layer reads where that is more).
    - ``dynamic``: which of the original's symbolic dims stay dynamic: all (True), none (False) or those named; the
      others are exported at their example size.
    - ``opset``: default the original's (at most the exporter's: 20 with torch 2.13), else the lowest above it that
      ONNX's version converter reaches.
    - ``check`` (when onnxruntime is installed): onnxruntime runs the model at the example shapes and at another size
      of every dynamic dim, on random inputs, and nothing is written unless every output matches the module's within
      ``rtol``/``atol`` (at least 1e-3 where the model computes in float16).
    - ``keep_bound``: the inputs bound at conversion (``convert(..., constants=...)``) are left out of the written
      model (default), or kept where the original has them, unused (callers that feed them need no change; the
      model computes for the bound values whatever they pass).

    Raises ExportError naming the node whose module torch cannot export, or the output that differs.
    """
    signature = recorded(module)
    if signature is None:
        raise ExportError("the module has no recorded ONNX signature: to_onnx writes modules made by "
                          "onnx2torch_rnn.convert")
    _refuse_integer_ops(module)
    axes = _dynamic_axes(signature, dynamic)
    # a dynamic dim's default example size: at least the steps unrolled layers read (dynamo's unrolled nn.RNN)
    size = max(DEFAULT_SIZE, steps_read(module))
    args = tuple(example_inputs) if example_inputs is not None else _example(signature, dims, size)
    _check_examples(signature, args, axes)
    was_training = module.training
    module.eval()  # ONNX semantics are inference semantics (BatchNormalization)
    try:
        proto, second = _export(module, signature, args, axes)
        masked_onnx.expand(proto)  # the Loops of masked recurrences
        restore_interface(proto, signature)
        if keep_bound:
            _keep_bound(proto, signature)
        proto = lower_opset(proto, opset or signature.opset or opset_of(proto))
        shapes = [[list(a.shape) for a in args], *second] if check else []
        checked, worst = _write_checked(proto, Path(path), module, signature, shapes, rtol, atol)
    finally:
        module.train(was_training)
    names = sorted({spec.symbol(axis) for spec, dynamic_axes in zip(signature.inputs, axes, strict=True)
                    for axis in dynamic_axes})
    recurrent = sum(n.op_type in ("LSTM", "GRU", "RNN") for n in proto.graph.node)
    return ExportSummary(Path(path).resolve(), opset_of(proto), names, checked, worst, recurrent)


def _refuse_integer_ops(module: nn.Module) -> None:
    """An int8 model (exact mode) is not written back: its integer ops would come back as float64 arithmetic or
    Python loops, not as the ONNX int8 ops onnxruntime runs."""
    labels = _onnx_nodes(module) if isinstance(module, fx.GraphModule) else {}
    found = [labels.get(name, f"{type(sub).__name__} module {name!r}") for name, sub in module.named_modules()
             if isinstance(sub, INTEGER_OPS)]
    if found:
        listed = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ExportError(f"{listed}: to_onnx does not write int8 ops back to ONNX; convert the model with "
                          "dequantize=True, fine-tune that float model, write it with to_onnx and quantize the file "
                          "again with onnxruntime.quantization (quantize_dynamic or quantize_static)")


def _dynamic_axes(signature: OnnxSignature, dynamic: bool | Collection[str]) -> list[list[int]]:
    """Per input, the axes to export as dynamic: symbolic in the original and chosen by ``dynamic``."""
    symbolic = [[axis for axis, d in enumerate(spec.dims or ()) if not isinstance(d, int)]
                for spec in signature.inputs]
    if isinstance(dynamic, bool):
        return symbolic if dynamic else [[] for _ in symbolic]
    known = {spec.symbol(axis) for spec, axes in zip(signature.inputs, symbolic, strict=True) for axis in axes}
    unknown = set(dynamic) - known
    if unknown:
        raise ExportError(f"dynamic names {sorted(unknown)}, which are not symbolic dims of the model's inputs "
                          f"({', '.join(sorted(known)) or 'it has none'})")
    return [[axis for axis in axes if spec.symbol(axis) in dynamic]
            for spec, axes in zip(signature.inputs, symbolic, strict=True)]


def _example(signature: OnnxSignature, dims: Mapping[str, int] | None, size: int) -> tuple[torch.Tensor, ...]:
    try:
        return example_inputs(signature, dims, size)
    except ValueError as error:
        raise ExportError(str(error)) from None


def _check_examples(signature: OnnxSignature, args: tuple[torch.Tensor, ...], axes: list[list[int]]) -> None:
    if len(args) != len(signature.inputs):
        raise ExportError(f"{len(args)} example inputs for {len(signature.inputs)} model inputs "
                          f"({', '.join(s.name for s in signature.inputs)})")
    for spec, arg, dynamic_axes in zip(signature.inputs, args, axes, strict=True):
        if arg.dtype != spec.dtype:
            raise ExportError(f"example input {spec.name!r} is {arg.dtype}; the model's input is {spec.dtype}")
        small = [axis for axis in dynamic_axes if axis < arg.dim() and arg.shape[axis] < 2]
        if small:  # torch.export makes dims of size 0 and 1 constants
            raise ExportError(f"example input {spec.name!r} has shape {list(arg.shape)}: its dynamic dim(s) "
                              f"{small} need a size of at least 2 to stay dynamic")


# ---------------------------------------------------------------------------------------------------- torch side

class _Exported(nn.Module):
    """The module under one attribute: its parameters' names ('model.<name>') cannot collide with the exporter's
    own value names (val_N, ...), as an ONNX initializer name kept as a parameter name could."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args)


def _onnx_nodes(module: fx.GraphModule) -> dict[str, str]:
    """Submodule name -> the ONNX node it came from, as error messages name it."""
    labels = {}
    for node in module.graph.nodes:
        if node.op == "call_module" and "onnx" in node.meta:
            onnx_node = node.meta["onnx"]
            name = repr(onnx_node["name"]) if onnx_node["name"] else f"(unnamed; module {node.target!r})"
            labels[node.target] = f"{onnx_node['op_type']} node {name}"
    return labels


class _Watch:
    """Which ONNX node's module torch.export is tracing: an error inside it names that node, and so does the first
    node after which a dim that should stay dynamic became a constant."""

    def __init__(self, module: fx.GraphModule, axes: list[list[int]]):
        self.module, self.axes = module, axes
        self.nodes = _onnx_nodes(module)
        self.running: list[str] = []
        self.dims: dict[tuple[int, int], torch.SymInt] = {}
        self.pinned_by: dict[tuple[int, int], str] = {}
        self.decided: dict[str, str] = {}  # If node -> its condition on sizes, decided in Python

    @contextlib.contextmanager
    def __call__(self) -> Iterator[_Watch]:
        handles = [self.module.register_forward_pre_hook(self._started)]
        for target, label in self.nodes.items():
            submodule = self.module.get_submodule(target)
            handles.append(submodule.register_forward_pre_hook(lambda *_, n=label: self.running.append(n)))
            handles.append(submodule.register_forward_hook(lambda *_, n=label: self._finished(n)))
            if isinstance(submodule, If):
                handles.append(submodule.register_forward_pre_hook(lambda m, args, n=label: self._if(n, m, args)))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _started(self, _module, args) -> None:
        self.running.clear()
        self.dims = {(i, axis): arg.shape[axis] for i, (arg, axes) in enumerate(zip(args, self.axes, strict=False))
                     for axis in axes if isinstance(arg.shape[axis], torch.SymInt)}

    def _finished(self, label: str) -> None:
        self.running.pop()
        for key, dim in self.dims.items():
            if key not in self.pinned_by and _is_constant(dim):
                self.pinned_by[key] = label

    def _if(self, label: str, module: If, args: tuple) -> None:
        """An If whose condition on dynamic sizes is decided in Python: from what torch.export assumes of them (a
        condition that holds at sizes 0 or 1 only: it takes no dynamic size to be either), or where the branches
        cannot be one torch.cond (If.carries)."""
        cond = args[0][0] if isinstance(args[0], list) else args[0]
        if (isinstance(cond, torch.SymBool) and cond.node.expr.free_symbols
                and not module.carries(cond, args[1:])):
            self.decided[label] = str(cond.node.expr)

    @property
    def failing_node(self) -> str | None:
        return self.running[-1] if self.running else None


def _is_constant(dim: torch.SymInt | int) -> bool:
    """Whether torch has pinned a size to one value (a guard ``s == 5`` replaces the symbol by 5)."""
    if not isinstance(dim, torch.SymInt):
        return True
    with contextlib.suppress(Exception):  # torch internals: without them, no node is named
        return bool(dim.node.shape_env.replace(dim.node.expr).is_number)
    return False


def _prefix(label: str | None) -> str:
    return f"{label}: " if label else ""


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _export(module: fx.GraphModule, signature: OnnxSignature, args: tuple[torch.Tensor, ...],
            axes: list[list[int]]) -> tuple[onnx.ModelProto, list[list[list[int]]]]:
    """The exported ONNX model, and the input shapes of a second check (each dynamic dim at another size)."""
    from torch.export import Dim

    watch = _Watch(module, axes)
    dynamic = tuple({axis: Dim.AUTO for axis in dynamic_axes} or None for dynamic_axes in axes)
    try:
        with watch(), quiet_torch():
            program = torch.export.export(_Exported(module), args, dynamic_shapes=(dynamic,), strict=False)
    except Exception as error:
        shapes = [list(a.shape) for a in args]
        raise ExportError(f"{_prefix(watch.failing_node)}torch.export cannot trace the module at input shapes "
                          f"{shapes}: {_first_line(error)}") from error
    _refuse_pinned_dims(program, signature, axes, watch)
    _refuse_decided_ifs(program, signature, watch)
    try:
        with quiet_torch():
            proto = torch.onnx.export(program, custom_translation_table=onnx_translation_table(), verbose=False,
                                      optimize=True).model_proto
    except Exception as error:
        raise ExportError(f"{_prefix(_translating(program, module, error))}torch.onnx cannot translate the "
                          f"exported program: {_first_line(_innermost(error))}") from error
    return proto, _second_shapes(program, args)


def _user_inputs(program: torch.export.ExportedProgram) -> list[fx.Node]:
    names = set(program.graph_signature.user_inputs)
    return [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]


def _refuse_pinned_dims(program: torch.export.ExportedProgram, signature: OnnxSignature, axes: list[list[int]],
                        watch: _Watch) -> None:
    for i, (spec, node, dynamic_axes) in enumerate(zip(signature.inputs, _user_inputs(program), axes, strict=True)):
        for axis in dynamic_axes:
            dim = node.meta["val"].shape[axis]
            if _is_constant(dim):
                raise ExportError(
                    f"{_prefix(watch.pinned_by.get((i, axis)))}its module pins dim {axis} ({spec.symbol(axis)!r}) "
                    f"of input {spec.name!r} to {int(dim)}: the exported model would only run at that size (if the "
                    f"original model too runs at that size only, leave {spec.symbol(axis)!r} out of dynamic=)")


def _refuse_decided_ifs(program: torch.export.ExportedProgram, signature: OnnxSignature, watch: _Watch) -> None:
    """An If decided in Python by a condition on dynamic sizes leaves one branch in the program, valid for a range of
    sizes that torch.export asserts at run time and ONNX cannot hold: the written model would take that branch at
    every size."""
    if not watch.decided:
        return
    label, condition = next(iter(watch.decided.items()))
    for node, spec in zip(_user_inputs(program), signature.inputs, strict=True):
        for axis, dim in enumerate(node.meta["val"].shape):
            if isinstance(dim, torch.SymInt) and dim.node.expr.is_symbol:
                condition = re.sub(rf"\b{dim.node.expr}\b", spec.symbol(axis), condition)
    raise ExportError(
        f"{label}: its condition on dynamic sizes ({condition}) is decided while exporting (torch.export takes every "
        "dynamic size to be at least 2, or the branches cannot be one torch.cond), so the written model would take "
        "the same branch at every size: export with those dims static (dims= and dynamic= without them), or bind "
        "the input the condition reads (convert(..., constants=...))")


def _innermost(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _translating(program: torch.export.ExportedProgram, module: fx.GraphModule, error: BaseException) -> str | None:
    """The ONNX node whose module made the program node that torch.onnx failed on (its message names it)."""
    nodes = _onnx_nodes(module)
    while error is not None:
        found = re.search(r"translating node %(\w+)", str(error))
        if found:
            node = next((n for n in program.graph.nodes if n.name == found.group(1)), None)
            stack = node.meta.get("nn_module_stack") or {} if node is not None else {}
            for path, _ in stack.values():
                parts = path.split(".")
                if len(parts) > 1 and parts[0] == "model" and parts[1] in nodes:
                    return nodes[parts[1]]
            return None
        error = error.__cause__
    return None


def _second_shapes(program: torch.export.ExportedProgram, args: tuple[torch.Tensor, ...]) -> list[list[list[int]]]:
    """The input shapes with every free size symbol of the program moved to another value in its range (derived
    dims, e.g. 2 * s0, follow); none when the program has no dynamic dim."""
    values, shapes = {}, []
    for node, arg in zip(_user_inputs(program), args, strict=True):
        shape = node.meta["val"].shape
        shapes.append(shape)
        for dim, size in zip(shape, arg.shape, strict=True):
            if isinstance(dim, torch.SymInt) and dim.node.expr.is_symbol:
                values[dim.node.expr] = size
    if not values:
        return []
    moved = {}
    for symbol, size in values.items():
        bounds = program.range_constraints.get(symbol)
        upper = bounds.upper if bounds is not None else size + 3
        moved[symbol] = size + 3 if size + 3 <= upper else max(size - 1, 2)
    return [[[int(d.node.expr.subs(moved)) if isinstance(d, torch.SymInt) else d for d in shape]
             for shape in shapes]]


def _keep_bound(proto: onnx.ModelProto, signature: OnnxSignature) -> None:
    """The bound inputs back among the graph inputs, at the original's positions, read by no node."""
    inputs = list(proto.graph.input)
    taken = {name for node in proto.graph.node for name in node.output} | {t.name for t in proto.graph.initializer}
    for bound in signature.bound:
        if bound.spec.name in taken:
            raise ExportError(f"bound input {bound.spec.name!r} cannot be kept: the exported model has a value of "
                              "that name (keep_bound=False leaves it out)")
        dims = None if bound.spec.dims is None else [d if d is not None else "" for d in bound.spec.dims]
        inputs.insert(bound.position, onnx.helper.make_tensor_value_info(bound.spec.name, bound.spec.elem_type, dims))
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)


# ---------------------------------------------------------------------------------------------------- check, write

def _write_checked(proto: onnx.ModelProto, path: Path, module: nn.Module, signature: OnnxSignature,
                   shapes: list[list[list[int]]], rtol: float, atol: float) -> tuple[list[list[list[int]]], float]:
    """Write the model (and its external data) into a folder beside ``path``, check it there, then move it in."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        external = sum(len(t.raw_data) for t in proto.graph.initializer) > EXTERNAL_DATA_BYTES
        staged = staging / path.name
        onnx.save_model(proto, staged, save_as_external_data=external, location=f"{path.name}.data")
        if has_half_precision(proto):
            rtol, atol = max(rtol, HALF_TOLERANCE), max(atol, HALF_TOLERANCE)
        result = _check(staged, module, signature, shapes, rtol, atol)
        for file in staging.iterdir():  # the model last: a reader never finds it without its data
            if file != staged:
                os.replace(file, path.parent / file.name)
        os.replace(staged, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def _check(path: Path, module: nn.Module, signature: OnnxSignature, shapes: list[list[list[int]]], rtol: float,
           atol: float) -> tuple[list[list[list[int]]], float]:
    """onnxruntime's outputs of the written model against the module's, on random inputs of each set of shapes."""
    try:
        import onnxruntime
    except ImportError:
        return [], 0.0
    if not shapes:
        return [], 0.0
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # an exported op that onnxruntime has no kernel for
        raise ExportError(f"onnxruntime cannot load the exported model: {_first_line(error)}; nothing "
                          "written") from error
    model = onnx.load(str(path), load_external_data=False)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    worst = 0.0
    for seed, input_shapes in enumerate(shapes):
        feeds = _random_feeds(model, signature, input_shapes, seed)
        with torch.no_grad():
            outputs = module(*(torch.from_numpy(feeds[spec.name]).to(device) for spec in signature.inputs))
        outputs = outputs if isinstance(outputs, tuple | list) else (outputs,)
        kept = {i.name for i in model.graph.input}
        try:
            expected = session.run(None, {**{b.spec.name: b.value for b in signature.bound if b.spec.name in kept},
                                          **feeds})
        except Exception as error:
            raise ExportError(f"onnxruntime cannot run the exported model at input shapes {input_shapes}: "
                              f"{_first_line(error)}; nothing written") from error
        for spec, got, want in zip(signature.outputs, outputs, expected, strict=True):
            result = compare_arrays(spec.name, _numpy(got), want, rtol, atol)
            if not result.ok:
                problem = result.problem or (f"max abs error {result.max_abs_error:.3g}, max rel error "
                                             f"{result.max_rel_error:.3g} (rtol {rtol:g}, atol {atol:g})")
                raise ExportError(f"output {spec.name!r} of the exported model differs from the module's at input "
                                  f"shapes {input_shapes}: {problem}; nothing written")
            worst = max(worst, result.max_abs_error)
    return shapes, worst


def _random_feeds(model: onnx.ModelProto, signature: OnnxSignature, input_shapes: list[list[int]],
                  seed: int) -> dict[str, np.ndarray]:
    """Floats standard normal, bools fair coins, integers in the range their use makes valid (checking's
    index_ranges: indices below the table size, lengths up to the sequence length), else checking's default."""
    sizes = {}
    taken = {spec.name for spec in signature.inputs}  # not the bound inputs kept (keep_bound)
    for info, shape in zip([i for i in model.graph.input if i.name in taken], input_shapes, strict=True):
        for dim, size in zip(info.type.tensor_type.shape.dim, shape, strict=True):
            sizes.setdefault(dim.dim_param, size)
    ranges = index_ranges(model, sizes)
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec, shape in zip(signature.inputs, input_shapes, strict=True):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(spec.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[spec.name] = rng.random(shape) > 0.5
        else:
            low, high = ranges.get(spec.name, DEFAULT_INT_RANGE)
            feeds[spec.name] = rng.integers(low, high, shape).astype(dtype)
    return feeds
