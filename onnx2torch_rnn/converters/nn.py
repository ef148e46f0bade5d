"""Neural-network layers: convolution, pooling, normalisation, dropout, rearrangement, resizing, padding.

Weight-carrying ops become real torch modules (nn.ConvNd, nn.BatchNormNd, ...) when their weights are constants
used by that node only and torch can express the geometry exactly; otherwise a generic module from
``modules/nn.py`` takes the weights as run-time inputs (constants then become parameters of the GraphModule).
"""

from __future__ import annotations

from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

from ..modules import nn as m
from ..modules.common import Function
from ..modules.packed import Conv1d, Conv2d
from ..node import Converted, OnnxNode, StaticInput
from ..registry import register_converter
from ..tensors import torch_dtype
from .shape import with_shape_inputs

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
SAME = ("SAME_UPPER", "SAME_LOWER")
TORCH_CONV = MappingProxyType({1: Conv1d, 2: Conv2d, 3: nn.Conv3d})  # 1-D, 2-D: packed for inference
TORCH_CONV_TRANSPOSE = MappingProxyType({1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d})
TORCH_BATCH_NORM = MappingProxyType({2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d})
TORCH_INSTANCE_NORM = MappingProxyType({3: nn.InstanceNorm1d, 4: nn.InstanceNorm2d, 5: nn.InstanceNorm3d})

# ----------------------------------------------------------------------------------------------- helpers

def static_sizes(ctx, name: str) -> list[int] | None:
    """The spatial sizes (axes 2...) of ``name`` when all are known at conversion."""
    shape = ctx.shape(name)
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape[2:]):
        return None
    return list(shape[2:])


def _rank(ctx, name: str) -> int | None:
    shape = ctx.shape(name)
    return None if shape is None else len(shape)


def _auto_pad(node: OnnxNode) -> str:
    auto_pad = node.attr("auto_pad")
    if auto_pad not in AUTO_PADS:
        raise node.unsupported("auto_pad", auto_pad, f"expected one of {AUTO_PADS}")
    return auto_pad


def _parameter(module: nn.Module, name: str, value: torch.Tensor | None) -> None:
    if value is not None:
        setattr(module, name, nn.Parameter(value.contiguous()))


def _rank_check(node: OnnxNode, kernel_rank: int) -> None:
    if kernel_rank not in (1, 2, 3):
        raise node.unsupported("kernel_shape", kernel_rank, "torch has 1-D, 2-D and 3-D windows only")


# ----------------------------------------------------------------------------------------------- convolution

def _conv_attributes(node: OnnxNode) -> dict:
    return {"auto_pad": _auto_pad(node), "dilations": node.attr("dilations"), "group": node.attr("group"),
            "kernel_shape": node.attr("kernel_shape"), "pads": node.attr("pads"), "strides": node.attr("strides")}


def _constant_weights(node: OnnxNode, ctx):
    """(W, B) when the weight and the bias (if any) are owned constants of a 1-3-D kernel, else None."""
    w, b = ctx.owned_constant(node.input(1)), ctx.owned_constant(node.input(2))
    if w is None or (node.input(2) is not None and (b is None or b.dtype != w.dtype)):
        return None
    _rank_check(node, w.dim() - 2)
    kernel_shape = node.attr("kernel_shape")
    if kernel_shape is not None and list(kernel_shape) != list(w.shape[2:]):
        raise node.unsupported("kernel_shape", kernel_shape, f"does not match the weight's kernel {list(w.shape[2:])}")
    return w, b


