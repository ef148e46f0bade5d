"""Inference calls that skip nn.Module.__call__ per node (onnx2torch_rnn/executor.py): the same numbers as
onnxruntime and as the per-node path, every hook a user sets still runs, replaced children are seen."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from onnx import helper

import onnx2torch_rnn
from onnx2torch_rnn import executor
from onnx2torch_rnn.checking import run_onnxruntime
from tests.control_flow_models import if_model
from tests.helpers import make_model

RNG = np.random.default_rng(0)


def chain_model():
    """y = relu(x * w + b) - 0.5, then exp: five nodes, each its own module."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Sub", ["r", "half"], ["s"]),
             helper.make_node("Exp", ["s"], ["y"])]
    init = {"w": RNG.standard_normal(4).astype(np.float32), "b": RNG.standard_normal(4).astype(np.float32),
            "half": np.float32(0.5)}
    return make_model(nodes, [("x", np.float32, [2, 4])], ["y"], init)


def _x():
    return torch.from_numpy(RNG.standard_normal((2, 4)).astype(np.float32))


def _fast_state(module):
    return module.__dict__.get("_fast_state")


def test_inference_takes_the_fast_path_and_matches():
    model = chain_model()
    module = onnx2torch_rnn.convert(model)
    assert executor.installed(module)
    x = _x()
    with torch.no_grad():
        fast = module(x)
    assert _fast_state(module) is not None and _fast_state(module).namespace is not None
    expected = run_onnxruntime(model, {"x": x.numpy()})[0]
    np.testing.assert_allclose(fast.numpy(), expected, rtol=1e-5, atol=1e-6)
    slow = module(x)  # grad enabled: fx's forward through nn.Module.__call__
    torch.testing.assert_close(fast, slow.detach(), rtol=0, atol=0)


def test_child_calls_skip_module_call(monkeypatch):
    """The fast path calls no child through nn.Module.__call__ (it would be no faster otherwise)."""
    module = onnx2torch_rnn.convert(chain_model())
    calls = []
    original = torch.nn.Module._call_impl

    def spy(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "_call_impl", spy)
    with torch.no_grad():
        module(_x())
    assert calls == [module]
    module(_x())  # with grad: every child through __call__
    assert set(calls[2:]) == set(module.children())


@pytest.mark.parametrize("kind", ["forward", "pre", "global"])
def test_hooks_run(kind):
    """A hook on a child, or a global one, runs at inference and its result counts."""
    module = onnx2torch_rnn.convert(chain_model())
    x = _x()
    with torch.no_grad():
        before = module(x)  # the fast path first: a hook registered afterwards must still be seen
    child = list(module.children())[-1]  # Exp
    seen = []
    if kind == "forward":
        handle = child.register_forward_hook(lambda m, args, out: seen.append(m) or out * 2)
    elif kind == "pre":
        handle = child.register_forward_pre_hook(lambda m, args: seen.append(m) or (args[0] + 1,))
    else:
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, args, out: seen.append(m) or (out * 2 if m is child else out))
    try:
        with torch.no_grad():
            after = module(x)
    finally:
        handle.remove()
    assert child in seen
    expected = before * 2 if kind != "pre" else before * np.e
    torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(module(x), before, rtol=0, atol=0)  # hook removed: fast again, same numbers


def test_replaced_child_is_called():
    module = onnx2torch_rnn.convert(chain_model())
    x = _x()
    with torch.no_grad():
        before = module(x)
    name = [n for n, _ in module.named_children()][-1]
    setattr(module, name, torch.nn.Identity())
    with torch.no_grad():
        torch.testing.assert_close(module(x), torch.log(before), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["setattr", "dict", "to"])
def test_replaced_weights_are_read(how):
    """The namespace holds the parameters and buffers the graph reads: one replaced afterwards (an assignment, a
    write to the module's dict, ``.to()``) is the one the next call reads."""
    module = onnx2torch_rnn.convert(chain_model())
    x = _x()
    with torch.no_grad():
        module(x)
        assert _fast_state(module).namespace.w is module.w  # read without nn.Module.__getattr__
        w = torch.nn.Parameter(module.w * 2)
        if how == "setattr":
            module.w = w
        elif how == "dict":
            module._parameters["w"] = w
        else:
            module.to(torch.float64)
            x = x.double()
        torch.testing.assert_close(module(x), module.forward.__wrapped__(module, x), rtol=0, atol=0)
        assert _fast_state(module).namespace.w is module.w


