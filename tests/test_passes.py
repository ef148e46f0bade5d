"""Recognition (onnx2torch_rnn/passes): stacked recurrent layers with torch.onnx's glue become one module.

The exporter models' own tests (tests/exporters) compare every fused model with onnxruntime on three input sets and
train it; here: that the patterns fire where they should (and only there), that a fused module computes and trains
exactly like the literal conversion, and that changing any proven detail of a match makes it not fire.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime
from onnx2torch_rnn.recurrent import Recurrent, StackedRecurrent
from tests.exporters.common import FLOAT16_TOLERANCE, MODELS, has_float16, manifest_input_sets, read_manifest
from tests.helpers import check, make_model, stacks

TORCH = MODELS / "torch"
MANIFEST = read_manifest(TORCH)
EXAMPLE = MODELS.parent.parent / "examples" / "bilstm_tagger.onnx"
# torch.onnx (TorchScript) models whose recurrent nodes all become one module: every stacked case but the packed
# sequences (PackedSequence sorting is another pattern) and a float16 model whose Casts sit between the layers.
# dynamo's stacks too, except nn.RNN, which dynamo unrolls into MatMul/Add/Tanh (another pattern).
STACKED = [m for m in MANIFEST["models"] if not m["case"].startswith("packed_") and not m["case"].startswith("rnn_")
           and m["case"] not in ("lstm_l2_fp16_blocked", "lstm_bi_fp16_weights", "seq2seq")] + [
    m for m in MANIFEST["models"] if m["exporter"] == "torchscript" and m["case"].startswith("rnn_")]


def fused(module: torch.fx.GraphModule) -> list[dict]:
    return [n.meta["onnx"] for n in module.graph.nodes if "replaces" in n.meta.get("onnx", {})]


def top_level_modules(module: torch.fx.GraphModule) -> list[type]:
    return [type(module.get_submodule(n.target)) for n in module.graph.nodes if n.op == "call_module"]


def outputs(module, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        result = module(*(torch.from_numpy(v) for v in feeds.values()))
    return [t.numpy() for t in (result if isinstance(result, tuple) else (result,))]


def assert_matches_onnxruntime(module, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    tolerance = FLOAT16_TOLERANCE if has_float16(model) else {"rtol": 1e-4, "atol": 1e-5}
    for got, want, info in zip(outputs(module, feeds), run_onnxruntime(model, feeds), model.graph.output,
                               strict=True):
        np.testing.assert_allclose(got, want, strict=True, err_msg=info.name, **tolerance)


@pytest.mark.parametrize("entry", STACKED, ids=lambda m: m["file"].removesuffix(".onnx"))
def test_torch_onnx_layers_and_glue_become_one_module(entry):
    model = onnx.load(TORCH / entry["file"])
    layers = [n.name for n in model.graph.node if n.op_type in ("LSTM", "GRU", "RNN")]
    module = onnx2torch_rnn.convert(model)
    (fusion,) = [f for f in fused(module) if f["pattern"] == "stacked_layers"]  # a classifier may be linear_bias
    assert set(layers) <= set(fusion["replaces"])
    # nothing outside the fused module reads a layer's output but the last's (dynamo's final Reshape to a constant
    # shape is not the merge of directions), and the zero initial states are gone
    produced = {o for n in model.graph.node if n.name in layers[:-1] for o in n.output}
    assert not [n for n in module.graph.nodes if set(n.meta.get("onnx_values", {}).get("inputs", ())) & produced]
    assert not {"ConstantOfShape", "Expand"} & {n.meta["onnx"]["op_type"] for n in module.graph.nodes
                                                if "onnx" in n.meta}
    if entry["exporter"] == "torchscript":  # whose node names say which nodes it wrote for the nn.LSTM: /lstm/...
        scope = layers[0].rsplit("/", 1)[0] + "/"
        remaining = [n.meta["onnx"] for n in module.graph.nodes if "onnx" in n.meta]
        # the Casts of a float16 model's outputs stay: they are its computation, not glue
        assert [m["name"] for m in remaining if m["name"].startswith(scope) and m["op_type"] != "Cast"] == [
            fusion["name"]]
    assert sum(isinstance(m, Recurrent) for m in module.modules()) == len(layers)
    for feeds in manifest_input_sets(TORCH, entry, MANIFEST["sizes"]):
        assert_matches_onnxruntime(module, model, feeds)


def test_the_tagger_prints_as_embedding_lstm_linear():
    module = onnx2torch_rnn.convert(EXAMPLE)
    kinds = [t.__name__ for t in top_level_modules(module)]
    assert kinds == ["Gather", "StackedRecurrent", "Linear"]  # the classifier's MatMul + Add is one nn.Linear
    (stack,) = [m for m in module.modules() if isinstance(m, StackedRecurrent)]
    assert stack.batch_first and stack.batch_first_output and len(stack.layers) == 2
    literal = onnx2torch_rnn.convert(EXAMPLE, fuse=False)
    assert not fused(literal) and StackedRecurrent not in top_level_modules(literal)
    assert len(top_level_modules(literal)) > 15


@pytest.mark.parametrize("case", ["lstm_l2_bi_h0c0", "gru_l3_h0_dropout", "rnn_relu_l2_bi_bf"])
def test_fused_module_trains_exactly_like_the_literal_conversion(case):
    entry = next(m for m in STACKED if m["case"] == case)
    model = onnx.load(TORCH / entry["file"])
    feeds = manifest_input_sets(TORCH, entry, MANIFEST["sizes"])[0]
    gradients = []
    for fuse in (True, False):
        module = onnx2torch_rnn.convert(model, fuse=fuse).train()
        inputs = [torch.from_numpy(v).requires_grad_() for v in feeds.values()]
        result = module(*inputs)
        loss = sum((t * torch.linspace(-1, 1, t.numel()).reshape(t.shape)).sum()
                   for t in (result if isinstance(result, tuple) else (result,)))
        loss.backward()
        # per parameter, by value (names differ: the stack holds the layers), and per input
        weights = sorted((tuple(p.shape), float(p.detach().sum()), p.grad.numpy()) for p in module.parameters())
        gradients.append(([w[2] for w in weights], [t.grad.numpy() for t in inputs]))
    for fused_grads, literal_grads in zip(*gradients, strict=True):
        for a, b in zip(fused_grads, literal_grads, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# every torch.onnx model of several layers that converts to a stack, the PackedSequence ones (lengths) too
STACK_MODELS = [m for m in STACKED + [m for m in MANIFEST["models"] if m["case"].startswith("packed_")]
                if m["recurrent_nodes"] > 1]


@pytest.mark.parametrize("entry", STACK_MODELS, ids=[m["case"] for m in STACK_MODELS])
def test_a_stack_is_one_native_op_that_computes_what_its_layers_do(entry, monkeypatch):
    """In eager inference on the native kernel a stack runs as one op (recurrent_stack: the Python around each layer
    costs about as much as its kernel at batch 1), which gives exactly what the layers' modules give one after the
    other; a hook on a layer makes the stack call the layers' modules, so the hook runs. Both paths, and the training
    path, match onnxruntime."""
    from onnx2torch_rnn.recurrent import kernel, op

    model = onnx.load(TORCH / entry["file"])
    module = onnx2torch_rnn.convert(model)
    stacks = [m for m in module.modules() if isinstance(m, StackedRecurrent)]
    assert stacks
    calls, hooked = [], []
    monkeypatch.setattr(op, "run_stack", lambda *args, _run=op.run_stack: calls.append(1) or _run(*args))
    for feeds in manifest_input_sets(TORCH, entry, MANIFEST["sizes"])[::2]:  # an export size and a second size
        calls.clear()
        native = outputs(module, feeds)
        assert len(calls) == (len(stacks) if kernel.loaded() else 0)
        assert_matches_onnxruntime(module, model, feeds)
        hooked.clear()
        handles = [stack.layers[-1].register_forward_hook(lambda _m, _a, output: hooked.append(output))
                   for stack in stacks]
        calls.clear()
        layer_by_layer = outputs(module, feeds)
        for handle in handles:
            handle.remove()
        assert not calls and len(hooked) == len(stacks)
        for a, b in zip(native, layer_by_layer, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)  # the same kernel on the same numbers
    training = module(*(torch.from_numpy(v) for v in feeds.values()))  # grad mode, weights requiring grad: autograd
    for got, want in zip(training if isinstance(training, tuple) else (training,), outputs(module, feeds), strict=True):
        assert got.requires_grad
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)


def _layer(cell: type, inputs: int, direction: str, rng, dtype, bias: bool = True, **kwargs):
    gates = {"OnnxLSTM": 4, "OnnxGRU": 3, "OnnxRNN": 1}[cell.__name__]
    d, h = 2 if direction == "bidirectional" else 1, 4
    weights = {k: torch.from_numpy(rng.standard_normal(shape)).to(dtype) for k, shape in
               (("W", (d, gates * h, inputs)), ("R", (d, gates * h, h)), ("B", (d, 2 * gates * h)))[:3 if bias else 2]}
    return cell(hidden_size=h, direction=direction, dtype=dtype, **weights, **kwargs)


@pytest.mark.parametrize("cell, attributes", [("OnnxLSTM", {}), ("OnnxGRU", {"linear_before_reset": 1}),
                                              ("OnnxRNN", {}), ("OnnxRNN", {"activations": ["Relu"] * 2})])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("flags", [{}, {"batch_first": True, "last_states": True},
                                   {"batch_first_output": True, "initial_h": [(0, None, None), None]}])
@pytest.mark.parametrize("dtype, bias", [(torch.float32, True), (torch.float64, False)])
def test_fast_layers_train_as_one_multi_layer_call(cell, attributes, direction, flags, dtype, bias, monkeypatch):
    """Layers of one torch mode, direction count and size (nn.LSTM(num_layers=L) as the exporters wrote it) run as
    one call of torch's multi-layer kernel outside native inference (training, CPU without the kernel): the same
    outputs and gradients as the layers' modules one after the other (a hook on a layer forces that path)."""
    from onnx2torch_rnn.recurrent import OnnxGRU, OnnxLSTM, OnnxRNN, module

    cls = {"OnnxLSTM": OnnxLSTM, "OnnxGRU": OnnxGRU, "OnnxRNN": OnnxRNN}[cell]
    rng = np.random.default_rng(1)
    d = 2 if direction == "bidirectional" else 1
    layers = [_layer(cls, inputs, direction, rng, dtype, bias, **attributes) for inputs in (3, 4 * d)]
    assert all(layer.fast for layer in layers)
    outputs = (True, True, cell == "OnnxLSTM")
    stack = StackedRecurrent(layers, outputs=outputs, **flags)
    x = torch.randn((2, 5, 3) if flags.get("batch_first") else (5, 2, 3), dtype=dtype, requires_grad=True)
    states = [torch.randn(d, 2, 4, dtype=dtype)] if "initial_h" in flags else []
    calls = []
    monkeypatch.setattr(module, "torch_layers", lambda *args, _run=module.torch_layers: calls.append(1) or _run(*args))
    results = []
    for hooked in (False, True):
        handle = layers[1].register_forward_hook(lambda *_: None) if hooked else None
        got = [t for t in stack(x, *states) if t is not None]
        assert len(got) == sum(outputs)
        sum((t * torch.linspace(-1, 1, t.numel(), dtype=dtype).view(t.shape)).sum() for t in got).backward()
        results.append([*got, x.grad.clone(), *(p.grad.clone() for p in stack.parameters())])
        x.grad = None
        stack.zero_grad(set_to_none=True)
        if handle:
            handle.remove()
    assert calls == [1]  # the unhooked run only
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("flags", [{}, {"batch_first": True, "batch_first_output": True}, {"merge_output": False},
                                   {"last_states": True, "batch_first": True}])
