"""Modules for tensor and shape manipulation ops, and the one module behind every Reduce* op.

Inputs that steer the computation (shapes, axes, starts, k, ...) are baked in as Python ints when they were constant
at conversion time; otherwise the module receives them as tensors and reads them at run time. In ``forward`` an
argument left as None means "use the baked value" (which is itself None when the optional ONNX input is absent).

Shape arithmetic computed at run time (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters emit for a
dynamic batch) would make every size a data-dependent tensor value: under torch.compile / torch.export its
``.tolist()`` gives unbacked symbols, and the first size check (``s == 0`` in Reshape, broadcasting in Expand) fails
with "Could not guard on data-dependent expression". So such inputs come as Python ints instead, computed by fx nodes
from the tensors' sizes (shape_arithmetic.py): symbolic sizes tied to the inputs under tracing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch

from .. import torch_compat
from .common import Module, attributes_repr, ceil_div, eager, kept_geometry, trunc_div


def ints(static: Sequence[int] | None, tensor: torch.Tensor | list | None) -> list[int] | None:
    """The baked list of ints, or the run-time value's: a tensor, or ints (shape arithmetic), or None for an absent
    optional input."""
    if tensor is None:
        return None if static is None else list(static)
    if isinstance(tensor, torch.Tensor):
        return tensor.reshape(-1).tolist()
    return list(tensor) if isinstance(tensor, (list, tuple)) else [tensor]


def scalar(static: int | None, tensor: torch.Tensor | list | int | None) -> int | None:
    """A baked int, or the single value of a run-time value (0-d or one element; a tensor or ints)."""
    if tensor is None:
        return static
    if isinstance(tensor, torch.Tensor):
        return int(tensor.reshape(-1)[0])
    return tensor[0] if isinstance(tensor, (list, tuple)) else tensor


def wrap(indices: torch.Tensor, size: int | torch.Tensor) -> torch.Tensor:
    """Negative indices counted from the end (ONNX allows them where torch.gather/scatter do not)."""
    indices = indices.long()
    return torch.where(indices < 0, indices + size, indices)


class _Attributes(Module):
    """Base that shows the ONNX attributes (the ``__init__`` arguments) in ``print(gm)``."""

    _shown: tuple[str, ...] = ()

    def extra_repr(self) -> str:
        return attributes_repr(self, self._shown)


class Shape(_Attributes):
    _shown = ("start", "end")

    def __init__(self, start: int = 0, end: int | None = None):
        super().__init__()
        self.start, self.end = start, end

    def forward(self, data):
        # Python slicing clamps out-of-range start/end exactly as ONNX specifies.
        return torch.tensor(data.shape[self.start:self.end], dtype=torch.int64, device=data.device)


class Size(Module):
    def forward(self, data):
        return torch.tensor(data.numel(), dtype=torch.int64, device=data.device)


class Reshape(_Attributes):
    _shown = ("shape", "allowzero")

    def __init__(self, shape: Sequence[int] | None = None, allowzero: int = 0):
        super().__init__()
        self.shape, self.allowzero = shape, allowzero
        self._plain = shape is not None and (allowzero or 0 not in shape)  # baked, nothing to copy from the input

    def forward(self, data, shape=None):
        if shape is None and self._plain:
            return data.reshape(self.shape)
        if type(shape) is list and not self.allowzero and eager() and 0 not in shape:  # sizes as ints (a CRNN's)
            return data.reshape(shape)
        shape = ints(self.shape, shape)
        if not self.allowzero:  # 0 copies the input's dimension; -1 is left for torch to infer
            shape = [data.shape[i] if torch_compat.is_zero(s) else s for i, s in enumerate(shape)]
        return data.reshape(shape)


class Flatten(_Attributes):
    _shown = ("axis",)

    def __init__(self, axis: int = 1):
        super().__init__()
        self.axis = axis

    def forward(self, data):
        axis = self.axis + data.dim() if self.axis < 0 else self.axis
        return data.reshape(math.prod(data.shape[:axis]), math.prod(data.shape[axis:]))


class Squeeze(_Attributes):
    _shown = ("axes",)

    def __init__(self, axes: Sequence[int] | None = None):
        super().__init__()
        self.axes = axes

    def forward(self, data, axes=None):
        axes = ints(self.axes, axes)
        if axes is None:
            return data.squeeze()
        compiling = torch.compiler.is_compiling()
        for axis in sorted({a % data.dim() for a in axes}, reverse=True):
            # ONNX requires size 1 (onnxruntime fails otherwise); select, not squeeze, which keeps a dim whose size
            # is unknown while tracing (a Loop's scan output under torch.compile) and would silently keep the rank
            if compiling:
                torch._check(data.shape[axis] == 1)  # checked at run time: no guard on an unknown size
            elif data.shape[axis] != 1:
                raise ValueError(f"Squeeze: dim {axis} of {list(data.shape)} is not 1")
            data = data.select(axis, 0)
        return data


class Unsqueeze(_Attributes):
    _shown = ("axes",)

    def __init__(self, axes: Sequence[int] | None = None):
        super().__init__()
        self.axes = axes

    def forward(self, data, axes=None):
        axes = ints(self.axes, axes)
        rank = data.dim() + len(axes)  # axes count in the output's rank
        for axis in sorted(a % rank for a in axes):
            data = data.unsqueeze(axis)
        return data


class Transpose(_Attributes):
    _shown = ("perm",)

    def __init__(self, perm: Sequence[int] | None = None):
        super().__init__()
        self.perm = perm

    def forward(self, data):
        return data.permute(self.perm if self.perm is not None else tuple(reversed(range(data.dim()))))


class Concat(_Attributes):
    _shown = ("axis",)

    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, *inputs):
        return torch.cat(inputs, dim=self.axis)


class Split(_Attributes):
    """Sizes from ``split`` (baked or at run time); otherwise ``num_outputs`` parts of ceil(n / num_outputs)."""

    _shown = ("axis", "split", "num_outputs")

    def __init__(self, axis: int = 0, split: Sequence[int] | None = None, num_outputs: int = 1):
        super().__init__()
        self.axis, self.split, self.num_outputs = axis, split, num_outputs

    def forward(self, data, split=None):
        sizes = ints(self.split, split)
        if sizes is None:
            n, parts = data.shape[self.axis], self.num_outputs
            chunk = ceil_div(n, parts)
            sizes = [chunk] * (parts - 1) + [n - chunk * (parts - 1)]  # the last part may be smaller
        parts = torch.split(data, sizes, dim=self.axis)
        return parts[0] if self.num_outputs == 1 else tuple(parts)  # a one-output node's value is a tensor


class Slice(_Attributes):
    _shown = ("starts", "ends", "axes", "steps")

    def __init__(self, starts=None, ends=None, axes=None, steps=None):
        super().__init__()
        self.starts, self.ends, self.axes, self.steps = starts, ends, axes, steps
        self._eager = None  # (axis, slice) per sliced axis, where everything is baked and every step positive
        if starts is not None and ends is not None and (steps is None or all(step > 0 for step in steps)):
            self._eager = [(axis, slice(start, None if end >= _INT32_MAX else end, step)) for axis, start, end, step in
                           zip(range(len(starts)) if axes is None else axes, starts, ends, steps or [1] * len(starts),
                               strict=True)]

    def forward(self, data, starts=None, ends=None, axes=None, steps=None):
        if (self._eager is not None and starts is ends is axes is steps is None and not torch.compiler.is_compiling()
                and not torch.jit.is_tracing()):  # eager: Python's slice clamps an end past the dim as ONNX does
            index = [slice(None)] * data.dim()
            for axis, part in self._eager:
                index[axis] = part  # a negative axis counts from the end, as in ONNX
            return data[tuple(index)]
        starts, ends = ints(self.starts, starts), ints(self.ends, ends)
        axes = ints(self.axes, axes)
        axes = range(len(starts)) if axes is None else axes
        steps = ints(self.steps, steps) or [1] * len(starts)
        index, flipped = [slice(None)] * data.dim(), []
        for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
            axis %= data.dim()
            dim = data.shape[axis]
            if step > 0:  # Python's slice clamps as ONNX does
                index[axis] = slice(start, None if _past_the_end(end, dim) else end, step)
            else:  # walk the flipped axis forwards: element i sits at dim - 1 - i
                start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
                index[axis] = slice(dim - 1 - start, dim - 1 - end, -step)
                flipped.append(axis)
        if flipped:
            data = data.flip(flipped)
        return data[tuple(index)]


def _past_the_end(end, dim) -> bool:
    """Whether a slice ends at or past the dim: then its end is None, which keeps a traced size provable (torch
    cannot simplify min(2147483647, s), and a Squeeze after such a slice falls to prims.view_of in torch.onnx). A
    traced (symbolic) dim is taken as shorter than INT32_MAX, the exporters' "to the end"."""
    if not isinstance(end, int):  # read from a tensor at run time
        return False
    # INT32_MAX first, without the dim: Dynamo answers isinstance(dim, int) for a traced dim too, and comparing an
    # unbacked one (a Loop body's) would be a data-dependent guard
    return end >= _INT32_MAX or (isinstance(dim, int) and end >= dim)


