"""Model loading: sources, validation, external data safety and size."""

import os

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx2torch_rnn
from onnx2torch_rnn import ConversionError, InvalidModelError
from onnx2torch_rnn.builder import build
from onnx2torch_rnn.loading import load_model
from tests.helpers import make_model


def _model_with_weight(weight: np.ndarray):
    node = helper.make_node("Add", ["x", "w"], ["y"])
    return make_model([node], [("x", np.float32, list(weight.shape))], ["y"], {"w": weight})


def _save_external(model, folder, location="weights.bin"):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
              size_threshold=0)
    return path


def _set_location(path, location):
    model = onnx.load(path, load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, path)


def test_external_data_is_read_from_the_model_folder(tmp_path):
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = _save_external(_model_with_weight(weight), tmp_path / "m")
    gm = onnx2torch_rnn.convert(path)
    torch.testing.assert_close(gm(torch.zeros(2, 3)), torch.from_numpy(weight))
    # bytes/ModelProto sources find external data through base_dir
    proto = onnx.load(path, load_external_data=False)
    gm = onnx2torch_rnn.convert(proto.SerializeToString(), base_dir=tmp_path / "m")
    torch.testing.assert_close(gm(torch.zeros(2, 3)), torch.from_numpy(weight))
    with pytest.raises(InvalidModelError, match="not loaded from a path"):
        onnx2torch_rnn.convert(proto)


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "/etc/passwd"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    path = _save_external(_model_with_weight(np.ones((2, 3), np.float32)), tmp_path / "m")
    (tmp_path / "secret.bin").write_bytes(np.ones(6, np.float32).tobytes())
    _set_location(path, location)
    with pytest.raises(InvalidModelError, match="escapes the model's folder"):
        onnx2torch_rnn.convert(path)


@pytest.mark.parametrize("location", ["weights\x00.bin", "weights.bin\x00../../etc/passwd"])
def test_external_data_location_with_a_nul_byte_is_refused(tmp_path, location):
    # onnx accepts such a location; the OS path functions raise a bare ValueError on it
    path = _save_external(_model_with_weight(np.ones((2, 3), np.float32)), tmp_path / "m")
    _set_location(path, location)
    with pytest.raises(InvalidModelError, match="NUL"):
        onnx2torch_rnn.convert(path)


@pytest.mark.parametrize("entry, value", [("offset", "-4"), ("offset", "ten"), ("length", "x"), ("length", "-1")])
def test_external_data_offset_and_length_must_be_byte_counts(tmp_path, entry, value):
    path = _save_external(_model_with_weight(np.ones((2, 3), np.float32)), tmp_path / "m")
    model = onnx.load(path, load_external_data=False)
    info = model.graph.initializer[0].external_data
    kept = [(e.key, e.value) for e in info if e.key != entry]
    del info[:]
    for key, old in [*kept, (entry, value)]:
        info.add(key=key, value=old)
    onnx.save(model, path)
    with pytest.raises(InvalidModelError, match=f"external data {entry}"):
        onnx2torch_rnn.convert(path)


def test_missing_external_file_is_a_clear_error(tmp_path):
    path = _save_external(_model_with_weight(np.ones((2, 3), np.float32)), tmp_path / "m")
    os.remove(tmp_path / "m" / "weights.bin")
    with pytest.raises(InvalidModelError, match="not found"):
        onnx2torch_rnn.convert(path)


def test_models_over_2gb_load(tmp_path):
    # A 2 GiB + 4 KiB external tensor in a sparse file: the proto stays small and nothing is serialized whole.
    count = (2**31 + 4096) // 4
    folder = tmp_path / "big"
    folder.mkdir()
    with open(folder / "big.bin", "wb") as f:
        f.truncate(count * 4)
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[count], data_location=TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value="big.bin")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1])], [output], initializer=[tensor])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    gm = onnx2torch_rnn.convert(folder / "model.onnx")
    (param,) = gm.parameters()
    assert param.numel() == count and param[-3:].tolist() == [0.0, 0.0, 0.0]


