"""The native int8 ops (recurrent/kernel/dynamic_quantize_lstm.cpp, quantized_ops.cpp) against their Python
references in modules/quantized.py, bit for bit: DynamicQuantizeLSTM (``reference_dynamic_quantize_lstm``) over random
configurations and its weight cache; MLAS's tanh and logistic, DynamicQuantizeLinear, the integer matrix product. The
tests against onnxruntime (tests/converters/test_onnxruntime_quantized.py, test_quantized.py, the shipped-like models)
run on the kernel too, and CI runs them once more with ONNX2TORCH_RNN_NATIVE=0 for the Python path."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch

from onnx2torch_rnn.modules import quantized as q
from onnx2torch_rnn.modules.quantized import (
    QUANTIZED_LSTM_CELL,
    dynamic_quantize_lstm_op,
    reference_dynamic_quantize_lstm,
)
from onnx2torch_rnn.recurrent import kernel
from onnx2torch_rnn.recurrent.cells import encode, make_config
from tests.helpers import OpSpy

pytestmark = pytest.mark.skipif(not kernel.enabled(), reason=f"{kernel.ENVIRONMENT}=0: the Python path only")

BOUNDED = ["Sigmoid", "HardSigmoid"]  # for the gates (in [0, 1]): states stay finite
EXACT = ["Sigmoid", "Tanh", "Relu", "Affine", "LeakyRelu", "ThresholdedRelu", "HardSigmoid", "Softsign"]
LIBM = ["ScaledTanh", "Elu", "Softplus"]  # libm's tanh/exp here, torch's there: a few ulps apart


@pytest.fixture(autouse=True)
def native_kernel():
    if not kernel.load("int8") and not os.environ.get("CI"):
        pytest.skip("the native kernel could not be built here (see the warning)")


def integers(generator, dtype, shape, low=None, high=None):
    info = torch.iinfo(dtype)
    low, high = info.min if low is None else low, info.max if high is None else high
    return torch.randint(low, high + 1, shape, generator=generator).to(dtype)


def random_case(rng: random.Random, steps: int | None = None):
    """A random node: directions, lengths (0 and T included), initial states, peepholes, clip, input_forget, every
    activation, int8 or uint8 weights per direction or per column, hidden sizes off and on the 16-unit blocks."""
    direction = rng.choice(["forward", "reverse", "bidirectional"])
    directions = 2 if direction == "bidirectional" else 1
    hidden, size, batch = rng.choice([1, 3, 16, 21, 40]), rng.choice([1, 5, 16, 33]), rng.choice([1, 3, 5, 6])
    steps = rng.choice([0, 1, 4, 9]) if steps is None else steps
    attributes = {"clip": rng.choice([0.5, 3.0])} if rng.random() < 0.3 else {}
    if rng.random() < 0.3:
        attributes["input_forget"] = 1
    libm = False
    if rng.random() < 0.4:
        names = [rng.choice(BOUNDED if k % 3 == 0 else EXACT + LIBM) for k in range(3 * directions)]
        libm = bool(set(names) & set(LIBM))
        attributes.update(activations=names, activation_alpha=[rng.uniform(0.1, 1) for _ in range(6)],
                          activation_beta=[rng.uniform(0.1, 1) for _ in range(6)])
    outputs = rng.choice([(True, True, True), (True, False, False), (False, True, True), (False, False, True)])
    cfg = make_config(QUANTIZED_LSTM_CELL, direction=direction, outputs=outputs, **attributes)
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    dtype = rng.choice([torch.int8, torch.uint8])
    columns = (directions, 4 * hidden) if rng.random() < 0.5 else (directions,)
    args = {"X": torch.randn(steps, batch, size, generator=generator) * rng.choice([0.5, 3.0]),
            "W": integers(generator, dtype, (directions, size, 4 * hidden)),
            "R": integers(generator, dtype, (directions, hidden, 4 * hidden)), "B": None, "sequence_lens": None,
            "initial_h": None, "initial_c": None, "P": None,
            "W_scale": torch.rand(columns, generator=generator) * 0.03 + 0.002,
            "W_zero_point": integers(generator, dtype, columns, 0, 0) if dtype == torch.int8 else
            torch.full(columns, rng.randrange(100, 156), dtype=dtype),
            "R_scale": torch.rand(columns, generator=generator) * 0.03 + 0.002}
    args["R_zero_point"] = args["W_zero_point"].clone()
    if rng.random() < 0.7:
        args["B"] = torch.randn(directions, 8 * hidden, generator=generator) * 0.5
    if rng.random() < 0.3:
        args["P"] = torch.randn(directions, 3 * hidden, generator=generator) * 0.5
    for name in ("initial_h", "initial_c"):
        if rng.random() < 0.5:
            args[name] = torch.randn(directions, batch, hidden, generator=generator)
    if rng.random() < 0.5:
        args["sequence_lens"] = torch.randint(0, steps + 1, (batch,), generator=generator, dtype=torch.int32)
    letters = "WR" + "".join(k for k in "BP" if args[k] is not None)
    return {**args, "config": encode(QUANTIZED_LSTM_CELL, cfg, letters)}, libm


def assert_same(got, want, libm: bool, label: str):
    for g, w in zip(got, want, strict=True):
        if libm:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=lambda m: f"{label}: {m}")
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{label}: {m}")


@pytest.mark.parametrize("seed", range(12))
def test_kernel_matches_python(seed):
    rng = random.Random(seed)
    for _ in range(12):
        args, libm = random_case(rng)
        want = reference_dynamic_quantize_lstm(**args)
        assert_same(dynamic_quantize_lstm_op(**args), want, libm, args["config"])


@pytest.mark.parametrize("seed", range(3))
def test_long_recurrences_match_python(seed):
    """60 steps: a state quantized one step apart would carry to every later step."""
    rng = random.Random(f"long{seed}")
    args, libm = random_case(rng, steps=60)
    assert_same(dynamic_quantize_lstm_op(**args), reference_dynamic_quantize_lstm(**args), libm, args["config"])


def test_weights_are_repacked_when_they_change():
    """The packed weights are kept per tensor and version: an in-place change is seen."""
    args, _ = random_case(random.Random(5), steps=5)
    first = dynamic_quantize_lstm_op(**args)
    args["R"].copy_(torch.flip(args["R"], [-1]))
    assert_same(dynamic_quantize_lstm_op(**args), reference_dynamic_quantize_lstm(**args), False, args["config"])
    assert not all(torch.equal(a, b) for a, b in zip(first, dynamic_quantize_lstm_op(**args), strict=True))


NATIVE = torch.ops.onnx2torch_rnn


def test_mlas_activations_match_python():
    """Every scale of input, the clamp bounds, signed zeros, infinities, NaN, subnormals."""
    generator = torch.Generator().manual_seed(0)
    special = [0.0, -0.0, 9.0, -9.0, 18.0, -18.0, 1e-40, -1e-40, 3e38, float("inf"), -float("inf"), float("nan")]
    x = torch.cat([torch.randn(100_000, generator=generator) * s for s in (1e-3, 0.3, 2, 8, 40)] +
                  [torch.tensor(special)])
    for native, python in ((NATIVE.mlas_tanh, q.mlas_tanh), (NATIVE.mlas_logistic, q.mlas_logistic)):
        torch.testing.assert_close(native(x), python(x), rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(native(x[:37].reshape(1, 37)), python(x[:37].reshape(1, 37)), rtol=0, atol=0)


@pytest.mark.parametrize("values", ["normal", "positive", "negative", "zeros", "empty", "ties", "large"])
def test_dynamic_quantize_linear_matches_python(values):
    generator = torch.Generator().manual_seed(1)
    x = {"normal": torch.randn(3, 70_001, generator=generator) * 3, "positive": torch.rand(50, generator=generator),
         "negative": -torch.rand(17, 5, generator=generator), "zeros": torch.zeros(9), "empty": torch.zeros(0, 4),
         "ties": torch.tensor([-2.55, 0.5, 1.5, 2.5, 127.5, 255.0]) / 1, "large": torch.randn(33) * 1e30}[values]
    scale, zero_point = q.dynamic_parameters(x)
    for got, want in zip(NATIVE.dynamic_quantize_linear(x), (q.quantize(x, scale, zero_point, torch.uint8), scale,
                                                             zero_point), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("a_type", [torch.uint8, torch.int8])
@pytest.mark.parametrize("b_type", [torch.uint8, torch.int8])
@pytest.mark.parametrize("zero_points", ["none", "scalar", "per row and column"])
@pytest.mark.parametrize(("a_shape", "n"), [((5, 70), 131), ((2, 3, 129), 1), ((4, 64), 15), ((7,), 64), ((3, 0), 40)])
def test_matmul_integer_matches_python(a_type, b_type, zero_points, a_shape, n):
    """Few columns (one by one) and many (panels of 64), K off the groups of 4 and 64, batched and 1-D a."""
    generator = torch.Generator().manual_seed(2)
    a, b = integers(generator, a_type, a_shape), integers(generator, b_type, (a_shape[-1], n))
    rows = a_shape[-2] if len(a_shape) > 1 else 1
    a_zp, b_zp = {"none": (None, None),
                  "scalar": (integers(generator, a_type, ()), integers(generator, b_type, ())),
                  "per row and column": (integers(generator, a_type, (rows,)), integers(generator, b_type, (n,)))
                  }[zero_points]
    want = torch.matmul(q.shifted(a, q._row_zero_point(a_zp)), q.shifted(b, b_zp)).to(torch.int32)
    assert torch.equal(NATIVE.matmul_integer(a, *q.packed_matrix(b, b_zp), a_zp), want)


def random_conv(rng: random.Random, generator: torch.Generator):
    """A ConvInteger module and operands: 1-3 spatial axes, groups, strides, dilations, explicit or automatic pads,
    uint8/int8 each, zero points absent, one value, or per output channel for w."""
    rank, group = rng.choice([1, 2, 2, 3]), rng.choice([1, 1, 2, 3])
    channels, out = group * rng.choice([1, 2, 5]), group * rng.choice([1, 2, 4])
    kernel = [rng.choice([1, 2, 3]) for _ in range(rank)]
    x_shape = (rng.choice([1, 2]), channels, *[rng.choice([3, 6, 9]) + k for k in kernel])
    if rank == 2 and rng.random() < 0.2:  # more output positions than one tile
        x_shape = (*x_shape[:2], 20, 33)
    strides, dilations = [rng.choice([1, 2]) for _ in range(rank)], [rng.choice([1, 2]) for _ in range(rank)]
    auto_pad = rng.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    pads = [rng.choice([0, 1, 2]) for _ in range(2 * rank)] if auto_pad == "NOTSET" else None
    conv = q.ConvInteger(auto_pad=auto_pad, dilations=dilations, group=group, pads=pads, strides=strides)
    x_type, w_type = rng.choice([torch.uint8, torch.int8]), rng.choice([torch.uint8, torch.int8])
    x, w = integers(generator, x_type, x_shape), integers(generator, w_type, (out, channels // group, *kernel))
    x_zp = rng.choice([None, integers(generator, x_type, ())])
    w_zp = rng.choice([None, integers(generator, w_type, ()), integers(generator, w_type, (out,))])
    return conv, x, w, x_zp, w_zp


@pytest.mark.parametrize("seed", range(4))
def test_conv_integer_matches_python(seed, monkeypatch):
    """ConvInteger's native op (conv_integer.cpp) against the Python reference, bit for bit, and the module calls
    it in eager inference."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    calls = []
    monkeypatch.setattr(q, "_NATIVE", type("Spy", (), {"conv_integer": lambda self, *args: calls.append(1) or
                                                       NATIVE.conv_integer(*args),
                                                       "__getattr__": lambda self, name: getattr(NATIVE, name)})())
    for _ in range(40):
        conv, x, w, x_zp, w_zp = random_conv(rng, generator)
        want = q.integer_conv(conv, x, w, x_zp, w_zp).to(torch.int32)
        got = conv(x, w, x_zp, w_zp)
        assert got.dtype == torch.int32 and got.shape == want.shape and torch.equal(got, want)
    assert len(calls) == 40


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.uint16, torch.int16])
@pytest.mark.parametrize("zero_point", [False, True])
def test_quantize_and_dequantize_linear_match_python(dtype, zero_point, monkeypatch):
    """QuantizeLinear / DequantizeLinear per tensor (kernel/quantize_linear.cpp) against the Python reference, bit for
    bit: ties at every half, NaN, infinities, values past the range, strided, transposed and broadcast inputs, the
    parameters folded or not, the two in one call; the modules call them (spy)."""
    generator = torch.Generator().manual_seed(3)
    low, high = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    scale = torch.tensor(0.37 if dtype.itemsize == 1 else 0.0037)
    zp = integers(generator, dtype, (), low // 2, high // 2) if zero_point else None
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e30, -1e30])
    ties = (torch.arange(-300, 300) + 0.5) * scale  # x / scale lands on (or one rounding from) each half
    x = torch.cat([special, ties, torch.randn(999, generator=generator) * scale * (high - low)])
    x = x.reshape(-1, 2)[:, 0]  # strided
    spy = OpSpy()
    monkeypatch.setattr(q, "_NATIVE", spy)
    want = q.quantize(x, scale, zp, dtype)
    for folded in (None, (scale, zp)):  # parameters at run time, or folded in by the converter
        module = q.QuantizeLinear(output_dtype=dtype, constants=folded)
        got = module(x) if folded else module(x, scale, zp)
        assert got.dtype == dtype and torch.equal(got, want)
    values = torch.cat([integers(generator, dtype, (500,)), torch.tensor([low, high], dtype=dtype)])
    for value in (values, values.to(torch.int32) * 40000):  # int32: the difference wraps as torch's does
        for folded in (None, (scale, zp)):
            module = q.DequantizeLinear(constants=folded)
            got = module(value) if folded else module(value, scale, zp)
            assert got.dtype == torch.float32 and torch.equal(got, q.dequantize(value, scale, zp))
    for other in (zp, None if zp is None else (zp.to(torch.int32) + 1).to(dtype)):  # a Q read by one DQ alone
        pair = q.QuantizeDequantizeLinear(q.QuantizeLinear(output_dtype=dtype, constants=(scale, zp)),
                                          q.DequantizeLinear(constants=(scale * 3, other)))
        assert torch.equal(pair(x), q.dequantize(want, scale * 3, other))
    for view in (lambda t: t[:120].reshape(2, 3, 4, 5).permute(3, 0, 2, 1), lambda t: t[:6].expand(4, 6)):
        quantized = q.QuantizeLinear(output_dtype=dtype, constants=(scale, zp))(view(x))  # through the strides
        assert torch.equal(quantized, q.quantize(view(x), scale, zp, dtype)) and quantized.is_contiguous()
        got = q.DequantizeLinear(constants=(scale, zp))(view(values))
        assert torch.equal(got, q.dequantize(view(values), scale, zp))
    assert spy.called == {"quantize_linear", "dequantize_linear", "quantize_dequantize_linear"}