class Gather(_Attributes):
    """``index`` is a baked scalar index (then the module takes only ``data``)."""

    _shown = ("axis", "index")

    def __init__(self, axis: int = 0, index: int | None = None):
        super().__init__()
        self.axis, self.index = axis, index

    def forward(self, data, indices=None):
        axis = self.axis % data.dim()
        if indices is None:
            return data.select(axis, self.index)
        if indices.dim() == 0:  # as index_select: indexing would read the index as a Python int (no while_loop body)
            return data.index_select(axis, wrap(indices, data.shape[axis]).reshape(1)).squeeze(axis)
        # Advanced indexing with one index tensor is exactly Gather, negative indices included.
        indices = indices if indices.dtype == torch.int64 else indices.long()
        return data[(slice(None),) * axis + (indices,)] if axis else data[indices]


class GatherElements(_Attributes):
    _shown = ("axis",)

    def __init__(self, axis: int = 0):
        super().__init__()
        self.axis = axis

    def forward(self, data, indices):
        return torch.gather(data, self.axis, wrap(indices, data.shape[self.axis]))


class GatherND(_Attributes):
    _shown = ("batch_dims",)

    def __init__(self, batch_dims: int = 0):
        super().__init__()
        self.batch_dims = batch_dims

    def forward(self, data, indices):
        b, k = self.batch_dims, indices.shape[-1]
        batch, tuples = math.prod(data.shape[:b]), math.prod(indices.shape[b:-1])
        flat = data.reshape(batch, *data.shape[b:])
        index = indices.long().reshape(batch, tuples, k)
        rows = torch.arange(batch, device=data.device).view(batch, 1).expand(batch, tuples)
        out = flat[(rows, *index.unbind(-1))]  # advanced indexing wraps negative indices itself
        return out.reshape(*indices.shape[:-1], *data.shape[b + k:])


