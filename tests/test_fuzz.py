"""Broken models get library errors: mutated and truncated model protos, random attribute values, bytes that are
not UTF-8 where ONNX keeps text, element types torch has no dtype for. Only `Onnx2TorchError`s may escape
`convert()`, none takes long; the cases are seeded, so a failure reproduces. Hostile sizes (a tiny model whose
constant inputs ask for gigabytes) convert without allocating them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn import InvalidModelError, Onnx2TorchError, UnsupportedTypeError, folding

ROOT = Path(__file__).resolve().parent.parent
SEEDS = [ROOT / "examples" / "bilstm_tagger.onnx", *sorted((ROOT / "tests" / "models" / "torch").glob("ts_*.onnx"))[:6],
         *sorted((ROOT / "tests" / "models" / "keras").glob("*.onnx"))[:6]]


def _add_model(initializer: TensorProto | None = None, node_name: str = "add") -> onnx.ModelProto:
    w = initializer or numpy_helper.from_array(np.ones(3, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name=node_name)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_text_that_is_not_utf8_is_refused():
    # ONNX's proto2 strings are not checked by protobuf's parser: the bytes reach the names as they are
    data = _add_model(node_name="ZZZZ").SerializeToString().replace(b"ZZZZ", b"\xff\xfeZZ")
    with pytest.raises(InvalidModelError, match="not valid UTF-8"):
        onnx2torch_rnn.convert(data)


@pytest.mark.parametrize("data_type, message", [(TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN has no torch equivalent"),
                                                (99, "99 is not an ONNX type")])
def test_element_types_without_a_torch_dtype_are_refused(data_type, message):
    tensor = TensorProto(name="w", data_type=data_type, dims=[3], raw_data=b"\x38\x38\x38")  # 1.0 in float8
    with pytest.raises(UnsupportedTypeError, match=message):
        onnx2torch_rnn.convert(_add_model(tensor).SerializeToString())


def _mutate_attribute(rng: random.Random, model: onnx.ModelProto) -> None:
    nodes = [n for n in model.graph.node if n.attribute]
    if not nodes:
        return
    attribute = rng.choice(rng.choice(nodes).attribute)
    if attribute.type == AttributeProto.INT:
        attribute.i = rng.choice([0, -1, 1, 2, 3, 7, 100, 2**31, -(2**63)])
    elif attribute.type == AttributeProto.FLOAT:
        attribute.f = rng.choice([0.0, -1.0, 1e30, float("nan"), float("inf")])
    elif attribute.type == AttributeProto.INTS:
        attribute.ints[:] = [rng.choice([0, -1, 1, 2, 5, 2**40]) for _ in range(rng.randint(0, 5))]
    elif attribute.type == AttributeProto.STRING:
        attribute.s = rng.choice([b"", b"foo", b"bidirectional", b"reverse", b"Tanh"])
    elif attribute.type == AttributeProto.STRINGS:
        attribute.strings[:] = [rng.choice([b"Relu", b"Foo", b""]) for _ in range(rng.randint(0, 7))]


def _mutate(rng: random.Random, model: onnx.ModelProto) -> None:
    graph, kind = model.graph, rng.random()
    if kind < 0.4:
        _mutate_attribute(rng, model)
    elif kind < 0.55:  # an input renamed, dropped or repeated
        node = rng.choice(graph.node)
        if node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(["", "nonexistent", node.input[0]])
    elif kind < 0.7 and graph.initializer:  # declared dims that contradict the data
        tensor = rng.choice(graph.initializer)
        if tensor.dims:
            tensor.dims[rng.randrange(len(tensor.dims))] = rng.choice([0, 1, 2, 3, -1, 10**6])
    elif kind < 0.8:
        del graph.node[rng.randrange(len(graph.node))]
    elif kind < 0.9:
        model.opset_import[0].version = rng.choice([1, 6, 7, 12, 30])
    else:
        rng.choice(graph.node).op_type = rng.choice(["LSTM", "GRU", "Add", "Foo", "Loop"])


def _case(rng: random.Random, seeds: list[bytes], protos: list[onnx.ModelProto]) -> bytes | onnx.ModelProto:
    index = rng.randrange(len(seeds))
    if rng.random() < 0.3:  # flipped bytes, maybe truncated
        data = bytearray(seeds[index])
        for _ in range(rng.randint(1, 5)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data[: rng.randrange(len(data))] if rng.random() < 0.3 else data)
    model = onnx.ModelProto()
    model.CopyFrom(protos[index])
    for _ in range(rng.randint(1, 3)):
        _mutate(rng, model)
    return model


@pytest.mark.parametrize("seed", range(4))
def test_mutated_models_raise_only_library_errors(seed):
    seeds = [path.read_bytes() for path in SEEDS]
    protos = [onnx.load_from_string(data) for data in seeds]
    rng = random.Random(seed)
    escaped, slow = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in range(500):
            start = time.perf_counter()
            try:
                onnx2torch_rnn.convert(_case(rng, seeds, protos))
            except Onnx2TorchError:
                pass
            except Exception as error:  # the point of the test
                escaped.append(f"case {case}: {type(error).__name__}: {error}"[:300])
            if time.perf_counter() - start > 10:  # the seeds convert in well under a second
                slow.append(case)
    assert not escaped, f"{len(escaped)} non-library errors, e.g.\n" + "\n".join(escaped[:5])
    assert not slow, f"cases {slow} took over 10 s"


def _tiny(nodes, constants, rank=1, opset=18, elem_type=TensorProto.FLOAT) -> onnx.ModelProto:
    """A model of a few bytes: ``nodes`` on ``constants`` (initializers), output y."""
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", elem_type, [None] * rank)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


HUGE = 2**31  # float32 elements: 8 GiB
ONE, I64 = np.ones(1, np.float32), np.int64
HOSTILE = {
    "ConstantOfShape": _tiny([helper.make_node("ConstantOfShape", ["s"], ["y"])], {"s": np.array([HUGE], I64)}),
    "Expand": _tiny([helper.make_node("Expand", ["x", "s"], ["y"])], {"x": ONE, "s": np.array([HUGE], I64)}),
    "Range": _tiny([helper.make_node("Range", ["a", "b", "d"], ["y"])],
                   {"a": np.float32(0), "b": np.float32(HUGE), "d": np.float32(1)}),
    "Tile": _tiny([helper.make_node("Tile", ["x", "r"], ["y"])], {"x": ONE, "r": np.array([HUGE], I64)}),
    "Pad": _tiny([helper.make_node("Pad", ["x", "p"], ["y"])], {"x": ONE, "p": np.array([0, HUGE], I64)}),
    "Resize": _tiny([helper.make_node("Resize", ["x", "", "", "s"], ["y"])],
                    {"x": np.ones((1, 1, 1, 1), np.float32), "s": np.array([1, 1, 2**16, 2**15], I64)}, rank=4),
    "Upsample": _tiny([helper.make_node("Upsample", ["x", "s"], ["y"])], {
        "x": np.ones((1, 1, 1, 1), np.float32), "s": np.array([1, 1, 2**16, 2**15], np.float32)}, rank=4, opset=9),
    "OneHot": _tiny([helper.make_node("OneHot", ["i", "d", "v"], ["y"])],
                    {"i": I64(0), "d": np.array(HUGE, I64), "v": np.array([0, 1], np.float32)}),
    "Add (outer)": _tiny([helper.make_node("Add", ["a", "b"], ["y"])],
                         {"a": np.ones((2**16, 1), np.float32), "b": np.ones((1, 2**15), np.float32)}, rank=2),
    "MatMul (outer)": _tiny([helper.make_node("MatMul", ["a", "b"], ["y"])],
                            {"a": np.ones((2**16, 1), np.float32), "b": np.ones((1, 2**15), np.float32)}, rank=2),
    "Loop (10**12 trips)": _tiny([helper.make_node("Loop", ["m", "", "m"], ["y"], body=helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Identity", ["v"], ["v_out"])], "body",
        [helper.make_tensor_value_info(n, t, []) for n, t in [("i", TensorProto.INT64), ("c", TensorProto.BOOL),
                                                              ("v", TensorProto.INT64)]],
        [helper.make_tensor_value_info(n, t, []) for n, t in [("c_out", TensorProto.BOOL),
                                                              ("v_out", TensorProto.INT64)]]))],
        {"m": np.array(10**12, I64)}, rank=0, elem_type=TensorProto.INT64),
}
# in a child process whose address space is limited to 2 GiB more than it holds after importing torch: an 8 GiB
# allocation fails there (even one whose pages are never touched), so a case that allocates cannot convert
_CONVERT_LIMITED = """
import json, resource, sys, time
import onnx2torch_rnn
size = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + 2**31, resource.RLIM_INFINITY))
results = {}
for name, path in json.loads(sys.argv[1]).items():
    start = time.perf_counter()
    try:
        onnx2torch_rnn.convert(path)
        results[name] = ["converted", time.perf_counter() - start]
    except Exception as error:
        results[name] = [f"{type(error).__name__}: {error}"[:200], time.perf_counter() - start]
