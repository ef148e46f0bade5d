"""The native QLinear ops (recurrent/kernel/qlinear.cpp) against their Python references in modules/quantized.py, bit
for bit, on random inputs: each module runs with the kernel and with the Python path (``native`` off), its scales
and zero points folded at construction (what the converter does with constants) and given at run time. The tests
against onnxruntime (tests/converters/test_onnxruntime_quantized.py, test_quantized.py) run on the kernel too, and CI
runs them once more with ONNX2TORCH_RNN_NATIVE=0 for the Python path."""

from __future__ import annotations

import math
import os

import pytest
import torch

from onnx2torch_rnn.modules import quantized as q
from onnx2torch_rnn.modules.nn import MaxPool
from onnx2torch_rnn.recurrent import kernel
from tests.helpers import OpSpy

pytestmark = pytest.mark.skipif(not kernel.enabled(), reason=f"{kernel.ENVIRONMENT}=0: the Python path only")
BYTES = [torch.uint8, torch.int8]


@pytest.fixture(autouse=True)
def native_kernel():
    if not kernel.load() and not os.environ.get("CI"):
        pytest.skip("the native kernel could not be built here (see the warning)")


def outputs(monkeypatch, op: str, calls) -> list[torch.Tensor]:
    """Each call's result with the kernel (which must run ``op``), then with the Python path: all equal."""
    spy = OpSpy()
    with monkeypatch.context() as patch:
        patch.setattr(q, "_NATIVE", spy)
        with torch.inference_mode():
            results = [call() for call in calls]
    assert op in spy.called
    with monkeypatch.context() as patch:
        patch.setattr(q, "native", lambda *tensors: False)
        results += [call() for call in calls]
    for result in results[1:]:
        assert result.dtype == results[0].dtype
        torch.testing.assert_close(result, results[0], rtol=0, atol=0, equal_nan=True)
    return results


def ints(generator, dtype, shape, low=None, high=None) -> torch.Tensor:
    info = torch.iinfo(dtype)
    low, high = info.min if low is None else low, info.max if high is None else high
    return torch.randint(low, high + 1, shape, generator=generator).to(dtype)


def scales(generator, shape=(), low=0.005, high=0.2) -> torch.Tensor:
    return (torch.rand(shape, generator=generator) * (high - low) + low).float()


def zero_point(generator, dtype, shape=()) -> torch.Tensor:
    return ints(generator, dtype, shape, torch.iinfo(dtype).min // 2, torch.iinfo(dtype).max // 2)


BROADCASTS = [((4, 65), (4, 65)), ((3, 5, 7), (7,)), ((6, 9), (6, 1)), ((51,), ()), ((), (33,)), ((2, 3, 5), (3, 1)),
              ((1, 7), (3, 1)), ((1, 5, 4, 3), (5, 1, 1))]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCASTS)
@pytest.mark.parametrize("seed", range(3))
def test_binary(monkeypatch, op, dtype, a_shape, b_shape, seed):
    """Both operand orders (onnxruntime's vector operand), wide ranges (saturation, past the int32 range)."""
    g = torch.Generator().manual_seed(seed)
    params = [scales(g), zero_point(g, dtype), scales(g), zero_point(g, dtype),
              scales(g, (), 1e-6, 0.05) if seed == 2 else scales(g), zero_point(g, dtype)]
    a, b = ints(g, dtype, a_shape), ints(g, dtype, b_shape)
    module_type = getattr(q, op)
    name = "qlinear_add" if op == "QLinearAdd" else "qlinear_mul"
    for x, y, p in ((a, b, params), (b, a, params[2:4] + params[:2] + params[4:])):  # the op is not symmetric
        folded, given = module_type(tuple(p)), module_type()
        results = outputs(monkeypatch, name, [lambda f=folded, x=x, y=y: f(x, None, None, y, None, None, None, None),
                                              lambda f=given, x=x, y=y, p=p: f(x, *p[:2], y, *p[2:])])
        assert results[0].shape == torch.broadcast_shapes(a_shape, b_shape)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", BYTES)