_INT32_MAX = 2**31 - 1
_SCATTER_REDUCE = MappingProxyType({"add": "sum", "mul": "prod", "max": "amax", "min": "amin"})


def scatter(data, dim: int, index, updates, reduction: str):
    if reduction == "none":
        return data.scatter(dim, index, updates)
    return data.scatter_reduce(dim, index, updates, _SCATTER_REDUCE[reduction], include_self=True)


class ScatterElements(_Attributes):
    _shown = ("axis", "reduction")

    def __init__(self, axis: int = 0, reduction: str = "none"):
        super().__init__()
        self.axis, self.reduction = axis, reduction

    def forward(self, data, indices, updates):
        return scatter(data, self.axis, wrap(indices, data.shape[self.axis]), updates, self.reduction)


class ScatterND(_Attributes):
    """Index tuples become linear offsets into ``data`` viewed as (prod(shape[:k]), rest): one scatter along dim 0."""

    _shown = ("reduction",)

    def __init__(self, reduction: str = "none"):
        super().__init__()
        self.reduction = reduction

    def forward(self, data, indices, updates):
        k = indices.shape[-1]
        outer, inner, count = math.prod(data.shape[:k]), math.prod(data.shape[k:]), math.prod(indices.shape[:-1])
        sizes = torch.tensor(data.shape[:k], dtype=torch.int64, device=data.device)
        strides = torch.tensor([math.prod(data.shape[j + 1:k]) for j in range(k)], dtype=torch.int64,
                               device=data.device)
        offsets = (wrap(indices.reshape(count, k), sizes) * strides).sum(-1)
        index = offsets.view(count, 1).expand(count, inner)
        out = scatter(data.reshape(outer, inner), 0, index, updates.reshape(count, inner), self.reduction)
        return out.reshape(data.shape)


