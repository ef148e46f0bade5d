"""GPU bench (issue 27): training steps and inference of converted recurrent models against the PyTorch modules they
were exported from, and of exact-path cells against cuDNN's plain cells, in float32 and under autocast.

    python bench/gpu.py                  # on a CUDA GPU (about 5 minutes; stops starting rows after --minutes)
    python bench/gpu.py --smoke          # tiny sizes on any device, a minute at most (tests/test_gpu_bench.py: CPU)
    bash scripts/device_check.sh         # the CUDA tests, then this bench: one table

Rows, each checked before it is timed (the converted model computes the original's numbers in float32):
- train: a training step (forward, MSE loss, backward, Adam step; float16 with a GradScaler) of ``Tagger`` (a 2-layer
  bidirectional nn.LSTM and a Linear, batch-first: what the fast path is for) exported by torch.onnx and converted,
  against the original module; batch 32/128 x sequence 64/256 x hidden 128/512/1024. Target <= 1.1x.
- cell train / cell infer: one exact-path ONNX node (LSTM with peepholes, GRU with linear_before_reset=0: no torch
  kernel computes them, so the cell loop runs a dozen small kernels per step) against nn.LSTM / nn.GRU of the same
  size (cuDNN); eagerly, and with the whole step captured in a CUDA graph (CUDA only: what removing the per-step
  launch cost gives, the fused-step candidate). Target <= 2x.
- infer: inference latency (eval, no_grad) at batch 1 and 32 of the tagger, converted against original.
- curve: 100 Adam steps of each bench model in bfloat16 / float16 autocast against float32 from the same start on
  the same data: the largest relative difference of the loss. Target <= 2%.
  The original Tagger's own curve is a row too: how far autocast moves a curve with no conversion at all.
- profile (CUDA only): CUDA kernels per call, their GPU time and the wall time per call of one case of each
  kind of miss (training step of a small tagger, exact-path cell inference and bfloat16 training).
Precisions: float32 (no TF32 anywhere: both sides of a row in the same precision), bfloat16 and float16 under
``torch.autocast`` (float16 on CUDA only: oneDNN refuses nn.LSTM under float16 autocast on CPU). Times are medians
over interleaved rounds (CUDA synchronised around each round). A row that fails (a CUDA graph capture, say) says
why; the run goes on, and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import onnx2torch_rnn  # noqa: E402  (the checkout's package, not an installed one)

TARGET_TRAIN, TARGET_CELL, TARGET_CURVE = 1.1, 2.0, 0.02
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Tagger(nn.Module):
    """The fast-path model: a 2-layer bidirectional LSTM over features (batch-first) and a Linear."""

    def __init__(self, hidden: int, outputs: int = 16):
        super().__init__()
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.classify = nn.Linear(2 * hidden, outputs)

    def forward(self, x):
        return self.classify(self.lstm(x)[0])


class Sizes:
    """The bench's sizes: (batch, steps, hidden) per section, the curve's steps."""

    def __init__(self, smoke: bool):
        if smoke:
            self.train = [(2, 5, 8), (3, 4, 8)]
            self.cells = [(2, 5, 8)]
            self.infer = [(1, 5, 8), (2, 5, 8)]
            self.curve, self.curve_steps = (4, 6, 8), 6
        else:
            self.train = [(b, t, h) for h in (128, 512, 1024) for b in (32, 128) for t in (64, 256)]
            self.cells = [(32, 64, 128), (32, 256, 512), (128, 64, 512), (128, 256, 1024), (32, 64, 1024)]
            self.infer = [(b, 64, h) for h in (256, 1024) for b in (1, 32)]
            self.curve, self.curve_steps = (32, 64, 256), 100


# ---------------------------------------------------------------------------------------------------------------
# Models

@functools.cache
def _exported(hidden: int) -> tuple[dict, bytes]:
    """The Tagger's weights and its ONNX model, exported by torch.onnx (TorchScript exporter, dynamic batch and
    time): once per size."""
    torch.manual_seed(0)
    original = Tagger(hidden).eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice, LSTM batch-size advice
        warnings.simplefilter("ignore")
        torch.onnx.export(original, (torch.randn(2, 3, hidden),), buffer, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "time"}, "y": {0: "batch", 1: "time"}})
    return original.state_dict(), buffer.getvalue()


def exported_tagger(hidden: int) -> tuple[nn.Module, nn.Module]:
    """(original, converted): a fresh Tagger and its export, converted."""
    weights, model = _exported(hidden)
    original = Tagger(hidden)
    original.load_state_dict(weights)
    return original, onnx2torch_rnn.convert(model)


def exact_cell(op: str, hidden: int) -> tuple[nn.Module, nn.Module]:
    """(cuDNN's plain cell, the converted exact-path node) of one size: LSTM with peepholes or GRU with
    linear_before_reset=0, X [T, N, H] -> Y."""
    generator = torch.Generator().manual_seed(0)
    gates = {"LSTM": 4, "GRU": 3}[op]

    def uniform(*shape):
        return ((torch.rand(shape, generator=generator) * 2 - 1) / hidden ** 0.5).numpy()

    weights = {"W": uniform(1, gates * hidden, hidden), "R": uniform(1, gates * hidden, hidden),
               "B": uniform(1, 2 * gates * hidden)}
    inputs, attributes = ["X", "W", "R", "B"], {"hidden_size": hidden}
    if op == "LSTM":
        weights["P"] = uniform(1, 3 * hidden)
        inputs += ["", "", "", "P"]
    else:
        attributes["linear_before_reset"] = 0
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["Y"], **attributes)], "cell",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["time", "batch", hidden])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["time", 1, "batch", hidden])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    converted = onnx2torch_rnn.convert(model)
    assert not any(isinstance(m, nn.RNNBase) for m in converted.modules()), "expected the exact path"
    torch.manual_seed(0)
    return (nn.LSTM if op == "LSTM" else nn.GRU)(hidden, hidden), converted  # cuDNN's cell on CUDA


def first_output(outputs) -> torch.Tensor:
    return outputs[0] if isinstance(outputs, tuple | list) else outputs


# ---------------------------------------------------------------------------------------------------------------
# Timing

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict[str, Callable[[], object]], device: torch.device, budget: float,
                rounds: int = 5) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns round by round (one untimed call
    first), each round about budget / rounds seconds."""
    per_call = {}
    for name, fn in fns.items():  # warm up, and learn how many calls fill a round
        fn()
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        per_call[name] = time.perf_counter() - start
    calls = {name: max(1, int(budget / rounds / len(fns) / max(t, 1e-6))) for name, t in per_call.items()}
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            synchronize(device)
            samples[name].append((time.perf_counter() - start) / calls[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def autocast(device: torch.device, precision: str, cache: bool = True):
    dtype = PRECISIONS[precision]
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None, cache_enabled=cache)


@contextlib.contextmanager
def full_float32():
    """No TF32 in cuDNN's RNNs and cuBLAS's products (the switches tests/test_devices.py sets): the whole bench runs
    so, the float32 rows' two sides in the same precision (by default cuDNN's RNNs may use TF32, cuBLAS not)."""
    saved = torch.backends.cudnn.rnn.fp32_precision, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.rnn.fp32_precision, torch.backends.cuda.matmul.allow_tf32 = "ieee", False
    try:
        yield
    finally:
        torch.backends.cudnn.rnn.fp32_precision, torch.backends.cuda.matmul.allow_tf32 = saved


def check_same(reference: nn.Module, converted: nn.Module, x: torch.Tensor, what: str) -> None:
    """The converted model computes the reference's numbers (in float32): else the timing means nothing."""
    with torch.no_grad():
        expected, actual = first_output(reference(x)), first_output(converted(x))
    actual = actual.reshape(expected.shape)  # a cell's Y [T, 1, N, H] against nn.LSTM's [T, N, H]
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def check_device(model: nn.Module, x: torch.Tensor, device: torch.device, what: str) -> None:
    """The model computes on the device what it computes on CPU (in float32)."""
    if device.type == "cpu":
        return
    with torch.no_grad():
        expected = first_output(model.to("cpu")(x))
        actual = first_output(model.to(device)(x.to(device))).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def train_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor, device: torch.device, precision: str,
               forward: Callable | None = None):
    """One step's closure: forward (under autocast), MSE loss, backward, Adam (float16: through a GradScaler)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    # float16: 2^10, not 2^16, as the first scale: the first steps' gradients stay finite (a skipped step would
    # shift the loss curve against float32's by one step)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 10) if precision == "float16" else None
    forward = forward or model

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision, cache=forward is model):
            y = first_output(forward(x))
        loss = nn.functional.mse_loss(y.float().reshape(target.shape), target)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.detach()
    return step


class _Holder(nn.Module):
    """The model inside a module of its own: make_graphed_callables replaces the forward of the module it is given,
    and the model itself must stay eager (the other variants, the other shapes)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)


