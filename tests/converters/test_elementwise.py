"""Element-wise arithmetic, logic and activation ops against onnxruntime.

Every since_version of each op that is in force from opset 7 to 25 is tested at the lowest opset that selects it
(float32); extra dtypes run at opset 25. Versions newer than onnxruntime's opset 25 (Mod/BitShift/Celu 28) are
checked against numpy.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn import UnsupportedAttributeError
from onnx2torch_rnn.registry import resolve
from tests.helpers import check, make_model, run_onnxruntime, run_torch

NEWEST = 25  # the newest opset onnxruntime runs
HALF = {"rtol": 1e-3, "atol": 1e-3}  # float16 keeps ~3 significant digits; torch and ORT may round 1 ulp apart
F32, F64, F16 = np.float32, np.float64, np.float16
I8, I32, I64, U8, U16, U32, U64 = np.int8, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0]


def since_versions(op: str, newest: int = NEWEST) -> list[int]:
    """The opset that selects each since_version of ``op`` in force from opset 7 to ``newest``."""
    versions = {onnx.defs.get_schema(op, opset).since_version for opset in range(7, newest + 1)
                if _exists(op, opset)}
    return sorted(max(7, v) for v in versions)


def _exists(op: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op, opset)
        return True
    except onnx.defs.SchemaError:
        return False


def opset_cases(ops, extra_dtypes=None):
    """pytest params (op, opset, dtype): float32 at every version, ``extra_dtypes[op]`` at the newest opset."""
    cases = []
    for op in ops:
        cases += [pytest.param(op, opset, F32, id=f"{op}-{opset}-float32") for opset in since_versions(op)]
        cases += [pytest.param(op, NEWEST, dt, id=f"{op}-{NEWEST}-{np.dtype(dt).name}")
                  for dt in (extra_dtypes or {}).get(op, ())]
    return cases


def values(dtype, shape=(2, 3, 4), kind="real", seed=0, specials=False) -> np.ndarray:
    """Test data: floats of a ``kind`` of domain (optionally with NaN/inf/0/-0 first), ints in a small signed or
    unsigned range, random bools."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -5
        return rng.integers(low, 6, shape).astype(dtype)
    ranges = {"real": (-3, 3), "positive": (0.1, 4), "unit": (-0.95, 0.95), "ge1": (1.05, 4)}
    array = rng.uniform(*ranges[kind], shape).astype(dtype)
    if specials:
        flat = array.reshape(-1)
        flat[: len(SPECIALS)] = SPECIALS[: flat.size]
    return array


def run_op(op, inputs, opset, attrs=None, tol=None, initializers=None, n_outputs=1):
    """Check one ``op`` node fed by graph inputs ``inputs`` ({name: array}) and ``initializers``."""
    feeds = {name: value for name, value in inputs.items() if value is not None}
    names = [name if value is not None else "" for name, value in inputs.items()]
    outputs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outputs, name=f"{op.lower()}_node", **(attrs or {}))
    model = make_model([node], [(n, v.dtype, list(v.shape)) for n, v in feeds.items()], outputs,
                       initializers=initializers, opset=opset)
    tolerance = tol or (HALF if any(v.dtype == np.float16 for v in feeds.values()) else {})
    return check(model, feeds, **tolerance)


# ---- unary ops without attributes -----------------------------------------------------------------------------
UNARY_KIND = {"Sqrt": "positive", "Log": "positive", "Reciprocal": "positive", "Asin": "unit", "Acos": "unit",
              "Atanh": "unit", "Acosh": "ge1"}
UNARY_FLOAT = ["Neg", "Abs", "Reciprocal", "Sqrt", "Exp", "Log", "Floor", "Ceil", "Round", "Sign", "Erf", "Sin", "Cos",
               "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Relu", "Sigmoid", "Tanh",
               "Softplus", "Softsign", "Mish", "HardSwish", "IsNaN"]