@pytest.mark.parametrize("steps, batch", [(5, 3), (0, 2), (4, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lengths", ["none", "given", "constant"])
@pytest.mark.parametrize("cells", ["LSTM", "mixed"])
def test_the_stack_op_takes_every_stack_argument(flags, steps, batch, dtype, lengths, cells):
    """StackedRecurrent's own arguments, on a hand-built stack (LSTM layers with c_n, or LSTM, GRU and RNN layers;
    initial states as rows of the inputs; lengths given at run time or every layer's constant ones): the native
    stack op gives exactly what the layers' modules give (a hook on a layer forces that path)."""
    from onnx2torch_rnn.recurrent import OnnxGRU, OnnxLSTM, OnnxRNN

    rng = np.random.default_rng(0)
    lens = rng.integers(0, steps + 1, batch)
    constant = {"sequence_lens": lens.tolist()} if lengths == "constant" else {}
    second, third = (OnnxLSTM, OnnxLSTM) if cells == "LSTM" else (OnnxGRU, OnnxRNN)
    constant["outputs"] = [True, True, True] if cells == "LSTM" else [True, True]  # the layers' states alike
    layers = [_layer(OnnxLSTM, 3, "bidirectional", rng, dtype, **constant),
              _layer(second, 8, "forward", rng, dtype, **constant),
              _layer(third, 4, "bidirectional", rng, dtype, **constant)]
    stack = StackedRecurrent(layers, initial_h=[(0, 0, 2), None, (0, 2, 4)],
                             initial_c=[(1, None, None), None, (1, None, None) if cells == "LSTM" else None],
                             outputs=(True, True, cells == "LSTM"), lengths=lengths == "given", **flags).eval()
    x = torch.randn((batch, steps, 3) if flags.get("batch_first") else (steps, batch, 3), dtype=dtype)
    args = [x, torch.randn(4, batch, 4, dtype=dtype), torch.randn(2, batch, 4, dtype=dtype)]
    args += [torch.from_numpy(lens)] if lengths == "given" else []
    with torch.no_grad():
        native = stack(*args)
        handle = layers[1].register_forward_hook(lambda *_: None)
        layer_by_layer = stack(*args)
        handle.remove()
    assert sum(r is not None for r in native) == (3 if cells == "LSTM" else 2)
    for a, b in zip(native, layer_by_layer, strict=True):
        assert (a is None and b is None) or (a.shape == b.shape and a.dtype == b.dtype)
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("native", [True, False])
def test_stack_squeezes_the_final_states_of_one_direction(native):
    """squeeze_states: h_n / c_n as [N, H] (Keras's return_state), the last layer's one direction's, on either path;
    refused where the final states hold more than one direction."""
    from onnx2torch_rnn.recurrent import OnnxGRU, OnnxLSTM

    rng = np.random.default_rng(1)
    layers = [_layer(OnnxGRU, 3, "bidirectional", rng, torch.float32, outputs=[True, True]),
              _layer(OnnxLSTM, 8, "forward", rng, torch.float32, outputs=[True, True, True])]
    kwargs = {"batch_first": True, "last_states": True, "outputs": (True, True, True)}
    plain, squeezed = (StackedRecurrent(layers, **kwargs, squeeze_states=s).eval() for s in (False, True))
    x = torch.randn(2, 5, 3)
    with torch.no_grad():
        handle = None if native else layers[1].register_forward_hook(lambda *_: None)
        want, got = plain(x), squeezed(x)
        if handle is not None:
            handle.remove()
    assert [tuple(t.shape) for t in got] == [(5, 2, 4), (2, 4), (2, 4)]  # y time-major: no batch_first_output
    for a, b in zip(got, (want[0], want[1][0], want[2][0]), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert "squeeze_states=True" in repr(squeezed)
    with pytest.raises(ValueError, match="squeeze_states"):
        StackedRecurrent(layers, squeeze_states=True)  # both layers' states
    with pytest.raises(ValueError, match="squeeze_states"):
        StackedRecurrent(layers[:1], squeeze_states=True)  # two directions


def test_fused_module_meta_codegen_and_bisect(tmp_path):
    module = onnx2torch_rnn.convert(EXAMPLE)
    fusion, classifier = fused(module)
    assert fusion["op_type"] == "2-layer LSTM" and fusion["name"] == "/lstm/LSTM"
    assert fusion["replaces"][0] == "/lstm/Shape" and "/lstm/LSTM_1" in fusion["replaces"]
    assert classifier["op_type"] == "Linear" and classifier["replaces"] == ["/classify/MatMul", "/classify/Add"]
    report = onnx2torch_rnn.compare(EXAMPLE, bisect=True)
    assert report.ok and report.compared_nodes == 3 and report.divergence is None  # Gather, the stack, the Linear


# ---- onnx.helper variants of torch.onnx's pattern: change one proven detail and the pattern must not fire


def stacked_model(*, value: float = 0.0, shape_source: str = "x", hn_order=(0, 1), reshape=(0, 0, -1),
                  extra_output: str | None = None, hidden: int = 4) -> onnx.ModelProto:
    """A 2-layer bidirectional batch-first LSTM as torch.onnx writes it; each keyword breaks one proven detail."""
    rng = np.random.default_rng(0)
    inits = {}
    nodes = [
        helper.make_node("Shape", [shape_source], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "zero_1d"], ["batch_1d"]),
        helper.make_node("Concat", ["rows", "batch_1d", "hidden"], ["state_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["state_shape"], ["zeros"],
                         value=numpy_helper.from_array(np.array([value], np.float32))),
        helper.make_node("Transpose", ["x"], ["x_t"], perm=[1, 0, 2]),
    ]
    inits.update(zero=np.array(0, np.int64), zero_1d=np.array([0], np.int64), rows=np.array([4], np.int64),
                 hidden=np.array([hidden], np.int64), merge=np.array(reshape, np.int64))
    x, features = "x_t", 3
    for layer in range(2):
        for k, state in enumerate(("h", "c")):
            starts, ends = f"s{layer}{k}", f"e{layer}{k}"
            inits[starts], inits[ends] = np.array([2 * layer], np.int64), np.array([2 * layer + 2], np.int64)
            nodes.append(helper.make_node("Slice", ["zeros", starts, ends, "zero_1d"], [f"{state}0_{layer}"]))
        inits[f"W{layer}"] = rng.standard_normal((2, 4 * hidden, features)).astype(np.float32)
        inits[f"R{layer}"] = rng.standard_normal((2, 4 * hidden, hidden)).astype(np.float32)
        inits[f"B{layer}"] = rng.standard_normal((2, 8 * hidden)).astype(np.float32)
        nodes += [
            helper.make_node("LSTM", [x, f"W{layer}", f"R{layer}", f"B{layer}", "", f"h0_{layer}", f"c0_{layer}"],
                             [f"Y{layer}", f"Yh{layer}", f"Yc{layer}"], direction="bidirectional",
                             hidden_size=hidden),
            helper.make_node("Transpose", [f"Y{layer}"], [f"Yt{layer}"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"Yt{layer}", "merge"], [f"out{layer}"]),
        ]
        x, features = f"out{layer}", 2 * hidden
    nodes += [helper.make_node("Transpose", ["out1"], ["y"], perm=[1, 0, 2]),
              helper.make_node("Concat", [f"Yh{i}" for i in hn_order], ["h_n"], axis=0)]
    inputs = [("x", np.float32, ["N", "T", 3])]
    if shape_source != "x":
        inputs.append((shape_source, np.float32, ["M", 2]))
    return make_model(nodes, inputs, ["y", "h_n", *([extra_output] if extra_output else [])], inits)


def feeds_for(model: onnx.ModelProto, batch: int = 3, time: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((batch, time, 3)).astype(np.float32)}
    if len(model.graph.input) > 1:  # a second input whose first dim happens to equal the batch
        feeds[model.graph.input[1].name] = rng.standard_normal((batch, 2)).astype(np.float32)
    return feeds


def test_the_helper_model_is_fused_whole():
    model = stacked_model()
    module = onnx2torch_rnn.convert(model)
    (stack,) = stacks(module)
    assert stack.initial_h == (None, None) and stack.outputs == (True, True)
    assert top_level_modules(module) == [StackedRecurrent]
    assert_matches_onnxruntime(module, model, feeds_for(model))
    assert_matches_onnxruntime(module, model, feeds_for(model, batch=1, time=2))


@pytest.mark.parametrize("change", [
    {"value": 0.5},  # initial states that are not zeros
    {"shape_source": "other"},  # zeros whose batch dim comes from another input: equal here, not provably
])
def test_initial_states_that_are_not_proven_zeros_stay(change):
    model = stacked_model(**change)
    module = onnx2torch_rnn.convert(model)
    (stack,) = stacks(module)
    assert all(where is not None for where in stack.initial_h + stack.initial_c)
    assert_matches_onnxruntime(module, model, feeds_for(model))


@pytest.mark.parametrize("change", [
    {"hn_order": (1, 0)},  # h_n is not the layers' Y_h in order
    {"extra_output": "Yh0"},  # a layer's Y_h is also read on its own
    {"extra_output": "out0"},  # the first layer's output is read outside
    {"reshape": (0, 0, 8)},  # another Reshape target: not the pattern's merge of directions
])
def test_layers_whose_values_are_read_otherwise_are_not_stacked(change):
    model = stacked_model(**change)
    module = onnx2torch_rnn.convert(model)
    # the second layer may still be fused on its own (its zero states then unproven: built from the model's input)
    assert all(len(stack.layers) == 1 for stack in stacks(module))
    assert_matches_onnxruntime(module, model, feeds_for(model))


@pytest.mark.parametrize("entry", [m for m in MANIFEST["models"] if m["case"].startswith("packed_")],
                         ids=lambda m: m["case"])
def test_packed_sequences_lose_their_sorting(entry):
    model = onnx.load(TORCH / entry["file"])
    module = onnx2torch_rnn.convert(model)
    (fusion,) = fused(module)
    sorting = {n.name for n in model.graph.node if n.op_type in ("TopK", "ScatterElements")}
    assert bool(sorting) == ("unsorted" in entry["case"]) and sorting <= set(fusion["replaces"])
    if sorting:  # what is left is the recurrence: x and the lengths go in as the caller gives them
        assert top_level_modules(module) == [StackedRecurrent]
    (stack,) = stacks(module)
    assert stack.lengths  # the caller's lengths, unsorted: the runtime takes them as they are
    sets = manifest_input_sets(TORCH, entry, MANIFEST["sizes"], seed=1)
    time = sets[-1]["x"].shape[1]
    sets.append({**sets[-1], "lengths": np.minimum(sets[-1]["lengths"], time - 2)})
    for feeds in sets:
        assert_matches_onnxruntime(module, model, feeds)


# ---- a user's own pattern, registered like a converter


@pytest.fixture
def silu_pattern():
    """A user pattern: x * Sigmoid(x), the way some exporters spell SiLU, becomes one nn.SiLU (and so does a custom
    MySigmoid op in that place, which has no converter)."""
    from onnx2torch_rnn.passes import _PATTERNS

    @onnx2torch_rnn.register_pattern("silu")
    def silu(view: onnx2torch_rnn.GraphView):
        for mul in view.nodes:
            if mul.op_type != "Mul":
                continue
            sigmoid = next((view.producer[v] for v in mul.input if v in view.producer
                            and view.producer[v].op_type in ("Sigmoid", "MySigmoid")), None)
            if sigmoid is None or sorted(mul.input) != sorted([sigmoid.input[0], sigmoid.output[0]]):
                continue
            yield onnx2torch_rnn.Fusion("silu", "SiLU", [mul, sigmoid], [sigmoid.input[0]], [mul.output[0]],
                                        lambda ctx, x=sigmoid.input[0]: onnx2torch_rnn.Converted(torch.nn.SiLU(), [x]))

    yield
    del _PATTERNS["silu"]


def test_a_registered_pattern_fuses_and_reports_what_it_replaced(silu_pattern):
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="gate"), helper.make_node("Mul", ["s", "x"], ["y"],
                                                                                      name="scale")]
    model = make_model(nodes, [("x", np.float32, ["N", 4])], ["y"])
    module = onnx2torch_rnn.convert(model)
    assert top_level_modules(module) == [torch.nn.SiLU]
    (fusion,) = fused(module)
    assert fusion["pattern"] == "silu" and sorted(fusion["replaces"]) == ["gate", "scale"]
    assert_matches_onnxruntime(module, model, {"x": np.random.default_rng(0).standard_normal((3, 4), np.float32)})
    assert top_level_modules(onnx2torch_rnn.convert(model, fuse=False)) != [torch.nn.SiLU]


def test_a_pattern_can_stand_for_an_op_that_has_no_converter(silu_pattern):
    """Recognition runs before the check for unsupported ops: the fused node needs no converter of its own."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    model = make_model(nodes, [("x", np.float32, ["N", 4])], ["y"])
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.domain, node.op_type = "example.com", "MySigmoid"  # no converter for it
    model.opset_import.append(helper.make_opsetid("example.com", 1))
    assert top_level_modules(onnx2torch_rnn.convert(model)) == [torch.nn.SiLU]
    with pytest.raises(onnx2torch_rnn.UnsupportedOperatorError, match="MySigmoid"):
        onnx2torch_rnn.convert(model, fuse=False)


# ---- MatMul + Add of constants: one nn.Linear


def linear_model(change: str = "") -> onnx.ModelProto:
    """x [N, T, 6] @ W [6, 4] + b [4], as exporters write a linear layer on a 3-D input; ``change`` breaks one
    detail that the fusion relies on."""
    rng = np.random.default_rng(3)
    dtype = np.float16 if change == "float16" else np.float32
    weights = {"W": rng.standard_normal((6, 4)).astype(dtype),
               "b": rng.standard_normal((1, 4) if change == "bias_2d" else (4,)).astype(dtype)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="project"),
             helper.make_node("Add", ["b", "xw"] if change == "swapped" else ["xw", "b"], ["y"], name="shift")]
    outputs = ["y"]
    if change == "product_read":
        outputs.append("xw")
    if change == "bias_read":
        nodes.append(helper.make_node("Mul", ["y", "b"], ["scaled"]))
        outputs.append("scaled")
    if change == "weight_shared":
        nodes.append(helper.make_node("MatMul", ["x", "W"], ["again"]))
        outputs.append("again")
    if change == "bias_input":
        del weights["b"]
    inputs = [("x", dtype, ["N", "T", 6])] + ([("b", dtype, [4])] if change == "bias_input" else [])
    return make_model(nodes, inputs, outputs, weights)


def linear_feeds(model: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    dtype = np.float16 if model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else np.float32
    feeds = {"x": rng.standard_normal((batch, 5, 6)).astype(dtype)}
    if len(model.graph.input) > 1:
        feeds["b"] = rng.standard_normal(4).astype(dtype)
    return feeds


@pytest.mark.parametrize("change", ["", "swapped"])
def test_matmul_and_add_of_constants_become_one_linear(change):
    model = linear_model(change)
    module = onnx2torch_rnn.convert(model)
    (linear,) = [module.get_submodule(n.target) for n in module.graph.nodes if n.op == "call_module"]
    assert isinstance(linear, torch.nn.Linear) and linear.bias is not None
    assert [(f["pattern"], sorted(f["replaces"])) for f in fused(module)] == [("linear_bias", ["project", "shift"])]
    assert len(top_level_modules(onnx2torch_rnn.convert(model, fuse=False))) == 2
    for batch in (2, 3):
        assert_matches_onnxruntime(module, model, linear_feeds(model, batch))


@pytest.mark.parametrize("change", ["bias_2d", "product_read", "bias_read", "weight_shared", "bias_input",
                                    "float16"])
def test_a_linear_layer_that_is_not_exactly_one_stays_as_written(change):
    model = linear_model(change)
    module = onnx2torch_rnn.convert(model)
    assert not [f for f in fused(module) if f["pattern"] == "linear_bias"]
    assert_matches_onnxruntime(module, model, linear_feeds(model, 3))


KERAS = MODELS / "keras"
KERAS_MANIFEST = read_manifest(KERAS)


@pytest.mark.parametrize("file", ["keras3_stacked.onnx", "tf_keras_stacked.onnx"])
def test_tf2onnx_stacked_lstm_layers_become_one_module(file):
    """tf2onnx writes each layer with zero states from Shape/Slice/Concat/Expand/Unsqueeze (int32 casts between) and
    turns time-major and back between layers (two Transposes that cancel). tf_keras's GRU after them joins the stack;
    Keras 3's is a Loop."""
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    op_type, count = ("2-layer LSTM", 2) if file.startswith("keras3") else ("3-layer LSTM+GRU", 3)
    lstm = [f for f in fused(module) if f["op_type"] == op_type]
    assert len(lstm) == 1
    layers = [n.name for n in model.graph.node if n.op_type in ("LSTM", "GRU")]
    assert set(layers) <= set(lstm[0]["replaces"])
    (stack,) = [s for s in stacks(module) if len(s.layers) == count]
    assert stack.initial_h == (None,) * count and stack.initial_c == (None,) * count
    entry = next(e for e in KERAS_MANIFEST["models"] if e["file"] == file)
    for feeds in manifest_input_sets(KERAS, entry, KERAS_MANIFEST["sizes"]):
        assert_matches_onnxruntime(module, model, feeds)


@pytest.mark.parametrize("file", ["mxnet_lstm_2layer.onnx", "mxnet_gru_2layer.onnx", "mxnet_rnn_relu_2layer.onnx"])
def test_layers_whose_weights_are_computed_from_initializers_stack_too(file):
    """MXNet slices every weight out of one flat blob: the weights are folded at conversion, so they are constants
    for recognition too (and the slicing nodes stay outside the fusion, to be folded first)."""
    model = onnx.load(MODELS / "patterns" / file)
    module = check(model)
    (stack,) = stacks(module)
    assert len(stack.layers) == 2 and all(not layer.runtime_weights for layer in stack.layers)
    assert check(model, seed=1) is not None


PADDLE_STACKS = ["paddle2onnx_lstm_2layer_bidirectional.onnx", "paddle2onnx_gru_2layer_bidirectional.onnx"]


@pytest.mark.parametrize("file", PADDLE_STACKS)
def test_paddle_stacks_whose_final_states_are_the_last_layers_fuse(file):
    """paddle2onnx's State outputs are the last layer's Y_h / Y_c, the other layers' are read by nothing: the stack
    returns the last layer's final states alone (``last_states``), exactly what the graph computes."""
    model = onnx.load(MODELS / "patterns" / file)
    module = check(model)
    (stack,) = stacks(module)
    assert len(stack.layers) == 2 and stack.last_states and stack.batch_first and stack.batch_first_output
    assert len([m for m in module.modules() if isinstance(m, Recurrent)]) == 2  # both inside the stack
    check(model, seed=1)


@pytest.mark.parametrize("file", PADDLE_STACKS)
def test_a_paddle_stack_whose_first_layer_state_is_read_too_is_not_one_stack(file):
    """The first layer's Y_h is also a graph output (not through a Concat of every layer's): h_n can be neither all
    layers' nor the last one's, so the layers do not become one stack; the result still matches."""
    model = onnx.load(MODELS / "patterns" / file)
    first = next(n for n in model.graph.node if n.op_type in ("LSTM", "GRU"))
    model.graph.node.append(helper.make_node("Identity", [first.output[1]], ["first_h"]))
    model.graph.output.append(helper.make_tensor_value_info("first_h", onnx.TensorProto.FLOAT, [None] * 3))
    module = check(model)
    assert all(len(stack.layers) == 1 for stack in stacks(module))
    check(model, seed=1)


@pytest.mark.parametrize("file", ["keras3_bi_lstm_concat.onnx", "tf_keras_bi_lstm_concat.onnx"])
def test_tf2onnx_bidirectional_layer_loses_its_glue(file):
    """tf2onnx's Bidirectional: zero states as a Concat of two Unsqueezed zeros, and the directions merged by a Slice
    and a Squeeze each, then a Concat on the last axis (the same as Transpose + Reshape)."""
    model = onnx.load(KERAS / file)
    module = onnx2torch_rnn.convert(model)
    (stack,) = stacks(module)
    assert stack.merge_output and stack.batch_first and stack.batch_first_output
    assert stack.initial_h == (None,) and stack.initial_c == (None,)
    assert top_level_modules(module) == [StackedRecurrent]
    entry = next(e for e in KERAS_MANIFEST["models"] if e["file"] == file)
    for feeds in manifest_input_sets(KERAS, entry, KERAS_MANIFEST["sizes"]):
        assert_matches_onnxruntime(module, model, feeds)