def test_binary_repeats_and_strides(monkeypatch, op, dtype):
    """Operands repeated within the output (not one block of it) and strided views (transposed, sliced, expanded)
    run natively too, through their strides."""
    g = torch.Generator().manual_seed(5)
    params = tuple([scales(g), zero_point(g, dtype)] * 3)
    module = getattr(q, op)(params)
    name = "qlinear_add" if op == "QLinearAdd" else "qlinear_mul"
    cases = [(ints(g, dtype, (3, 1, 4)), ints(g, dtype, (3, 5, 4))),
             (ints(g, dtype, (5, 1)), ints(g, dtype, (2, 5, 4))),
             (ints(g, dtype, (4, 6)).t(), ints(g, dtype, (6, 4))),
             (ints(g, dtype, (6, 9))[:, ::2], ints(g, dtype, (5,))),
             (ints(g, dtype, (1, 7)).expand(3, 7), ints(g, dtype, (3, 1))),
             (ints(g, dtype, (0, 3)), ints(g, dtype, (3,)))]
    for a, b in cases:
        for x, y in ((a, b), (b, a)):
            result = outputs(monkeypatch, name, [lambda x=x, y=y: module(x, None, None, y, None, None, None, None)])
            assert result[0].shape == torch.broadcast_shapes(x.shape, y.shape)


def _requantized(monkeypatch, module_type, constants: dict, runtime_args, attributes=None, op="requantize"):
    folded = module_type(constants=constants, **(attributes or {}))
    given = module_type(**(attributes or {}))
    nones = [None] * len(constants)
    return outputs(monkeypatch, op, [lambda: folded(runtime_args[0], *nones), lambda: given(*runtime_args)])


CONVS = [({"pads": [1, 1, 1, 1]}, (1, 3, 16, 16), (8, 3, 3, 3)), ({"strides": [2, 1]}, (2, 4, 7, 5), (5, 4, 3, 2)),
         ({"group": 2, "pads": [0, 1, 2, 0]}, (1, 4, 6, 9), (6, 2, 1, 3)), ({}, (2, 3, 11), (7, 3, 4)),
         ({"strides": [3], "pads": [4, 2], "dilations": [2]}, (1, 2, 13), (3, 2, 3)),
         ({"strides": [2, 3], "pads": [2, 0, 1, 3], "dilations": [1, 2]}, (1, 3, 9, 40), (4, 3, 3, 3)),
         ({"pads": [1, 0, 1, 1, 0, 1], "strides": [1, 2, 1]}, (1, 2, 3, 5, 4), (3, 2, 2, 2, 2)),
         ({"group": 3, "pads": [1, 1, 1, 1]}, (1, 3, 5, 300), (3, 1, 3, 3)),
         ({"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]}, (2, 4, 9, 8), (8, 1, 3, 3)),  # depthwise, 2 each
         ({"pads": [0, 1, 0, 1]}, (2, 3, 20, 15), (70, 3, 1, 2)),  # more channels than a panel block, tiles
         ({"dilations": [2, 1], "pads": [2, 1, 2, 1]}, (1, 40, 6, 5), (5, 40, 3, 3))]  # many taps


@pytest.mark.parametrize(("attributes", "x_shape", "w_shape"), CONVS)
@pytest.mark.parametrize("types", [(torch.uint8, torch.int8), (torch.int8, torch.int8), (torch.uint8, torch.uint8)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("after", ["", "pool", "lookup", "quantize", "quantize, pool"])
def test_qlinear_conv(monkeypatch, attributes, x_shape, w_shape, types, per_channel, bias, after):
    """``after``: a MaxPool or a QLinearLookup after it, or the QuantizeLinear of a float x before it
    (passes/quantized.py), in the native call with folded constants; the quantization's zero point need not be
    the convolution's (both are used as given)."""
    g = torch.Generator().manual_seed(len(x_shape) + per_channel + 2 * bias)
    rank, x_type = len(x_shape) - 2, types[0]
    if after.endswith("pool"):
        attributes = {**attributes, "pool": MaxPool([2] * rank, pads=[1] * rank + [0] * rank, strides=[2] * rank,
                                                    ceil_mode=int(per_channel))}
    elif after == "lookup":
        parameters = (scales(g, (), 0.05, 0.3), zero_point(g, x_type), scales(g), zero_point(g, x_type))
        attributes = {**attributes, "lookup": q.QLinearLookup("Sigmoid" if bias else "LeakyRelu", 0.1, parameters)}
    x_type, w_type = types
    channels = (w_shape[0],) if per_channel else ()
    constants = {"x_scale": scales(g), "x_zero_point": zero_point(g, x_type), "w": ints(g, w_type, w_shape),
                 "w_scale": scales(g, channels, 0.001, 0.02), "w_zero_point": zero_point(g, w_type, channels),
                 "y_scale": scales(g, (), 0.05, 0.3), "y_zero_point": zero_point(g, x_type),
                 "B": torch.randint(-3000, 3000, (w_shape[0],), generator=g, dtype=torch.int32) if bias else None}
    x = ints(g, x_type, x_shape)
    if after.startswith("quantize"):  # floats over the quantization's range and past it, NaN and infinities
        parameters = (scales(g, (), 0.01, 0.05), zero_point(g, x_type))
        attributes = {**attributes, "quantize": q.QuantizeLinear(output_dtype=x_type, constants=parameters)}
        x = torch.randn(x_shape, generator=g) * 4
        x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])[:x.numel()]
    _requantized(monkeypatch, q.QLinearConv, constants, [x, *constants.values()], attributes, "qlinear_conv")


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 8), (8, 5)), ((2, 5, 17), (17, 40)), ((7,), (7, 3)),
                                                  ((9, 70), (70, 65)), ((2, 3, 1), (1, 33))])