UNARY_DTYPES = {
    "Neg": [F64, F16, I8, I32, I64], "Abs": [F64, F16, I32, I64, U8, U16, U32], "Sign": [F64, F16, I32, I64, U8, U32],
    "Relu": [F64, F16, I8, I32], "Reciprocal": [F64, F16], "Sqrt": [F64, F16], "Exp": [F64, F16], "Log": [F64, F16],
    "Floor": [F64, F16], "Ceil": [F64, F16], "Round": [F64, F16], "Sigmoid": [F64, F16], "Tanh": [F64, F16],
    "Sin": [F64, F16], "Cos": [F64, F16], "Erf": [F16], "Softplus": [F16], "Softsign": [F16], "Mish": [F16],
    "HardSwish": [F16], "Acosh": [F16], "IsNaN": [F64, F16],
}


@pytest.mark.parametrize(("op", "opset", "dtype"), opset_cases(UNARY_FLOAT, UNARY_DTYPES))
def test_unary(op, opset, dtype):
    # NaN, inf and signed zeros where the op is defined everywhere; onnxruntime's float16 Sign maps NaN to 0
    # (its float32/float64 Sign keeps NaN, which the converter follows)
    specials = UNARY_KIND.get(op) is None and not (op == "Sign" and dtype == F16)
    run_op(op, {"x": values(dtype, kind=UNARY_KIND.get(op, "real"), specials=specials)}, opset)


@pytest.mark.parametrize("opset", since_versions("Not"))
def test_not(opset):
    run_op("Not", {"x": values(np.bool_)}, opset)


def test_round_halves_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, 3.5000002], dtype=np.float32)
    run_op("Round", {"x": x}, 11)


# ---- binary ops ----------------------------------------------------------------------------------------------
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
NUMERIC = [F64, F16, I8, I32, I64, U8, U16, U32]
BINARY_DTYPES = {"Add": [*NUMERIC, U64], "Sub": [*NUMERIC, U64], "Mul": [*NUMERIC, U64], "Div": NUMERIC,
                 "Pow": [F64, F16, I32, I64], "Equal": [*NUMERIC, U64, np.bool_], "Less": NUMERIC,
                 "LessOrEqual": NUMERIC, "Greater": NUMERIC, "GreaterOrEqual": NUMERIC}


def binary_inputs(op, dtype):
    """a of shape (2, 3, 4) and b of shape (3, 1) (numpy broadcasting); nonzero divisors, equal elements."""
    a, b = values(dtype, seed=1), values(dtype, (3, 1), seed=2)
    if op == "Div":
        b = np.where(b == 0, np.ones_like(b), b)
    if op == "Pow" and np.issubdtype(dtype, np.floating):
        a = np.abs(a) + np.asarray(0.5, dtype)  # real results only
    if op == "Pow" and np.issubdtype(dtype, np.integer):
        b = np.abs(b) % 4  # no overflow in the integer result
    if dtype != np.bool_:
        a.reshape(-1)[:3] = b.reshape(-1)  # some equal pairs for the comparisons
    return {"a": a, "b": b}


@pytest.mark.parametrize(("op", "opset", "dtype"), opset_cases(BINARY, BINARY_DTYPES))
def test_binary(op, opset, dtype):
    if op in ("Equal", "Less", "Greater") and opset < 9 and dtype == F32:
        dtype = I32 if op == "Equal" else dtype  # Equal-7 takes bool/int32/int64 only
    run_op(op, binary_inputs(op, dtype), opset)


@pytest.mark.parametrize(("op", "opset"), [(op, opset) for op in ("And", "Or", "Xor") for opset in (7, NEWEST)])
def test_logic(op, opset):
    run_op(op, {"a": values(np.bool_, seed=1), "b": values(np.bool_, (3, 4), seed=2)}, opset)


@pytest.mark.parametrize("dtype", [I8, I32, I64, U8, U16, U32])
def test_integer_division_truncates_toward_zero(dtype):
    signed = np.issubdtype(dtype, np.signedinteger)
    a = np.array([7, -7, 7, -7, 0, 1, -1, 9] if signed else [7, 9, 255, 3, 0, 1, 12, 100], dtype=dtype)
    b = np.array([2, 2, -2, -2, 3, 4, -4, 3] if signed else [2, 4, 16, 5, 3, 4, 5, 7], dtype=dtype)
    run_op("Div", {"a": a, "b": b}, NEWEST)