def graphed_training(model: nn.Module, x: torch.Tensor, device: torch.device, precision: str) -> Callable:
    """The model's forward and backward captured in CUDA graphs for this x (torch.cuda.make_graphed_callables, whose
    graphs take the model's parameters as inputs; autocast needs its cache off there)."""
    with autocast(device, precision, cache=False):
        return torch.cuda.make_graphed_callables(_Holder(model), (x,))


def graphed_inference(model: nn.Module, x: torch.Tensor, device: torch.device, precision: str) -> Callable:
    """The model's inference captured in one CUDA graph, replayed on the same input."""
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad(), autocast(device, precision, cache=False):
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad(), autocast(device, precision, cache=False):
        model(static)
    return graph.replay


def with_compiled_steps(fn: Callable) -> Callable:
    """fn within onnx2torch_rnn.compiled_steps(): the exact path's step functions compiled (the fused-step candidate
    that needs no kernel of the library's own)."""
    def run(*args):
        # one graph per cell configuration, dtype, grad mode and shape regime: the bench's rows need more than
        # Dynamo's default 8 (past it a step would run eagerly, and the row would time that)
        torch._dynamo.config.recompile_limit = 512
        torch._dynamo.config.accumulated_recompile_limit = 4096
        with onnx2torch_rnn.compiled_steps():
            return fn(*args)
    return run