def test_a_module_repacks_its_weights_when_they_change():
    """A DynamicQuantizeLSTM module holds its packed weights (op.Kept, by identity and version): a buffer changed in
    place, by load_state_dict or replaced is packed again, and the numbers are the Python reference's."""
    generator = torch.Generator().manual_seed(3)
    hidden, size = 5, 4

    def weights(shift: int) -> dict:
        return {"W": integers(generator, torch.int8, (1, size, 4 * hidden)),
                "R": integers(generator, torch.int8, (1, hidden, 4 * hidden)),
                "W_scale": torch.tensor([0.02 + shift * 0.01]), "W_zero_point": torch.zeros(1, dtype=torch.int8),
                "R_scale": torch.tensor([0.03]), "R_zero_point": torch.zeros(1, dtype=torch.int8)}

    module, other = (q.DynamicQuantizeLSTM(quantized=weights(k), hidden_size=hidden, B=torch.randn(1, 8 * hidden))
                     for k in range(2))
    X = torch.randn(6, 2, size, generator=generator)

    def check():
        buffers = {name: getattr(module, buffer) for name, buffer in zip(module.QUANTIZED, module.BUFFERS,
                                                                         strict=True)}
        want = reference_dynamic_quantize_lstm(X, B=module.B, sequence_lens=None, initial_h=None, initial_c=None,
                                               P=None, config=module.op_config, **buffers)
        with torch.no_grad():
            got = module(X)
        assert_same(got, want, False, "module")
        return got[0]

    first = check()
    for change in (lambda: module.R_quantized.copy_(torch.flip(module.R_quantized, [-1])),
                   lambda: module.load_state_dict(other.state_dict()),
                   lambda: setattr(module, "W_scale", module.W_scale * 2), lambda: module.B.mul_(0.5)):
        with torch.no_grad():
            change()
        second = check()
        assert not torch.equal(first, second)
        first = second