class ScatterBox(_Attributes):
    """ScatterND whose constant indices enumerate a box of ``data`` in row-major order (the cache update of a
    streaming model: ``cache[0, :, 2:4] = new``): a copy with that block assigned, two ops instead of a scatter
    over computed offsets."""

    _shown = ("starts", "sizes")

    def __init__(self, starts: Sequence[int], sizes: Sequence[int]):
        super().__init__()
        self.starts, self.sizes = list(starts), list(sizes)

    def forward(self, data, updates):
        box = []
        for axis, (start, size) in enumerate(zip(self.starts, self.sizes, strict=True)):
            if start + size > data.shape[axis]:  # onnxruntime refuses an index past the end; slicing would clip
                raise IndexError(f"ScatterND: index {start + size - 1} is out of bounds for axis {axis} of size "
                                 f"{data.shape[axis]}")
            box.append(slice(start, start + size))
        out = data.clone()
        out[tuple(box)] = updates.reshape(*self.sizes, *data.shape[len(self.sizes):])
        return out


class Expand(_Attributes):
    _shown = ("shape",)

    def __init__(self, shape: Sequence[int] | None = None):
        super().__init__()
        self.shape = shape

    def forward(self, data, shape=None):
        # Bidirectional broadcasting: a target dim of 1 keeps the input's dim.
        target = ints(self.shape, shape)
        # eager, plain sizes: the broadcast kept per shapes (torch.broadcast_shapes costs ~10 us of Python)
        if eager() and isinstance(data, torch.Tensor) and isinstance(target, list | tuple):
            size = kept_geometry(self, (data.shape, *target), lambda: broadcast_sizes(data.shape, target))
            if size is not None:
                return data.expand(size)
        return data.expand(torch.broadcast_shapes(data.shape, target))


def broadcast_sizes(a: Sequence, b: Sequence) -> list[int] | None:
    """The broadcast of two shapes of plain ints; None where one is not (symbolic) or they do not broadcast (then
    torch.broadcast_shapes says why)."""
    n = max(len(a), len(b))
    out = []
    for x, y in zip([1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b), strict=True):
        if type(x) is not int or type(y) is not int or (x != y and x != 1 and y != 1):
            return None
        out.append(y if x == 1 else x)
    return out


class Tile(_Attributes):
    _shown = ("repeats",)

    def __init__(self, repeats: Sequence[int] | None = None):
        super().__init__()
        self.repeats = repeats

    def forward(self, data, repeats=None):
        return data.repeat(ints(self.repeats, repeats))


