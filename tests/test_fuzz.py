"""Broken models get library errors: mutated and truncated model protos, random attribute values, bytes that are
not UTF-8 where ONNX keeps text, element types torch has no dtype for. Only `Onnx2TorchError`s may escape
`convert()`; the cases are seeded, so a failure reproduces."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn import InvalidModelError, Onnx2TorchError, UnsupportedTypeError

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
    escaped = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in range(500):
            try:
                onnx2torch_rnn.convert(_case(rng, seeds, protos))
            except Onnx2TorchError:
                pass
            except Exception as error:  # the point of the test
                escaped.append(f"case {case}: {type(error).__name__}: {error}"[:300])
    assert not escaped, f"{len(escaped)} non-library errors, e.g.\n" + "\n".join(escaped[:5])
