"""Compare a converted model with onnxruntime: generated inputs, per-output errors, a report as data.

onnxruntime is an optional dependency (the ``test`` extra); it is imported only when a comparison runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch

from .loading import ModelSource

DEFAULT_DIM = 3  # size given to a symbolic dimension that the caller did not set


def _as_proto(model: ModelSource) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes | bytearray):
        return onnx.ModelProto.FromString(bytes(model))
    return onnx.load(os.fspath(model), load_external_data=False)


def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are fed at run time (an input with a same-named initializer is a constant)."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def random_inputs(
    model: ModelSource,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    default_int_range: tuple[int, int] = (0, 4),
) -> dict[str, np.ndarray]:
    """Random feeds: floats standard normal, integers uniform in [low, high), bools fair coins.

    Symbolic dimensions take their size from ``dims`` (default ``DEFAULT_DIM``); ``int_ranges`` gives per-input
    integer ranges.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in runtime_inputs(_as_proto(model)):
        tensor_type = info.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, DEFAULT_DIM)
                 for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[info.name] = rng.random(shape) > 0.5
        else:
            low, high = (int_ranges or {}).get(info.name, default_int_range)
            feeds[info.name] = rng.integers(low, high, shape).astype(dtype)
    return feeds


def run_onnxruntime(model: ModelSource, feeds: Mapping[str, np.ndarray], threads: int = 1) -> list[np.ndarray]:
    """onnxruntime's outputs with graph optimisations off (the plain kernels are the reference)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def run_torch(module: torch.nn.Module, model: ModelSource, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The converted module's outputs, fed the graph inputs positionally in ONNX order."""
    args = [torch.from_numpy(np.array(feeds[i.name])) for i in runtime_inputs(_as_proto(model))]
    with torch.no_grad():
        result = module(*args)
    results = list(result) if isinstance(result, tuple | list) else [result]
    return [(r.float() if r.dtype == torch.bfloat16 else r).detach().numpy() for r in results]


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
class Report:
    outputs: list[OutputComparison] = field(default_factory=list)
    rtol: float = 1e-4
    atol: float = 1e-5

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
    abs_error = np.where(same, 0.0, np.abs(a - e))
    rel_error = np.where(same, 0.0, abs_error / np.maximum(np.abs(e), np.finfo(np.float64).tiny))
    ok = bool(np.all(abs_error <= atol + rtol * np.abs(e)))
    return OutputComparison(name, actual.shape, str(actual.dtype), float(np.nanmax(abs_error)),
                            float(np.nanmax(rel_error)), ok)


def compare(
    model: ModelSource,
    inputs: Mapping[str, np.ndarray] | None = None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    module: torch.nn.Module | None = None,
) -> Report:
    """Convert ``model`` (unless ``module`` is given), run it and onnxruntime on ``inputs`` (random when None)
    and compare every output."""
    from . import convert

    feeds = random_inputs(model, seed, dims) if inputs is None else dict(inputs)
    module = convert(model) if module is None else module
    expected = run_onnxruntime(model, feeds)
    actual = run_torch(module, model, feeds)
    names = [o.name for o in _as_proto(model).graph.output]
    report = Report(rtol=rtol, atol=atol)
    for name, got, want in zip(names, actual, expected, strict=True):
        report.outputs.append(compare_arrays(name, got, want, rtol, atol))
    return report
