"""Tensor and shape manipulation ops.

Inputs that steer the computation (Reshape's shape, Squeeze's axes, Slice's starts, TopK's k, ...) are declared
static (``register_converter(static=...)``) and read with ``ctx.static``: baked into the module as Python ints when
they are constants at conversion time; when an exporter computes them at run time (Shape -> Gather -> Concat ->
Reshape) the module takes them as tensors instead, with the same semantics.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import torch
from onnx import TensorProto

from ..modules import shape as m
from ..modules.common import Function
from ..node import Converted, OnnxNode, refuse_uint64
from ..registry import register_converter
from ..tensors import torch_dtype

# ---- helpers shared with reduce.py, sequence.py and nn.py --------------------------------------------------------


def converted(module, inputs: Sequence[str | None]) -> Converted:
    """Converted with trailing None inputs dropped (baked or absent), so the graph shows only what runs."""
    inputs = list(inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    return Converted(module, inputs)


def with_shape_inputs(module, inputs: Sequence[str | None], positions: Sequence[int] = (1,),
                      device: bool = False) -> Converted:
    """``converted(module, inputs)``, whose inputs at ``positions`` the module also takes as ints: where they are
    shape arithmetic on tensor sizes, the builder passes them so (``Converted.ints``, shape_arithmetic.py);
    ``device``: the module creates a tensor from the shape alone."""
    result = converted(module, inputs)
    return Converted(result.module, result.inputs, tuple(positions), device)


def element_type(node: OnnxNode, attribute: str, onnx_type: int) -> torch.dtype:
    """The torch dtype of an ONNX element type, refusing types torch cannot hold (string, float8, int4, ...)."""
    try:
        return torch_dtype(onnx_type)
    except NotImplementedError:
        name = TensorProto.DataType.Name(onnx_type) if onnx_type in TensorProto.DataType.values() else onnx_type
        raise node.unsupported(attribute, name, "this element type has no torch equivalent") from None


# ---- shapes ---------------------------------------------------------------------------------------------------------


@register_converter("Shape", (1, 13, 15, 19, 21, 23, 24, 25))
def shape(node: OnnxNode, ctx) -> Converted:
    """Returns the int64 shape; start/end (opset 15) are clamped to the rank as the spec says."""
    return Converted(m.Shape(node.attr("start", 0), node.attr("end", None)), [node.input(0)])


@register_converter("Size", (1, 13, 19, 21, 23, 24, 25))
def size(node: OnnxNode, ctx) -> Converted:
    """Returns the element count as a 0-d int64 tensor."""
    return Converted(m.Size(), [node.input(0)])


@register_converter("Reshape", (5, 13, 14, 19, 21, 23, 24, 25), static=(1,))
def reshape(node: OnnxNode, ctx) -> Converted:
    """Full semantics: 0 copies the input dim (unless allowzero=1), -1 is inferred; shape constant or run-time."""
    shape = ctx.static(node, 1)
    module = m.Reshape(shape.ints(), node.attr("allowzero", 0))
    return with_shape_inputs(module, [node.input(0), shape.run_time])


@register_converter("Flatten", (1, 9, 11, 13, 21, 23, 24, 25))
def flatten(node: OnnxNode, ctx) -> Converted:
    """To 2-D around `axis` (negative axes from opset 11)."""
    return Converted(m.Flatten(node.attr("axis")), [node.input(0)])


@register_converter("Squeeze", (1, 11, 13, 21, 23, 24, 25), static=(1,))
def squeeze(node: OnnxNode, ctx) -> Converted:
    """Axes as attribute (before 13) or input (constant or run-time); no axes squeezes every size-1 dim."""
    axes = ctx.static(node, 1, "axes")
    return with_shape_inputs(m.Squeeze(axes.ints()), [node.input(0), axes.run_time])


@register_converter("Unsqueeze", (1, 11, 13, 21, 23, 24, 25), static=(1,))
def unsqueeze(node: OnnxNode, ctx) -> Converted:
    """Axes as attribute (before 13) or input (constant or run-time), negative axes count in the output rank."""
    axes = ctx.static(node, 1, "axes")
    return with_shape_inputs(m.Unsqueeze(axes.ints()), [node.input(0), axes.run_time])


@register_converter("Transpose", (1, 13, 21, 23, 24, 25))
def transpose(node: OnnxNode, ctx) -> Converted:
    """Permutes by `perm` (reverses the dims when absent)."""
    return Converted(m.Transpose(node.attr("perm")), [node.input(0)])


@register_converter("Concat", (4, 11, 13))
def concat(node: OnnxNode, ctx) -> Converted:
    """torch.cat along `axis`."""
    return Converted(m.Concat(node.attr("axis")), node.inputs)


@register_converter("Split", (2, 11, 13, 18), static=(1,))
def split(node: OnnxNode, ctx) -> Converted:
    """Sizes from `split` (attribute before 13, then an input, constant or run-time) or equal parts; with
    num_outputs (opset 18) the last part may be smaller."""
    sizes = ctx.static(node, 1, "split")
    parts = len(node.outputs)
    num_outputs = node.attr("num_outputs", None)
    if num_outputs is not None and num_outputs != parts:
        raise node.unsupported("num_outputs", num_outputs, f"the node has {parts} outputs")
    module = m.Split(node.attr("axis"), sizes.ints() or None, parts)
    return with_shape_inputs(module, [node.input(0), sizes.run_time])


@register_converter("Slice", (1, 10, 11, 13), static=(1, 2, 3, 4))
def slice_(node: OnnxNode, ctx) -> Converted:
    """Starts/ends/axes as attributes (opset 1) or inputs, each constant or run-time; negative steps, absent axes,
    and clamping of out-of-range starts and ends as the spec says."""
    values = [ctx.static(node, i, name) for i, name in enumerate(("starts", "ends", "axes", "steps"), 1)]
    module = m.Slice(*(value.ints() for value in values))
    return with_shape_inputs(module, [node.input(0), *(value.run_time for value in values)], (1, 2, 3, 4))


@register_converter("Expand", (8, 13), static=(1,))
def expand(node: OnnxNode, ctx) -> Converted:
    """Bidirectional broadcasting to `shape` (a 1 keeps the input's dim); shape constant or run-time."""
    shape = ctx.static(node, 1)
    return with_shape_inputs(m.Expand(shape.ints()), [node.input(0), shape.run_time])


@register_converter("Tile", (6, 13), static=(1,))
def tile(node: OnnxNode, ctx) -> Converted:
    """Tensor.repeat; repeats constant or run-time."""
    repeats = ctx.static(node, 1)
    return with_shape_inputs(m.Tile(repeats.ints()), [node.input(0), repeats.run_time])


# ---- indexing -------------------------------------------------------------------------------------------------------


@register_converter("Gather", (1, 11, 13))
def gather(node: OnnxNode, ctx) -> Converted:
    """Indexing along `axis`, negative indices included; a constant scalar index becomes a plain select."""
    indices = ctx.constant(node.input(1))
    if indices is not None and indices.dim() == 0:
        return Converted(m.Gather(node.attr("axis"), int(indices)), [node.input(0)])
    return Converted(m.Gather(node.attr("axis")), node.inputs)


@register_converter("GatherElements", (11, 13))
def gather_elements(node: OnnxNode, ctx) -> Converted:
    """torch.gather, negative indices included."""
    refuse_uint64(node, ctx)
    return Converted(m.GatherElements(node.attr("axis")), node.inputs)


@register_converter("GatherND", (11, 12, 13))
def gather_nd(node: OnnxNode, ctx) -> Converted:
    """Any batch_dims (opset 12), negative indices included."""
    return Converted(m.GatherND(node.attr("batch_dims", 0)), node.inputs)


_SCATTER_REDUCTIONS = MappingProxyType({1: ("none",), 16: ("none", "add", "mul"),
                                        18: ("none", "add", "mul", "max", "min")})


def _reduction(node: OnnxNode) -> str:
    reduction = node.attr("reduction", "none")
    allowed = _SCATTER_REDUCTIONS[max(v for v in _SCATTER_REDUCTIONS if v <= node.version)]
    if reduction not in allowed:
        raise node.unsupported("reduction", reduction, f"opset {node.version} allows {', '.join(allowed)}")
    return reduction


@register_converter("ScatterElements", (11, 13, 16, 18))
def scatter_elements(node: OnnxNode, ctx) -> Converted:
    """torch.scatter / scatter_reduce with reduction none/add/mul (16) and max/min (18); negative indices included.
    With duplicate indices and reduction none the result is unspecified (as in ONNX)."""
    refuse_uint64(node, ctx)
    return Converted(m.ScatterElements(node.attr("axis"), _reduction(node)), node.inputs)


@register_converter("Scatter", (9,))  # Scatter-11 only marks the deprecation: the checker refuses it
def scatter(node: OnnxNode, ctx) -> Converted:
    """The deprecated name of ScatterElements (no reduction); negative indices included."""
    return scatter_elements(node, ctx)


@register_converter("ScatterND", (11, 13, 16, 18))
def scatter_nd(node: OnnxNode, ctx) -> Converted:
    """One scatter over linearised index tuples, reduction none/add/mul (16) and max/min (18), negative indices
    included. With duplicate indices and reduction none the result is unspecified (as in ONNX). Constant indices that
    list a box in row-major order (a streaming model's cache update) become a copy with that block assigned."""
    refuse_uint64(node, ctx)
    reduction = _reduction(node)
    box = _index_box(ctx.constant(node.input(1))) if reduction == "none" else None
    if box is not None:
        return Converted(m.ScatterBox(*box), [node.input(0), node.input(2)])
    return Converted(m.ScatterND(reduction), node.inputs)


def _index_box(indices: torch.Tensor | None) -> tuple[list[int], list[int]] | None:
    """(starts, sizes) when the index tuples of a constant ScatterND index list every element of a box, each once,
    in row-major order (non-negative: a negative index depends on the data's size), else None."""
    if indices is None or indices.dim() == 0 or indices.numel() == 0 or indices.dtype.is_floating_point:
        return None
    tuples = indices.reshape(-1, indices.shape[-1]).long()
    if bool((tuples < 0).any()):
        return None
    starts, stops = tuples.min(0).values, tuples.max(0).values + 1
    if int((stops - starts).prod()) != tuples.shape[0]:
        return None
    grid = torch.cartesian_prod(*(torch.arange(a, b) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)))
    if not torch.equal(grid.reshape(-1, tuples.shape[1]), tuples):
        return None
    return starts.tolist(), (stops - starts).tolist()