def inference(model: nn.Module, x: torch.Tensor, device: torch.device, precision: str) -> Callable:
    def run():
        with torch.no_grad(), autocast(device, precision):
            return model(x)
    return run


# ---------------------------------------------------------------------------------------------------------------
# Sections: each yields rows {section, case, precision, reference, ours (name, seconds), target}

class Build:
    """A function that the bench builds first (a CUDA graph capture: its failure is the row's, not the run's)."""

    def __init__(self, make: Callable[[], Callable]):
        self.make = make


def failure(error: Exception) -> str:
    return f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"


class Bench:
    def __init__(self, device: torch.device, sizes: Sizes, precisions: list[str], budget: float, minutes: float,
                 compiled_steps: bool = False):
        self.device, self.sizes, self.precisions, self.budget = device, sizes, precisions, budget
        self.compiled_steps = compiled_steps
        self.deadline = time.monotonic() + 60 * minutes
        self.rows: list[dict] = []

    def add(self, section: str, case: str, precision: str, reference: tuple[str, float | None],
            ours: tuple[str, float | None], target: float | None, note: str = "") -> None:
        row = {"section": section, "case": case, "precision": precision, "reference": reference, "ours": ours,
               "target": target, "note": note}
        self.rows.append(row)
        print(format_row(row), flush=True)

    def timed(self, section: str, case: str, precision: str, fns: dict[str, Callable], reference: str,
              target: float) -> None:
        """Time the functions (``Build(make)``: the function that make() returns) and add one row per function but
        the reference; a failure (building or timing) or the deadline is a row saying so."""
        if time.monotonic() > self.deadline:
            self.add(section, case, precision, (reference, None), ("-", None), target, "skipped: --minutes")
            return
        ready = {}
        for name, fn in fns.items():
            try:
                ready[name] = fn.make() if isinstance(fn, Build) else fn
            except Exception as error:  # the row says what failed; the run goes on, and fails at its end
                self.add(section, case, precision, (reference, None), (name, None), target, failure(error))
        try:
            times = interleaved(ready, self.device, self.budget)
        except Exception as error:
            self.add(section, case, precision, (reference, None), ("-", None), target, failure(error))
            return
        for name, seconds in times.items():
            if name != reference:
                self.add(section, case, precision, (reference, times.get(reference)), (name, seconds), target)

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(shape, device=self.device)

    def train(self) -> None:
        """Fast path: the converted Tagger's training step against the original module's."""
        for hidden in sorted({h for _, _, h in self.sizes.train}):
            original, converted = (m.to(self.device).train() for m in exported_tagger(hidden))
            check_same(original, converted, self.randn(2, 3, hidden), f"Tagger H{hidden}")
            for batch, steps, _ in [s for s in self.sizes.train if s[2] == hidden]:
                x, target = self.randn(batch, steps, hidden), self.randn(batch, steps, 16)
                for precision in self.precisions:
                    self.timed("train", f"Tagger H{hidden} T{steps} B{batch}", precision,
                               {"original": train_step(original, x, target, self.device, precision),
                                "converted": train_step(converted, x, target, self.device, precision)},
                               "original", TARGET_TRAIN)

    def cells(self) -> None:
        """Exact path: a training step and inference of the converted cell against cuDNN's plain cell."""
        for op in ("LSTM", "GRU"):
            for hidden in sorted({h for _, _, h in self.sizes.cells + self.sizes.infer}):
                cudnn, exact = (m.to(self.device).train() for m in exact_cell(op, hidden))
                check_device(exact, torch.randn(4, 3, hidden), self.device, f"{op} H{hidden}")
                name = f"{op} {'peepholes' if op == 'LSTM' else 'linear_before_reset=0'} H{hidden}"
                for batch, steps, _ in [s for s in self.sizes.cells if s[2] == hidden]:
                    x, target = self.randn(steps, batch, hidden), self.randn(steps, batch, hidden)
                    for precision in self.precisions:
                        fns = {f"nn.{op}": train_step(cudnn, x, target, self.device, precision),
                               "exact": train_step(exact, x, target, self.device, precision)}
                        if self.device.type == "cuda":
                            fns["exact CUDA graph"] = Build(lambda m=exact, x=x, target=target, p=precision: train_step(
                                m, x, target, self.device, p, graphed_training(m, x, self.device, p)))
                        if self.compiled_steps:
                            fns["exact compiled step"] = with_compiled_steps(
                                train_step(exact, x, target, self.device, precision))
                            if self.device.type == "cuda":
                                fns["exact compiled step CUDA graph"] = Build(
                                    lambda m=exact, x=x, target=target, p=precision: train_step(
                                        m, x, target, self.device, p,
                                        with_compiled_steps(graphed_training)(m, x, self.device, p)))
                        self.timed("cell train", f"{name} T{steps} B{batch}", precision, fns, f"nn.{op}",
                                   TARGET_CELL)
                for batch, steps, _ in [s for s in self.sizes.infer if s[2] == hidden]:
                    x = self.randn(steps, batch, hidden)
                    for precision in self.precisions:
                        fns = {f"nn.{op}": inference(cudnn, x, self.device, precision),
                               "exact": inference(exact, x, self.device, precision)}
                        if self.device.type == "cuda":
                            fns["exact CUDA graph"] = Build(lambda m=exact, x=x, p=precision: graphed_inference(
                                m, x, self.device, p))
                        if self.compiled_steps:
                            fns["exact compiled step"] = with_compiled_steps(
                                inference(exact, x, self.device, precision))
                            if self.device.type == "cuda":
                                fns["exact compiled step CUDA graph"] = Build(
                                    lambda m=exact, x=x, p=precision: with_compiled_steps(graphed_inference)(
                                        m, x, self.device, p))
                        self.timed("cell infer", f"{name} T{steps} B{batch}", precision, fns, f"nn.{op}",
                                   TARGET_CELL)

    def infer(self) -> None:
        """Fast path: inference latency of the converted Tagger against the original module."""
        for hidden in sorted({h for _, _, h in self.sizes.infer}):
            original, converted = (m.to(self.device).eval() for m in exported_tagger(hidden))
            for batch, steps, _ in [s for s in self.sizes.infer if s[2] == hidden]:
                x = self.randn(batch, steps, hidden)
                for precision in self.precisions:
                    self.timed("infer", f"Tagger H{hidden} T{steps} B{batch}", precision,
                               {"original": inference(original, x, self.device, precision),
                                "converted": inference(converted, x, self.device, precision)},
                               "original", TARGET_TRAIN)

    def curve(self) -> None:
        """Autocast's loss curve against float32's over the same steps from the same start."""
        batch, steps, hidden = self.sizes.curve
        models = {f"Tagger H{hidden} T{steps} B{batch}": lambda: exported_tagger(hidden)[1],
                  # the module it was exported from: how far autocast moves the curve without any conversion
                  f"Tagger original H{hidden} T{steps} B{batch}": lambda: exported_tagger(hidden)[0]}
        for op in ("LSTM", "GRU"):
            models[f"{op} exact H{hidden} T{steps} B{batch}"] = lambda op=op: exact_cell(op, hidden)[1]
        for case, make in models.items():
            if time.monotonic() > self.deadline:
                self.add("curve", case, "-", ("float32", None), ("-", None), TARGET_CURVE, "skipped: --minutes")
                continue
            x_shape = (batch, steps, hidden) if case.startswith("Tagger") else (steps, batch, hidden)
            generator = torch.Generator().manual_seed(0)
            x = torch.randn(x_shape, generator=generator).to(self.device)
            model = make().to(self.device).train()
            with torch.no_grad():
                target = torch.randn(first_output(model(x)).shape, generator=generator).to(self.device)
            start = {k: v.clone() for k, v in model.state_dict().items()}
            curves = {}
            for precision in self.precisions:
                model.load_state_dict(start)
                step = train_step(model, x, target, self.device, precision)
                curves[precision] = torch.stack([step() for _ in range(self.sizes.curve_steps)]).cpu()
            full = curves["float32"]
            for precision, losses in curves.items():
                if precision != "float32":
                    worst = ((losses - full).abs() / full).max().item()
                    self.add("curve", case, precision, ("float32", float(full[-1])), (precision, float(losses[-1])),
                             TARGET_CURVE, f"worst {worst:.2%}")


    def profile(self) -> None:
        """Where the misses go: CUDA kernels per call, their summed GPU time and the wall time per call, for one case
        of each kind (torch.profiler over a few calls after a warm-up). A call whose GPU time is far below its wall
        time is bound by launching kernels (the host), not by computing them."""
        if self.device.type != "cuda":
            return
        hidden = 128
        original, converted = (m.to(self.device).train() for m in exported_tagger(hidden))
        x, target = self.randn(32, 64, hidden), self.randn(32, 64, 16)
        self.profiled(f"train Tagger H{hidden} T64 B32", "float32",
                      {"original": train_step(original, x, target, self.device, "float32"),
                       "converted": train_step(converted, x, target, self.device, "float32")})
        for op, section, (batch, steps, hidden), precision in [("LSTM", "infer", (32, 64, 256), "float32"),
                                                               ("LSTM", "train", (32, 256, 512), "bfloat16")]:
            cudnn, exact = (m.to(self.device).train() for m in exact_cell(op, hidden))
            x, target = self.randn(steps, batch, hidden), self.randn(steps, batch, hidden)
            if section == "infer":
                fns = {f"nn.{op}": inference(cudnn, x, self.device, precision),
                       "exact": inference(exact, x, self.device, precision),
                       "exact CUDA graph": Build(lambda m=exact, x=x, p=precision: graphed_inference(
                           m, x, self.device, p))}
            else:
                fns = {f"nn.{op}": train_step(cudnn, x, target, self.device, precision),
                       "exact CUDA graph": Build(lambda m=exact, x=x, t=target, p=precision: train_step(
                           m, x, t, self.device, p, graphed_training(m, x, self.device, p)))}
            self.profiled(f"cell {section} {op} peepholes H{hidden} T{steps} B{batch}", precision, fns)

    def profiled(self, case: str, precision: str, fns: dict[str, Callable]) -> None:
        for name, fn in fns.items():
            try:
                kernels, gpu, wall = kernel_profile(fn.make() if isinstance(fn, Build) else fn, self.device)
            except Exception as error:
                self.add("profile", case, precision, (name, None), ("-", None), None, failure(error))
                continue
            self.add("profile", case, precision, (name, None), ("-", None), None,
                     f"{kernels:.0f} kernels/call, GPU {gpu * 1e3:.3f} ms of {wall * 1e3:.3f} ms wall "
                     f"({gpu / wall:.0%} busy)")


