"""Compare a converted model with onnxruntime: generated inputs, per-output errors, and the first diverging node.

onnxruntime is an optional dependency (the ``test`` extra); it is imported only when a comparison runs.

The bisect runs both sides once with every intermediate value kept: onnxruntime on a copy of the model that lists
each value computed by a node of the main graph as a graph output, the converted module node by node through
``torch.fx.Interpreter``. ``node.meta["onnx_values"]`` names the ONNX values of each fx node's arguments and outputs.
Values computed inside If/Loop/Scan bodies cannot be exposed: such a node is compared as a whole. A node folded at
conversion has no fx node; its value is compared where the module reads it as a constant. Shape arithmetic that the
module computes as ints (shape_arithmetic.py) is compared where a module reads it; the values in between (a Shape or
Gather on the way) have no fx node and are not compared.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import fx

from .builder import build
from .errors import ModuleRunError, ReferenceRuntimeError
from .loading import LoadedModel, ModelSource, _skeleton, load_model, subgraphs
from .registry import normalize_domain
from .tensors import is_external, torch_dtype

DEFAULT_DIM = 3  # size given to a symbolic dimension that the caller did not set
DEFAULT_INT_RANGE = (0, 4)  # integer inputs whose use does not tell a safe range

# Ops that pass integer values through unchanged (only their layout changes): an index stays an index.
_PASS_THROUGH = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand"})
_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
# Ops that round float values to integer steps: a float input one ulp off can move an output a whole step.
_QUANTIZERS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul",
                         "MatMulIntegerToFloat"})


def _graph(model: ModelSource | LoadedModel) -> onnx.ModelProto | LoadedModel:
    """A ModelProto or LoadedModel as it is; a path or bytes loaded (``load_model``), the one place that parses."""
    return model if isinstance(model, onnx.ModelProto | LoadedModel) else load_model(model)


def _proto(model: onnx.ModelProto | LoadedModel) -> onnx.ModelProto:
    return model.proto if isinstance(model, LoadedModel) else model


def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are fed at run time (an input with a same-named initializer is a constant)."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


# ----------------------------------------------------------------------------------------------- inputs

def _shapes(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, list[int | None]]:
    """Static shapes of the main graph's values (symbolic dims resolved through ``dims``), where known."""
    def shape(type_proto: onnx.TypeProto) -> list[int | None]:
        return [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, DEFAULT_DIM if d.dim_param else None)
                for d in type_proto.tensor_type.shape.dim]

    infos = [*model.graph.input, *model.graph.value_info, *model.graph.output]
    result = {i.name: shape(i.type) for i in infos if i.type.tensor_type.HasField("shape")}
    result.update({t.name: list(t.dims) for t in model.graph.initializer})
    return result