print(json.dumps(results))
"""


def test_hostile_sizes_convert_without_allocating_them(tmp_path):
    """Folding refuses to create a tensor over FOLD_LIMIT_BYTES: such a node is computed at run time instead, and a
    Loop never folds (its trip count is unbounded). Each case converts quickly in a process that cannot allocate
    8 GiB."""
    paths = {}
    for index, (name, model) in enumerate(HOSTILE.items()):
        onnx.checker.check_model(model)
        paths[name] = str(tmp_path / f"{index}.onnx")
        onnx.save(model, paths[name])
    child = subprocess.run([sys.executable, "-c", _CONVERT_LIMITED, json.dumps(paths)], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    results = json.loads(child.stdout.splitlines()[-1])
    failed = {name: outcome for name, (outcome, seconds) in results.items() if outcome != "converted" or seconds > 10}
    assert not failed and len(results) == len(HOSTILE), failed


def test_a_declared_size_is_checked_before_the_data_is_read():
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**12], raw_data=b"\0" * 4)
    with pytest.raises(InvalidModelError, match="does not fit its declared dims"):
        onnx2torch_rnn.convert(_add_model(tensor).SerializeToString())


@pytest.mark.parametrize("size", [3, 4])
def test_a_result_over_the_fold_limit_is_computed_at_run_time(size, monkeypatch):
    monkeypatch.setattr(folding, "FOLD_LIMIT_BYTES", 12)  # three float32
    model = _tiny([helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(
        np.array([2.5], np.float32))), helper.make_node("Add", ["c", "c"], ["y"])], {"s": np.array([size], I64)})
    module = onnx2torch_rnn.convert(model)
    assert [n.meta["onnx"]["op_type"] for n in module.graph.nodes if n.op == "call_module"] == (
        [] if size == 3 else ["ConstantOfShape", "Add"])
    np.testing.assert_array_equal(module().detach().numpy(), np.full(size, 5.0, np.float32))
