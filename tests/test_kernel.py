"""The native recurrent kernel against the Python recurrence (its reference), over random configurations; its
packed-weight cache (op.PACKS); its errors. The parametrised recurrent tests against onnxruntime run with the kernel
too (and CI runs them once more with ONNX2TORCH_RNN_NATIVE=0, for the Python path)."""

from __future__ import annotations

import fnmatch
import os
import random
import threading
import tomllib
from pathlib import Path

import pytest
import torch

from onnx2torch_rnn.recurrent import OnnxGRU, OnnxLSTM, kernel, op
from onnx2torch_rnn.recurrent.cells import CELLS, encode, make_config
from onnx2torch_rnn.recurrent.kernel import build
from onnx2torch_rnn.recurrent.runtime import recurrent

pytestmark = pytest.mark.skipif(not kernel.enabled(), reason=f"{kernel.ENVIRONMENT}=0: the Python path only")

ACTIVATIONS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
               "Elu", "Softsign", "Softplus"]
BOUNDED = ["Tanh", "Sigmoid", "HardSigmoid", "Softsign", "ScaledTanh"]  # for the gates: states stay finite


@pytest.fixture(autouse=True)
def native_kernel():
    """Every test here runs with the kernel registered: op.run falls back to the Python path silently otherwise,
    and the differential tests would compare that path with itself."""
    if not kernel.load() and not os.environ.get("CI"):
        pytest.skip("the native kernel could not be built here (see the warning)")


def test_kernel_is_built():
    """Where a compiler exists (CI: always), the kernel must build: a silent fallback would hide a broken build."""
    if os.environ.get("CI") or kernel.load():
        assert kernel.load(), "the native kernel did not build (see the warning)"


def test_build_name_is_per_sources_and_folder(tmp_path, monkeypatch):
    """Two checkouts of the same sources build apart: one build folder names one source path, and sharing it made
    each rebuild after the other."""
    name = kernel._name("baseline")
    copies = [tmp_path / path.name for path in kernel.FILES]
    for path, copy in zip(kernel.FILES, copies, strict=True):
        copy.write_bytes(path.read_bytes())
    monkeypatch.setattr(kernel, "FILES", copies)
    monkeypatch.setattr(kernel, "FOLDER", tmp_path)
    elsewhere = kernel._name("baseline")
    assert elsewhere != name
    copies[0].write_bytes(copies[0].read_bytes() + b"\n")
    assert kernel._name("baseline") not in (name, elsewhere, kernel._name("avx2"))


def test_the_loaded_variant_is_the_chosen_one():
    """variant() names what runs: ONNX2TORCH_RNN_CPU's variant (CI runs these tests under each this CPU can), else
    the best this CPU runs; library() the file it came from."""
    assert kernel.variant() == kernel.chosen()
    for library, _ in build.LIBRARIES:
        assert Path(kernel.library(library)).is_file()
        prebuilt = kernel.prebuilt(kernel.variant(), library)
        if prebuilt and prebuilt.exists():
            assert kernel.library(library) == str(prebuilt)


def test_a_prebuilt_library_loads_where_its_abi_does(monkeypatch):
    """A wheel's libraries (both on PyTorch's stable ABI) are named by the stable ABI they target and load in every
    torch from that one on (an older one builds them on first use)."""
    major, minor = build.STABLE_ABI
    for library in ("recurrent", "int8"):
        assert kernel.prebuilt("avx2", library).name == f"{library}_avx2_abi{major}_{minor}.so"
        monkeypatch.setattr(torch, "__version__", f"{major}.{minor + 1}.1+cu130")
        assert kernel.prebuilt("avx2", library).name == f"{library}_avx2_abi{major}_{minor}.so"
        monkeypatch.setattr(torch, "__version__", f"{major}.{minor - 1}.0")
        assert kernel.prebuilt("avx2", library) is None
        monkeypatch.undo()
    assert build.flags("avx2")[-1] == f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000"


AVX512 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni"}
AVX2 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}


@pytest.mark.skipif("baseline" not in build.variants(), reason="the x86-64 variants")
@pytest.mark.parametrize("flags, runs", [(AVX512 | AVX2 | {"sse2"}, ["avx512", "avx2", "baseline"]),
                                         (AVX2, ["avx2", "baseline"]), ((AVX512 | AVX2) - {"fma"}, ["baseline"]),
                                         (AVX512, ["baseline"]), (set(), ["baseline"]),
                                         ((AVX512 | AVX2) - {"avx512_vnni"}, ["avx2", "baseline"])])