def test_invalid_models_raise_with_the_checker_reason():
    model = _model_with_weight(np.ones((2, 3), np.float32))
    model.graph.node[0].input[1] = "nowhere"
    with pytest.raises(InvalidModelError, match="nowhere"):
        onnx2torch_rnn.convert(model)
    with pytest.raises(InvalidModelError, match="not a serialized ONNX model"):
        onnx2torch_rnn.convert(b"\x00garbage")
    with pytest.raises(FileNotFoundError):
        onnx2torch_rnn.convert("/no/such/model.onnx")


def test_deprecated_ops_that_runtimes_still_run_are_accepted():
    # onnx's checker refuses GroupNormalization-18 as deprecated; onnxruntime runs it, so must we.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3])
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=2)
    init = [onnx.numpy_helper.from_array(np.ones(2, np.float32), "scale"),
            onnx.numpy_helper.from_array(np.zeros(2, np.float32), "bias")]
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], init),
                              opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(onnx.checker.ValidationError, match="deprecated"):
        onnx.checker.check_model(model)
    out = onnx2torch_rnn.convert(model)(torch.arange(12.0).reshape(1, 4, 3)).detach()
    assert out.shape == (1, 4, 3) and abs(float(out.mean())) < 1e-6


def test_opset_newer_than_known_refused():
    """Ops may change meaning in an opset this package has never seen: refused, not converted as the newest."""
    newest = onnx.defs.onnx_opset_version()
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.float32, [2])], ["y"], opset=newest)
    assert onnx2torch_rnn.convert(model)(torch.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]
    model.opset_import[0].version = newest + 1
    with pytest.raises(onnx2torch_rnn.UnsupportedOpsetError,
                       match=f"imports opset {newest + 1} of ai.onnx; the newest this package knows is {newest}"):
        onnx2torch_rnn.convert(model)


def _inline(dtype, values, raw=False):
    tensor = helper.make_tensor("w", dtype, [len(values) // 4 if raw else len(values)], values, raw=raw)
    tensor.dims[:] = [3]  # declared dims that do not match the data
    return tensor


@pytest.mark.parametrize("tensor", [
    _inline(TensorProto.FLOAT, [1.0, 2.0, 3.0, 4.0]),  # more values than the dims hold: the checker allows it
    _inline(TensorProto.FLOAT, np.ones(4, np.float32).tobytes(), raw=True),
    _inline(TensorProto.FLOAT, [1.0, 2.0]),  # fewer: the checker's message
    _inline(TensorProto.INT64, [1, 2, 3, 4]),
], ids=["float_data long", "raw_data long", "float_data short", "int64_data long"])
def test_initializer_data_that_does_not_fit_its_dims_is_refused(tensor):
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", tensor.data_type, [3])],
                              [helper.make_tensor_value_info("y", tensor.data_type, [3])], [tensor])
    with pytest.raises(InvalidModelError, match=r"'w'|name: w\)"):
        onnx2torch_rnn.convert(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_loaded_model_converts_any_number_of_times():
    """Each conversion of one LoadedModel gets its own parameters (building took its weights: a second one lost
    them); a single-use one (what convert() loads) gives its weights to the one conversion and refuses another."""
    rng = np.random.default_rng(0)
    weights = {"m": rng.standard_normal((40, 40)).astype(np.float32),
               "W": rng.standard_normal((1, 64, 40)).astype(np.float32) * 0.2,
               "R": rng.standard_normal((1, 64, 16)).astype(np.float32) * 0.2}
    nodes = [helper.make_node("MatMul", ["x", "m"], ["h"]),
             helper.make_node("LSTM", ["h", "W", "R"], ["y"], hidden_size=16)]
    data = make_model(nodes, [("x", np.float32, ["T", "N", 40])], ["y"], weights).SerializeToString()
    loaded = load_model(data)
    assert set(loaded.weights) == {"m", "W"}  # over SKELETON_MAX_ELEMENTS: read at load time
    first, second = build(loaded), build(loaded)
    x = torch.randn(5, 2, 40)
    with torch.no_grad():
        expected = first(x)
        for p in first.parameters():
            p.add_(1.0)
        torch.testing.assert_close(second(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(build(loaded)(x), expected, rtol=0, atol=0)
    stored = {t.data_ptr() for t in loaded.weights.values()}
    assert not stored & {p.data_ptr() for p in second.parameters()}
    once = load_model(data, single_use=True)
    build(once)
    assert not once.weights
    with pytest.raises(ConversionError, match="single-use LoadedModel went to an earlier conversion"):
        build(once)