@pytest.mark.parametrize("types", [(torch.uint8, torch.int8), (torch.int8, torch.int8), (torch.uint8, torch.uint8),
                                   (torch.int8, torch.uint8)])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(monkeypatch, a_shape, b_shape, types, per_column):
    """The folded product in one call (qlinear_matmul: few columns stored by column, more as panels, rows past a
    register tile), the given one as the integer product then requantize."""
    g = torch.Generator().manual_seed(len(a_shape) + per_column)
    a_type, b_type = types
    columns = (b_shape[1],) if per_column else ()
    constants = {"a_scale": scales(g), "a_zero_point": zero_point(g, a_type), "b": ints(g, b_type, b_shape),
                 "b_scale": scales(g, columns, 0.001, 0.02), "b_zero_point": zero_point(g, b_type, columns),
                 "y_scale": scales(g, (), 0.05, 0.3), "y_zero_point": zero_point(g, a_type)}
    a = ints(g, a_type, a_shape)
    _requantized(monkeypatch, q.QLinearMatMul, constants, [a, *constants.values()], op="qlinear_matmul")


@pytest.mark.parametrize(("attributes", "a_shape", "b_shape", "c_shape"), [
    ({}, (3, 8), (8, 5), (5,)), ({"alpha": 0.5}, (3, 8), (8, 5), None), ({"transA": 1}, (8, 3), (8, 5), (3, 5)),
    ({"transB": 1}, (3, 8), (5, 8), (1, 5)), ({"transA": 1, "transB": 1, "alpha": 2.0}, (8, 3), (5, 8), ()),
    ({}, (4, 30), (30, 6), (4, 1)), ({"transB": 1}, (1, 16), (5, 16), (5,)), ({"transB": 1}, (6, 20), (40, 20), (40,)),
    ({"alpha": 0.25}, (5, 9), (9, 3), (1,))])
@pytest.mark.parametrize("per_column", [False, True])
def test_qgemm(monkeypatch, attributes, a_shape, b_shape, c_shape, per_column):
    g = torch.Generator().manual_seed(len(a_shape) + per_column)
    n = b_shape[0] if attributes.get("transB") else b_shape[1]
    columns = (n,) if per_column else ()
    constants = {"a_scale": scales(g), "a_zero_point": zero_point(g, torch.uint8), "b": ints(g, torch.int8, b_shape),
                 "b_scale": scales(g, columns, 0.001, 0.02), "b_zero_point": zero_point(g, torch.int8, columns),
                 "c": None if c_shape is None else torch.randint(-3000, 3000, c_shape, generator=g, dtype=torch.int32),
                 "y_scale": scales(g, (), 0.05, 0.3), "y_zero_point": zero_point(g, torch.uint8)}
    a = ints(g, torch.uint8, a_shape)
    # the folded product in one call (qlinear_matmul) where C is a bias per column, and op(A) is A
    fused = not attributes.get("transA") and (c_shape is None or math.prod(c_shape) in (1, c_shape[-1]))
    _requantized(monkeypatch, q.QGemm, constants, [a, *constants.values()], attributes,
                 "qlinear_matmul" if fused else "requantize")