class Range(_Attributes):
    """output[i] = start + i * delta (the spec's formula), computed in float32 for float16/bfloat16 (stash_type=1)."""

    _shown = ("stash_type",)

    def __init__(self, stash_type: int = 1, dtype: torch.dtype | None = None):
        super().__init__()
        self.stash_type = stash_type
        self.dtype = dtype  # the output dtype when start, limit, delta come as ints (shape arithmetic)

    def forward(self, start, limit, delta, device=None):
        if not isinstance(start, torch.Tensor):  # ints (shape arithmetic): the formula is exactly arange's
            return torch.arange(start, limit, delta, dtype=self.dtype, device=device)
        dtype = start.dtype
        if dtype in (torch.float16, torch.bfloat16) and self.stash_type == 1:
            start, limit, delta = start.float(), limit.float(), delta.float()
        first, last, step = start.item(), limit.item(), delta.item()
        count = -((first - last) // step) if isinstance(first, int) else math.ceil((last - first) / step)
        steps = torch.arange(max(count, 0), dtype=start.dtype, device=start.device)
        return (start + steps * delta).to(dtype)


class ConstantOfShape(_Attributes):
    _shown = ("value", "dtype", "shape")

    def __init__(self, value: bool | int | float, dtype: torch.dtype, shape: Sequence[int] | None = None):
        super().__init__()
        self.value, self.dtype, self.shape = value, dtype, shape

    def forward(self, shape=None, device=None):
        device = shape.device if isinstance(shape, torch.Tensor) else device  # else ints, and the builder passes it
        return torch.full(ints(self.shape, shape), self.value, dtype=self.dtype, device=device)


class CastLike(Module):
    """Casts to the dtype of a second tensor (used when that dtype is unknown at conversion time)."""

    def forward(self, data, target):
        return data.to(target.dtype)


class ReverseSequence(_Attributes):
    _shown = ("batch_axis", "time_axis")

    def __init__(self, batch_axis: int = 1, time_axis: int = 0):
        super().__init__()
        self.batch_axis, self.time_axis = batch_axis, time_axis

    def forward(self, data, sequence_lens):
        time, batch = self.time_axis, self.batch_axis
        steps = torch.arange(data.shape[time], device=data.device).view(-1, 1)
        lengths = sequence_lens.long().view(1, -1)
        index = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (time, batch)
        if time > batch:
            index = index.T
        shape = [1] * data.dim()
        shape[time], shape[batch] = data.shape[time], data.shape[batch]
        return data.gather(time, index.reshape(shape).expand(data.shape))


class TopK(_Attributes):
    """A stable full sort, so equal values keep index order (the lower index first) as onnxruntime does."""

    _shown = ("axis", "largest", "sorted", "k")

    def __init__(self, axis: int = -1, largest: int = 1, sorted: int = 1, k: int | None = None):
        super().__init__()
        self.axis, self.largest, self.sorted, self.k = axis, largest, sorted, k

    def forward(self, data, k=None):
        k = scalar(self.k, k)
        if torch.jit.is_tracing():  # torch.onnx.export(dynamo=False) has no stable sort: an ONNX TopK is this op
            return torch.topk(data, k, dim=self.axis, largest=bool(self.largest), sorted=True)
        values, indices = torch.sort(data, dim=self.axis, descending=bool(self.largest), stable=True)
        return values.narrow(self.axis, 0, k), indices.narrow(self.axis, 0, k)


class ArgExtreme(_Attributes):
    """ArgMax / ArgMin; with select_last_index the axis is flipped so the last extreme is found."""

    _shown = ("axis", "keepdims", "select_last_index")

    def __init__(self, fn: Callable, axis: int = 0, keepdims: int = 1, select_last_index: int = 0):
        super().__init__()
        self.fn, self.axis, self.keepdims, self.select_last_index = fn, axis, keepdims, select_last_index

    def forward(self, data):
        if not self.select_last_index:
            return self.fn(data, self.axis, bool(self.keepdims))
        found = self.fn(data.flip(self.axis), self.axis, bool(self.keepdims))
        return data.shape[self.axis] - 1 - found

    def extra_repr(self) -> str:
        return f"{self.fn.__name__}, {super().extra_repr()}"


class NonZero(Module):
    def forward(self, data):
        # onnxruntime treats a 0-d input as one element: shape (1, n).
        return torch.nonzero(data.reshape(1) if data.dim() == 0 else data).T


class Unique(_Attributes):
    """(Y, indices, inverse_indices, counts): the unique values (slices along ``axis``, of the flattened input when
    None), ascending or, with sorted=0, in order of first occurrence (as onnxruntime); indices of first
    occurrences."""

    _shown = ("axis", "sorted")

    def __init__(self, axis: int | None = None, sorted: int = 1, outputs: int = 4):
        super().__init__()
        self.axis, self.sorted, self.outputs = axis, sorted, outputs

    def forward(self, x):
        axis = 0 if self.axis is None else self.axis % x.dim()
        x = x.reshape(-1) if self.axis is None else x
        y, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=axis)
        positions = torch.arange(inverse.numel(), device=x.device)
        first = torch.full_like(counts, inverse.numel()).scatter_reduce(0, inverse, positions, "amin")
        if not self.sorted:  # reorder by first occurrence
            order = torch.argsort(first)
            y, first, counts = y.index_select(axis, order), first[order], counts[order]
            inverse = torch.argsort(order)[inverse]
        return (y, first, inverse, counts)[: self.outputs] if self.outputs > 1 else y