def test_unsigned_values_beyond_the_signed_range():
    """uint32 above 2**31 and uint64 above 2**63 (where an int32/int64 reading would be negative)."""
    a32 = np.array([4_000_000_000, 3_000_000_000, 5, 2**32 - 1], dtype=np.uint32)
    b32 = np.array([3, 3_000_000_001, 2**31, 2], dtype=np.uint32)
    for op in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Less", "Greater", "Equal"):
        run_op(op, {"a": a32, "b": b32}, NEWEST)
    a64 = np.array([2**64 - 1, 2**63 + 5, 7, 2**63], dtype=np.uint64)
    b64 = np.array([2, 2**63, 2**64 - 3, 2**63], dtype=np.uint64)
    for op in ("Add", "Sub", "Mul", "Equal"):
        run_op(op, {"a": a64, "b": b64}, NEWEST)


# ops without an exact uint64 computation: op -> (the inputs after "a" (uint64 [2, 3]), attributes, initializers)
NO_UINT64 = {
    **{op: (["a"], {}, {}) for op in ("Div", "Mod", "Max", "Min", "Less", "LessOrEqual", "Greater",
                                       "GreaterOrEqual")},
    **{op: ([], {}, {}) for op in ("Abs", "Sign", "ReduceSum", "ReduceMax", "ReduceMean", "ReduceL2", "ArgMax",
                                   "ArgMin", "NonZero", "Trilu")},
    "Einsum": (["a"], {"equation": "ij,ij->i"}, {}),
    "MatMul": (["b"], {}, {"b": np.ones((3, 2), U64)}),
    "Gemm": (["b"], {"transB": 1}, {"b": np.ones((2, 3), U64)}),
    "Clip": (["lo"], {}, {"lo": np.array(2, U64)}),
    "CumSum": (["axis"], {}, {"axis": np.array(1)}),
    "GatherElements": (["i"], {}, {"i": np.zeros((2, 3), np.int64)}),
    "ScatterElements": (["i", "a"], {}, {"i": np.zeros((2, 3), np.int64)}),
    "ScatterND": (["i", "v"], {}, {"i": np.array([[0]]), "v": np.ones((1, 3), U64)}),
    "ReverseSequence": (["lens"], {"batch_axis": 0, "time_axis": 1}, {"lens": np.array([2, 3])}),
}


@pytest.mark.parametrize("op", NO_UINT64)
def test_uint64_without_exact_computation_refused_at_conversion(op):
    """torch has no uint64 kernels for these ops and reading uint64 as int64 would be wrong: refused at conversion,
    naming node, input and dtype (not torch's NotImplementedError at run time)."""
    inputs, attributes, initializers = NO_UINT64[op]
    model = make_model([helper.make_node(op, ["a", *inputs], ["y"], name="n", **attributes)], [("a", U64, [2, 3])],
                       ["y"], initializers, opset=18)
    with pytest.raises(UnsupportedAttributeError, match=rf"{op} node 'n': attribute input 0='uint64' is not supported"):
        onnx2torch_rnn.convert(model)


# ---- Pow with mixed types ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("base", "exponent"),
    [
        (np.array([7, -7, 3, 2, 1, -1, 5, 0], np.int32), np.array([2, 3, -1, -1, -2, -3, 0, 2], np.int32)),
        (np.array([3, 3, 2, -2], np.int64), np.array([39, 33, 62, 3], np.int64)),  # beyond 2**53: float64 rounding
        (np.array([7, 10, 5, 4], np.int32), np.array([1.5, 0.30103, 0.8613531, 0.5], np.float32)),  # truncated
        (np.array([7, 2, 3], np.int64), np.array([2, 5, 1], np.int32)),
        (np.array([1.1, -2.0, 0.5], np.float32), np.array([3, 3, -2], np.int64)),
        (np.array([1.1, 2.0, 0.5], np.float32), np.array([0.3, 3, -2.5], np.float64)),
        (np.array([1.1, 2.0, 0.5], np.float64), np.array([0.3, 3, -2.5], np.float32)),
        (np.array([1.5, -2.0, 0.5], np.float16), np.array([2, 3, -1], np.int64)),
    ],
    ids=["i32^i32", "i64^i64-big", "i32^f32", "i64^i32", "f32^i64", "f32^f64", "f64^f32", "f16^i64"],
)
@pytest.mark.parametrize("opset", [12, NEWEST])
def test_pow_mixed_types(base, exponent, opset):
    run_op("Pow", {"x": base, "y": exponent}, opset)