def test_qlinear_matmul_repacks_changed_weights(monkeypatch):
    """The packed b is kept between calls and made again when b changes (load_state_dict, in place)."""
    g = torch.Generator().manual_seed(5)
    constants = {"a_scale": scales(g), "a_zero_point": zero_point(g, torch.uint8), "b": ints(g, torch.int8, (6, 4)),
                 "b_scale": scales(g), "b_zero_point": zero_point(g, torch.int8), "y_scale": scales(g, (), 0.05, 0.3),
                 "y_zero_point": zero_point(g, torch.uint8)}
    module, a, original = q.QLinearMatMul(constants=constants), ints(g, torch.uint8, (3, 6)), constants["b"].clone()
    first = outputs(monkeypatch, "qlinear_matmul", [lambda: module(a, *[None] * 7)])[0]
    state = module.state_dict()
    state["b"] = ints(g, torch.int8, (6, 4))
    module.load_state_dict(state)
    second = outputs(monkeypatch, "qlinear_matmul", [lambda: module(a, *[None] * 7)])[0]
    module.b.copy_(original)
    third = outputs(monkeypatch, "qlinear_matmul", [lambda: module(a, *[None] * 7)])[0]
    assert not torch.equal(first, second) and torch.equal(first, third)


def _pool_parameters(g, dtype):
    return (scales(g, (), 0.02, 0.1), zero_point(g, dtype), scales(g, (), 0.01, 0.05), zero_point(g, dtype))