def kernel_profile(fn: Callable, device: torch.device, calls: int = 3) -> tuple[float, float, float]:
    """(CUDA kernels per call, their GPU seconds per call, wall seconds per call) over ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        wall = (time.perf_counter() - start) / calls
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu = sum(e.device_time for e in kernels) * 1e-6 / calls  # microseconds
    return len(kernels) / calls, gpu, wall


# ---------------------------------------------------------------------------------------------------------------
# The table

HEADER = ("| section | case | precision | reference | ours | ours/reference | target | note |\n"
          "|---|---|---|---|---|---|---|---|")


def _value(name: str, value: float | None, section: str) -> str:
    if value is None:
        return name
    return f"{name}: loss {value:.4g}" if section == "curve" else f"{name}: {value * 1e3:.3f} ms"


def _ratio(row: dict) -> tuple[str, bool]:
    """The row's ratio (the curve's: its worst relative difference) and whether it meets the target."""
    (_, reference), (_, ours), target = row["reference"], row["ours"], row["target"]
    if row["section"] == "curve":
        if ours is None:
            return "-", False
        worst = float(row["note"].split()[-1].rstrip("%")) / 100
        return f"{worst:.2%}", worst <= target
    if reference is None or ours is None or target is None:
        return "-", False
    ratio = ours / reference
    return f"{ratio:.2f}", ratio <= target


def format_row(row: dict) -> str:
    ratio, met = _ratio(row)
    target = ("-" if row["target"] is None else f"<= {row['target']:.0%}" if row["section"] == "curve"
              else f"<= {row['target']}")
    ratio = ratio if met or ratio == "-" else f"**{ratio}**"
    return (f"| {row['section']} | {row['case']} | {row['precision']} | "
            f"{_value(*row['reference'], row['section'])} | {_value(*row['ours'], row['section'])} | {ratio} | "
            f"{target} | {row['note']} |")


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        extra = f"cuDNN {torch.backends.cudnn.version()}, CUDA {torch.version.cuda}"
    else:
        name, extra = platform.processor() or platform.machine(), f"{torch.get_num_threads()} threads"
    return f"{name}; torch {torch.__version__}, {extra}; python {platform.python_version()}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves the bench runs, on any device")
    parser.add_argument("--sections", nargs="+", default=["train", "cells", "infer", "curve", "profile"],
                        choices=["train", "cells", "infer", "curve", "profile"])
    parser.add_argument("--precisions", nargs="+", default=None, choices=list(PRECISIONS),
                        help="default: all three on CUDA; float32 and bfloat16 on CPU (oneDNN's LSTM refuses float16 "
                             "autocast there, nn.LSTM's too)")
    parser.add_argument("--budget", type=float, default=None, help="seconds of timing per row")
    parser.add_argument("--minutes", type=float, default=6.0, help="start no row after this many minutes")
    parser.add_argument("--compiled-steps", action="store_true",
                        help="cells: also the exact path within onnx2torch_rnn.compiled_steps() (its steps compiled)")
    parser.add_argument("--tests", default="", help="the device tests' summary line, as the table's first row")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu.md")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    budget = args.budget if args.budget is not None else (0.02 if args.smoke else 0.6)
    precisions = args.precisions or (list(PRECISIONS) if device.type == "cuda" else ["float32", "bfloat16"])
    bench = Bench(device, Sizes(args.smoke), precisions, budget, args.minutes, args.compiled_steps)
    started = time.monotonic()
    print(f"device: {describe(device)}\n{HEADER}", flush=True)
    if args.tests:
        bench.add("tests", "scripts/device_check.sh's pytest run", "-", ("-", None), ("-", None), None, args.tests)
    with full_float32():
        for section in args.sections:
            try:
                getattr(bench, section)()
            except Exception as error:  # a model that does not export, convert or match: the section's row says so
                traceback.print_exc()
                bench.add(section, "(the section stopped)", "-", ("-", None), ("-", None), None, failure(error))
    failures = [r for r in bench.rows if r["note"].startswith("failed")]
    lines = [f"GPU bench (bench/gpu.py{' --smoke' if args.smoke else ''}), {time.strftime('%Y-%m-%d %H:%M')}, "
             f"{time.monotonic() - started:.0f} s; device: {describe(device)}", "", HEADER]
    lines += [format_row(r) for r in bench.rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\n{len(bench.rows)} rows, {len(failures)} failed, {time.monotonic() - started:.0f} s; wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
