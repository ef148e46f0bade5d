"""Recognition of unrolled cells (onnx2torch_rnn/passes/unrolled.py): T copies of one cell step in the main graph.

dynamo's unrolled nn.RNN (tests/models/torch) and onnx.helper models of LSTM / GRU / RNN steps written out with
Gemm / MatMul, Split / Slice / Gather, activations and Mul / Add: each chain (a layer, a direction) becomes one
LoopedRecurrent, and layers joined by dynamo's glue (directions concatenated, zero or sliced initial states, final
states stacked) one StackedRecurrent; each matches onnxruntime on the original graph, trains, compiles in one graph
and exports. Near-misses (an extra op in one step, a step with other weights, a weight or a middle state read
elsewhere; glue read elsewhere or in another order) stay as written, or as separate layers, and still match.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import onnx2torch_rnn
from tests.exporters.common import MODELS, compare_with_onnxruntime, manifest_input_sets, read_manifest
from tests.helpers import (
    assert_fused_trains_like_literal,
    literal_ops,
    looped,
    make_model,
    recurrent_modules,
    stacks,
)
from tests.helpers import check as check_against_onnxruntime

TORCH = MODELS / "torch"
MANIFEST = read_manifest(TORCH)
ENTRIES = {e["file"]: e for e in MANIFEST["models"]}
DYNAMO = {"dynamo_rnn_tanh.onnx": (1, 1), "dynamo_rnn_relu_l2_bi_bf.onnx": (2, 2),
          "dynamo_rnn_l3_h0_nobias.onnx": (3, 1)}  # layers, directions
BI = "dynamo_rnn_relu_l2_bi_bf.onnx"


def dynamo_sets(file: str) -> list[dict[str, np.ndarray]]:
    """Two input sets at batch 2, one at batch 3 and one at batch 1 (the dynamo models are specialised to 5
    steps)."""
    sets = manifest_input_sets(TORCH, ENTRIES[file], MANIFEST["sizes"])
    batch = {name: spec["dims"].index("batch") for name, spec in ENTRIES[file]["inputs"].items()}
    return [*sets, {name: np.take(value, [0], axis=batch[name]) for name, value in sets[2].items()}]


def steps(file: str, feeds: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """``feeds`` with x of ``count`` steps (the first ones, repeated where there are fewer)."""
    axis = ENTRIES[file]["inputs"]["x"]["dims"].index("time")
    return {**feeds, "x": np.take(feeds["x"], np.arange(count) % feeds["x"].shape[axis], axis=axis)}


@pytest.mark.parametrize("file", sorted(DYNAMO))
def test_dynamo_unrolled_rnn_becomes_one_stack(file):
    """The whole graph becomes one StackedRecurrent of bidirectional (or forward) layers: the directions' Concats,
    zero or sliced initial states, final states stacked and Transposes to and from batch-major go with it."""
    model = onnx.load(TORCH / file)
    module = onnx2torch_rnn.convert(model)
    layers, directions = DYNAMO[file]
    (stack,) = stacks(module)
    assert [n.op for n in module.graph.nodes].count("call_module") == 1 and not looped(module)
    assert len(stack.layers) == layers and stack.window[0] == (0, 5)
    assert all(type(r).__name__ == "OnnxRNN" and r.fast and r.config.num_directions == directions
               for r in stack.layers)
    (fused,) = [n for n in module.graph.nodes if n.op == "call_module"]
    assert sorted(fused.meta["onnx"]["replaces"]) == sorted(n.name for n in model.graph.node)
    sets = dynamo_sets(file)
    assert {s["x"].shape[1 if "_bf" not in file else 0] for s in sets} == {1, 2, 3}
    for feeds in sets:
        compare_with_onnxruntime(module, model, feeds)
    literal = onnx2torch_rnn.convert(model, fuse=False)
    assert not recurrent_modules(literal) and "MatMul" in literal_ops(literal)


@pytest.mark.parametrize("file", ["dynamo_rnn_tanh.onnx", BI])
def test_dynamo_unrolled_rnn_trains_like_the_graph(file):
    """The loss and the gradient at x match the graph as written; the gradient reaches every fused weight, which
    is a parameter."""
    fused, _ = assert_fused_trains_like_literal(TORCH / file, dynamo_sets(file)[0]["x"])
    weights = [p for r in recurrent_modules(fused) for p in r.parameters()]
    assert weights and all(isinstance(p, torch.nn.Parameter) for p in weights)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in weights)


@pytest.mark.compile
@pytest.mark.parametrize("file", sorted(DYNAMO))
def test_dynamo_unrolled_rnn_compiles_in_one_graph_and_exports_with_dynamic_batch(file):
    model = onnx.load(TORCH / file)
    module = onnx2torch_rnn.convert(model)
    sets = dynamo_sets(file)
    args = [torch.from_numpy(sets[0][i.name]) for i in model.graph.input]
    batch = torch.export.Dim("batch", min=1)
    axis = 0 if "_bf" in file else 1
    shapes = [{axis if i.name == "x" else 1: batch} for i in model.graph.input]
    exported = torch.export.export(module, tuple(args), dynamic_shapes=shapes).module()
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend="eager")
    for feeds in sets[:3]:
        for runner in (exported, compiled):
            compare_with_onnxruntime(runner, model, feeds)
    compare_with_onnxruntime(compiled, model, steps(file, sets[0], 7))  # the first steps forwards, the last backwards


@pytest.mark.parametrize("file", sorted(DYNAMO))
def test_dynamo_window_reads_the_unrolled_steps_and_refuses_fewer(file, monkeypatch):
    """dynamo specialised the graph to 5 steps: the fused stack reads those of a longer x as the graph does (the
    forward direction the first 5, the reverse the last 5), and fails where x is shorter (the graph's SequenceAt
    fails there too). At 5 steps each layer is one call (in eager inference on the native kernel, the whole stack
    one op); at 7 the first layer's directions read other steps, one call each."""
    from onnx2torch_rnn.recurrent import kernel, op

    model = onnx.load(TORCH / file)
    module = onnx2torch_rnn.convert(model)
    first = stacks(module)[0].layers[0]
    feeds = dynamo_sets(file)[0]
    layer_calls = []  # a hook on a layer: the stack calls its layers' modules
    handle = first.register_forward_pre_hook(lambda _module, args: layer_calls.append(args[0].shape[0]))
    compare_with_onnxruntime(module, model, steps(file, feeds, 5))
    assert layer_calls == [5]
    layer_calls.clear()
    compare_with_onnxruntime(module, model, steps(file, feeds, 7))
    assert layer_calls == [5] * first.config.num_directions
    handle.remove()
    stack_calls = []
    monkeypatch.setattr(op, "run_stack", lambda x, *args, _run=op.run_stack: stack_calls.append(x.shape[0]) or
                        _run(x, *args))
    compare_with_onnxruntime(module, model, steps(file, feeds, 5))
    compare_with_onnxruntime(module, model, steps(file, feeds, 7))  # two directions' steps differ: layer by layer
    assert stack_calls == ([5] * (3 - first.config.num_directions) if kernel.loaded() else [])
    with pytest.raises(RuntimeError, match="reads 5 steps"):
        module(*(torch.from_numpy(v) for v in steps(file, feeds, 4).values()))