# ---- Mod --------------------------------------------------------------------------------------------------------
MOD_A = np.array([7, -7, 7, -7, 0, 5, -5, 9], np.int64)
MOD_B = np.array([2, 2, -2, -2, 3, 3, 3, -4], np.int64)


@pytest.mark.parametrize("opset", since_versions("Mod"))
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [I8, I32, I64])
def test_mod_integers(dtype, fmod, opset):
    run_op("Mod", {"a": MOD_A.astype(dtype), "b": MOD_B.astype(dtype)}, opset, {"fmod": fmod})


@pytest.mark.parametrize("dtype", [U8, U16, U32])
def test_mod_unsigned(dtype):
    run_op("Mod", {"a": values(dtype, seed=1), "b": values(dtype, seed=2) + dtype(1)}, NEWEST)


@pytest.mark.parametrize("opset", since_versions("Mod"))
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_mod_floats_fmod(dtype, opset):
    a = (MOD_A + 0.5).astype(dtype)
    run_op("Mod", {"a": a, "b": MOD_B.astype(dtype) * dtype(1.5)}, opset, {"fmod": 1})


def test_mod_float_without_fmod_is_refused_before_opset_28():
    model = make_model([helper.make_node("Mod", ["a", "b"], ["y"])], [("a", F32, [3]), ("b", F32, [3])], ["y"],
                       opset=13)
    with pytest.raises(UnsupportedAttributeError, match="fmod"):
        onnx2torch_rnn.convert(model)


def _convert_and_run(nodes, inputs, outputs, opset):
    """For opsets onnxruntime cannot run: the converted module's outputs on ``inputs``."""
    model = make_model(nodes, [(n, v.dtype, list(v.shape)) for n, v in inputs.items()], outputs, opset=opset)
    return run_torch(onnx2torch_rnn.convert(model), model, inputs)


def test_mod_28_floor_semantics_for_floats():
    """Opset 28 defines fmod=0 for floats as A - floor(A / B) * B (numpy's remainder); onnxruntime stops at 25."""
    a = np.array([7.5, -7.5, 7.5, -7.5, 0.0, -5.0, 5.0, np.inf, 3.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, np.inf, np.inf, 2.0, 0.0], np.float32)
    for fmod, reference in ((0, np.remainder), (1, np.fmod)):
        (got,) = _convert_and_run([helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)], {"a": a, "b": b}, ["y"], 28)
        with np.errstate(invalid="ignore"):  # inf % 2 and 3 % 0 are NaN
            np.testing.assert_allclose(got, reference(a, b), rtol=1e-6, strict=True)


# ---- BitShift -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [U8, U16, U32, U64])
@pytest.mark.parametrize("opset", [11, NEWEST])
def test_bitshift_unsigned(dtype, direction, opset):
    bits = np.iinfo(dtype).bits
    top = np.iinfo(dtype).max
    x = np.array([1, 2, 128, top, top - 1, 5, 3, 1 << (bits - 1)], dtype=dtype)
    y = np.array([1, 7, 1, 3, bits - 1, 0, bits, bits + 3], dtype=dtype)  # shifts of the width or more give 0
    run_op("BitShift", {"x": x, "y": y}, opset, {"direction": direction})


def test_bitshift_broadcasts():
    run_op("BitShift", {"x": values(U32, (2, 3)), "y": np.array([2], U32)}, NEWEST, {"direction": "LEFT"})


