"""Recognised (fused) models on a CUDA GPU: the same numbers as onnxruntime on CPU, gradients on the GPU, and
torch.compile there; int8 models too. The GPU tests are skipped without one; the native kernel is CPU-only, so they
run the Python path (cuDNN's kernels on the fast path). Each case also runs on CPU, which checks the case itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnx2torch_rnn
from onnx2torch_rnn.checking import random_inputs, run_onnxruntime
from tests.helpers import recurrent_modules
from tests.recurrent_models import convert, inputs

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# the CPU runs check the cases themselves (feeds, reference), so that a GPU run only adds the device
DEVICES = ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)]
ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"


def _floats(rng, batch, time, features, zero_steps=False):
    x = rng.standard_normal((batch, time, features)).astype(np.float32)
    if zero_steps:  # Keras Masking: all-zero steps are masked, not only at the end
        x[:, 2] = 0
        x[0, -3:] = 0
    return x


# model -> feeds(rng, batch); each fused by recognition into recurrent modules (checked below)
CASES = {
    "examples/bilstm_tagger.onnx": lambda rng, n: {"tokens": rng.integers(0, 50, (n, 9))},
    "tests/models/torch/ts_packed_lstm_l2_unsorted_op19.onnx": lambda rng, n: {
        "x": _floats(rng, n, 8, 6), "lengths": rng.integers(1, 9, n)},
    "tests/models/torch/dynamo_rnn_relu_l2_bi_bf.onnx": lambda rng, n: {"x": _floats(rng, n, 5, 6)},
    "tests/models/keras/tf_keras_masking_gru.onnx": lambda rng, n: {"x": _floats(rng, n, 7, 5, zero_steps=True)},
    "tests/models/keras/keras3_gru_reset_before.onnx": lambda rng, n: {"x": _floats(rng, n, 7, 5)},
    "tests/models/keras/keras3_bi_lstm_concat.onnx": lambda rng, n: {"x": _floats(rng, n, 7, 5)},
    "tests/models/keras/keras3_embedding_mask_lstm.onnx": lambda rng, n: {
        "x": np.where(np.arange(7) < rng.integers(1, 8, (n, 1)), rng.integers(1, 12, (n, 7)), 0).astype(np.int32)},
    "tests/models/keras/tf_v1_bi_gru_cell.onnx": lambda rng, n: {"x:0": _floats(rng, n, 7, 5)},
    # unroll=True: a go_backwards LoopedRecurrent (Y in processing order), a Bidirectional (one layer), a stack
    "tests/models/keras/tf_keras_unrolled_lstm_go_backwards.onnx": lambda rng, n: {"x": _floats(rng, n, 6, 5)},
    "tests/models/keras/keras3_unrolled_bi_gru_concat.onnx": lambda rng, n: {"x": _floats(rng, n, 6, 5)},
    "tests/models/keras/keras3_unrolled_stacked.onnx": lambda rng, n: {"x": _floats(rng, n, 6, 5)},
    # torch's nn.LSTMCell called once (time_axis=None) and nn.GRUCell in a loop over x[:, t] (time_axis=1)
    "tests/models/torch_cells/ts_lstm_step.onnx": lambda rng, n: {
        "x": _floats(rng, n, 1, 6)[:, 0], "h": _floats(rng, n, 1, 8)[:, 0], "c": _floats(rng, n, 1, 8)[:, 0]},
    "tests/models/torch_cells/dynamo_gru_loop_bf.onnx": lambda rng, n: {
        "x": _floats(rng, n, 5, 6), "h": _floats(rng, n, 1, 8)[:, 0]},
}


@pytest.fixture
def cudnn_ieee():
    """cuDNN RNNs, convolutions and matmuls may use TF32 on Ampere and newer: compare in full float32 precision."""
    cudnn = torch.backends.cudnn
    previous = cudnn.rnn.fp32_precision, cudnn.conv.fp32_precision, torch.backends.cuda.matmul.allow_tf32
    cudnn.rnn.fp32_precision, cudnn.conv.fp32_precision, torch.backends.cuda.matmul.allow_tf32 = "ieee", "ieee", False
    yield
    cudnn.rnn.fp32_precision, cudnn.conv.fp32_precision, torch.backends.cuda.matmul.allow_tf32 = previous


def _expected(path: str, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(str(ROOT / path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _on(device: str, outputs) -> list[torch.Tensor]:
    outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    assert all(o.device.type == device for o in outputs)
    return list(outputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", CASES)
def test_fused_model_matches_onnxruntime(path, device, cudnn_ieee):
    module = onnx2torch_rnn.convert(ROOT / path).to(device)
    assert recurrent_modules(module), "recognition fused nothing"
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        feeds = CASES[path](rng, batch)
        outputs = _on(device, module(*(torch.from_numpy(v).to(device) for v in feeds.values())))
        for got, want in zip(outputs, _expected(path, feeds), strict=True):
            np.testing.assert_allclose(got.detach().cpu().numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", CASES)
def test_fused_model_trains(path, device, cudnn_ieee):
    module = onnx2torch_rnn.convert(ROOT / path).to(device).train()
    feeds = CASES[path](np.random.default_rng(1), 3)
    outputs = _on(device, module(*(torch.from_numpy(v).to(device) for v in feeds.values())))
    sum(o.float().square().mean() for o in outputs if o.is_floating_point()).backward()
    grads = [p.grad for p in module.parameters()]
    assert grads and all(g is not None and g.device.type == device for g in grads)
    assert any(bool(g.abs().sum() > 0) for g in grads)


# int8 models (tests/models/quantized), each kind of int8 op among them: on CUDA the Python path (the native int8
# kernel is CPU-only); its integer products are exact there too, with shapes torch's CUDA int8 GEMM refuses (a batch
# of 3, a recurrence's state) among them. Float ops between quantizers run in cuDNN's and cuBLAS's order of sums,
# so a quantizer fed a value within float32 rounding of a rounding boundary may land one step away: ONE_STEP is
# above every output step of these models (0.005 at most).
INT8_CASES = ["ts_crnn_op18_dyn_pt_s8.onnx", "ts_crnn_op18_qop_u8s8.onnx", "ts_crnn_op18_qdq_u8s8_pc.onnx",
              "ts_tagger_op17_dyn_pc_u8_rr.onnx", "ts_tagger_op17_qdq_u8s8.onnx", "ts_seq2seq_op16_qop_u8s8.onnx",
              "tf_keras_bi_lstm_concat_qop_u8s8.onnx", "ts_audio_gru_op19_qdq_u16s8.onnx",
              "small_cnn_qop_s8s8_pc.onnx", "shipped_like/voice_filter_dyn.onnx"]
ONE_STEP = 1e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", INT8_CASES)
def test_int8_model_matches_onnxruntime(name, device, cudnn_ieee):
    path = MODELS / "quantized" / name
    feeds = random_inputs(path, seed=0)
    module = onnx2torch_rnn.convert(path).to(device)
    with torch.no_grad():
        outputs = _on(device, module(*(torch.from_numpy(v).to(device) for v in feeds.values())))
    for got, want in zip(outputs, run_onnxruntime(path, feeds), strict=True):
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=0, atol=1e-6 if device == "cpu" else ONE_STEP)


# GPU images may carry an older torch than pyproject allows (an H200 image had 2.11, whose Dynamo traces neither a
# torch._check message naming a variable nor a module attribute holding Tensor.to): compiling needs a supported one
SUPPORTED_TORCH = pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
                                     reason="pyproject requires torch >= 2.13")


@NEEDS_CUDA
@SUPPORTED_TORCH
@pytest.mark.compile
@pytest.mark.parametrize("path", ["examples/bilstm_tagger.onnx", "tests/models/keras/tf_keras_masking_gru.onnx",
                                  "tests/models/torch/dynamo_rnn_relu_l2_bi_bf.onnx",
                                  "tests/models/keras/tf_keras_unrolled_lstm_go_backwards.onnx",
                                  "tests/models/torch_cells/ts_lstm_step.onnx"])
def test_fused_model_compiles_on_cuda(path, cudnn_ieee):
    module = onnx2torch_rnn.convert(ROOT / path).to("cuda")
    compiled = torch.compile(module, fullgraph=True)
    feeds = CASES[path](np.random.default_rng(2), 3)
    outputs = _on("cuda", compiled(*(torch.from_numpy(v).cuda() for v in feeds.values())))
    for got, want in zip(outputs, _expected(path, feeds), strict=True):
        np.testing.assert_allclose(got.detach().cpu().numpy(), want, rtol=1e-4, atol=1e-5)


@NEEDS_CUDA
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_exact_path_recurrence_never_waits_for_the_gpu(op, cudnn_ieee):
    """The cell loop's forward and backward run without one host synchronisation (torch raises on any under
    sync_debug_mode "error"): the CPU queues the steps while the GPU computes."""
    module = convert(op, "bidirectional", "exact").to("cuda").train()
    (x,) = (t.cuda() for t in inputs(3, 7, False))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outputs = module(x)
        sum(o.square().mean() for o in outputs).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(p.grad is not None for p in module.parameters())


@NEEDS_CUDA
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_exact_path_with_lengths_captures_in_a_cuda_graph(op, cudnn_ieee):
    """With sequence_lens the exact path still captures into one CUDA graph (the lengths' range check is asynchronous
    there), and replaying it computes what eager computes."""
    module = convert(op, "bidirectional", "exact", lens=True).to("cuda")
    x, lengths = (t.cuda() for t in inputs(3, 7, True))
    with torch.no_grad():
        expected = module(x, lengths)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            module(x, lengths)  # warm-up outside the capture, as CUDA graphs require
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = module(x, lengths)
        graph.replay()
    for got, want in zip(captured, expected, strict=True):
        torch.testing.assert_close(got, want)