class OneHot(_Attributes):
    _shown = ("axis", "depth")

    def __init__(self, axis: int = -1, depth: int | None = None):
        super().__init__()
        self.axis, self.depth = axis, depth

    def forward(self, indices, depth, values):
        depth = scalar(self.depth, depth)
        indices = wrap(indices, depth)  # float indices truncate toward zero, as onnxruntime casts them
        axis = self.axis + indices.dim() + 1 if self.axis < 0 else self.axis
        classes = torch.arange(depth, device=indices.device).view(-1, *[1] * (indices.dim() - axis))
        return torch.where(indices.unsqueeze(axis) == classes, values[1], values[0])


class CumSum(_Attributes):
    _shown = ("exclusive", "reverse", "axis")

    def __init__(self, exclusive: int = 0, reverse: int = 0, axis: int | None = None):
        super().__init__()
        self.exclusive, self.reverse, self.axis = exclusive, reverse, axis

    def forward(self, data, axis=None):
        axis = scalar(self.axis, axis)
        if self.reverse:
            data = data.flip(axis)
        out = data.cumsum(axis, dtype=data.dtype)
        if self.exclusive and out.shape[axis] > 0:  # shift by one: each sum leaves out its own element
            out = torch.cat([torch.zeros_like(out.narrow(axis, 0, 1)), out.narrow(axis, 0, out.shape[axis] - 1)],
                            axis)
        return out.flip(axis) if self.reverse else out


class Trilu(_Attributes):
    _shown = ("upper", "k")

    def __init__(self, upper: int = 1, k: int | None = 0):
        super().__init__()
        self.upper, self.k = upper, k

    def forward(self, data, k=None):
        k = scalar(self.k, k)
        if isinstance(k, torch.SymInt):  # computed from traced sizes: triu/tril's diagonal would pin it
            rows = torch.arange(data.shape[-2], device=data.device)[:, None]
            offsets = torch.arange(data.shape[-1], device=data.device) - rows
            keep = offsets >= k if self.upper else offsets <= k
            return torch.where(keep, data, torch.zeros((), dtype=data.dtype, device=data.device))
        return (torch.triu if self.upper else torch.tril)(data, k)


class EyeLike(_Attributes):
    _shown = ("dtype", "k")

    def __init__(self, dtype: torch.dtype | None = None, k: int = 0):
        super().__init__()
        self.dtype, self.k = dtype, k

    def forward(self, data):
        rows = torch.arange(data.shape[0], device=data.device).view(-1, 1)
        cols = torch.arange(data.shape[1], device=data.device).view(1, -1)
        return (cols - rows == self.k).to(self.dtype or data.dtype)


class Compress(_Attributes):
    """A condition shorter than the axis drops the rest; a longer one is cut (as onnxruntime does)."""

    _shown = ("axis",)

    def __init__(self, axis: int | None = None):
        super().__init__()
        self.axis = axis

    def forward(self, data, condition):
        if self.axis is None:
            data, axis = data.reshape(-1), 0
        else:
            axis = self.axis
        keep = torch.nonzero(condition[: data.shape[axis]]).reshape(-1)
        return data.index_select(axis, keep)