@pytest.mark.parametrize("dtype", [I8, I32, I64])
def test_bitshift_28_signed(dtype):
    """Opset 28: arithmetic right shift; a shift < 0 or >= the width gives the sign fill (-1 or 0)."""
    bits = np.iinfo(dtype).bits
    x = np.array([1, -1, 5, -128, -7, 3, -3, 64], dtype=dtype)
    y = np.array([1, 1, 2, 3, bits, bits + 1, -1, 2], dtype=dtype)
    in_range = (y >= 0) & (y < bits)
    safe = np.where(in_range, y, 0)
    want_left = np.where(in_range, np.left_shift(x, safe), 0).astype(dtype)
    want_right = np.where(in_range, np.right_shift(x, safe), np.where(x < 0, -1, 0)).astype(dtype)
    for direction, want in (("LEFT", want_left), ("RIGHT", want_right)):
        node = helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)
        (got,) = _convert_and_run([node], {"x": x, "y": y}, ["z"], 28)
        np.testing.assert_array_equal(got, want, strict=True)


# ---- BitwiseAnd/Or/Xor/Not ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
@pytest.mark.parametrize("dtype", [I8, np.int16, I32, I64, U8, U16, U32, U64])
def test_bitwise(op, dtype):
    info = np.iinfo(dtype)
    x = np.array([[0, 1, 5, info.max], [info.min, info.max - 1, 12, 3]], dtype=dtype)  # sign bits and top bits
    y = np.array([info.max, 6, info.min, 9], dtype=dtype)  # broadcast over x's rows
    run_op(op, {"x": x} if op == "BitwiseNot" else {"x": x, "y": y}, 18)


# ---- variadic Max Min Sum Mean and Where --------------------------------------------------------------------------
VARIADIC_DTYPES = {"Max": [F64, F16, I8, I32, I64, U8, U32], "Min": [F64, F16, I8, I32, I64, U8, U32],
                   "Sum": [F64, F16], "Mean": [F16]}  # onnxruntime has no float64 Mean


@pytest.mark.parametrize(("op", "opset", "dtype"), opset_cases(["Max", "Min", "Sum", "Mean"], VARIADIC_DTYPES))
@pytest.mark.parametrize("count", [1, 2, 3])
def test_variadic(op, opset, dtype, count):
    # Max-6/Sum-6 (in force at opset 7) need equal shapes; numpy broadcasting from version 8
    shapes = [(2, 3, 4)] * 3 if opset < 8 else [(2, 3, 4), (3, 1), (4,)]
    inputs = {f"x{i}": values(dtype, shapes[i], seed=i, specials=op in ("Max", "Min") and i == 1)
              for i in range(count)}
    run_op(op, inputs, opset)


def where_inputs(dtype):
    return {"c": values(np.bool_, (3, 1), seed=3), "x": values(dtype, (2, 3, 4), seed=1),
            "y": values(dtype, (4,), seed=2)}


@pytest.mark.parametrize(("opset", "dtype"), [(9, F32), (NEWEST, F32), (NEWEST, I8), (NEWEST, I64), (NEWEST, U8),
                                              (NEWEST, U32), (NEWEST, F16), (NEWEST, F64)])
def test_where(opset, dtype):
    run_op("Where", where_inputs(dtype), opset)


@pytest.mark.parametrize("dtype", [U16, U64, np.bool_])
def test_where_types_onnxruntime_lacks(dtype):
    inputs = where_inputs(dtype)
    inputs["x"].reshape(-1)[0] = np.iinfo(dtype).max if dtype != np.bool_ else True
    (got,) = _convert_and_run([helper.make_node("Where", ["c", "x", "y"], ["z"])], inputs, ["z"], NEWEST)
    np.testing.assert_array_equal(got, np.where(inputs["c"], inputs["x"], inputs["y"]), strict=True)


# ---- Clip ----------------------------------------------------------------------------------------------------------
CLIP_X = np.array([-np.inf, -5, -1.5, np.nan, 0, 0.5, 2, 5, np.inf], np.float32)


CLIP_6_ATTRS = [{}, {"min": -1.0}, {"max": 1.5}, {"min": -1.0, "max": 1.5}, {"min": 1.0, "max": 1.0}]


@pytest.mark.parametrize("attrs", CLIP_6_ATTRS, ids=["defaults", "min", "max", "both", "equal"])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_clip_6_attributes(attrs, dtype):
    run_op("Clip", {"x": CLIP_X.astype(dtype)}, 7, attrs)