def _quantized_layer(generator, rng: random.Random, size: int, direction: str, hidden: int, **attributes):
    directions = 2 if direction == "bidirectional" else 1
    dtype = rng.choice([torch.int8, torch.uint8])
    columns = (directions, 4 * hidden) if rng.random() < 0.5 else (directions,)
    zero = (torch.zeros(columns, dtype=dtype) if dtype == torch.int8 else
            torch.full(columns, rng.randrange(100, 156), dtype=dtype))
    weights = {"W": integers(generator, dtype, (directions, size, 4 * hidden)),
               "R": integers(generator, dtype, (directions, hidden, 4 * hidden)),
               "W_scale": torch.rand(columns, generator=generator) * 0.03 + 0.002, "W_zero_point": zero,
               "R_scale": torch.rand(columns, generator=generator) * 0.03 + 0.002, "R_zero_point": zero.clone()}
    bias = {"B": torch.randn(directions, 8 * hidden, generator=generator) * 0.5} if rng.random() < 0.7 else {}
    peepholes = {"P": torch.randn(directions, 3 * hidden, generator=generator) * 0.5} if rng.random() < 0.3 else {}
    return q.DynamicQuantizeLSTM(quantized=weights, hidden_size=hidden, direction=direction, **bias, **peepholes,
                                 **attributes)


