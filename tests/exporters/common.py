"""Shared checks for models written by real exporters (tests/models/<exporter>/): convert once, compare every output
with onnxruntime on several input sets, and check that training reaches the weights."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime, runtime_inputs
from onnx2torch_rnn.recurrent import Recurrent
from tests.helpers import recurrent_modules

MODELS = Path(__file__).parent.parent / "models"
RECURRENT_OPS = ("LSTM", "GRU", "RNN")
# Models with float16 values: a float32 difference of 1e-7 can flip the rounding of a float16 result by one unit in
# the last place (2**-11 relative); and onnxruntime's InsertCastTransformer (which runs even with optimisations off)
# runs a float16 LSTM/GRU/RNN in float32 and drops the Cast pair float32 -> float16 -> float32 when the result goes on
# through a Cast to float32, so that output skips the float16 rounding the graph asks for (we round, as ONNX says).
FLOAT16_TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}


def symbolic_dims(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """For each run-time input: per axis, its index if the exporter left it symbolic (dynamic), else None."""
    return {info.name: [axis if d.dim_param or not d.HasField("dim_value") else None
                        for axis, d in enumerate(info.type.tensor_type.shape.dim)]
            for info in runtime_inputs(model)}


def has_float16(model: onnx.ModelProto) -> bool:
    """Whether float16 values occur: an initializer, a graph input or output, or a Cast to float16."""
    half = onnx.TensorProto.FLOAT16
    return (any(t.data_type == half for t in model.graph.initializer)
            or any(v.type.tensor_type.elem_type == half for v in (*model.graph.input, *model.graph.output))
            or any(a.name == "to" and a.i == half for n in model.graph.node if n.op_type == "Cast"
                   for a in n.attribute))


def _as_torch(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.array(feeds[i.name])) for i in runtime_inputs(model)]


def compare_with_onnxruntime(module: torch.nn.Module, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                             rtol: float = 1e-4, atol: float = 1e-5) -> None:
    expected = run_onnxruntime(model, feeds)
    with torch.no_grad():
        actual = module(*_as_torch(model, feeds))
    actual = list(actual) if isinstance(actual, tuple | list) else [actual]
    names = [o.name for o in model.graph.output]
    tolerance = FLOAT16_TOLERANCE if has_float16(model) else {"rtol": rtol, "atol": atol}
    for name, want, got in zip(names, expected, actual, strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want, strict=True, err_msg=f"output {name!r}", **tolerance)


def backward(module: torch.nn.Module, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """One backward pass of a loss that depends on every element of every float output.

    Each output is weighed by fixed random numbers: a plain sum would give zero gradients through e.g. a softmax.
    """
    module.zero_grad(set_to_none=True)
    outputs = module(*_as_torch(model, feeds))
    outputs = outputs if isinstance(outputs, tuple | list) else [outputs]
    generator = torch.Generator().manual_seed(0)
    loss = sum((out.float() * torch.randn(out.shape, generator=generator)).sum()
               for out in outputs if out.is_floating_point())
    loss.backward()


def assert_trains(module: torch.nn.Module, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """Backward reaches the weights: every parameter of every recurrent module (nn.LSTM/GRU/RNN on the fast path,
    W/R/B on the exact path) gets a non-zero gradient; where the exporter unrolled the recurrence into MatMul/Add
    (no recurrent module) every weight matrix does."""
    backward(module, model, feeds)
    recurrent = recurrent_modules(module)
    named = ([(f"{name}.{p}", param) for name, m in module.named_modules() if isinstance(m, Recurrent)
              for p, param in m.named_parameters()] if recurrent else
             [(name, param) for name, param in module.named_parameters() if param.dim() >= 2])
    assert named, "no weights to train"
    for name, param in named:
        assert param.grad is not None and bool(param.grad.abs().sum() > 0), f"no gradient reaches {name}"


def assert_weights_are_parameters(module: torch.nn.Module) -> None:
    """Weights that the exporter computes from initializers (Slice/Split/Concat/Reshape/Transpose...) were folded at
    conversion into parameters: no float buffer of more than one element (a frozen weight; the builder keeps float
    scalars such as an epsilon or the 0 that Expand broadcasts into an initial state as buffers), no recurrent module
    that gets a weight at run time, and no node of any graph or control-flow body that computes from constants alone
    (it would recompute a weight on every call)."""
    frozen = [name for name, buffer in module.named_buffers() if buffer.is_floating_point() and buffer.numel() > 1]
    assert not frozen, f"float buffers (frozen weights): {frozen}"
    for name, m in module.named_modules():
        if isinstance(m, Recurrent):
            assert not m.runtime_weights, f"{name}: weights {m.runtime_weights} recomputed at run time"
        if isinstance(m, torch.fx.GraphModule):
            constant: set[torch.fx.Node] = set()
            for node in m.graph.nodes:
                inputs = node.all_input_nodes
                if node.op == "get_attr" or (node.op == "call_function" and inputs and set(inputs) <= constant):
                    constant.add(node)  # getitem of a constant is reported at the node that computed it
                elif node.op == "call_module" and inputs and set(inputs) <= constant:
                    raise AssertionError(f"{name or 'graph'}: {node.format_node()} recomputes from constants")


def check_exported(model_path: str | Path, input_sets: Sequence[Mapping[str, np.ndarray]], rtol: float = 1e-4,
                   atol: float = 1e-5) -> torch.fx.GraphModule:
    """Convert the model once, compare every output with onnxruntime on each input set (give two random sets of the
    export's shapes and one of other batch/sequence sizes where the export is dynamic), then check that backward
    reaches the weights. Returns the converted module for further assertions (fast path, parameters)."""
    model = onnx.load(str(model_path))
    module = onnx2torch_rnn.convert(model)
    for feeds in input_sets:
        compare_with_onnxruntime(module, model, feeds, rtol, atol)
    assert_trains(module, model, input_sets[0])
    return module


def assert_fast_path(module: torch.nn.Module, model: onnx.ModelProto) -> None:
    """Every LSTM/GRU/RNN node became one module on the fast path (a real nn.LSTM/GRU/RNN), holding its weights as
    parameters (folded from whatever the exporter computed them with), none passed in at run time."""
    nodes = sum(node.op_type in RECURRENT_OPS for node in model.graph.node)
    modules = recurrent_modules(module)
    assert len(modules) == nodes
    for m in modules:
        assert m.fast, f"exact path taken: {m}"
        assert not m.runtime_weights, f"weights recomputed at run time: {m}"
        assert isinstance(m.rnn, torch.nn.LSTM | torch.nn.GRU | torch.nn.RNN)
        assert all(p.requires_grad for p in m.rnn.parameters())


# ---------------------------------------------------------------------------------------------------------------
# Models described by a manifest.json (written by the folder's generating script):
#   {"sizes": {axis: {"export": n, "second": m}},
#    "models": [{"file", "exporter", "inputs": {name: {"kind", "dims"}}, "dynamic_axes": [axis, ...], ...}], ...}
# dims: ints, or axis names from "sizes"; dynamic_axes: the named axes the export really leaves dynamic (checked
# against the source framework when generated; default: the axes the model's inputs leave symbolic).
# kinds: "float" (the model's float type), "int:<high>" (tokens in [0, high)), "lengths" / "lengths_sorted" (sequence
# lengths in [1, time] with one row of full length; sorted: longest first, as pack_padded_sequence(enforce_sorted=True)
# requires), "tokens:<high>" ([batch, time, ...] ints in [1, high)
# with 0 as padding, see padding_mask), "float_masked" ([batch, time, features] floats with all-zero padding steps).

def read_manifest(folder: str | Path) -> dict:
    return json.loads((Path(folder) / "manifest.json").read_text())


def padding_mask(rng: np.random.Generator, batch: int, time: int) -> np.ndarray:
    """[batch, time], True at padded steps: each row is padded after a random length (one row keeps every step, and
    with three rows or more one is all padding), and about one step in six is padded inside the rows too."""
    lengths = rng.integers(1, time + 1, batch)
    lengths[0] = time
    if batch >= 3:
        lengths[-1] = 0
    return (np.arange(time) >= lengths[:, None]) | (rng.random((batch, time)) < 1 / 6)


def manifest_input_sets(folder: str | Path, entry: Mapping, sizes: Mapping[str, Mapping[str, int]],
                        seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Two random input sets of the export's sizes, then one of the second sizes on the dynamic axes (if any)."""
    model = onnx.load(str(Path(folder) / entry["file"]), load_external_data=False)
    symbolic = symbolic_dims(model)
    dynamic = set(entry["dynamic_axes"]) if "dynamic_axes" in entry else {
        axis for name, spec in entry["inputs"].items() for index, axis in enumerate(spec["dims"])
        if isinstance(axis, str) and symbolic[name][index] is not None}
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in runtime_inputs(model)}

    def feeds(which: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
        def size(axis: int | str) -> int:
            return axis if isinstance(axis, int) else sizes[axis][which if axis in dynamic else "export"]

        result = {}
        for name, spec in entry["inputs"].items():
            shape = [size(axis) for axis in spec["dims"]]
            kind, dtype = spec["kind"], types[name]
            if kind.startswith("lengths"):
                time = size("time")
                lengths = rng.integers(1, time + 1, shape)
                lengths[rng.integers(shape[0])] = time
                result[name] = (-np.sort(-lengths) if kind == "lengths_sorted" else lengths).astype(dtype)
            elif kind.startswith("int:"):
                result[name] = rng.integers(0, int(kind[4:]), shape).astype(dtype)
            elif kind.startswith("tokens:"):  # 0 is padding (Keras mask_zero): tokens from 1 where not padded
                tokens = rng.integers(1, int(kind[7:]), shape)
                result[name] = np.where(padding_mask(rng, *shape[:2]), 0, tokens).astype(dtype)
            elif kind == "float_masked":  # all-zero steps are padding (keras.layers.Masking(0.0))
                values = rng.standard_normal(shape)
                result[name] = np.where(padding_mask(rng, *shape[:2])[..., None], 0, values).astype(dtype)
            else:
                result[name] = rng.standard_normal(shape).astype(dtype)
        return result

    rng = np.random.default_rng(seed)
    sets = [feeds("export", rng), feeds("export", rng)]
    if dynamic:
        sets.append(feeds("second", rng))
    return sets


# ---------------------------------------------------------------------------------------------------------------
# Rebuilt exporter patterns (tests/models/patterns) carry a "reference": the framework layer they stand for. MXNet's
# and paddle's fused RNN weights have torch's gate order and formulas, so an nn.LSTM/GRU/RNN holding the same
# tensors computes what the framework would: the pattern's Slice/Split/Concat reordering must reproduce it.

def framework_reference(model: onnx.ModelProto, entry: Mapping, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs (sequence, final h[, final c]) of the torch layer equal to the exported framework layer. Weights:
    "parameters" (MXNet's flat blob) or "weights" (paddle's list) in the framework order: each layer's and
    direction's input and hidden weights, then their biases in the same order."""
    ref = entry["reference"]
    tensors = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
    mode, layers, hidden = ref["mode"], ref["layers"], ref["hidden_size"]
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode, torch.nn.RNN)
    kwargs = {"nonlinearity": mode.removeprefix("rnn_")} if cls is torch.nn.RNN else {}
    layer = cls(ref["input_size"], hidden, num_layers=layers, bidirectional=ref["bidirectional"],
                batch_first=not ref["time_major"], **kwargs)
    names = list(layer._flat_weights_names)  # per layer and direction: weight_ih, weight_hh, bias_ih, bias_hh
    order = [n for n in names if n.startswith("weight")] + [n for n in names if n.startswith("bias")]
    if "parameters" in ref:
        blob, sources, offset = tensors[ref["parameters"]], [], 0
        for name in order:
            size = getattr(layer, name).numel()
            sources.append(blob[offset:offset + size])
            offset += size
        assert offset == blob.numel()
    else:
        sources = [tensors[n] for n in ref["weights"]]
    with torch.no_grad():
        for name, source in zip(order, sources, strict=True):
            getattr(layer, name).copy_(source.reshape(getattr(layer, name).shape))
        states = [torch.from_numpy(feeds[n]) for n in ("state", "state_cell", "h0", "c0") if n in feeds]
        x = torch.from_numpy(feeds["data" if "data" in feeds else "x"])
        y, final = layer(x, (tuple(states) if mode == "lstm" else states[0]) if states else None)
    finals = list(final) if mode == "lstm" else [final]
    return [y.numpy(), *(f.numpy() for f in finals)]