def test_clip_6_min_above_max_is_refused():
    model = make_model([helper.make_node("Clip", ["x"], ["y"], min=2.0, max=1.0)], [("x", F32, [3])], ["y"], opset=7)
    with pytest.raises(UnsupportedAttributeError, match="min"):
        onnx2torch_rnn.convert(model)


@pytest.mark.parametrize("opset", [11, 12, 13, NEWEST])
@pytest.mark.parametrize("bounds", ["none", "min", "max", "both", "min>max", "empty-min", "runtime", "runtime-max"])
def test_clip_inputs(opset, bounds):
    low, high = np.array(-1.0, np.float32), np.array(1.5, np.float32)
    inputs, initializers = {"x": CLIP_X}, {}
    if bounds in ("min", "both", "min>max"):
        initializers["lo"] = high if bounds == "min>max" else low
        inputs["lo"] = None
    if bounds in ("max", "both", "min>max", "empty-min", "runtime-max"):
        initializers["hi"] = low if bounds == "min>max" else high
    names = {"none": ["x"], "min": ["x", "lo"], "max": ["x", "", "hi"], "both": ["x", "lo", "hi"],
             "min>max": ["x", "lo", "hi"], "empty-min": ["x", "", "hi"], "runtime": ["x", "lo", "hi"],
             "runtime-max": ["x", "lo", "hi"]}[bounds]
    feeds = {"x": CLIP_X}
    if bounds == "runtime":
        feeds.update(lo=low, hi=high)
    if bounds == "runtime-max":
        feeds.update(lo=low)
        initializers = {"hi": high}  # min computed at run time, max a constant
    node = helper.make_node("Clip", names, ["y"])
    graph_inputs = [(n, v.dtype, list(v.shape)) for n, v in feeds.items()]
    model = make_model([node], graph_inputs, ["y"], initializers=initializers, opset=opset)
    check(model, feeds)


@pytest.mark.parametrize("dtype", [I8, I32, I64, U8, U32])  # onnxruntime fails on uint16 Clip with bounds
@pytest.mark.parametrize("runtime", [False, True])
def test_clip_integers(dtype, runtime):
    x = values(dtype)
    low, high = np.array(1, dtype), np.array(4, dtype)
    if runtime:
        run_op("Clip", {"x": x, "lo": low, "hi": high}, NEWEST)
    else:
        node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
        model = make_model([node], [("x", dtype, list(x.shape))], ["y"], initializers={"lo": low, "hi": high},
                           opset=NEWEST)
        check(model, {"x": x})


def test_clip_absent_bounds_float16_map_inf_to_finite():
    run_op("Clip", {"x": np.array([-np.inf, 1e4, np.inf, np.nan], np.float16)}, NEWEST)


# ---- activations with attributes -----------------------------------------------------------------------------
ACTIVATION_ATTRS = {
    "LeakyRelu": [{}, {"alpha": 0.3}],
    "Elu": [{}, {"alpha": 0.5}],
    "Selu": [{}, {"alpha": 1.2, "gamma": 0.8}],
    "Celu": [{}, {"alpha": 2.0}],
    "HardSigmoid": [{}, {"alpha": 0.3, "beta": 0.1}],
    "ThresholdedRelu": [{}, {"alpha": 0.5}, {"alpha": -0.5}],
    "IsInf": [{}, {"detect_positive": 0}, {"detect_negative": 0}, {"detect_positive": 0, "detect_negative": 0}],
    "Gelu": [{}, {"approximate": "none"}, {"approximate": "tanh"}],
}
ACTIVATION_DTYPES = {"LeakyRelu": [F16], "Elu": [F16], "Selu": [F16], "HardSigmoid": [F16],
                     "ThresholdedRelu": [F16], "IsInf": [F64, F16], "Gelu": [F16]}


@pytest.mark.parametrize(("op", "opset", "dtype"), opset_cases(ACTIVATION_ATTRS, ACTIVATION_DTYPES))
def test_activation_attributes(op, opset, dtype):
    for attrs in ACTIVATION_ATTRS[op]:
        run_op(op, {"x": values(dtype, specials=True)}, opset, attrs)