@register_converter("Conv", (1, 11, 22))
def conv(node: OnnxNode, ctx) -> Converted:
    """1-D/2-D/3-D convolution with groups, strides, dilations, pads (asymmetric ones through an explicit pad) and
    auto_pad. Constant weights become nn.ConvNd; run-time weights use F.convNd. SAME_* with dilations > 1 is
    refused (onnxruntime refuses it too)."""
    attributes = _conv_attributes(node)
    n = len(attributes["kernel_shape"] or attributes["dilations"] or attributes["strides"] or []) or None
    dilations = attributes["dilations"] or []
    if attributes["auto_pad"] in SAME and any(d != 1 for d in dilations):
        raise node.unsupported("dilations", dilations, "SAME_* auto_pad with dilation is not defined by onnxruntime")
    weights = _constant_weights(node, ctx)
    if weights is not None:
        w, b = weights
        n = w.dim() - 2
        strides, dilations = m.per_axis(attributes["strides"], n, 1), m.per_axis(attributes["dilations"], n, 1)
        sizes = static_sizes(ctx, node.input(0))
        # SAME pads depend on the input size unless every stride is 1
        if sizes is not None or attributes["auto_pad"] not in SAME or all(s == 1 for s in strides):
            begins, ends = m.conv_pads(attributes["auto_pad"], sizes or [1] * n, list(w.shape[2:]), strides,
                                       dilations, attributes["pads"])
            group = attributes["group"]
            module = TORCH_CONV[n](w.shape[1] * group, w.shape[0], tuple(w.shape[2:]), strides,
                                   begins if begins == ends else 0, dilations, group, b is not None,
                                   device="meta", dtype=w.dtype)
            _parameter(module, "weight", w)
            _parameter(module, "bias", b)
            if begins != ends:
                module = nn.Sequential(m.spatial_pad(begins, ends), module)
            return Converted(module, [node.input(0)])
    elif n is not None:
        _rank_check(node, n)
    return Converted(m.Conv(**attributes), node.inputs)


@register_converter("ConvTranspose", (1, 11, 22))
def conv_transpose(node: OnnxNode, ctx) -> Converted:
    """1-D/2-D/3-D transposed convolution with groups, strides, dilations, pads, output_padding, output_shape and
    auto_pad. Constant weights become nn.ConvTransposeNd (plus a crop for asymmetric pads); run-time weights use
    F.conv_transposeNd. Negative pads are refused.

    Padding follows onnxruntime: with output_shape, the total padding max(0, full + output_padding - output_shape)
    is split with the smaller half first for SAME_UPPER and the larger half first otherwise (pads are ignored);
    SAME_* without output_shape yields input * stride outputs, SAME_UPPER putting the smaller half first."""
    attributes = _conv_attributes(node)
    attributes["output_padding"] = node.attr("output_padding")
    attributes["output_shape"] = node.attr("output_shape")
    if any(p < 0 for p in attributes["pads"] or []):
        raise node.unsupported("pads", attributes["pads"], "negative pads")
    weights = _constant_weights(node, ctx)
    sizes = static_sizes(ctx, node.input(0))
    if weights is not None and (sizes is not None or not attributes["output_shape"]):
        w, b = weights
        n = w.dim() - 2
        strides, dilations = m.per_axis(attributes["strides"], n, 1), m.per_axis(attributes["dilations"], n, 1)
        output_shape = attributes["output_shape"][-n:] if attributes["output_shape"] else None
        begins, ends = m.conv_transpose_crop(attributes["auto_pad"], sizes or [1] * n, list(w.shape[2:]), strides,
                                             dilations, m.per_axis(attributes["output_padding"], n, 0), output_shape,
                                             attributes["pads"])
        # torch yields full[p : L - p + q] with output_padding q < max(stride, dilation); crop the rest
        padding = [max(0, min(begin, end)) for begin, end in zip(begins, ends, strict=True)]
        extra = [max(0, p - end) for p, end in zip(padding, ends, strict=True)]
        if all(q < max(s, d) for q, s, d in zip(extra, strides, dilations, strict=True)):
            group = attributes["group"]
            module = TORCH_CONV_TRANSPOSE[n](w.shape[0], w.shape[1] * group, w.shape[2:], strides, padding, extra,
                                             group, b is not None, dilations, device="meta", dtype=w.dtype)
            _parameter(module, "weight", w)
            _parameter(module, "bias", b)
            crop_begin = [p - begin for p, begin in zip(padding, begins, strict=True)]
            crop_end = [p - end - q for p, end, q in zip(padding, ends, extra, strict=True)]
            if any(crop_begin) or any(crop_end):
                module = nn.Sequential(module, m.spatial_pad(crop_begin, crop_end))
            return Converted(module, [node.input(0)])
    return Converted(m.ConvTranspose(**attributes), node.inputs)


# ----------------------------------------------------------------------------------------------- pooling

def _pool_attributes(node: OnnxNode) -> dict:
    kernel_shape = node.attr("kernel_shape")
    _rank_check(node, len(kernel_shape))
    return {"kernel_shape": kernel_shape, "auto_pad": _auto_pad(node), "ceil_mode": node.attr("ceil_mode") or 0,
            "dilations": node.attr("dilations"), "pads": node.attr("pads"), "strides": node.attr("strides")}