@pytest.mark.parametrize("flags", [{}, {"batch_first": True, "batch_first_output": True}, {"merge_output": False},
                                   {"merge_output": False, "batch_first_output": True},
                                   {"last_states": True, "batch_first": True}])
@pytest.mark.parametrize("steps, batch", [(5, 3), (0, 2), (4, 0), (7, 1)])
@pytest.mark.parametrize("lengths", ["none", "given", "constant"])
def test_the_quantized_stack_op_takes_every_stack_argument(flags, steps, batch, lengths):
    """A StackedRecurrent of DynamicQuantizeLSTM layers (a hidden size off or on the 16-unit blocks, random weights,
    initial states as rows of the inputs, a view among them, lengths given at run time or every layer's constant
    ones) is one call of
    dynamic_quantize_lstm_stack in eager inference, which gives bit for bit what the layers' modules give (a hook on
    a layer forces that path); float64 x runs the layers' Python path."""
    from onnx2torch_rnn.recurrent import StackedRecurrent

    rng = random.Random(f"{flags}{steps}{batch}{lengths}")
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    lens = torch.randint(0, steps + 1, (batch,), generator=generator)
    constant = {"sequence_lens": lens.tolist()} if lengths == "constant" else {}
    hidden = rng.choice([5, 17])  # the layers' final states are joined: one size
    layers = [_quantized_layer(generator, rng, 3, "bidirectional", hidden, outputs=[True, True, True], **constant),
              _quantized_layer(generator, rng, 2 * hidden, "forward", hidden, outputs=[True, True, True], **constant),
              _quantized_layer(generator, rng, hidden, "reverse", hidden, outputs=[True, True, True], **constant)]
    stack = StackedRecurrent(layers, initial_h=[(0, 0, 2), None, (0, -1, None)],
                             initial_c=[(1, None, None), None, None], outputs=(True, True, True),
                             lengths=lengths == "given", **flags).eval()
    x = torch.randn((batch, steps, 3) if flags.get("batch_first") else (steps, batch, 3), generator=generator)
    args = [x, torch.randn(4, batch, hidden, generator=generator)[1:],  # a view: rows read past its offset
            torch.randn(2, batch, hidden, generator=generator)]
    args += [lens] if lengths == "given" else []
    calls = []
    spy = lambda *a, _run=q._run_stack: calls.append(1) or _run(*a)  # noqa: E731
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(q.DynamicQuantizeLSTM, "STACK", dataclasses.replace(q.DynamicQuantizeLSTM.STACK, run=spy))
        stack.__dict__.pop("_native_stack", None)
        native = stack(*args)
        handle = layers[1].register_forward_hook(lambda *_: None)
        layer_by_layer = stack(*args)
        handle.remove()
        assert calls == [1]
        in_float64 = stack(*(a.double() if a.is_floating_point() else a for a in args))
        assert calls == [1] and [t.shape for t in in_float64] == [t.shape for t in native]
    for a, b in zip(native, layer_by_layer, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)