def test_branches_take_it_and_see_hooks():
    """An If's branches are converted graphs of their own: fast too, and a hook inside a branch runs."""
    model = if_model(17)
    module = onnx2torch_rnn.convert(model)
    branches = [m for m in module.modules() if m is not module and executor.installed(m)]
    assert branches
    feeds = {"x": np.float32([1, 2, 3]), "bias": np.float32([0.5, 0.5, 0.5])}
    x, bias = (torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad():
        y = module(x, bias)
    np.testing.assert_allclose(y.numpy(), run_onnxruntime(model, feeds)[0], rtol=1e-6)
    taken = [b for b in branches if _fast_state(b) is not None]
    assert taken
    inner = next(iter(taken[0].children()))
    handle = inner.register_forward_hook(lambda m, args, out: out + 100)
    with torch.no_grad():
        torch.testing.assert_close(module(x, bias), y + 100)
    handle.remove()


def test_copies_and_pickles_keep_it(monkeypatch):
    """A deepcopy, an unpickled copy and the original after pickling (which recompiles it) take the fast path, with
    the same numbers and the meta to_onnx reads; a graph edit's recompile keeps it too."""
    module = onnx2torch_rnn.convert(chain_model())
    x = _x()
    with torch.no_grad():
        y = module(x)
        for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module)), module):
            assert executor.installed(other) and other.meta.keys() == module.meta.keys()
            other.__dict__.pop("_fast_state", None)
            torch.testing.assert_close(other(x), y, rtol=0, atol=0)
            assert _fast_state(other).namespace is not None
        module.recompile()
        assert executor.installed(module)


def test_training_and_tracing_keep_the_module_path():
    """With grad, the forward is fx's as written: backward hooks and gradients as torch gives them."""
    module = onnx2torch_rnn.convert(chain_model())
    x = _x().requires_grad_()
    grads = []
    child = next(iter(module.children()))
    child.register_full_backward_hook(lambda m, gi, go: grads.append(go))
    module(x).sum().backward()
    assert grads and x.grad is not None
    traced = torch.fx.symbolic_trace(module)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), module(x), rtol=0, atol=0)


def test_each_graph_has_its_own_code():
    """torch.compile caches compiled frames per code object and stops at 8: one shared wrapper would make the
    ninth model compiled in a process fail (fullgraph) where fx's per-graph code did not."""
    first, second = (onnx2torch_rnn.convert(chain_model()) for _ in range(2))
    assert type(first).forward.__code__ is not type(second).forward.__code__


def linear_norm_model():
    """Gemm (nn.Linear) then LayerNormalization (nn.LayerNorm), constant weights."""
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1),
             helper.make_node("LayerNormalization", ["g", "scale", "bias"], ["y"], axis=-1)]
    init = {"w": RNG.standard_normal((6, 4)).astype(np.float32), "c": RNG.standard_normal(6).astype(np.float32),
            "scale": RNG.standard_normal(6).astype(np.float32), "bias": RNG.standard_normal(6).astype(np.float32)}
    return make_model(nodes, [("x", np.float32, [2, 4])], ["y"], init, opset=17)


@pytest.mark.parametrize("how", ["setattr", "dict", "in place", "to"])
def test_direct_forwards_read_the_children_parameters(how):
    """nn.Linear and nn.LayerNorm children run their functional directly in the fast call (no bound forward),
    onnxruntime's numbers and fx's bit for bit, reading the child's parameters at each call (one replaced or
    changed afterwards counts); a hook on such a child still runs."""
    model = linear_norm_model()
    module = onnx2torch_rnn.convert(model)
    kinds = [type(child) for child in module.children()]
    assert kinds == [torch.nn.Linear, torch.nn.LayerNorm]
    linear, norm = module.children()
    x = _x()
    with torch.no_grad():
        fast = module(x)
        assert not hasattr(getattr(_fast_state(module).namespace, next(iter(module._modules))), "__self__")
        np.testing.assert_allclose(fast.numpy(), run_onnxruntime(model, {"x": x.numpy()})[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast, module.forward.__wrapped__(module, x), rtol=0, atol=0)
        if how == "setattr":
            linear.weight = torch.nn.Parameter(linear.weight * 2)
        elif how == "dict":
            norm._parameters["weight"] = torch.nn.Parameter(norm.weight * 3)
        elif how == "in place":
            linear.bias.add_(1)
        else:
            module.to(torch.float64)
            x = x.double()
        after = module(x)
        torch.testing.assert_close(after, module.forward.__wrapped__(module, x), rtol=0, atol=0)
        assert not torch.equal(after.float(), fast)
        handle = linear.register_forward_hook(lambda m, args, out: out * 0)
        try:
            torch.testing.assert_close(module(x), norm(torch.zeros_like(linear(x))), rtol=0, atol=0)
        finally:
            handle.remove()