def test_variants_follow_the_cpu(monkeypatch, flags, runs):
    monkeypatch.setattr(kernel, "cpu_flags", lambda: flags)
    monkeypatch.delenv(kernel.CPU_ENVIRONMENT, raising=False)
    assert kernel.supported() == runs
    assert kernel.chosen() == runs[0]
    monkeypatch.setenv(kernel.CPU_ENVIRONMENT, "baseline")
    assert kernel.chosen() == "baseline"
    for forced, message in (("avx512", "this CPU cannot run it"), ("sse9", "not a kernel variant")):
        if forced not in runs:
            monkeypatch.setenv(kernel.CPU_ENVIRONMENT, forced)
            with pytest.raises(ValueError, match=message):
                kernel.chosen()


def random_case(rng: random.Random):
    """A random node configuration and inputs: every cell, direction, layout and activation, lengths (0 and T
    included) or a mask, initial states, peepholes, clip, sizes down to hidden 1, batch 0 and T = 0."""
    cell = CELLS[rng.choice(list(CELLS))]
    direction = rng.choice(["forward", "reverse", "bidirectional"])
    directions, gates, roles = (2 if direction == "bidirectional" else 1), cell.gates, len(cell.default_activations)
    hidden, size, steps, batch = (rng.choice(v) for v in ([1, 3, 16, 17, 40], [1, 5, 16], [0, 1, 4, 7],
                                                            [0, 1, 3, 5, 9]))
    layout = rng.choice([0, 1])
    dtype = rng.choice([torch.float32, torch.float64])
    attributes = {}
    if cell.op_type == "GRU":
        attributes["linear_before_reset"] = rng.choice([0, 1])
    if rng.random() < 0.3:
        attributes["clip"] = 1.5
    if cell.op_type == "LSTM" and rng.random() < 0.3:
        attributes["input_forget"] = 1
    if rng.random() < 0.4:
        attributes["activations"] = [rng.choice(BOUNDED if k % roles == 0 else ACTIVATIONS)
                                     for k in range(roles * directions)]
        attributes["activation_alpha"] = [rng.uniform(0.1, 1) for _ in range(6)]
        attributes["activation_beta"] = [rng.uniform(0.1, 1) for _ in range(6)]
    masked = rng.random() < 0.2
    cfg = make_config(cell, direction=direction, layout=layout,
                      mask_output=rng.choice(["zero", "hold"]) if masked else None, **attributes)
    generator = torch.Generator().manual_seed(rng.randrange(2**31))

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator, dtype=dtype) * scale

    weights = {"W": rand(directions, gates * hidden, size, scale=0.3), "R": rand(directions, gates * hidden, hidden,
                                                                                scale=0.3)}
    if rng.random() < 0.7:
        weights["B"] = rand(directions, 2 * gates * hidden)
    if cell.op_type == "LSTM" and rng.random() < 0.3:
        weights["P"] = rand(directions, 3 * hidden)
    X = rand(*((batch, steps, size) if layout else (steps, batch, size)))
    state = (batch, directions, hidden) if layout else (directions, batch, hidden)
    inputs = {"initial_h": rand(*state) if rng.random() < 0.5 else None,
              "initial_c": rand(*state) if cell.op_type == "LSTM" and rng.random() < 0.5 else None,
              "sequence_lens": None, "mask": None}
    if masked:
        inputs["mask"] = torch.rand(*X.shape[:2], generator=generator) < 0.7
    elif rng.random() < 0.4:
        inputs["sequence_lens"] = torch.randint(0, steps + 1, (batch,), generator=generator, dtype=torch.int32)
    return cell, cfg, X, weights, inputs


@pytest.mark.parametrize("seed", range(40))
def test_kernel_matches_python(seed):
    rng = random.Random(seed)
    for _ in range(10):
        cell, cfg, X, weights, inputs = random_case(rng)
        expected = recurrent(cell, cfg, X, **weights, **inputs)
        got = op.run(X, list(weights.values()), encode(cell, cfg, "".join(weights)), inputs["sequence_lens"],
                     inputs["initial_h"], inputs["initial_c"], inputs["mask"])
        tolerance = {"rtol": 1e-4, "atol": 1e-5} if X.dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
        for want, have in zip(expected, got, strict=True):
            assert (want is None) == (have is None)
            if want is not None:
                torch.testing.assert_close(have, want, **tolerance, msg=lambda m, c=cfg: f"{c}: {m}")