def test_softplus_wide_range():
    x = np.array([-100, -30, -20, -5, 0, 5, 15, 20, 20.5, 30, 88, 100], np.float32)
    run_op("Softplus", {"x": x}, NEWEST)


@pytest.mark.parametrize(("op", "attrs", "dtype"), [("Gelu", {"approximate": "fast"}, F32),
                                                    ("BitShift", {"direction": "UP"}, U8),
                                                    ("Mod", {"fmod": 2}, I32)])
def test_refused_attribute_values(op, attrs, dtype):
    names = ["a"] if op == "Gelu" else ["a", "b"]
    model = make_model([helper.make_node(op, names, ["y"], **attrs)], [(n, dtype, [3]) for n in names],
                       [("y", dtype, [3])], opset=NEWEST)
    with pytest.raises(UnsupportedAttributeError, match=next(iter(attrs))):
        onnx2torch_rnn.convert(model)


def test_celu_28_double():
    x = values(F64, specials=True)
    (got,) = _convert_and_run([helper.make_node("Celu", ["x"], ["y"], alpha=1.5)], {"x": x}, ["y"], 28)
    want = np.maximum(0, x) + np.minimum(0, 1.5 * (np.exp(x / 1.5) - 1))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, strict=True)


# ---- PRelu -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("opset", since_versions("PRelu"))
@pytest.mark.parametrize(
    ("x_shape", "slope_shape", "fast"),
    [((2, 3, 4, 5), (3, 1, 1), True), ((2, 3, 4, 5), (1, 3, 1, 1), True), ((2, 3), (3,), True), ((2, 3, 4), (1,), True),
     ((2, 3, 4), (), True), ((2, 3, 4), (4,), False), ((2, 3, 4), (3, 4), False), ((2, 3, 4), (2, 3, 4), False)],
)
def test_prelu_constant_slope(opset, x_shape, slope_shape, fast):
    slope = values(F32, slope_shape, seed=5)
    node = helper.make_node("PRelu", ["x", "slope"], ["y"])
    model = make_model([node], [("x", F32, list(x_shape))], ["y"], initializers={"slope": slope}, opset=opset)
    module = check(model, {"x": values(F32, x_shape, specials=True)})
    prelus = [m for m in module.modules() if isinstance(m, torch.nn.PReLU)]
    assert len(prelus) == int(fast)
    if fast:
        assert prelus[0].weight.requires_grad


# onnxruntime runs integer and float64 PRelu only at opsets 16 to 19
def test_prelu_shared_slope_stays_one_parameter():
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["h"]), helper.make_node("PRelu", ["h", "slope"], ["y"])]
    model = make_model(nodes, [("x", F32, [2, 3, 4])], ["y"], initializers={"slope": values(F32, (3, 1), seed=5)})
    module = check(model)
    assert not any(isinstance(m, torch.nn.PReLU) for m in module.modules())
    assert len(list(module.parameters())) == 1


@pytest.mark.parametrize(("opset", "dtype"), [(7, F32), (9, F32), (NEWEST, F32), (NEWEST, F16), (16, I32), (16, I64),
                                              (16, F64)])
def test_prelu_runtime_slope(opset, dtype):
    run_op("PRelu", {"x": values(dtype, seed=1), "slope": values(dtype, (3, 1), seed=2)}, opset)


# ---- Softmax LogSoftmax Hardmax -------------------------------------------------------------------------------------
SOFTMAX_AXES = {1: [None, 0, 1, 2, -1], 11: [None, 0, 2, -1, -3], 13: [None, 0, 1, -2]}


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("version", [1, 11, 13])
def test_softmax_family(op, version):
    opset = max(7, version)
    x = values(F32, (2, 3, 4), seed=4)
    x[0, 1, :2] = x[0, 1, 2]  # ties: Hardmax marks the first maximum
    for axis in SOFTMAX_AXES[version]:
        run_op(op, {"x": x}, opset, {} if axis is None else {"axis": axis})


@pytest.mark.parametrize("version", [11, 13])
def test_hardmax_nan_like_onnxruntime(version):
    x = np.array([[np.nan, 1, 2], [1, np.nan, 3], [3, np.nan, 1], [1, 2, np.nan]], np.float32)
    run_op("Hardmax", {"x": x}, version, {"axis": 1})