# ---------------------------------------------------------------------------------------------------------------
# Near-misses of dynamo's glue: each changes one proven detail of the 2-layer bidirectional model; its layers stay
# apart (one module per layer and direction) and still match.

def _edited(edit) -> onnx.ModelProto:
    model = onnx.load(TORCH / BI)
    edit(model.graph, {n.output[0]: n for n in model.graph.node})
    return model


def _direction_read_elsewhere(graph, producer):
    """The first layer's forward Y is also a graph output."""
    graph.output.append(helper.make_tensor_value_info("cat", onnx.TensorProto.FLOAT, [5, "batch", 8]))


def _directions_swapped(graph, producer):
    """The first layer's directions concatenated reverse first."""
    concat = producer["cat_2"]
    concat.input[:] = list(concat.input)[::-1]


def _final_states_swapped(graph, producer):
    """h_n lists the second layer's states first."""
    concat = producer["h_n"]
    concat.input[:] = [*concat.input[2:], *concat.input[:2]]


def _state_not_zero(graph, producer):
    """The second layer's forward initial state is the zeros' row plus 0.5."""
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    graph.node.append(helper.make_node("Add", ["getitem_2", "half"], ["shifted"]))
    producer["unsqueeze_2"].input[0] = "shifted"
    nodes = list(graph.node)
    nodes.insert(nodes.index(producer["getitem_2"]) + 1, nodes.pop())  # topological order: after its input
    del graph.node[:]
    graph.node.extend(nodes)