def threaded_case(op_type, attributes, direction, hidden=160, size=96, steps=12, batch=9, seed=""):
    """A node large enough for the kernel to share its work among threads, with random lengths."""
    rng = random.Random(f"{op_type}{attributes}{direction}{hidden}{seed}")
    cell = CELLS[op_type]
    directions = 2 if direction == "bidirectional" else 1
    cfg = make_config(cell, direction=direction, **attributes)
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    weights = [torch.randn(directions, cell.gates * hidden, n, generator=generator) / n**0.5 for n in (size, hidden)]
    X = torch.randn(steps, batch, size, generator=generator)
    lens = torch.tensor([rng.randint(0, steps) for _ in range(batch)], dtype=torch.int32)
    return cell, cfg, X, weights, lens


def run_threaded(cell, cfg, X, weights, lens, threads=2):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return op.run(X, weights, encode(cell, cfg, "WR"), lens, None, None, None)
    finally:
        torch.set_num_threads(before)


def assert_same(got, expected):
    for want, have in zip(expected, got, strict=True):
        if want is not None:
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden, threads", [(160, 2), (600, 2), (160, 3)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op_type, attributes", [("LSTM", {}), ("GRU", {"linear_before_reset": 0}),
                                                 ("GRU", {"linear_before_reset": 1}), ("RNN", {})])
def test_threaded_paths_match_python(op_type, attributes, direction, hidden, threads):
    """Sizes large enough for the kernel to share work among threads: both directions at once, or one direction's
    hidden blocks in the input projection and in every step (random lengths). Hidden 600: one direction's weights
    pass half of a 2 MiB L2, so a bidirectional node shares blocks, direction by direction. 3 threads: 10 blocks
    in uneven ranges."""
    cell, cfg, X, weights, lens = threaded_case(op_type, attributes, direction, hidden)
    assert_same(run_threaded(cell, cfg, X, weights, lens, threads),
                recurrent(cell, cfg, X, *weights, sequence_lens=lens))


def test_two_python_threads_at_once():
    """Two threads of the caller's own, each running its own node over and over at 2 torch threads (one of them
    gets the kernel's workers, the other runs alone, turn by turn), get their own numbers."""
    cases = [threaded_case("LSTM", {}, "bidirectional", seed=1), threaded_case("GRU", {}, "forward")]
    expected = [recurrent(cell, cfg, X, *weights, sequence_lens=lens) for cell, cfg, X, weights, lens in cases]
    results: dict[int, list] = {0: [], 1: []}

    def work(k):
        for _ in range(30):
            results[k].append(run_threaded(*cases[k]))

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in (0, 1):
        assert len(results[k]) == 30
        for got in results[k]:
            assert_same(got, expected[k])


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/task").is_dir(), reason="counts /proc's threads")
def test_a_small_node_starts_no_worker():
    """At 2 threads a node of the bundled tagger's size at batch 1 (1-2 * 10^5 multiply-adds a direction) runs on
    the calling thread alone: waking a worker would cost more than it saves, and on a busy machine a worker the OS
    does not run held a whole direction (recurrent.cpp, kJobWork). Counted in a forked child, whose kernel has no
    worker yet; a large node there starts one."""
    cases = [threaded_case("LSTM", {}, "bidirectional", hidden=32, size=64, steps=16, batch=1),
             threaded_case("LSTM", {}, "bidirectional")]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: reports how many threads each call added, then leaves without pytest's clean-up
        try:
            added = []
            for case in cases:
                before = len(os.listdir("/proc/self/task"))
                run_threaded(*case)
                added.append(len(os.listdir("/proc/self/task")) - before)
            os.write(write, bytes(added))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        added = list(pipe.read())
    os.waitpid(pid, 0)
    assert added == [0, 1]