# ---- reductions ---------------------------------------------------------------------------------------------------
# Each op is (element-wise step before, reduction (x, dims, keepdim), element-wise step after); with
# noop_with_empty_axes=1 and no axes only the reduction is skipped (ReduceSumSquare squares, ReduceLogSum takes logs).
# Like onnxruntime, integer inputs compute every step in their own type: a mean divides with truncation and
# sqrt/log/exp results are truncated toward zero.


def _sum(x, dims, keep):
    return x.sum(dims, keep, dtype=x.dtype)


def _mean(x, dims, keep):
    if x.is_floating_point():
        return x.mean(dims, keep)
    count = math.prod(x.shape[d] for d in dims)
    return trunc_div(_sum(x, dims, keep), count)


def _prod(x, dims, keep):
    for dim in sorted(dims, reverse=True):  # torch.prod takes one dim at a time
        x = x.prod(dim, keep, dtype=x.dtype)
    return x


def _log_sum_exp(x, dims, keep):
    if x.is_floating_point():
        return torch.logsumexp(x, dims, keep)
    # onnxruntime: each exp term truncated to the integer type, then log(total) + peak in double, then truncated
    peak = x.amax(dims, keepdim=True)
    total = _sum(torch.exp(x - peak).to(x.dtype), dims, keep)
    return (torch.log(total.double()) + (peak if keep else peak.squeeze(dims))).to(x.dtype)


def _extreme(reduce: Callable, largest: bool) -> Callable:
    """amax / amin, which refuse an empty reduction; the spec gives the identity there: -inf for max, +inf for min
    (an integer type's lowest / highest value, False / True for bool)."""
    def apply(x, dims, keep):
        if all(x.shape[d] for d in dims):
            return reduce(x, dims, keep)
        if x.dtype == torch.bool:
            identity = not largest
        elif x.is_floating_point():
            identity = -math.inf if largest else math.inf
        else:
            identity = torch.iinfo(x.dtype).min if largest else torch.iinfo(x.dtype).max
        shape = [1 if d in dims else size for d, size in enumerate(x.shape) if keep or d not in dims]
        return x.new_full(shape, identity)
    return apply


def _square(x):
    return x * x


REDUCTIONS: Mapping[str, tuple[Callable | None, Callable, Callable | None]] = MappingProxyType({
    "ReduceSum": (None, _sum, None),
    "ReduceMean": (None, _mean, None),
    "ReduceMax": (None, _extreme(torch.amax, largest=True), None),
    "ReduceMin": (None, _extreme(torch.amin, largest=False), None),
    "ReduceProd": (None, _prod, None),
    "ReduceL1": (torch.abs, _sum, None),
    "ReduceL2": (_square, _sum, torch.sqrt),
    "ReduceLogSum": (None, _sum, torch.log),
    "ReduceLogSumExp": (None, _log_sum_exp, None),
    "ReduceSumSquare": (_square, _sum, None),
})


class Reduce(_Attributes):
    """One ONNX Reduce* op; absent or empty axes mean all axes, or none with noop_with_empty_axes=1."""

    _shown = ("op_type", "axes", "keepdims", "noop_with_empty_axes")

    def __init__(self, op_type: str, axes: Sequence[int] | None = None, keepdims: int = 1,
                 noop_with_empty_axes: int = 0):
        super().__init__()
        self.op_type, self.axes, self.keepdims = op_type, axes, keepdims
        self.noop_with_empty_axes = noop_with_empty_axes
        self.before, self.reduce, self.after = REDUCTIONS[op_type]

    def forward(self, data, axes=None):
        axes = ints(self.axes, axes)
        dtype = data.dtype
        if self.before is not None:
            data = self.before(data)
        if axes or not self.noop_with_empty_axes:
            axes = axes or range(data.dim())
            data = self.reduce(data, tuple(sorted({a % data.dim() for a in axes})), bool(self.keepdims))
        return data if self.after is None else self.after(data).to(dtype)
