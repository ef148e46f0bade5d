"""Fine-tuning converted recurrent models: the loss goes down (eager and compiled), state_dict round trip,
.to(dtype) / .to(device), train() / eval()."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from onnx import helper

import onnx2torch_rnn
from tests.helpers import make_model
from tests.recurrent_models import OPS, PATHS, SUBSET, assert_same, convert, inputs

CASES = [(op, path) for op in OPS for path in PATHS]


def loss_of(outputs, targets) -> torch.Tensor:
    return sum(torch.nn.functional.mse_loss(o, t) for o, t in zip(outputs, targets, strict=True))


def fine_tune(model, trained, args, steps: int, lr: float = 0.05) -> list[float]:
    """Adam on ``trained``'s parameters, fitting ``model``'s (Y, Y_h) to those of the same node with other weights
    (a target the model can reach); the losses."""
    op, direction, path, lens = model_case(trained)
    with torch.no_grad():
        targets = convert(op, direction, path, lens, seed=1)(*args)[:2]
    optimizer = torch.optim.Adam(trained.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model(*args)[:2], targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def model_case(gm) -> tuple:
    """(op, direction, path, lens) of a model made by tests.recurrent_models.convert."""
    (module,) = [m for m in gm.modules() if hasattr(m, "cell")]
    return (module.cell.op_type, module.config.direction, "fast" if module.fast else "exact",
            "sequence_lens" in [n.target for n in gm.graph.nodes if n.op == "placeholder"])


@pytest.mark.parametrize("op, path", CASES)
def test_fine_tuning_lowers_the_loss(op, path):
    gm = convert(op, "bidirectional", path, lens=True).train()
    losses = fine_tune(gm, gm, inputs(4, 6, True), steps=30)
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gm.parameters())


@pytest.mark.compile
@pytest.mark.parametrize("op, path", [pytest.param(*case, marks=() if case in (("LSTM", "fast"), ("GRU", "exact"))
                                                   else pytest.mark.slow) for case in CASES])
def test_fine_tuning_through_torch_compile(op, path):
    """The compiled module trains like the eager one: same first gradients, the loss goes down."""
    torch._dynamo.reset()
    gm = convert(op, "bidirectional", path, lens=True).train()
    args = inputs(4, 6, True)
    compiled = torch.compile(gm, fullgraph=True, backend="aot_eager")
    grads = []
    for model in (gm, compiled):
        gm.zero_grad()
        sum(o.square().mean() for o in model(*args)[:2]).backward()
        grads.append([p.grad.clone() for p in gm.parameters()])
    assert_same(grads[1], grads[0])
    losses = fine_tune(compiled, gm, args, steps=15)
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.compile
@pytest.mark.parametrize("op", [pytest.param(op, marks=() if op == "LSTM" else pytest.mark.slow) for op in OPS])
def test_compiled_steps_train_like_the_eager_steps(op, monkeypatch):
    """Within compiled_steps the exact path's cell loop runs the compiled step function (a spy sees it), and gives
    the eager loop's outputs and gradients, which match onnxruntime (tests.recurrent_models)."""
    from onnx2torch_rnn.recurrent import runtime

    compiled = []
    monkeypatch.setattr(runtime, "_compiled", lambda step: compiled.append(step) or runtime.torch.compile(step))
    gm = convert(op, "bidirectional", "exact", lens=True).train()
    args = inputs(4, 6, True)
    results = []
    for context in (contextlib.nullcontext(), onnx2torch_rnn.compiled_steps()):
        gm.zero_grad()
        with context:
            outputs = gm(*args)[:2]
        sum(o.square().mean() for o in outputs).backward()
        results.append([*(o.detach() for o in outputs), *(p.grad.clone() for p in gm.parameters())])
    assert compiled and all(step is compiled[0] for step in compiled), compiled  # the cell's own step, every step
    assert_same(results[1], results[0], rtol=1e-5, atol=1e-6)
    with onnx2torch_rnn.compiled_steps(False):  # nested: off again
        count = len(compiled)
        gm(*args)
        assert len(compiled) == count


@pytest.mark.parametrize("path", PATHS)
def test_state_dict_round_trip(path):
    trained = convert("LSTM", "reverse", path, lens=True).train()
    args = inputs(3, 5, True)
    fine_tune(trained, trained, args, steps=3)
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    fresh = convert("LSTM", "reverse", path, lens=True)
    assert list(fresh.state_dict()) == list(trained.state_dict())
    with pytest.raises(AssertionError):  # the training changed the weights
        assert_same(fresh(*args), trained(*args))
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer))
    assert_same(fresh(*args), trained(*args))


@pytest.mark.parametrize("op, direction, path, lens", SUBSET)
def test_to_float64(op, direction, path, lens):
    gm = convert(op, direction, path, lens)
    args = inputs(3, 5, lens)
    expected = gm(*args)
    gm.double()
    assert all(p.dtype == torch.float64 for p in gm.parameters())
    outputs = gm(args[0].double(), *args[1:])
    assert all(o.dtype == torch.float64 for o in outputs)
    assert_same(outputs, tuple(e.double() for e in expected))


def test_to_device_cpu():
    gm = convert("GRU", "forward", "fast", lens=True)
    args = inputs(2, 4, True)
    expected = gm(*args)
    assert_same(gm.to("cpu")(*args), expected)
    assert all(p.device.type == "cpu" for p in gm.parameters())


@pytest.fixture
def cudnn_ieee():
    """cuDNN RNNs use TF32 by default on Ampere and newer: compare in full float32 precision."""
    previous = torch.backends.cudnn.rnn.fp32_precision
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    yield
    torch.backends.cudnn.rnn.fp32_precision = previous


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("op, direction, path, lens", SUBSET)
def test_cuda_matches_cpu(op, direction, path, lens, cudnn_ieee):
    gm = convert(op, direction, path, lens)
    args = inputs(5, 9, lens)
    expected = gm(*args)
    gm.to("cuda")
    outputs = gm(*(a.cuda() for a in args))
    assert all(o.device.type == "cuda" for o in outputs)
    assert_same(tuple(o.cpu() for o in outputs), expected)
    sum(o.square().mean() for o in outputs[:2]).backward()  # gradients on the GPU too
    assert all(p.grad is not None and p.grad.device.type == "cuda" for p in gm.parameters())


def test_train_and_eval_give_the_same_numbers():
    """ONNX Dropout is inference-only (training_mode is an input of the node, not the module's mode): train() must
    not switch dropout on, and eval() must not change anything."""
    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((1, 16, 3)).astype(np.float32),
               "R": rng.standard_normal((1, 16, 4)).astype(np.float32)}
    nodes = [helper.make_node("Dropout", ["X", "ratio"], ["dropped"]),
             helper.make_node("LSTM", ["dropped", "W", "R"], ["Y"], hidden_size=4)]
    model = make_model(nodes, [("X", np.float32, ["T", "N", 3])], ["Y"],
                       {**weights, "ratio": np.array(0.5, np.float32)}, opset=14)
    gm = onnx2torch_rnn.convert(model)
    assert not gm.training  # converted models start in eval mode
    x = torch.randn(5, 2, 3)
    expected = gm(x)
    gm.train()
    assert all(module.training for module in gm.modules())
    assert_same(gm(x), expected)
    assert_same(gm(x), expected)
    assert_same(gm.eval()(x), expected)