class _Node(torch.utils.data.Dataset):
    """Item k runs the node at k + 1 threads in the worker (the inputs made at the worker's own 1 thread)."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return run_threaded(*threaded_case("LSTM", {}, "forward"), threads=index + 1)[0]


def test_dataloader_worker():
    """Inside a DataLoader worker forked after the kernel's threads have run: at 1 thread (what the DataLoader
    sets) and at 2 (the child has none of its parent's threads: the kernel starts its own anew)."""
    expected = run_threaded(*threaded_case("LSTM", {}, "forward"))[0]
    loader = torch.utils.data.DataLoader(_Node(), num_workers=1, multiprocessing_context="fork", batch_size=None)
    results = list(loader)
    assert len(results) == 2
    for got in results:
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def lstm(hidden=4, size=3, **kwargs):
    torch.manual_seed(0)
    return OnnxLSTM(hidden_size=hidden, W=torch.randn(1, 4 * hidden, size), R=torch.randn(1, 4 * hidden, hidden),
                    B=torch.randn(1, 8 * hidden), **kwargs)


@pytest.mark.parametrize("path", ["fast", "exact"])
def test_weights_changed_in_place_are_repacked(path):
    """The kernel packs weights once per version: an optimizer step (in place) must be seen at the next call."""
    module = lstm(clip=None if path == "fast" else 5.0)
    assert module.fast == (path == "fast")
    X = torch.randn(6, 2, 3)
    with torch.no_grad():
        before = module(X)[0].clone()
        for p in module.parameters():
            p.mul_(0.5)
        after = module(X)[0]
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, recurrent(module.cell, module.config, X, **python_weights(module))[0])


def test_new_weight_tensors_are_repacked():
    module = lstm(clip=5.0)
    X = torch.randn(6, 2, 3)
    with torch.no_grad():
        first = module(X)[0].clone()
        module.R = torch.nn.Parameter(torch.randn_like(module.R))
        torch.testing.assert_close(module(X)[0], recurrent(module.cell, module.config, X,
                                                            **python_weights(module))[0])
        assert not torch.allclose(first, module(X)[0])


def test_inference_mode_weights():
    """Tensors made under torch.inference_mode have no version counter: they are packed at every call."""
    with torch.inference_mode():
        module = lstm(clip=5.0)
        X = torch.randn(6, 2, 3)
        first = module(X)[0].clone()
        module.W.mul_(2)
        torch.testing.assert_close(module(X)[0], recurrent(module.cell, module.config, X,
                                                            **python_weights(module))[0])
        assert not torch.allclose(first, module(X)[0])


def test_packed_weights_are_cached_per_version_and_forgotten_with_their_tensors(monkeypatch):
    """op.PACKS (the op's CPU implementation: compiled and exported programs) packs a node's weights once per version
    and holds them weakly: an entry leaves with its tensors (a later tensor may get a freed one's id, and must not
    get its packed weights). A module's eager calls pack once per version too, into the module's own op.Kept."""
    packs = []
    pack = op._PACK
    monkeypatch.setattr(op, "_PACK", lambda *args: packs.append(args[1]) or pack(*args))
    module, X = lstm(clip=5.0), torch.randn(6, 2, 3)

    def through_the_op(m):
        return op._RECURRENT(X, [m.W, m.R, m.B], m.op_config, None, None, None, None)

    with torch.no_grad():
        for call in (through_the_op, lambda m: m(X)):
            packs.clear()
            for _ in range(3):
                call(module)
            assert len(packs) == 1
            module.R.mul_(0.5)
            call(module)
            assert len(packs) == 2
    keys = [key for key in op.PACKS._entries if id(module.R) in key]
    assert len(keys) == 1
    del module
    assert not any(key in op.PACKS._entries for key in keys)


def test_a_stack_is_packed_once_per_version(monkeypatch):
    """A StackedRecurrent packs its layers once (op.Kept), and all of them again only when a weight changes in place
    (an optimizer step, load_state_dict) or is replaced; the numbers are then the new weights' (torch's path, with
    grad)."""
    import onnx2torch_rnn  # the bundled tagger: a 2-layer bidirectional LSTM stack

    packs = []
    pack = op._PACK
    monkeypatch.setattr(op, "_PACK", lambda *args: packs.append(args[1]) or pack(*args))
    path = Path(__file__).resolve().parents[1] / "examples" / "bilstm_tagger.onnx"
    module, other = onnx2torch_rnn.convert(path), onnx2torch_rnn.convert(path)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    tokens = torch.randint(0, 50, (2, 9))
    layers = module.lstm_LSTM.layers
    with torch.no_grad():
        module(tokens)
    for packed, change in ((0, lambda: None), (2, lambda: layers[1].rnn.weight_hh_l0.detach().mul_(0.5)),
                           (2, lambda: setattr(layers[0].rnn, "weight_ih_l0",
                                               torch.nn.Parameter(layers[0].rnn.weight_ih_l0 * 2))),
                           (2, lambda: module.load_state_dict(other.state_dict()))):
        change()
        packs.clear()
        with torch.no_grad():
            got = [module(tokens) for _ in range(3)]
        assert len(packs) == packed  # every layer once, on the first call
        torch.testing.assert_close(got[-1], module(tokens).detach())
    torch.testing.assert_close(got[-1], other(tokens).detach())


