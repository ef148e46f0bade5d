"""Values computed from the inputs' sizes and constants only, kept per input signature by the fast inference call
(onnx2torch_rnn/signature_kept.py): the same numbers as onnxruntime and as fx's forward, computed again when the
sizes or a tensor they read change, never a graph output, nothing random, and training sees every parameter."""

from __future__ import annotations

import numpy as np
import torch
from onnx import helper

import onnx2torch_rnn
from onnx2torch_rnn.checking import run_onnxruntime
from tests.helpers import make_model

RNG = np.random.default_rng(0)


def sized_model(random: bool = False):
    """y = x + Expand(w, [x.size(0), 4]) * v; z = ConstantOfShape([x.size(0), 4]) (an output of sizes only); with
    ``random``, r = x + Dropout(z) in training mode too."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "four"], ["shape"], axis=0),
             helper.make_node("Expand", ["w", "shape"], ["e"]), helper.make_node("Mul", ["e", "v"], ["m"]),
             helper.make_node("Add", ["x", "m"], ["y"]),
             helper.make_node("ConstantOfShape", ["shape"], ["z"],
                              value=helper.make_tensor("one", 1, [1], [1.0]))]
    outputs = ["y", "z"]
    if random:
        nodes += [helper.make_node("Dropout", ["z", "half", "true"], ["d"]), helper.make_node("Add", ["x", "d"], ["r"])]
        outputs.append("r")
    init = {"w": RNG.standard_normal(4).astype(np.float32), "v": RNG.standard_normal(4).astype(np.float32),
            "zero": np.int64(0), "axes": np.int64([0]), "four": np.int64([4]), "half": np.float32(0.5),
            "true": np.bool_(True)}
    return make_model(nodes, [("x", np.float32, ["N", 4])], outputs, init)


def _counting(module, op_type: str) -> list:
    """Counts the calls of the graph's ``op_type`` module (set before the first fast call: the fast path binds it)."""
    calls = []
    for node in module.graph.nodes:
        if node.op == "call_module" and node.meta["onnx"]["op_type"] == op_type:
            child = module.get_submodule(node.target)
            forward = child.forward
            child.forward = lambda *args, forward=forward: calls.append(1) or forward(*args)
    return calls


def _x(n: int) -> torch.Tensor:
    return torch.from_numpy(RNG.standard_normal((n, 4)).astype(np.float32))


def test_kept_per_sizes_and_exact():
    model = sized_model()
    module = onnx2torch_rnn.convert(model)
    expands = _counting(module, "Expand")
    with torch.inference_mode():
        for n, misses in ((2, 1), (2, 1), (3, 2), (3, 2), (2, 3)):
            x = _x(n)
            y, z = module(x)
            assert len(expands) == misses
            expected = run_onnxruntime(model, {"x": x.numpy()})
            np.testing.assert_allclose(y.numpy(), expected[0], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(z.numpy(), expected[1])
            y2, z2 = module(x)
            assert z2 is not z  # an output is each call's own tensor
            torch.testing.assert_close(y2, y, rtol=0, atol=0)


def test_changed_parameters_are_read():
    """A parameter the kept values read, changed in place or replaced, is read by the next call."""
    module = onnx2torch_rnn.convert(sized_model())
    x = _x(2)
    with torch.no_grad():
        before = module(x)[0]
        module.w.mul_(2)
        torch.testing.assert_close(module(x)[0], module.forward.__wrapped__(module, x)[0], rtol=0, atol=0)
        module.v = torch.nn.Parameter(module.v * 3)
        after = module(x)[0]
        torch.testing.assert_close(after, module.forward.__wrapped__(module, x)[0], rtol=0, atol=0)
        assert not torch.equal(after, before)
        state = {k: t * 0.5 if k == "w" else t for k, t in module.state_dict().items()}
        module.load_state_dict(state, assign=True)
        torch.testing.assert_close(module(x)[0], module.forward.__wrapped__(module, x)[0], rtol=0, atol=0)


def test_training_reaches_the_parameters():
    """With grad the graph runs as fx wrote it: gradients reach the parameters the kept values read."""
    module = onnx2torch_rnn.convert(sized_model())
    x = _x(3)
    with torch.no_grad():
        module(x)
    module(x)[0].sum().backward()
    torch.testing.assert_close(module.w.grad, module.v.detach() * 3)
    torch.testing.assert_close(module.v.grad, module.w.detach() * 3)


def test_random_ops_are_not_kept():
    module = onnx2torch_rnn.convert(sized_model(random=True))
    with torch.inference_mode():
        first, second = (module(torch.zeros(8, 4))[2] for _ in range(2))
    assert first.shape == (8, 4) and not torch.equal(first, second)