NEAR_MISSES = [_direction_read_elsewhere, _directions_swapped, _final_states_swapped, _state_not_zero]


@pytest.mark.parametrize("edit", NEAR_MISSES)
def test_dynamo_glue_near_misses_stay_apart(edit):
    model = _edited(edit)
    module = onnx2torch_rnn.convert(model)
    layers = recurrent_modules(module)  # some one-direction layers may be stacks of one layer
    assert len(layers) == 4 and all(r.config.num_directions == 1 for r in layers)
    for feeds in dynamo_sets(BI)[2:]:  # batch 3 and 1
        compare_with_onnxruntime(module, model, feeds)


def test_dynamo_states_that_are_not_zeros_are_rows_the_stack_reads():
    """Zeros made of 0.5: the layers' initial states are rows 0:2 and 2:4 of that value, which the stack reads."""
    def half(graph, producer):
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"))
        producer["zeros"].input[0] = "half"

    model = _edited(half)
    module = onnx2torch_rnn.convert(model)
    (stack,) = stacks(module)
    assert stack.initial_h == ((0, 0, 2), (0, 2, 4))
    for feeds in dynamo_sets(BI)[2:]:
        compare_with_onnxruntime(module, model, feeds)


# ---------------------------------------------------------------------------------------------------------------
# onnx.helper models: a cell step written out, T times

RNG = np.random.default_rng(0)
FEATURES, H = 4, 5