def test_frozen_layers_pass_the_gradient_to_their_input():
    """Weights that need no gradient but an input that does (a frozen recurrent layer under a trained embedding):
    the path autograd differentiates runs, not the native kernel's ops, which have no derivative."""
    import onnx2torch_rnn

    module = onnx2torch_rnn.convert(Path(__file__).resolve().parents[1] / "examples" / "bilstm_tagger.onnx")
    module.requires_grad_(False)
    stack = module.lstm_LSTM
    x = torch.randn(2, 5, 16, requires_grad=True)
    for run in (lambda: stack(x), lambda: stack.layers[0](x.transpose(0, 1))):
        x.grad = None
        run().sum().backward()
        expected = torch.autograd.grad(run().sum(), x)[0]  # the same call again: a gradient, not None
        assert x.grad is not None and x.grad.abs().sum() > 0
        torch.testing.assert_close(x.grad, expected)


def python_weights(module) -> dict:
    if module.fast:
        return {"W": None, "R": None, "torch_weights": module._fast_weights()}
    return {k: getattr(module, k) for k in "WRBP"}


BAD_INPUTS = {  # the messages of recurrent/validation.py
    "rank": ({"X": torch.randn(6, 3)}, "X must have 3 dimensions, got shape [6, 3]"),
    "features": ({"X": torch.randn(6, 2, 5)}, "X must have shape [6, 2, 3], got [6, 2, 5]"),
    "initial_h": ({"initial_h": torch.randn(1, 3, 4)}, "initial_h must have shape [1, 2, 4], got [1, 3, 4]"),
    "initial_c": ({"initial_c": torch.randn(2, 2, 4)}, "initial_c must have shape [1, 2, 4], got [2, 2, 4]"),
    "lens shape": ({"sequence_lens": torch.tensor([6, 6, 6])}, "sequence_lens must have shape [2], got [3]"),
    "lens range": ({"sequence_lens": torch.tensor([7, 1])}, "sequence_lens values must lie in [0, 6] (the sequence "
                                                            "length of X), got [7, 1]"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("path", ["fast", "exact"])
def test_errors_match_the_python_path(case, path):
    module = lstm(clip=None if path == "fast" else 5.0)
    given, message = BAD_INPUTS[case]
    args = {"X": torch.randn(6, 2, 3), **given}
    with torch.no_grad(), pytest.raises(ValueError) as native:
        module(**args)
    with pytest.raises(ValueError) as python:  # the Python path (autograd)
        module(**args)
    assert str(native.value).splitlines()[0] == str(python.value) == message


def test_gru_batch_zero_and_empty_sequence():
    module = OnnxGRU(hidden_size=3, W=torch.randn(1, 9, 2), R=torch.randn(1, 9, 3), linear_before_reset=1)
    with torch.no_grad():
        y, y_h = module(torch.randn(0, 4, 2), initial_h=torch.randn(1, 4, 3))
        assert y.shape == (0, 1, 4, 3) and torch.equal(y_h, torch.zeros(1, 4, 3))  # onnxruntime: zero states
        y, y_h = module(torch.randn(5, 0, 2))
        assert y.shape == (5, 1, 0, 3) and y_h.shape == (1, 0, 3)


def test_config_of_a_program_saved_before_hidden_size():
    """Programs exported earlier carry op configs without the hidden_size key: both implementations still run them."""
    module = lstm(clip=5.0)
    X = torch.randn(6, 2, 3)
    weights = [module.W, module.R, module.B]
    old = ";".join(item for item in module.op_config.split(";") if not item.startswith("hidden_size="))
    with torch.no_grad():
        expected = op.run(X, weights, module.op_config)
        for got in (op.run(X, weights, old), op._python_impl(X, weights, old, None, None, None, None)):
            for want, have in zip(expected, got, strict=False):
                if want is not None:
                    torch.testing.assert_close(have, want)


def test_wheel_carries_the_kernel_sources():
    """pyproject's package data covers every source the build reads: an installed package builds the kernel too."""
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["onnx2torch_rnn.recurrent.kernel"]
    for path in kernel.FILES:
        assert any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns), path.name