@register_converter("MaxPool", (1, 8, 10, 11, 12, 22))
def max_pool(node: OnnxNode, ctx) -> Converted:
    """1-D/2-D/3-D max pooling with pads, auto_pad, ceil_mode, dilations, storage_order and the Indices output
    (flat over N x C x spatial). int8/uint8 from opset 12.

    Geometry follows onnxruntime, also where the spec's shape formulas differ: SAME_* pads use the undilated
    kernel, ceil_mode drops a last window that would start past the input and its head padding. Positions past
    the input read the lowest value of the type."""
    return Converted(m.MaxPool(storage_order=node.attr("storage_order") or 0, indices=len(node.outputs) > 1,
                               **_pool_attributes(node)), [node.input(0)])


@register_converter("AveragePool", (7, 10, 11, 19, 22))
def average_pool(node: OnnxNode, ctx) -> Converted:
    """1-D/2-D/3-D average pooling with pads, auto_pad, count_include_pad, ceil_mode and (opset 19) dilations.

    Geometry follows onnxruntime as for MaxPool. The divisor counts the taps inside the input, or with
    count_include_pad inside the input and its pads; taps past the pads (ceil_mode) never count."""
    return Converted(m.AveragePool(count_include_pad=node.attr("count_include_pad"), **_pool_attributes(node)),
                     [node.input(0)])


@register_converter("LpPool", (2, 11, 18, 22))
def lp_pool(node: OnnxNode, ctx) -> Converted:
    """1-D/2-D/3-D Lp pooling with pads, auto_pad, and (opset 18) ceil_mode and dilations; padding counts as
    zero and geometry follows onnxruntime as for MaxPool."""
    return Converted(m.LpPool(p=node.attr("p"), **_pool_attributes(node)), [node.input(0)])


@register_converter("GlobalAveragePool", (1, 22))
def global_average_pool(node: OnnxNode, ctx) -> Converted:
    """Mean over all spatial axes, kept as size 1."""
    return Converted(m.GlobalPool("mean"), node.inputs)


@register_converter("GlobalMaxPool", (1, 22))
def global_max_pool(node: OnnxNode, ctx) -> Converted:
    """Max over all spatial axes, kept as size 1."""
    return Converted(m.GlobalPool("max"), node.inputs)


# ----------------------------------------------------------------------------------------------- normalisation

@register_converter("BatchNormalization", (7, 9, 14, 15))
def batch_normalization(node: OnnxNode, ctx) -> Converted:
    """Inference batch normalisation; spatial=0 (opset 7) normalises per channel and position. Constant
    statistics become nn.BatchNormNd put in eval mode: it computes ONNX inference semantics until someone calls
    ``.train()`` on it, after which it is an ordinary torch BatchNorm (batch statistics, running statistics
    updated with momentum 1 - ONNX momentum). training_mode=1 (opset 14) is honoured exactly (batch statistics,
    running-statistics outputs). The training outputs of opset 7/9 are refused."""
    epsilon, momentum = node.attr("epsilon"), node.attr("momentum")
    spatial, training_mode = node.attr("spatial", 1), node.attr("training_mode", 0)
    extra_outputs = [name for name in node.outputs[1:] if name is not None]
    if extra_outputs and not training_mode:
        attribute = "training_mode" if node.version >= 14 else "outputs"
        raise node.unsupported(attribute, training_mode if node.version >= 14 else extra_outputs,
                               "the mean/variance outputs exist in training mode only (opset 14 training_mode=1)")
    outputs = len(node.outputs)
    params = [ctx.owned_constant(name) for name in node.inputs[1:5]]
    rank = _rank(ctx, node.input(0))
    if (all(p is not None and p.dtype == params[0].dtype and p.dim() == 1 for p in params) and spatial
            and not training_mode and outputs == 1 and rank in TORCH_BATCH_NORM):
        scale, bias, mean, var = params
        module = TORCH_BATCH_NORM[rank](scale.numel(), epsilon, 1 - momentum, device="meta", dtype=scale.dtype)
        _parameter(module, "weight", scale)
        _parameter(module, "bias", bias)
        module.running_mean, module.running_var = mean.clone(), var.clone()
        module.num_batches_tracked = torch.tensor(0)
        return Converted(module.eval(), [node.input(0)])
    return Converted(m.BatchNormalization(epsilon, momentum, spatial, training_mode, outputs), node.inputs)


