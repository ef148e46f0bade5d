"""ONNX <-> torch dtypes and tensors: the one place that knows both type systems."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

from .errors import InvalidModelError, UnsupportedTypeError

TORCH_DTYPES: Mapping[int, torch.dtype] = MappingProxyType({
    TensorProto.FLOAT: torch.float32,
    TensorProto.DOUBLE: torch.float64,
    TensorProto.FLOAT16: torch.float16,
    TensorProto.BFLOAT16: torch.bfloat16,
    TensorProto.INT8: torch.int8,
    TensorProto.INT16: torch.int16,
    TensorProto.INT32: torch.int32,
    TensorProto.INT64: torch.int64,
    TensorProto.UINT8: torch.uint8,
    TensorProto.UINT16: torch.uint16,
    TensorProto.UINT32: torch.uint32,
    TensorProto.UINT64: torch.uint64,
    TensorProto.BOOL: torch.bool,
    TensorProto.COMPLEX64: torch.complex64,
    TensorProto.COMPLEX128: torch.complex128,
})
ONNX_DTYPES: Mapping[torch.dtype, int] = MappingProxyType({v: k for k, v in TORCH_DTYPES.items()})


def torch_dtype(onnx_type: int) -> torch.dtype:
    try:
        return TORCH_DTYPES[onnx_type]
    except KeyError:
        if onnx_type not in TensorProto.DataType.values():
            raise UnsupportedTypeError(f"element type {onnx_type} is not an ONNX type") from None
        name = TensorProto.DataType.Name(onnx_type)
        raise UnsupportedTypeError(f"ONNX element type {name} has no torch equivalent") from None


def onnx_dtype(dtype: torch.dtype) -> int:
    return ONNX_DTYPES[dtype]


def is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def external_data_path(tensor: TensorProto, base_dir: str | None) -> str:
    """The file that holds an external tensor, refusing any location outside the model's folder."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise InvalidModelError(
            f"tensor {tensor.name!r} keeps its data in external file {location!r}, but the model was not "
            "loaded from a path: pass the model's file path so its folder is known"
        )
    if "\x00" in location:  # onnx accepts it; the OS path functions would raise a bare ValueError
        raise InvalidModelError(f"tensor {tensor.name!r}: external data location {location!r} contains a NUL byte")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if not location or os.path.isabs(location) or os.path.commonpath([root, path]) != root:
        raise InvalidModelError(
            f"tensor {tensor.name!r}: external data location {location!r} escapes the model's folder {root!r}; refused"
        )
    if not os.path.isfile(path):
        raise InvalidModelError(f"tensor {tensor.name!r}: external data file {location!r} not found in {root!r}")
    return path


def _read_external(tensor: TensorProto, base_dir: str | None) -> np.ndarray:
    path = external_data_path(tensor, base_dir)
    info = {entry.key: entry.value for entry in tensor.external_data}
    offset = _byte_count(tensor, info, "offset", 0)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if "length" in info and _byte_count(tensor, info, "length", 0) != count * dtype.itemsize:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data length does not match its shape")
    with open(path, "rb") as f:
        f.seek(offset)
        data = np.fromfile(f, dtype=dtype.newbyteorder("<"), count=count)
    if data.size != count:
        raise InvalidModelError(f"tensor {tensor.name!r}: external data file {path!r} is too short")
    return data.astype(dtype, copy=False).reshape(tuple(tensor.dims))


def _byte_count(tensor: TensorProto, info: dict[str, str], key: str, default: int) -> int:
    value = info.get(key, str(default))
    if not (value.isascii() and value.isdigit()):  # digits only: no sign, no spaces
        raise InvalidModelError(f"tensor {tensor.name!r}: external data {key} {value!r} is not a byte count")
    return int(value)


def _inline_array(tensor: TensorProto, dtype: torch.dtype) -> np.ndarray:
    if tensor.HasField("raw_data") and dtype not in (torch.bool, torch.complex64, torch.complex128):
        # one writable copy of the little-endian bytes (numpy_helper.to_array and a copy would make two)
        np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        return np.frombuffer(tensor.raw_data, np_dtype.newbyteorder("<")).astype(np_dtype).reshape(tensor.dims)
    return numpy_helper.to_array(tensor)


def to_torch(tensor: TensorProto, base_dir: str | None = None) -> torch.Tensor:
    """A TensorProto (inline or external data) as a torch tensor of the matching dtype."""
    dtype = torch_dtype(tensor.data_type)
    if is_external(tensor):
        array = _read_external(tensor, base_dir)
    else:
        try:
            array = _inline_array(tensor, dtype)
        except ValueError as error:  # more data than the dims hold (the checker catches less), or a partial element
            raise InvalidModelError(f"tensor {tensor.name!r}: its data does not fit its declared dims "
                                    f"{list(tensor.dims)} ({error})") from None
    # np.ascontiguousarray would turn a 0-d array into 1-d: copy only when needed instead
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = array.copy()
    if dtype == torch.bfloat16:  # numpy has no bfloat16: carry the bits
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
