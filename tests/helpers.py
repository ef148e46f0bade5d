"""Shared test helpers: build small ONNX models, run onnxruntime, compare every output with the converted module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import random_inputs, run_onnxruntime, run_torch

Spec = tuple  # (name, element type as TensorProto int or numpy dtype, shape or None)


def _elem_type(dtype) -> int:
    if isinstance(dtype, int):
        return dtype
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def value_info(spec: Spec | str | onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    if isinstance(spec, onnx.ValueInfoProto):
        return spec
    if isinstance(spec, str):  # type left to shape inference
        return helper.make_empty_tensor_value_info(spec)
    name, dtype, shape = spec
    return helper.make_tensor_value_info(name, _elem_type(dtype), shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[Spec | onnx.ValueInfoProto],
    outputs: Sequence[Spec | str | onnx.ValueInfoProto],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
    extra_opsets: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """A model of ``nodes``; outputs given as bare names get their types from shape inference."""
    graph = helper.make_graph(
        list(nodes),
        "test_graph",
        [value_info(s) for s in inputs],
        [value_info(s) for s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), name) for name, v in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    # onnxruntime reads IR <= 10; IR >= 4 lets initializers be absent from the graph inputs at any opset
    ir_version = max(4, min(10, helper.find_min_ir_version_for(opsets, ignore_unknown=True)))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    for out in model.graph.output:
        if not out.type.HasField("tensor_type") and out.name in known:
            out.CopyFrom(known[out.name])
    onnx.checker.check_model(model)
    return model


def initializers_to_inputs(model: onnx.ModelProto, names: Sequence[str] | None = None):
    """Move initializers (all, or ``names``) to graph inputs. Returns (new model, {name: array} to feed)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    moved = {}
    for tensor in list(model.graph.initializer):
        if names is None or tensor.name in names:
            array = numpy_helper.to_array(tensor)
            moved[tensor.name] = array
            model.graph.initializer.remove(tensor)
            model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, array.shape))
    return model, moved


def check(
    model: onnx.ModelProto,
    inputs: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    seed: int = 0,
) -> torch.fx.GraphModule:
    """Convert ``model``, run it and onnxruntime on ``inputs`` (random if None), compare every output.

    Returns the converted module so tests can assert more (e.g. which modules were used).
    """
    feeds = random_inputs(model, seed) if inputs is None else dict(inputs)
    module = onnx2torch_rnn.convert(model)
    expected = run_onnxruntime(model, feeds)
    actual = run_torch(module, model, feeds)
    names = [o.name for o in model.graph.output]
    for name, want, got in zip(names, expected, actual, strict=True):
        if str(want.dtype) == "bfloat16":
            want = want.astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, strict=True, err_msg=f"output {name!r}")
    return module


def tensor_type(dtype) -> int:
    """TensorProto element type of a numpy dtype (np.float32 -> TensorProto.FLOAT)."""
    return _elem_type(dtype)


__all__ = ["TensorProto", "check", "helper", "initializers_to_inputs", "make_model", "random_inputs",
           "run_onnxruntime", "run_torch", "tensor_type"]