@register_converter("Compress", (9, 11, 28))
def compress(node: OnnxNode, ctx) -> Converted:
    """Selects along `axis` (the flattened input when absent); a condition shorter than the axis drops the rest."""
    return Converted(m.Compress(node.attr("axis", None)), node.inputs)


@register_converter("NonZero", (9, 13))
def nonzero(node: OnnxNode, ctx) -> Converted:
    """Indices of non-zero elements, shape (rank, n); a 0-d input gives shape (1, n) as in onnxruntime."""
    refuse_uint64(node, ctx)
    return Converted(m.NonZero(), node.inputs)


@register_converter("Unique", (11, 28))
def unique(node: OnnxNode, ctx) -> Converted:
    """Unique values (flattened, or slices along ``axis``) with first-occurrence indices, inverse indices and
    counts; sorted=1 ascending, sorted=0 in order of first occurrence as onnxruntime has it. Each NaN is a value of
    its own (torch.unique); onnxruntime's comparisons merge NaNs with the values next to them."""
    refuse_uint64(node, ctx)
    return Converted(m.Unique(node.attr("axis"), node.attr("sorted"), len(node.outputs)), node.inputs)


# ---- generators -----------------------------------------------------------------------------------------------------


@register_converter("Range", (11, 27))
def range_(node: OnnxNode, ctx) -> Converted:
    """start + i * delta, every numeric type; float16/bfloat16 (opset 27) computed in float32 (stash_type=1 only).
    onnxruntime accumulates float ranges by repeated addition, so long ranges with inexact deltas differ in the
    last bits."""
    stash_type = node.attr("stash_type", 1)
    if stash_type != 1 and ctx.dtype(node.input(0)) not in (torch.float32, torch.float64, torch.int16, torch.int32,
                                                            torch.int64):
        raise node.unsupported("stash_type", stash_type, "only 1 (compute float16/bfloat16 in float32) is supported")
    dtype = ctx.dtype(node.input(0))
    if dtype in (torch.int16, torch.int32, torch.int64):  # perhaps a range of a size computed at run time
        return Converted(m.Range(stash_type, dtype), node.inputs, (0, 1, 2), device=True)
    return Converted(m.Range(stash_type), node.inputs)