@register_converter("InstanceNormalization", (6, 22))
def instance_normalization(node: OnnxNode, ctx) -> Converted:
    """Per-instance, per-channel normalisation; constant scale/bias become nn.InstanceNormNd(affine=True)."""
    epsilon = node.attr("epsilon")
    scale, bias = ctx.owned_constant(node.input(1)), ctx.owned_constant(node.input(2))
    rank = _rank(ctx, node.input(0))
    if scale is not None and bias is not None and rank in TORCH_INSTANCE_NORM and scale.dtype == bias.dtype:
        module = TORCH_INSTANCE_NORM[rank](scale.numel(), epsilon, affine=True, device="meta", dtype=scale.dtype)
        _parameter(module, "weight", scale)
        _parameter(module, "bias", bias)
        return Converted(module, [node.input(0)])
    return Converted(m.InstanceNormalization(epsilon), node.inputs)


def _stash_type(node: OnnxNode) -> torch.dtype:
    stash_type = node.attr("stash_type", 1)
    try:
        return torch_dtype(stash_type)
    except NotImplementedError:
        raise node.unsupported("stash_type", stash_type, "no torch dtype") from None


@register_converter("LayerNormalization", (17,))
def layer_normalization(node: OnnxNode, ctx) -> Converted:
    """Normalisation over the axes from ``axis`` on, computed in stash_type, with the optional Mean and InvStdDev
    outputs. A float32 node with constant Scale (and B) of the normalised shape becomes nn.LayerNorm."""
    axis, epsilon, stash_type = node.attr("axis"), node.attr("epsilon"), _stash_type(node)
    scale, bias = ctx.owned_constant(node.input(1)), ctx.owned_constant(node.input(2))
    shape = ctx.shape(node.input(0))
    if (scale is not None and (node.input(2) is None or (bias is not None and bias.shape == scale.shape))
            and shape is not None and stash_type == torch.float32 == scale.dtype == ctx.dtype(node.input(0))
            and len(node.outputs) == 1 and list(shape[axis % len(shape):]) == list(scale.shape)):
        module = nn.LayerNorm(scale.shape, epsilon, bias=bias is not None, device="meta")
        _parameter(module, "weight", scale)
        _parameter(module, "bias", bias)
        return Converted(module, [node.input(0)])
    return Converted(m.LayerNormalization(axis, epsilon, stash_type, len(node.outputs)), node.inputs)


@register_converter("RMSNormalization", (23,))
def rms_normalization(node: OnnxNode, ctx) -> Converted:
    """Root-mean-square normalisation over the axes from ``axis`` on, computed in stash_type; Scale broadcasts."""
    module = m.RMSNormalization(node.attr("axis"), node.attr("epsilon"), _stash_type(node))
    return Converted(module, node.inputs)