POOLS = [({"kernel_shape": [2, 2], "strides": [2, 2]}, (2, 3, 6, 7)),
         ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (1, 4, 5, 6)),
         ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, (1, 4, 5, 6)),
         ({"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}, (1, 2, 7, 8)),
         ({"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 2, 7, 8)),
         ({"kernel_shape": [3], "strides": [2], "pads": [1, 0]}, (2, 3, 9)),
         ({"kernel_shape": [2, 2, 2]}, (1, 2, 4, 5, 3)),
         ({"kernel_shape": [2, 2], "strides": [2, 2]}, (1, 3, 20, 38)),
         ({"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 2, 2, 1], "ceil_mode": 1}, (1, 2, 11, 40)),
         ({"kernel_shape": [4], "pads": [2, 1], "count_include_pad": 1}, (2, 3, 45))]


@pytest.mark.parametrize(("attributes", "shape"), POOLS)
@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_average_pool(monkeypatch, attributes, shape, dtype, channels_last):
    g = torch.Generator().manual_seed(len(shape) + channels_last)
    parameters = _pool_parameters(g, dtype)
    if channels_last:
        shape = (shape[0], *shape[2:], shape[1])
    x = ints(g, dtype, shape)
    folded = q.QLinearAveragePool(channels_last=channels_last, parameters=parameters, **attributes)
    given = q.QLinearAveragePool(channels_last=channels_last, **attributes)
    outputs(monkeypatch, "qlinear_average_pool", [lambda: folded(x), lambda: given(x, *parameters)])


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("shape", "channels_last"), [((2, 3, 5, 6), 0), ((1, 4, 7), 0), ((2, 5, 6, 3), 1),
                                                      ((3, 16, 16, 40), 0), ((1, 9, 17), 1)])
def test_qlinear_global_average_pool(monkeypatch, dtype, shape, channels_last):
    g = torch.Generator().manual_seed(len(shape) + channels_last)
    parameters = _pool_parameters(g, dtype)
    x = ints(g, dtype, shape)
    folded = q.QLinearGlobalAveragePool(channels_last, parameters)
    given = q.QLinearGlobalAveragePool(channels_last)
    outputs(monkeypatch, "qlinear_global_average_pool", [lambda: folded(x), lambda: given(x, *parameters)])


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("shape", "axis", "opset"), [((4, 10), -1, 13), ((3, 2, 7), 2, 13), ((2, 3, 5), 1, 12),
                                                      ((3, 41), 1, 11), ((5, 1), -1, 13), ((2, 5, 3), 1, 13),
                                                      ((4, 3, 2), 0, 13), ((2, 3, 4, 5), 1, 11)])
@pytest.mark.parametrize("output", [(1 / 256, None), (0.007, 3)])
def test_qlinear_softmax(monkeypatch, dtype, shape, axis, opset, output):
    g = torch.Generator().manual_seed(len(shape))
    x_scale = scales(g, (), 0.02, 0.2)
    y_scale = torch.tensor(output[0], dtype=torch.float32)
    y_zero = torch.tensor(output[1] if output[1] is not None else (0 if dtype == torch.uint8 else -128), dtype=dtype)
    x = ints(g, dtype, shape)
    folded = q.QLinearSoftmax(axis, opset, float(x_scale), (y_scale, y_zero))
    given = q.QLinearSoftmax(axis, opset)
    outputs(monkeypatch, "qlinear_softmax", [lambda: folded(x, x_scale), lambda: given(x, x_scale, None, y_scale,
                                                                                      y_zero)])


def test_pool_and_softmax_plan_each_new_input(monkeypatch):
    """The folded modules keep their native numbers for the last input's shape and type: another one (and back) is
    planned anew."""
    g = torch.Generator().manual_seed(5)
    pool = q.QLinearAveragePool([2, 2], strides=[2, 2], parameters=_pool_parameters(g, torch.uint8))
    x_scale = scales(g, (), 0.02, 0.2)
    softmax = q.QLinearSoftmax(1, 13, float(x_scale), (torch.tensor(1 / 256), torch.tensor(3)))
    for dtype, shape in [(torch.uint8, (1, 2, 6, 8)), (torch.uint8, (2, 3, 4, 10)), (torch.int8, (2, 3, 4, 10)),
                         (torch.uint8, (1, 2, 6, 8))]:
        x = ints(g, dtype, shape)
        if dtype == torch.uint8:
            outputs(monkeypatch, "qlinear_average_pool", [lambda x=x: pool(x)])
        outputs(monkeypatch, "qlinear_softmax", [lambda x=x: softmax(x, x_scale)])


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("shapes", "axis"), [([(2, 1, 3), (2, 4, 3), (2, 5, 3)], 1), ([(3, 2), (1, 2)], 0),
                                              ([(2, 3, 2), (2, 3, 1), (2, 3, 4)], -1)])
def test_qlinear_concat_and_lookup_tables(monkeypatch, dtype, shapes, axis):
    """QLinearConcat's requantization tables (built at construction) in one qlinear_concat (an identity table for
    the copied input), and QLinearLookup's, looked up natively."""
    g = torch.Generator().manual_seed(len(shapes))
    y_scale, y_zero = scales(g), zero_point(g, dtype)
    xs = [ints(g, dtype, shape) for shape in shapes]
    parameters = [(scales(g), zero_point(g, dtype)) for _ in xs]
    parameters[1] = (y_scale, y_zero)  # copied
    tables = tuple(q.QLinearConcat.table(*p, y_scale, y_zero) for p in parameters)
    assert tables[1] is None and tables[0] is not None
    same = tuple(t is None for t in tables)
    folded, given = q.QLinearConcat(axis, same, tables), q.QLinearConcat(axis)
    args = [v for x, p in zip(xs, parameters, strict=True) for v in (x, *p)]
    nones = [v if i % 3 == 0 else None for i, v in enumerate(args)]
    outputs(monkeypatch, "qlinear_concat", [lambda: folded(None, None, *nones), lambda: given(y_scale, y_zero, *args)])
    strided = [v.transpose(0, -1).contiguous().transpose(0, -1) if i == 0 else v for i, v in enumerate(nones)]
    assert not strided[0].is_contiguous()
    outputs(monkeypatch, "qlinear_concat", [lambda: folded(None, None, *strided)])  # a strided input: copied
    lookup = q.QLinearLookup("Sigmoid", None, (scales(g), zero_point(g, dtype), torch.tensor(1 / 256), None))
    x = ints(g, dtype, (3, 7, 5))
    outputs(monkeypatch, "qlinear_lookup", [lambda: lookup(x)])


@pytest.mark.parametrize(("a_shape", "n", "operand_shape"), [((3, 8), 5, (5,)), ((2, 5, 17), 40, (1, 40)),
                                                              ((9, 70), 65, ()), ((4, 6), 7, (1,)),
                                                              ((2, 3, 4), 1, (1,))])
@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("position", [0, 3])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_add(monkeypatch, a_shape, n, operand_shape, dtype, position, per_column):
    """QLinearMatMul then QLinearAdd of a constant per column (qlinear_matmul_add: both roundings in one call, the
    constant either operand, one value repeated, wide add ratios for saturation) against the two modules."""
    g = torch.Generator().manual_seed(n + position + per_column)
    columns = (n,) if per_column else ()
    constants = {"a_scale": scales(g), "a_zero_point": zero_point(g, dtype), "b": ints(g, torch.int8, (a_shape[-1], n)),
                 "b_scale": scales(g, columns, 0.001, 0.02), "b_zero_point": zero_point(g, torch.int8, columns),
                 "y_scale": scales(g, (), 0.05, 0.3), "y_zero_point": zero_point(g, dtype)}
    add_parameters = [scales(g), zero_point(g, dtype), scales(g), zero_point(g, dtype), scales(g, (), 0.01, 0.2),
                      zero_point(g, dtype)]
    module = q.QLinearMatMulAdd(q.QLinearMatMul(constants=constants), q.QLinearAdd(tuple(add_parameters)),
                                ints(g, dtype, operand_shape), position)
    assert module.swap is not None
    a = ints(g, dtype, a_shape)
    results = outputs(monkeypatch, "qlinear_matmul_add", [lambda: module(a, *[None] * 7)])
    assert results[0].shape == (*a_shape[:-1], n)


def test_qlinear_matmul_add_falls_back():
    """A constant that is not one value per column (or of another type) leaves the two modules' calls."""
    g = torch.Generator().manual_seed(0)
    constants = {"a_scale": scales(g), "a_zero_point": zero_point(g, torch.uint8), "b": ints(g, torch.int8, (6, 4)),
                 "b_scale": scales(g), "b_zero_point": zero_point(g, torch.int8), "y_scale": scales(g, (), 0.05, 0.3),
                 "y_zero_point": zero_point(g, torch.uint8)}
    parameters = (scales(g), zero_point(g, torch.uint8)) * 3
    for operand in (ints(g, torch.uint8, (3, 4)), ints(g, torch.int8, (4,))):
        module = q.QLinearMatMulAdd(q.QLinearMatMul(constants=constants), q.QLinearAdd(parameters), operand, 0)
        assert module.swap is None


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("shapes", "axis"), [([(2, 3, 4), (2, 5, 4)], 1), ([(3, 4), (3, 2), (3, 1)], -1),
                                              ([(1, 2, 6)], 0), ([(4, 2, 3), (1, 2, 3)], 0)])
@pytest.mark.parametrize("copied", ["none", "first", "all"])
@pytest.mark.parametrize("transposed", [False, True])
def test_quantize_concat_dequantize(monkeypatch, dtype, shapes, axis, copied, transposed):
    """QuantizeLinear of each input -> QLinearConcat -> (Transpose ->) DequantizeLinear in one call
    (quantize_concat_dequantize) against the modules: values on rounding ties, past the type's range, NaN; inputs
    copied by the concat (its scale and zero point) or requantized by tables."""
    from onnx2torch_rnn.modules.shape import Transpose

    g = torch.Generator().manual_seed(len(shapes) + transposed)
    y_scale, y_zero = scales(g), zero_point(g, dtype)
    parameters = [(y_scale, y_zero) if copied == "all" or (copied == "first" and i == 0) else
                  (scales(g), zero_point(g, dtype)) for i in range(len(shapes))]
    quantizers = [q.QuantizeLinear(output_dtype=dtype, constants=p) for p in parameters]
    same = tuple(q.QLinearConcat.copies(*p, y_scale, y_zero) for p in parameters)
    tables = tuple(q.QLinearConcat.table(*p, y_scale, y_zero) for p in parameters)
    concat = q.QLinearConcat(axis, same, None if all(same) else tables)
    view = Transpose(list(reversed(range(len(shapes[0]))))) if transposed else None
    module = q.QuantizeConcatDequantize(quantizers, concat, q.DequantizeLinear(constants=(y_scale, y_zero)), view)
    assert module.numbers is not None
    xs = []
    for shape, (scale, _) in zip(shapes, parameters, strict=True):
        x = torch.randint(-300, 300, shape, generator=g) * scale / 2  # halves of a step: ties
        x.view(-1)[0] = float("nan")
        xs.append(x.float())
    outputs(monkeypatch, "quantize_concat_dequantize", [lambda: module(*xs)])