def index_ranges(model: ModelSource | LoadedModel, dims: Mapping[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """Safe ``[low, high)`` ranges for integer inputs whose use tells one: indices of a Gather (GatherElements)
    into a value of known size get ``[0, size)``; the sequence_lens of an LSTM/GRU/RNN get ``[1, T]``.

    Indices are followed through ops that only change layout or type (Cast, Reshape, Unsqueeze, ...).
    """
    model = _graph(model)
    proto, dims = _proto(model), dict(dims or {})
    readers = defaultdict(list)
    for node in proto.graph.node:
        for position, name in enumerate(node.input):
            readers[name].append((node, position))
    shapes: dict[str, list[int | None]] | None = None
    ranges = {}
    for info in runtime_inputs(proto):
        highs, pending, seen = [], [info.name], set()
        while pending:
            name = pending.pop()
            seen.add(name)
            for node, position in readers[name]:
                attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                if node.op_type in _PASS_THROUGH and position == 0:
                    pending += [o for o in node.output[:1] if o and o not in seen]
                    continue
                if node.op_type in ("Gather", "GatherElements") and position == 1:
                    axis, data, offset = attributes.get("axis", 0), node.input[0], 0
                elif node.op_type in _RECURRENT and position == 4:
                    axis, data, offset = attributes.get("layout", 0), node.input[0], 1  # time axis of X; lens <= T
                else:
                    continue
                shapes = _shapes(_inferred(model), dims) if shapes is None else shapes
                shape = shapes.get(data)
                if shape and -len(shape) <= axis < len(shape) and shape[axis]:
                    highs.append((shape[axis] + offset, offset))
        if highs:
            high, low = min(highs)
            ranges[info.name] = (low, max(high, low + 1))
    return ranges


def _inferred(model: onnx.ModelProto | LoadedModel) -> onnx.ModelProto:
    """The model with the static types of its values: a LoadedModel's own, else inferred on a weightless copy."""
    if isinstance(model, LoadedModel):
        return model.inferred
    with contextlib.suppress(Exception):
        return onnx.shape_inference.infer_shapes(_skeleton(model), check_type=False, strict_mode=False)
    return model


def random_inputs(
    model: ModelSource | LoadedModel,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    default_int_range: tuple[int, int] | None = None,
) -> dict[str, np.ndarray]:
    """Random feeds: floats standard normal, integers uniform in ``[low, high)``, bools fair coins.

    Symbolic dimensions take their size from ``dims`` (default ``DEFAULT_DIM``). An integer input takes its range
    from ``int_ranges``, else from its use (``index_ranges``), else ``default_int_range`` (default
    ``DEFAULT_INT_RANGE``); a ``default_int_range`` given explicitly applies to every input not in ``int_ranges``.
    """
    model = _graph(model)
    rng = np.random.default_rng(seed)
    ranges = {} if default_int_range is not None else index_ranges(model, dims)
    ranges.update(int_ranges or {})
    feeds = {}
    for info in runtime_inputs(_proto(model)):
        tensor_type = info.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, DEFAULT_DIM)
                 for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[info.name] = rng.random(shape) > 0.5
        else:
            low, high = ranges.get(info.name, default_int_range or DEFAULT_INT_RANGE)
            feeds[info.name] = rng.integers(low, high, shape).astype(dtype)
    return feeds


# ----------------------------------------------------------------------------------------------- running

@contextlib.contextmanager
def _reference(model: ModelSource | LoadedModel, outputs: Sequence[str] = ()) -> Iterator[str | bytes]:
    """What onnxruntime opens: the model as given (a LoadedModel: as it was given to ``load_model``, so a dequantized
    model's reference is the quantized one), with ``outputs`` added to its graph outputs.

    The outputs are added by appending a serialized ModelProto that holds only them: protobuf merges concatenated
    messages (repeated fields append), so the weights are not copied into a second proto. A loaded model with
    external data is opened from a file in its folder (a temporary copy unless it is the given file), so that the
    data's relative paths resolve.
    """
    loaded = model if isinstance(model, LoadedModel) else None
    source = model if loaded is None else loaded.proto if loaded.source is None else loaded.source
    path = os.fspath(source) if isinstance(source, str | os.PathLike) else None
    if path is not None and not outputs:
        yield path
        return
    data = (Path(path).read_bytes() if path is not None else bytes(source) if isinstance(source, bytes | bytearray)
            else source.SerializeToString())
    if outputs:  # untyped: onnxruntime infers their types
        data += onnx.ModelProto(graph=onnx.GraphProto(
            output=[onnx.ValueInfoProto(name=name) for name in outputs])).SerializeToString()
    if loaded is None or not any(is_external(t) for g in subgraphs(loaded.proto.graph) for t in g.initializer):
        yield data
        return
    handle, copy = tempfile.mkstemp(suffix=".onnx", dir=loaded.base_dir)  # load_model refuses external data without one
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        yield copy
    finally:
        os.unlink(copy)


@contextlib.contextmanager
def _reference_failures() -> Iterator[None]:
    """Whatever onnxruntime raises while it opens or runs a model, as ReferenceRuntimeError."""
    try:
        import onnxruntime  # noqa: F401 - an optional dependency
    except ImportError as error:
        raise ReferenceRuntimeError("onnxruntime is not installed (pip install onnxruntime, or this package's "
                                    "'test' extra)") from error
    try:
        yield
    except Exception as error:
        raise ReferenceRuntimeError(str(error)) from error


def _session(source: str | bytes, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def run_onnxruntime(model: ModelSource | LoadedModel, feeds: Mapping[str, np.ndarray],
                    threads: int = 1) -> list[np.ndarray]:
    """onnxruntime's outputs with graph optimisations off (the plain kernels are the reference). Raises
    ReferenceRuntimeError when onnxruntime cannot run the model on ``feeds``."""
    with _reference(model) as source, _reference_failures():
        return _session(source, threads).run(None, _with_bound(model, feeds))


def _with_bound(model: ModelSource | LoadedModel, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds, with the values of the inputs a loaded model binds (the reference is the model as given)."""
    binding = model.binding if isinstance(model, LoadedModel) else None
    return {**feeds, **(binding.values if binding is not None else {})}


def _torch_args(model: ModelSource | LoadedModel, feeds: Mapping[str, np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.array(feeds[i.name])) for i in runtime_inputs(_proto(_graph(model)))]


def _numpy(value: torch.Tensor) -> np.ndarray:
    return (value.float() if value.dtype == torch.bfloat16 else value).detach().cpu().numpy()


def run_torch(module: torch.nn.Module, model: ModelSource | LoadedModel,
              feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The converted module's outputs, fed the graph inputs positionally in ONNX order."""
    with torch.no_grad():
        result = module(*_torch_args(model, feeds))
    return [_numpy(r) for r in (result if isinstance(result, tuple | list) else [result])]


@contextlib.contextmanager
def _module_failures() -> Iterator[None]:
    """Whatever the converted module raises while it runs, as ModuleRunError."""
    try:
        yield
    except Exception as error:
        raise ModuleRunError(error) from error


# ----------------------------------------------------------------------------------------------- the report

@dataclass
class OutputComparison:
    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_error: float
    max_rel_error: float
    ok: bool
    problem: str = ""  # set when shape or dtype differ


@dataclass
class ValueSummary:
    """An input of the diverging node: shape and dtype (as onnxruntime saw it), and whether both sides agreed."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str
    matches: bool | None  # None: not compared (e.g. a constant folded into a module)


@dataclass
class Divergence:
    """The first ONNX node (in graph order) whose output differs from onnxruntime's beyond tolerance."""

    node: str  # the node's name, or OpType_index when it has none
    op_type: str
    domain: str
    index: int  # position in the main graph's node list
    attributes: dict[str, str]  # printable values
    inputs: list[ValueSummary]
    outputs: list[OutputComparison]  # the compared outputs of the node (at least one fails)
    folded: bool  # evaluated at conversion: the module reads its value as a constant
    fused_into: str | None = None  # the recognised recurrence that computes the node's outputs, if any
    # a quantizer whose float inputs match only to tolerance: where the first value that is not bit for bit
    # onnxruntime's comes from ("<op> node '<name>' (max abs error e)")
    flipped_by: str | None = None
    flipped_at: str | None = None  # that quantizer: this node, or one inside the recognised recurrence computing it


    def __str__(self) -> str:
        op = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        lines = [f"first divergence: {op} node {self.node!r} (#{self.index} in graph order)"
                 + (", folded to a constant at conversion" if self.folded else "")]
        if self.flipped_by:
            lines.append(f"  quantization step flipped at node {self.flipped_at!r}: its float inputs match onnxruntime "
                         f"to tolerance but not bit for bit, and a value that close to a rounding boundary rounds to "
                         f"the neighbouring step; the first value not bit for bit is the output of {self.flipped_by}")
        if self.fused_into:
            lines.append(f"  computed by {self.fused_into} (fuse=False / --no-fuse compares the nodes inside it)")
        lines.append("  attributes: " + (", ".join(f"{k}={v}" for k, v in self.attributes.items()) or "none"))
        for value in self.inputs:
            state = {True: "matches", False: "DIFFERS", None: "not compared"}[value.matches]
            shape = "?" if value.shape is None else list(value.shape)
            lines.append(f"  input  {value.name}: {value.dtype} {shape} ({state})")
        for out in self.outputs:
            status = "ok" if out.ok else (out.problem or "DIFFERS")
            lines.append(f"  output {out.name}: {out.dtype} {list(out.shape)}, max abs error {out.max_abs_error:.3g},"
                         f" max rel error {out.max_rel_error:.3g} ({status})")
        return "\n".join(lines)


@dataclass
class Report:
    outputs: list[OutputComparison] = field(default_factory=list)
    rtol: float = 1e-4
    atol: float = 1e-5
    bisected: bool = False  # whether intermediate values were compared
    compared_nodes: int = 0  # nodes with at least one output compared by the bisect
    divergence: Divergence | None = None  # set by the bisect when some node differs

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


def compare_arrays(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> OutputComparison:
    if str(expected.dtype) == "bfloat16":
        expected = expected.astype(np.float32)
    problem = ""
    if actual.shape != expected.shape:
        problem = f"shape {actual.shape} != onnxruntime's {expected.shape}"
    elif actual.dtype != expected.dtype:
        problem = f"dtype {actual.dtype} != onnxruntime's {expected.dtype}"
    if problem or actual.size == 0:
        return OutputComparison(name, actual.shape, str(actual.dtype), 0.0, 0.0, not problem, problem)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    same = (a == e) | (np.isnan(a) & np.isnan(e))  # equal infinities and NaNs count as no error
    with np.errstate(invalid="ignore", divide="ignore"):
        abs_error = np.where(same, 0.0, np.abs(a - e))
        rel_error = np.where(same, 0.0, abs_error / np.maximum(np.abs(e), np.finfo(np.float64).tiny))
        close = np.isfinite(e) & (abs_error <= atol + rtol * np.abs(e))  # a NaN or infinity must be matched exactly
    ok = bool(np.all(same | close))
    return OutputComparison(name, actual.shape, str(actual.dtype), float(abs_error.max()),
                            float(rel_error.max()), ok)


def compare(
    model: ModelSource | LoadedModel,
    inputs: Mapping[str, np.ndarray] | None = None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    module: torch.nn.Module | None = None,
    bisect: bool | None = None,
) -> Report:
    """Convert ``model`` (unless ``module`` is given), run it and onnxruntime on ``inputs`` (random when None,
    see ``random_inputs``) and compare every output.

    ``bisect`` (default: only when an output differs) also compares every intermediate value and sets
    ``report.divergence`` to the first node whose output differs beyond tolerance.

    The model is parsed once: every step works on one ``LoadedModel``. Pass one (``load_model``) to share it with
    the caller, converted to ``module`` or not.
    Raises ReferenceRuntimeError when onnxruntime cannot run the model on the inputs, ModuleRunError when the
    module fails on inputs that onnxruntime runs.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model, single_use=True)
    feeds = random_inputs(loaded, seed, dims, int_ranges) if inputs is None else dict(inputs)
    module = build(loaded) if module is None else module
    expected = run_onnxruntime(loaded, feeds)
    with _module_failures():
        actual = run_torch(module, loaded, feeds)
    names = [o.name for o in loaded.proto.graph.output]
    report = Report(rtol=rtol, atol=atol)
    for name, got, want in zip(names, actual, expected, strict=True):
        report.outputs.append(compare_arrays(name, got, want, rtol, atol))
    if bisect or (bisect is None and not report.ok):
        report.bisected = True
        report.compared_nodes, report.divergence = _bisect(loaded, module, feeds, rtol, atol)
    return report


# ----------------------------------------------------------------------------------------------- the bisect

def _onnxruntime_values(loaded: LoadedModel, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of the main graph as onnxruntime computes it: the inputs, and each node's outputs."""
    listed = {o.name for o in loaded.proto.graph.output}
    inlined = loaded.binding.inlined if loaded.binding is not None else frozenset()  # not in the reference's graph
    exposed = dict.fromkeys(name for node in loaded.proto.graph.node for name in node.output
                            if name and name not in listed and name not in inlined)
    with _reference(loaded, list(exposed)) as source, _reference_failures():
        session = _session(source, threads=1)
        # onnxruntime's Python API cannot return bfloat16 arrays: such values are not compared
        names = [o.name for o in session.get_outputs() if o.type != "tensor(bfloat16)"]
        values = dict(zip(names, session.run(names, _with_bound(loaded, feeds)), strict=True))
    values.update(feeds)
    return {k: v for k, v in values.items() if isinstance(v, np.ndarray)}  # sequences and maps are not compared


def _torch_values(module: fx.GraphModule, loaded: LoadedModel, feeds: Mapping[str, np.ndarray]):
    """(value name -> tensor, names of values the module reads as constants, value name -> (the fused recurrence
    that computes it, the nodes it replaces)) from one node-by-node run."""
    interpreter = fx.Interpreter(module, garbage_collect_values=False)
    args = _torch_args(loaded, feeds)
    with torch.no_grad(), _module_failures():
        interpreter.run(*args)
    values, constants, fused = {}, set(), {}
    for node in module.graph.nodes:
        names = node.meta.get("onnx_values")
        if names is None:
            continue
        result = interpreter.env[node]
        outputs = names["outputs"]
        onnx_node = node.meta.get("onnx", {})
        if "replaces" in onnx_node:
            label = (f"the fused {onnx_node['op_type']} {onnx_node['name']!r} ({len(onnx_node['replaces'])} nodes, "
                     f"pattern {onnx_node['pattern']})")
            fused.update((name, (label, onnx_node["replaces"])) for name in outputs if name)
        pairs = [(outputs[0], result)] if len(outputs) == 1 else zip(outputs, result, strict=False)
        values.update((name, value) for name, value in pairs if name is not None)
        for name, arg in zip(names["inputs"], node.args, strict=True):
            if name is not None and isinstance(arg, fx.Node) and arg.op == "get_attr":
                values[name] = interpreter.env[arg]
                constants.add(name)
            elif name is not None and _is_ints(value := fx.node.map_arg(arg, interpreter.env.get)):
                values[name] = _ints(value, loaded.types.get(name))
    return {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}, constants, fused


def _is_ints(value) -> bool:
    return isinstance(value, int) or (isinstance(value, list) and all(isinstance(v, int) for v in value))


def _ints(value: int | list[int], value_type: onnx.TypeProto | None) -> torch.Tensor:
    """A value a module reads as ints, as the tensor of its ONNX type."""
    elem_type = value_type.tensor_type.elem_type if value_type is not None else onnx.TensorProto.INT64
    return torch.tensor(value, dtype=torch_dtype(elem_type or onnx.TensorProto.INT64))


def _bisect(loaded: LoadedModel, module: torch.nn.Module, feeds: Mapping[str, np.ndarray], rtol: float,
            atol: float) -> tuple[int, Divergence | None]:
    if not isinstance(module, fx.GraphModule):
        raise TypeError("the bisect needs the torch.fx.GraphModule that convert() returns")
    proto = loaded.proto
    expected = _onnxruntime_values(loaded, feeds)
    actual, constants, fused = _torch_values(module, loaded, feeds)
    initializers = {t.name: t for t in proto.graph.initializer}
    verdicts: dict[str, bool] = {}
    compared, inexact = 0, {}  # node index -> label, for nodes whose outputs match to tolerance only
    for index, node in enumerate(proto.graph.node):
        outputs = [compare_arrays(name, _numpy(actual[name]), expected[name], rtol, atol)
                   for name in node.output if name in actual and name in expected]
        verdicts.update((o.name, o.ok) for o in outputs)
        compared += bool(outputs)
        if all(o.ok for o in outputs):
            error = max((o.max_abs_error for o in outputs), default=0.0)
            if error > 0:
                name = node.name or f"{node.op_type}_{index}"
                inexact[index] = f"{node.op_type} node {name!r} (max abs error {error:.3g})"
            continue
        inputs = []
        for name in filter(None, node.input):
            if name in expected:
                shape, dtype = expected[name].shape, str(expected[name].dtype)
            elif name in initializers:
                tensor = initializers[name]
                shape = tuple(tensor.dims)
                dtype = str(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
            else:
                shape, dtype = None, "?"
            inputs.append(ValueSummary(name, shape, dtype, verdicts.get(name)))
        folded = all(o.name in constants for o in outputs)
        label, replaced = next((fused[o.name] for o in outputs if o.name in fused), (None, ()))
        divergence = Divergence(node.name or f"{node.op_type}_{index}", node.op_type, normalize_domain(node.domain),
                                index, {a.name: _show_attribute(a) for a in node.attribute}, inputs, outputs, folded,
                                label)
        # a quantizer, or a recurrence recognised around one (its own outputs are not computed to compare)
        quantizers = [n.name for n in proto.graph.node if n.name in replaced and n.op_type in _QUANTIZERS]
        flipped_at = divergence.node if node.op_type in _QUANTIZERS else next(iter(quantizers), None)
        if flipped_at is not None and all(i.matches is not False for i in inputs):
            divergence.flipped_by = _first_inexact_ancestor(proto.graph, index, inexact)
            divergence.flipped_at = flipped_at
        return compared, divergence
    return compared, None


def _first_inexact_ancestor(graph: onnx.GraphProto, index: int, inexact: Mapping[int, str]) -> str | None:
    """The label of the earliest node, among those whose values reach node ``index``, that matched onnxruntime
    to tolerance only."""
    producers = {name: i for i, node in enumerate(graph.node[:index]) for name in node.output if name}
    seen, stack = set(), [index]
    while stack:
        for name in graph.node[stack.pop()].input:
            producer = producers.get(name)
            if producer is not None and producer not in seen:
                seen.add(producer)
                stack.append(producer)
    found = sorted(seen & inexact.keys())
    return inexact[found[0]] if found else None


def _show_attribute(attribute: onnx.AttributeProto) -> str:
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, onnx.GraphProto):
        return f"<graph {value.name!r}: {len(value.node)} nodes>"
    if isinstance(value, onnx.TensorProto):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.data_type)
        return f"<tensor {dtype} {list(value.dims)}>"
    if isinstance(value, bytes):
        return repr(value.decode())
    if isinstance(value, Sequence) and value and isinstance(value[0], bytes):
        return repr([v.decode() for v in value])
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