@pytest.mark.parametrize(("op", "dtype"), [("Softmax", F64), ("Softmax", F16), ("LogSoftmax", F64),
                                           ("LogSoftmax", F16), ("Hardmax", F16)])  # no float64 Hardmax in ORT
def test_softmax_family_dtypes(op, dtype):
    run_op(op, {"x": values(dtype, seed=4)}, NEWEST, {"axis": 1})


def test_softmax_legacy_differs_from_13():
    """Guard that the version switch matters: the same node gives different numbers at opsets 11 and 13."""
    x = values(F32, (2, 3, 4))
    old = run_op("Softmax", {"x": x}, 11, {"axis": 1})
    new = run_op("Softmax", {"x": x}, 13, {"axis": 1})
    t = torch.from_numpy(x)
    assert not torch.allclose(old(t), new(t))


# ---- Identity and Constant -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("opset", since_versions("Identity"))
@pytest.mark.parametrize("dtype", [F32, I64, np.bool_])
def test_identity(opset, dtype):
    run_op("Identity", {"x": values(dtype)}, opset)


CONSTANTS = {
    "value": numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c"),
    "value_float": 2.5,
    "value_floats": [1.0, -2.0, 3.5],
    "value_int": -3,
    "value_ints": [4, 5, 6],
}


@pytest.mark.parametrize(("opset", "kind"), [(opset, kind) for opset in since_versions("Constant") for kind in CONSTANTS
                                             if opset >= 12 or kind == "value"])  # value_* came with Constant-12
def test_constant(opset, kind):
    x = values(F32 if "float" in kind or kind == "value" else I64, (2, 3))
    nodes = [helper.make_node("Constant", [], ["c"], **{kind: CONSTANTS[kind]}),
             helper.make_node("Add", ["x", "c"], ["y"])]
    check(make_model(nodes, [("x", x.dtype, [2, 3])], ["y"], opset=opset), {"x": x})
    # the constant itself as a graph output: same value, dtype and shape (a float one is a Parameter: detach)
    model = make_model(nodes[:1], [], ["c"], opset=opset)
    (want,) = run_onnxruntime(model, {})
    np.testing.assert_array_equal(onnx2torch_rnn.convert(model)().detach().numpy(), want, strict=True)


@pytest.mark.parametrize("coordinates", [False, True])
def test_constant_sparse(coordinates):
    indices = np.array([[0, 1], [1, 2]] if coordinates else [1, 5], np.int64)
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.5, -2.5], np.float32), "v"),
                                       numpy_helper.from_array(indices, "i"), [2, 3])
    nodes = [helper.make_node("Constant", [], ["c"], sparse_value=sparse), helper.make_node("Add", ["x", "c"], ["y"])]
    model = make_model(nodes, [("x", F32, [2, 3])], ["y"], opset=NEWEST)
    check(model, {"x": np.zeros((2, 3), np.float32)})


def test_constant_string_is_refused():
    node = helper.make_node("Constant", [], ["c"], value_string="hello")
    model = helper.make_model(helper.make_graph([node], "g", [], [helper.make_tensor_value_info("c", 8, [])]),
                              opset_imports=[helper.make_opsetid("", NEWEST)], ir_version=10)
    with pytest.raises(UnsupportedAttributeError, match="value_string"):
        onnx2torch_rnn.convert(model)


# ---- registration ----------------------------------------------------------------------------------------------------
OPS = [*UNARY_FLOAT, *BINARY, "Not", "And", "Or", "Xor", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
       "BitwiseNot", "Max", "Min", "Sum", "Mean", "Where",
       "Clip", *ACTIVATION_ATTRS, "PRelu", "Softmax", "LogSoftmax", "Hardmax", "Identity", "Constant"]


@pytest.mark.parametrize("op", OPS)
def test_every_version_is_registered(op):
    """Each opset from 7 (or the op's first) to the newest onnx knows finds a converter."""
    newest = onnx.defs.onnx_opset_version()
    missing = [opset for opset in range(7, newest + 1) if _exists(op, opset) and resolve("", op, opset) is None]
    assert not missing
