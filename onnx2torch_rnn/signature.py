"""The ONNX graph's interface, recorded at conversion: what ``to_onnx`` needs to write a drop-in replacement.

``convert`` stores an ``OnnxSignature`` in ``module.meta["onnx_signature"]``: the run-time inputs in the order the
module takes them and the outputs in the order it returns them, each with its ONNX name, element type and dims
(ints, symbolic names, or None where the model leaves a dim unnamed and unknown), and the model's opset and IR
version. So the module goes back to ONNX with the same names, dtypes and dynamic dims, and example inputs can be
made without the ONNX file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
import torch

from .binding import Binding
from .tensors import torch_dtype

META_KEY = "onnx_signature"


@dataclass(frozen=True)
class TensorSpec:
    name: str  # the ONNX value name
    elem_type: int  # onnx.TensorProto element type
    dims: tuple[int | str | None, ...] | None  # static size, symbolic name or None (unknown); None: rank unknown

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.elem_type)

    def symbol(self, axis: int) -> str | None:
        """The name of a dynamic dim (an unnamed one gets ``<input>.<axis>``), None for a static one."""
        dim = self.dims[axis]
        return None if isinstance(dim, int) else dim or f"{self.name}.{axis}"


@dataclass(frozen=True)
class BoundInput:
    """A graph input bound to a constant at conversion (``convert(..., constants=...)``), which the module does not
    take."""

    spec: TensorSpec
    position: int  # among the original's graph inputs
    value: np.ndarray


@dataclass(frozen=True)
class OnnxSignature:
    inputs: tuple[TensorSpec, ...]  # run-time graph inputs (an input with an initializer is a constant)
    outputs: tuple[TensorSpec, ...]
    opset: int  # of the default domain
    ir_version: int
    bound: tuple[BoundInput, ...] = ()  # inputs the conversion bound to constants, in graph input order


def _spec(name: str, type_proto: onnx.TypeProto | None) -> TensorSpec:
    tensor = type_proto.tensor_type if type_proto is not None else None
    if tensor is None or not tensor.HasField("shape"):
        return TensorSpec(name, tensor.elem_type if tensor is not None else 0, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
    return TensorSpec(name, tensor.elem_type, dims)


def record(proto: onnx.ModelProto, inferred_types: Mapping[str, onnx.TypeProto],
           binding: Binding | None = None) -> OnnxSignature:
    """The signature of ``proto``'s main graph; output types the graph does not declare come from inference;
    ``binding``: the inputs bound to constants (binding.py)."""
    graph = proto.graph
    constants = {t.name for t in graph.initializer}
    inputs = tuple(_spec(i.name, i.type) for i in graph.input if i.name not in constants)
    outputs = tuple(_spec(o.name, o.type if o.type.tensor_type.elem_type else inferred_types.get(o.name))
                    for o in graph.output)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    bound = () if binding is None else tuple(
        BoundInput(_spec(name, info.type), position, binding.values[name])
        for name, (position, info) in binding.inputs.items())
    return OnnxSignature(inputs, outputs, opset, proto.ir_version, bound)


def recorded(module: torch.nn.Module) -> OnnxSignature | None:
    meta = getattr(module, "meta", None)
    return meta.get(META_KEY) if isinstance(meta, dict) else None


def example_inputs(signature: OnnxSignature, sizes: Mapping[str, int] | None = None,
                   default_size: int = 4) -> tuple[torch.Tensor, ...]:
    """Inputs of the recorded dtypes and shapes: each dynamic dim ``sizes[name]`` (default ``default_size``); floats
    standard normal, integers 0 (a valid index and a valid length), bools False. For tracing: values do not
    matter there."""
    sizes = dict(sizes or {})
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for spec in signature.inputs:
        if spec.dims is None:
            raise ValueError(f"input {spec.name!r} has no recorded shape: pass example inputs")
        shape = [d if isinstance(d, int) else sizes.get(spec.symbol(axis), default_size)
                 for axis, d in enumerate(spec.dims)]
        dtype = spec.dtype
        if dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=generator).to(dtype))
        else:
            tensors.append(torch.zeros(shape, dtype=dtype))
    return tuple(tensors)