@register_converter("GroupNormalization", (18, 21))
def group_normalization(node: OnnxNode, ctx) -> Converted:
    """Group normalisation. Opset 18 scale/bias are per group, opset 21 per channel (with stash_type). Constant
    float32 scale/bias become nn.GroupNorm (opset-18 values repeated over each group's channels)."""
    num_groups, epsilon = node.attr("num_groups"), node.attr("epsilon")
    stash_type = _stash_type(node)
    per_group = node.version < 21
    scale, bias = ctx.owned_constant(node.input(1)), ctx.owned_constant(node.input(2))
    shape = ctx.shape(node.input(0))
    channels = shape[1] if shape is not None and len(shape) > 1 and isinstance(shape[1], int) else None
    if scale is not None and bias is not None and channels and stash_type == torch.float32 == scale.dtype:
        if per_group:
            scale, bias = (t.repeat_interleave(channels // num_groups) for t in (scale, bias))
        module = nn.GroupNorm(num_groups, channels, epsilon, device="meta")
        _parameter(module, "weight", scale)
        _parameter(module, "bias", bias)
        return Converted(module, [node.input(0)])
    return Converted(m.GroupNormalization(num_groups, epsilon, stash_type, per_group), node.inputs)


@register_converter("LRN", (1, 13))
def lrn(node: OnnxNode, ctx) -> Converted:
    """Local response normalisation across channels, with ONNX's window for even sizes."""
    return Converted(m.LRN(node.attr("size"), node.attr("alpha"), node.attr("beta"), node.attr("bias")), node.inputs)


@register_converter("Dropout", (7, 10, 12, 13, 22), static=(1, 2))
def dropout(node: OnnxNode, ctx) -> Converted:
    """Inference: the identity. The mask output is all true from opset 12 and, as onnxruntime has it, all false
    (opset 10: bool; opset 7: the input's type) before. training_mode (opset 12) true, constant or at run time,
    is honoured with torch's random generator (seeded with ``seed`` when given); its random numbers cannot match
    onnxruntime's."""
    seed = node.attr("seed")
    ratio, training = ctx.static(node, 1, "ratio"), ctx.static(node, 2)
    module = m.Dropout(0.5 if ratio.value is None else float(ratio.scalar()), seed, bool(training.scalar()),
                       len(node.outputs), inference_mask=node.version >= 12, bool_mask=node.version >= 10)
    return Converted(module, [node.input(0), ratio.run_time, training.run_time])


# ----------------------------------------------------------------------------------------------- attention

SOFTMAX_PRECISIONS = (1, 10, 11, 16)  # float, float16, double, bfloat16


@register_converter("Attention", (23, 24, 25))
def attention(node: OnnxNode, ctx) -> Converted:
    """Scaled dot-product attention, every attribute: 3-D inputs with q_num_heads/kv_num_heads or 4-D inputs,
    GQA/MQA (K/V heads repeated), scale, is_causal (bottom-right: offset by the past length, or per batch by
    nonpad_kv_seqlen - q_length), softcap, bool or float attn_mask (one shorter than the keys is padded as masked),
    past_key/past_value with the present outputs, nonpad_kv_seqlen (opset 24), left/right_window_size (opset 25),
    softmax_precision, qk_matmul_output_mode 0-3; a query row with no attendable key gives zeros. Computed in the
    spec's order (Q and K each times sqrt(scale)). qk_matmul_output_mode=0 with softcap is the QK product before
    the softcap, as the spec and onnxruntime have it (onnx's reference evaluator returns it softcapped); mode 2 has
    -inf where the bias masks, as the spec has it (onnxruntime: the float's lowest value). onnxruntime refuses
    1-D masks and masks shorter than the keys, which follow the spec here."""
    attributes = {name: node.attr(name) for name in ("is_causal", "scale", "softcap", "qk_matmul_output_mode",
                                                     "q_num_heads", "kv_num_heads")}
    if attributes["is_causal"] not in (0, 1):
        raise node.unsupported("is_causal", attributes["is_causal"], "expected 0 or 1")
    if attributes["softcap"] < 0:
        raise node.unsupported("softcap", attributes["softcap"], "expected 0 (none) or a positive cap")
    if attributes["qk_matmul_output_mode"] not in (0, 1, 2, 3):
        raise node.unsupported("qk_matmul_output_mode", attributes["qk_matmul_output_mode"], "expected 0 to 3")
    for name in ("q_num_heads", "kv_num_heads"):
        if attributes[name] is not None and attributes[name] < 1:
            raise node.unsupported(name, attributes[name], "expected a positive head count")
    precision = node.attr("softmax_precision")
    if precision is not None and precision not in SOFTMAX_PRECISIONS:
        raise node.unsupported("softmax_precision", precision, "expected FLOAT, FLOAT16, DOUBLE or BFLOAT16")
    for name in ("left_window_size", "right_window_size"):
        attributes[name] = node.attr(name) if node.version >= 25 else -1
        if attributes[name] < -1:
            raise node.unsupported(name, attributes[name], "expected -1 (unbounded) or a nonnegative size")
    if (node.input(4) is None) != (node.input(5) is None):
        raise node.unsupported("past_key/past_value", node.inputs[4:6], "the two are given together or not at all")
    if node.input(4) is not None and node.input(6) is not None:
        raise node.unsupported("nonpad_kv_seqlen", node.input(6), "cannot be combined with past_key/past_value")
    module = m.Attention(**attributes, softmax_precision=precision and torch_dtype(precision),
                         outputs=len(node.outputs))
    return Converted(module, [node.input(i) for i in range(7)])


# ----------------------------------------------------------------------------------------------- losses

@register_converter("NegativeLogLikelihoodLoss", (12, 13, 22))
@register_converter("SoftmaxCrossEntropyLoss", (12, 13))
def loss(node: OnnxNode, ctx) -> Converted:
    """NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (the loss of the log-softmax over axis 1, with the
    optional log_prob output): inputs [N, C, d1, ...] with targets [N, d1, ...], optional class weights,
    ignore_index, reduction none, sum or mean (divided by the sum of the applied weights: without weights, the
    count of targets not ignored, as onnxruntime has it also for ignore_index=-1, where onnx's reference evaluator
    divides by all)."""
    reduction = _choice(node, "reduction", ("none", "sum", "mean"))
    module = m.NegativeLogLikelihoodLoss(reduction, node.attr("ignore_index"),
                                         node.op_type == "SoftmaxCrossEntropyLoss", len(node.outputs))
    return Converted(module, node.inputs)


# ----------------------------------------------------------------------------------------------- rearrangement

@register_converter("DepthToSpace", (1, 11, 13, 28))
def depth_to_space(node: OnnxNode, ctx) -> Converted:
    """DCR and CRD modes (4-D input)."""
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise node.unsupported("mode", mode, "expected DCR or CRD")
    return Converted(m.DepthToSpace(node.attr("blocksize"), mode), node.inputs)


@register_converter("SpaceToDepth", (1, 13, 28))
def space_to_depth(node: OnnxNode, ctx) -> Converted:
    """DCR order, and CRD (opset 28) (4-D input)."""
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise node.unsupported("mode", mode, "expected DCR or CRD")
    return Converted(m.SpaceToDepth(node.attr("blocksize"), mode), node.inputs)


@register_converter("Pad", (2, 11, 13, 18, 19, 21, 23, 24, 25), static=(1, 2, 3))
def pad(node: OnnxNode, ctx) -> Converted:
    """constant, reflect, edge and (opset 19) wrap padding of any axes (opset 18 ``axes``); negative pads crop.
    Constant pads, value and axes are baked in; run-time ones are read at run time."""
    mode = node.attr("mode")
    modes = ("constant", "reflect", "edge", "wrap") if node.version >= 19 else ("constant", "reflect", "edge")
    if mode not in modes:
        raise node.unsupported("mode", mode, f"expected one of {modes}")
    pads, value, axes = ctx.static(node, 1, "pads"), ctx.static(node, 2, "value"), ctx.static(node, 3)
    static = {"pads": pads.ints(), "value": value.scalar(), "axes": axes.ints()}
    module = m.Pad(mode, **{key: v for key, v in static.items() if v is not None})
    return with_shape_inputs(module, [node.input(0), pads.run_time, value.run_time, axes.run_time], (1, 3))


# ----------------------------------------------------------------------------------------------- resizing

RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
                    "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_RATIO_POLICIES = ("stretch", "not_larger", "not_smaller")


def _choice(node: OnnxNode, name: str, allowed, default=None):
    value = node.attr(name, default) if default is not None else node.attr(name)
    if value not in allowed:
        raise node.unsupported(name, value, f"expected one of {tuple(allowed)}")
    return value


@register_converter("Resize", (10, 11, 13, 18, 19), static=(1, 2, 3))
def resize(node: OnnxNode, ctx) -> Converted:
    """nearest, linear and cubic resampling of any axes with every nearest_mode, coordinate_transformation_mode
    (half_pixel_symmetric from opset 19; tf_crop_and_resize with roi and extrapolation_value), cubic_coeff_a,
    exclude_outside, antialias (linear, cubic), scales or sizes, axes and keep_aspect_ratio_policy (opset 18).
    linear/cubic on integer tensors and antialias with nearest are refused.

    Indices and weights follow onnxruntime's float32 arithmetic and its quirks: opset 10 rounds nearest by
    truncation (ceil when downscaling); output sizes from scales ignore the roi; an input whose size does not
    change is returned unchanged (also with tf_crop_and_resize); antialias uses onnxruntime's (Pillow's) filter.
    Known difference: onnxruntime's
    nearest path treats coordinates within about 1e-6 of a .5 tie as ties; here they round as computed.
    Negative axes with keep_aspect_ratio_policy count from the back as the spec says (onnxruntime resizes
    nothing)."""
    mode = _choice(node, "mode", RESIZE_MODES)
    if node.version == 10:
        attributes = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "simple"}
        roi = sizes = StaticInput(None, None)
        scales = ctx.static(node, 1)
    else:
        coordinate_modes = COORDINATE_MODES + (("half_pixel_symmetric",) if node.version >= 19 else ())
        attributes = {
            "coordinate_transformation_mode": _choice(node, "coordinate_transformation_mode", coordinate_modes),
            "nearest_mode": _choice(node, "nearest_mode", NEAREST_MODES), "cubic_coeff_a": node.attr("cubic_coeff_a"),
            "exclude_outside": node.attr("exclude_outside"), "extrapolation_value": node.attr("extrapolation_value"),
            "antialias": node.attr("antialias", 0), "axes": node.attr("axes"),
            "keep_aspect_ratio_policy": _choice(node, "keep_aspect_ratio_policy", ASPECT_RATIO_POLICIES, "stretch")}
        if attributes["antialias"] and mode == "nearest":
            raise node.unsupported("antialias", 1, "antialias applies to linear and cubic only")
        if attributes["exclude_outside"] and mode != "cubic" and not (attributes["antialias"] and mode == "linear"):
            raise node.unsupported("exclude_outside", 1, "applies to cubic (and antialiased linear) only")
        roi = ctx.static(node, 1)
        if attributes["coordinate_transformation_mode"] != "tf_crop_and_resize":
            roi = StaticInput(None, None)  # roi only takes effect with tf_crop_and_resize
        scales, sizes = ctx.static(node, 2), ctx.static(node, 3)
    dtype = ctx.dtype(node.input(0))
    if mode != "nearest" and dtype is not None and not dtype.is_floating_point:
        raise node.unsupported("mode", mode, f"{mode} resizing of {dtype} tensors (onnxruntime rounds them)")
    # an empty scales input means "use sizes"
    module = m.Resize(mode, roi=roi.values(), scales=scales.values() or None, sizes=sizes.values(), **attributes)
    return with_shape_inputs(module, [node.input(0), roi.run_time, scales.run_time, sizes.run_time], (3,))


GRID_SAMPLE_MODES = MappingProxyType({"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest",
                                      "bicubic": "bicubic", "cubic": "bicubic"})  # opset 16's names and opset 20's


@register_converter("GridSample", (16, 20, 22))
def grid_sample(node: OnnxNode, ctx) -> Converted:
    """F.grid_sample: 2-D (4-D input) linear, nearest and cubic, 3-D (5-D input, opset 20) linear and nearest;
    padding zeros, border or reflection; align_corners. Other ranks, and cubic in 3-D, are refused (torch has no
    kernel)."""
    names = ("bilinear", "nearest", "bicubic") if node.version < 20 else ("linear", "nearest", "cubic")
    mode = GRID_SAMPLE_MODES[_choice(node, "mode", names)]
    padding_mode = _choice(node, "padding_mode", ("zeros", "border", "reflection"))
    rank, ranks = _rank(ctx, node.input(0)), (4,) if node.version < 20 else (4, 5)  # opset 16 is 2-D only
    if rank is not None and rank not in ranks:
        raise node.unsupported("input 0", f"rank {rank}", f"expected rank {' or '.join(map(str, ranks))} "
                               "(torch samples 4-D and 5-D inputs only)")
    if rank == 5 and mode == "bicubic":
        raise node.unsupported("mode", node.attr("mode"), "torch has no cubic sampling of 5-D inputs")
    align_corners = bool(node.attr("align_corners"))
    return Converted(Function(F.grid_sample, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
                     node.inputs)


@register_converter("Upsample", (7, 9), static=(1,))
def upsample(node: OnnxNode, ctx) -> Converted:
    """nearest and linear upsampling (Resize with asymmetric coordinates and opset-10 nearest rounding); scales
    from the attribute (opset 7) or a constant or run-time input (opset 9)."""
    mode = _choice(node, "mode", ("nearest", "linear"))
    scales = ctx.static(node, 1, "scales")
    module = m.Resize(mode, "asymmetric", "simple", scales=scales.values())
    return Converted(module, [node.input(0), None, scales.run_time, None])