class Unrolled:
    """Builds an unrolled layer: ``slice_with`` picks each step of x [T, N, I] (time-major), ``step`` writes one cell
    step from (x_t [N, I], states) and returns the new states (h first)."""

    def __init__(self, cell: str, steps: int = 3, slice_with: str = "split", linear_before_reset: int = 0,
                 given_states: bool = False):
        self.cell, self.steps, self.slice_with, self.lbr = cell, steps, slice_with, linear_before_reset
        self.nodes: list[onnx.NodeProto] = []
        self.weights: dict[str, np.ndarray] = {}
        self.inputs: list = [("x", np.float32, [steps, "batch", FEATURES])]
        self.outputs: list[str] = []
        self.given_states = given_states
        self.count = 0
        self.other_weights_at: int | None = None  # the step that has weights of its own (a near-miss)
        self.sequence_output = False  # Y as ConcatFromSequence of a SequenceConstruct
        self.y_order: list[int] | None = None  # the steps (by x's position) that Y concatenates; None: x's order

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attributes) -> str | list[str]:
        self.count += 1
        names = [f"{op_type.lower()}{self.count}_{k}" for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=f"{op_type}{self.count}", **attributes))
        return names[0] if outputs == 1 else names

    def weight(self, name: str, shape, scale: float = 0.5) -> str:
        self.weights[name] = (RNG.standard_normal(shape) * scale).astype(np.float32)
        return name

    def constant(self, value) -> str:
        name = f"const{len(self.weights)}"
        self.weights[name] = np.asarray(value)
        return name

    def x_steps(self, x: str = "x") -> list[str]:
        """x's steps [N, I] in x's order."""
        axis0 = self.constant(np.array([0]))
        if self.slice_with == "split":
            parts = self.op("Split", x, self.constant(np.ones(self.steps, np.int64)), outputs=self.steps, axis=0)
            parts = parts if self.steps > 1 else [parts]
            return [self.op("Squeeze", p, axis0) for p in parts]
        if self.slice_with == "slice":
            return [self.op("Squeeze", self.op("Slice", x, self.constant(np.array([t])),
                                               self.constant(np.array([t + 1])), axis0), axis0)
                    for t in range(self.steps)]
        return [self.op("Gather", x, self.constant(np.array(t)), axis=0) for t in range(self.steps)]

    def initial(self, suffix: str = "") -> list[str]:
        names = ["h0", "c0"][: 2 if self.cell == "LSTM" else 1]
        if self.given_states:
            self.inputs += [(n + suffix, np.float32, ["batch", H]) for n in names]
            return [n + suffix for n in names]
        batch = self.op("Shape", "x", start=1, end=2)
        shape = self.op("Concat", batch, self.constant(np.array([H])), axis=0)
        return [self.op("ConstantOfShape", shape) for _ in names]

    def step(self, x: str, states: list[str], suffix: str = "", width: int = FEATURES) -> list[str]:
        gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[self.cell]
        w, r, b = (f"{n}{suffix}" for n in ("W", "R", "B"))
        if w not in self.weights:
            self.weight(w, (width, gates * H)), self.weight(b, (gates * H,)), self.weight(f"Rb{suffix}", (H,))
            for name in [f"{r}_{k}" for k in range(3)] if self.cell == "GRU" else [r]:
                self.weight(name, (H, H if self.cell == "GRU" else gates * H))
        projected = self.op("Gemm", x, w, b)
        if self.cell == "RNN":
            return [self.op("Tanh", self.op("Add", projected, self.op("MatMul", states[0], r)))]
        if self.cell == "LSTM":
            i, o, f, g = self.op("Split", self.op("Add", projected, self.op("MatMul", states[0], r)), outputs=4,
                                 axis=1)
            c = self.op("Add", self.op("Mul", self.op("Sigmoid", f), states[1]),
                        self.op("Mul", self.op("Sigmoid", i), self.op("Tanh", g)))
            return [self.op("Mul", self.op("Sigmoid", o), self.op("Tanh", c)), c]
        return [self.gru_step(projected, states[0], r, suffix)]

    def gru_step(self, projected: str, h: str, r: str, suffix: str) -> str:
        xz, xr, xh = self.op("Split", projected, outputs=3, axis=1)
        rz, rr, rh = (f"{r}_{k}" for k in range(3))
        z = self.op("Sigmoid", self.op("Add", xz, self.op("MatMul", h, rz)))
        reset = self.op("Sigmoid", self.op("Add", xr, self.op("MatMul", h, rr)))
        if self.lbr:
            recurrent = self.op("Add", self.op("MatMul", h, rh), f"Rb{suffix}")
            candidate = self.op("Tanh", self.op("Add", xh, self.op("Mul", reset, recurrent)))
        else:
            candidate = self.op("Tanh", self.op("Add", xh, self.op("MatMul", self.op("Mul", reset, h), rh)))
        one_minus_z = self.op("Sub", self.constant(np.float32(1)), z)
        return self.op("Add", self.op("Mul", one_minus_z, candidate), self.op("Mul", z, h))

    def layer(self, reverse: bool = False, suffix: str = "", xs: list[str] | None = None,
              after_step=None, width: int = FEATURES, states: list[str] | None = None) -> tuple[str, list[str]]:
        """One direction: its Y [T, N, H] (Concat of each step's h Unsqueezed) and final states. ``after_step(t,
        states)`` may change the states a step passes on (near-misses); ``width``: the features of its x; ``states``:
        the initial ones."""
        xs = xs or self.x_steps()
        states = states or self.initial(suffix)
        ys: dict[int, str] = {}
        for t in (range(self.steps - 1, -1, -1) if reverse else range(self.steps)):
            states = self.step(xs[t], states, suffix + ("_other" if t == self.other_weights_at else ""), width)
            states = after_step(t, states) if after_step else states
            ys[t] = states[0]
        if self.sequence_output:  # stacked from a sequence of [N, H]
            y = self.op("ConcatFromSequence", self.op("SequenceConstruct", *[ys[t] for t in range(self.steps)]),
                        axis=0, new_axis=1)
            return y, states
        axis0 = self.constant(np.array([0]))
        order = self.y_order or range(self.steps)
        y = self.op("Concat", *[self.op("Unsqueeze", ys[t], axis0) for t in order], axis=0)
        return y, states

    def stack(self, layers: int = 2) -> list[str]:
        """Bidirectional layers as dynamo joins them: each reads the previous one's directions concatenated; the
        outputs are the last Y and the final states Unsqueezed and concatenated (h_n, then c_n)."""
        x, width, finals = "x", FEATURES, []
        for layer in range(layers):
            xs = self.x_steps(x)
            forward, forward_states = self.layer(suffix=f"_{layer}", xs=xs, width=width)
            backward, backward_states = self.layer(reverse=True, suffix=f"_{layer}r", xs=xs, width=width)
            x, width = self.op("Concat", forward, backward, axis=-1), 2 * H
            finals += [forward_states, backward_states]
        axis0 = self.constant(np.array([0]))
        return [x, *(self.op("Concat", *[self.op("Unsqueeze", s[k], axis0) for s in finals], axis=0)
                     for k in range(len(finals[0])))]

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        return make_model(self.nodes, self.inputs, outputs, self.weights)