@register_converter("ConstantOfShape", (9, 20, 21, 23, 24, 25), static=(0,))
def constant_of_shape(node: OnnxNode, ctx) -> Converted:
    """torch.full with the `value` attribute's dtype (float32 0 by default); shape constant or run-time."""
    try:
        value = node.attr("value")
    except NotImplementedError as error:
        raise node.unsupported("value", "tensor", str(error)) from None
    value = torch.zeros(1) if value is None else value
    shape = ctx.static(node, 0)
    module = m.ConstantOfShape(value.reshape(-1)[0].item(), value.dtype, shape.ints())
    return with_shape_inputs(module, [shape.run_time], (0,), device=True)


@register_converter("EyeLike", (9, 22))
def eye_like(node: OnnxNode, ctx) -> Converted:
    """Ones on diagonal `k` of a 2-D shape, `dtype` or the input's."""
    dtype = node.attr("dtype", None)
    dtype = None if dtype is None else element_type(node, "dtype", dtype)
    return Converted(m.EyeLike(dtype, node.attr("k")), [node.input(0)])


@register_converter("OneHot", (9, 11, 28), static=(1,))
def one_hot(node: OnnxNode, ctx) -> Converted:
    """Negative indices count from `depth`, out-of-range ones give all off values; float indices and depth
    truncate toward zero; depth constant or run-time."""
    depth = ctx.static(node, 1)
    module = m.OneHot(node.attr("axis"), depth.integer())
    return with_shape_inputs(module, [node.input(0), depth.run_time, node.input(2)])


@register_converter("Trilu", (14,), static=(1,))
def trilu(node: OnnxNode, ctx) -> Converted:
    """torch.triu / torch.tril over the last two dims; k constant or run-time."""
    refuse_uint64(node, ctx)
    k = ctx.static(node, 1)
    module = m.Trilu(node.attr("upper"), 0 if node.input(1) is None else k.integer())
    return with_shape_inputs(module, [node.input(0), k.run_time])


# ---- types ----------------------------------------------------------------------------------------------------------


def _check_float8_attributes(node: OnnxNode) -> None:
    """saturate (opset 19) and round_mode (opset 24) only change casts to float8 types, which are refused: the
    values are validated and otherwise have no effect."""
    saturate, round_mode = node.attr("saturate", 1), node.attr("round_mode", "up")
    if saturate not in (0, 1):
        raise node.unsupported("saturate", saturate, "must be 0 or 1")
    if round_mode not in ("up", "down", "nearest"):
        raise node.unsupported("round_mode", round_mode, "must be up, down or nearest")


def _check_source_type(node: OnnxNode, ctx) -> None:
    """A cast from a type torch cannot hold is refused at conversion (no tensor of it could ever be fed)."""
    try:
        ctx.dtype(node.input(0))
    except NotImplementedError as error:
        raise node.unsupported("input 0", node.input(0), str(error)) from None


@register_converter("Cast", (6, 9, 13, 19, 21, 23, 24, 25, 28))
def cast(node: OnnxNode, ctx) -> Converted:
    """Tensor.to between all types torch holds (float -> int truncates toward zero); string, float8, float4, int4
    and other narrow types are refused, as the target and as the input."""
    dtype = element_type(node, "to", node.attr("to"))
    _check_source_type(node, ctx)
    _check_float8_attributes(node)
    return Converted(Function(torch.Tensor.to, dtype=dtype), [node.input(0)])


@register_converter("CastLike", (15, 19, 21, 23, 24, 25))
def cast_like(node: OnnxNode, ctx) -> Converted:
    """Cast to the second input's dtype (static when known at conversion time); narrow types refused as in Cast."""
    try:
        dtype = ctx.dtype(node.input(1))
    except NotImplementedError as error:
        raise node.unsupported("target_type", node.input(1), str(error)) from None
    _check_source_type(node, ctx)
    _check_float8_attributes(node)
    if dtype is None:
        return Converted(m.CastLike(), node.inputs)
    return Converted(Function(torch.Tensor.to, dtype=dtype), [node.input(0)])


# ---- sequences and ordering -----------------------------------------------------------------------------------------


@register_converter("ReverseSequence", (10, 28))
def reverse_sequence(node: OnnxNode, ctx) -> Converted:
    """Reverses the first sequence_lens[b] steps of each batch entry (one gather)."""
    refuse_uint64(node, ctx)
    module = m.ReverseSequence(node.attr("batch_axis"), node.attr("time_axis"))
    return Converted(module, node.inputs)


@register_converter("TopK", (1, 10, 11, 24), static=(1,))
def top_k(node: OnnxNode, ctx) -> Converted:
    """Stable sort: ties keep the lower index first as in onnxruntime; k attribute (opset 1) or input (constant or
    run-time); largest/sorted (opset 11). sorted=0 also returns sorted values (the spec leaves the order open,
    onnxruntime returns another order)."""
    k = ctx.static(node, 1, "k")
    module = m.TopK(node.attr("axis"), node.attr("largest", 1), node.attr("sorted", 1), k.integer())
    return with_shape_inputs(module, [node.input(0), k.run_time])


def _arg_extreme(node: OnnxNode, ctx) -> Converted:
    """First index of the extreme along `axis` (last with select_last_index, opset 12), keepdims. NaN counts as
    the extreme (torch); onnxruntime's scan skips NaN unless it comes first."""
    refuse_uint64(node, ctx)
    fn = torch.argmax if node.op_type == "ArgMax" else torch.argmin
    module = m.ArgExtreme(fn, node.attr("axis"), node.attr("keepdims"), node.attr("select_last_index", 0))
    return Converted(module, [node.input(0)])


for _op in ("ArgMax", "ArgMin"):
    register_converter(_op, (1, 11, 12, 13))(_arg_extreme)


@register_converter("CumSum", (11, 14), static=(1,))
def cum_sum(node: OnnxNode, ctx) -> Converted:
    """Cumulative sum in the input's dtype, exclusive and reverse; axis constant or run-time."""
    refuse_uint64(node, ctx)
    axis = ctx.static(node, 1)
    module = m.CumSum(node.attr("exclusive"), node.attr("reverse"), axis.integer())
    return converted(module, [node.input(0), axis.run_time])