def input_sets(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """Two input sets at batch 2 and one at batch 3."""
    rng = np.random.default_rng(1)
    sets = []
    for batch in (2, 2, 3):
        feeds = {}
        for i in model.graph.input:
            shape = [d.dim_value or batch for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        sets.append(feeds)
    return sets


def check(model: onnx.ModelProto, cells: int) -> torch.nn.Module:
    module = onnx2torch_rnn.convert(model)
    assert len(looped(module)) == cells
    for feeds in input_sets(model):
        compare_with_onnxruntime(module, model, feeds)
    return module


LAYERS = [("LSTM", 0, "split"), ("GRU", 0, "slice"), ("GRU", 1, "gather"), ("RNN", 0, "slice"), ("LSTM", 0, "gather"),
          ("GRU", 1, "split")]


@pytest.mark.parametrize("cell, linear_before_reset, slice_with", LAYERS)
def test_unrolled_layer_becomes_its_cell(cell, linear_before_reset, slice_with):
    builder = Unrolled(cell, slice_with=slice_with, linear_before_reset=linear_before_reset)
    y, states = builder.layer()
    model = builder.model([y, *states])
    module = check(model, 1)
    (fused,) = looped(module)
    assert type(fused.layer).__name__ == f"Onnx{cell}" and fused.window is None
    assert fused.layer.config.linear_before_reset == bool(linear_before_reset)
    assert not fused.initial_h and not fused.initial_c  # zeros of [N, H]: dropped
    assert not {"Gemm", "MatMul", "Split", "Sigmoid", "Tanh"} & set(literal_ops(module))
    literal = onnx2torch_rnn.convert(model, fuse=False)
    assert not looped(literal)


@pytest.mark.parametrize("reverse", [False, True])
def test_y_from_a_sequence_of_steps(reverse):
    builder = Unrolled("GRU", linear_before_reset=1)
    builder.sequence_output = True
    y, states = builder.layer(reverse=reverse)
    (fused,) = looped(check(builder.model([y, *states]), 1))
    assert fused.outputs[:2] == (True, True) and fused.layer.config.direction == ("reverse" if reverse else "forward")


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_given_initial_states_and_only_the_final_state_read(cell):
    builder = Unrolled(cell, given_states=True, linear_before_reset=1)
    _, states = builder.layer()
    model = builder.model(states[:1])  # Y is not read, nor (LSTM) c_n
    (fused,) = looped(check(model, 1))
    assert fused.initial_h and fused.initial_c == (cell == "LSTM") and fused.outputs[:3] == (False, True, False)


@pytest.mark.parametrize("cell", ["LSTM", "RNN"])
def test_bidirectional_unrolled_layer(cell):
    builder = Unrolled(cell, slice_with="gather")
    xs = builder.x_steps()
    forward, _ = builder.layer(xs=xs)
    backward, states = builder.layer(reverse=True, suffix="_reverse", xs=xs)
    merged = builder.op("Concat", forward, backward, axis=-1)
    module = check(builder.model([merged, states[0]]), 2)
    assert sorted(c.layer.config.direction for c in looped(module)) == ["forward", "reverse"]


@pytest.mark.parametrize("cell, slice_with", [("LSTM", "split"), ("GRU", "gather"), ("RNN", "slice")])
def test_unrolled_bidirectional_layers_become_one_stack(cell, slice_with):
    """Two bidirectional layers (the directions of each reading the same slices of its x), zero states [N, H] made
    from the graph input's batch, final h and c stacked: one StackedRecurrent, c_n too."""
    builder = Unrolled(cell, slice_with=slice_with, linear_before_reset=1)
    outputs = builder.stack()
    module = check(builder.model(outputs), 0)
    (stack,) = stacks(module)
    assert [r.config.num_directions for r in stack.layers] == [2, 2] and stack.window is None
    assert stack.initial_h == (None, None) and stack.outputs == (True, True, True)[: len(outputs)]
    assert [n.op for n in module.graph.nodes].count("call_module") == 1


def test_unrolled_stack_with_given_states_stays_apart():
    """Initial states given as [N, H] inputs: a stack would need them as rows of one [L*D, N, H] value."""
    builder = Unrolled("GRU", given_states=True)
    check(builder.model(builder.stack()), 4)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_single_step_with_the_state_passed_in_and_out(cell):
    """Streaming models (VAD, denoisers) run one step per call: x [1, N, I], the states in and out as [N, H]."""
    builder = Unrolled(cell, steps=1, slice_with="split", given_states=True)
    (x,) = builder.x_steps()
    states = builder.step(x, builder.initial())
    module = check(builder.model(states), 1)
    (fused,) = looped(module)
    assert fused.initial_h and fused.initial_c == (cell == "LSTM")


@pytest.mark.parametrize("given", [False, True])
def test_one_value_as_both_initial_states(given):
    """Keras passes one zeros tensor as an LSTM's initial h and c: each read of it in the first step is one of
    them."""
    builder = Unrolled("LSTM", given_states=given)
    h0 = builder.initial()[0]
    y, states = builder.layer(states=[h0, h0])
    (fused,) = looped(check(builder.model([y, *states]), 1))
    assert (fused.initial_h, fused.initial_c) == (given, given)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("final_unsqueezed", [False, True])
def test_y_in_the_order_opposite_to_x(reverse, final_unsqueezed):
    """Keras's go_backwards writes Y in processing order: a reverse chain's first h first (y_backwards). It stays a
    LoopedRecurrent where dynamo's glue (h_n Unsqueezed) would make a chain a StackedRecurrent, whose Y is in x's
    order."""
    builder = Unrolled("LSTM", slice_with="slice")
    builder.y_order = list(range(builder.steps - 1, -1, -1))
    y, states = builder.layer(reverse=reverse)
    if final_unsqueezed:
        states = [builder.op("Unsqueeze", states[0], builder.constant(np.array([0])))]
    module = check(builder.model([y, *states]), 1)
    (fused,) = looped(module)
    assert fused.y_backwards and fused.layer.config.direction == ("reverse" if reverse else "forward")


def test_check_and_verbose_report_the_fusion(capsys, tmp_path):
    from onnx2torch_rnn.cli import main

    builder = Unrolled("GRU")
    y, states = builder.layer()
    onnx.save(builder.model([y, *states]), tmp_path / "gru.onnx")
    assert main(["check", str(tmp_path / "gru.onnx"), "--verbose"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"recognised: GRU unrolled from \d+ nodes, 'Split\d+' on \(pattern unrolled_cells\)", out)
    assert re.search(r"fused \d+ nodes into GRU unrolled 'Split\d+' \(pattern unrolled_cells\): 'Split", err)


# ---------------------------------------------------------------------------------------------------------------
# Near-misses: each changes one proven detail; the steps must stay as written and still match.

def _extra_op(builder: Unrolled):
    """Step 1 passes on 1.5 h: not the cell's h."""
    return builder.layer(after_step=lambda t, s: [builder.op("Mul", s[0], builder.constant(np.float32(1.5))),
                                                  *s[1:]] if t == 1 else s)


def _other_weights(builder: Unrolled):
    builder.other_weights_at = 2
    return builder.layer()


def _shared_weight(builder: Unrolled):
    """The recurrent kernel is also read by a graph output: a fused copy would untie it."""
    y, states = builder.layer()
    shared = builder.op("Identity", "R" if "R" in builder.weights else "R_0")
    return y, [*states, shared]


def _middle_state_read(builder: Unrolled):
    """Step 0's h is read outside the chain: the fused node does not give it."""
    middle = []
    y, states = builder.layer(after_step=lambda t, s: middle.append(builder.op("Relu", s[0])) or s if t == 0 else s)
    return y, [*states, *middle]


def _rounding_cast(builder: Unrolled):
    """Step 1 passes on its h rounded to float16 and back."""
    def rounded(t, states):
        if t != 1:
            return states
        half = builder.op("Cast", states[0], to=onnx.TensorProto.FLOAT16)
        return [builder.op("Cast", half, to=onnx.TensorProto.FLOAT), *states[1:]]
    return builder.layer(after_step=rounded)


def _y_out_of_order(builder: Unrolled):
    """Y has steps 0 and 1 swapped: neither x's order nor the opposite."""
    builder.y_order = [1, 0, *range(2, builder.steps)]
    return builder.layer()


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("near_miss", [_extra_op, _other_weights, _shared_weight, _middle_state_read, _rounding_cast,
                                       _y_out_of_order])
def test_near_misses_stay_as_written(cell, near_miss):
    builder = Unrolled(cell, linear_before_reset=1)
    y, outputs = near_miss(builder)
    check(builder.model([y, *outputs]), 0)


def test_one_initial_value_read_once_more_stays_as_written():
    """One value as both initial states, which the first step also adds to its h: not a cell step."""
    builder = Unrolled("LSTM")
    h0 = builder.initial()[0]
    y, states = builder.layer(states=[h0, h0], after_step=lambda t, s: [builder.op("Add", s[0], h0), *s[1:]]
                              if t == 0 else s)
    check(builder.model([y, *states]), 0)


def test_directions_sharing_float_weights_stay_as_written():
    """Both directions read one W, R and B: fused copies would untie them (integers, such as split sizes, may be
    shared: the Keras Bidirectional models)."""
    builder = Unrolled("RNN", slice_with="gather")
    xs = builder.x_steps()
    forward, _ = builder.layer(xs=xs)
    backward, _ = builder.layer(reverse=True, xs=xs)
    check(builder.model([builder.op("Concat", forward, backward, axis=-1)]), 0)


def test_codegen_writes_the_window(tmp_path):
    """The generated code builds the same StackedRecurrent: it reads the 5 unrolled steps of a longer x too."""
    from onnx2torch_rnn import codegen

    model = onnx.load(TORCH / "dynamo_rnn_tanh.onnx")
    converted = codegen.write(model, tmp_path)
    rebuilt = codegen.load_generated(tmp_path).load()
    assert "window=((0, 5),)" in (tmp_path / "model.py").read_text()
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((7, 2, 6)).astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), converted(x), rtol=0, atol=0)
    compare_with_onnxruntime(rebuilt, model, {"x": x.numpy()})


def test_a_wide_input_is_not_proven_a_projection():
    """A MatMul whose input is wider than the proof's identity can hold (262145 x 262145 in float64: 512 GiB) converts
    as written, and matches onnxruntime: recognition does not run out of memory (it did)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((262145, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "wide",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 262145])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
                              [onnx.numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check_against_onnxruntime(model, {"x": rng.standard_normal((1, 262145)).astype(np.float32)}, rtol=1e-4, atol=1e-3)
