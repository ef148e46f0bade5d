"""The native CPU kernel of the recurrent op: loaded once per process and registered as the op's CPU
implementation, in the variant this CPU runs best.

The kernel is compiled for several CPU variants (build.py: AVX-512, AVX2+FMA, baseline x86-64); ``load()`` picks the
best one this CPU supports, or the one ``ONNX2TORCH_RNN_CPU`` names, and loads, first found first:
- the prebuilt library of a wheel built with the kernel (setup.py), when it was built against the running torch;
- else a build on first use: the sources compiled with torch.utils.cpp_extension (ninja) into torch's extension
  cache, under a name that holds a hash of the sources, their folder, the flags and torch's version (another
  version of the sources never reuses a stale build).
The library registers itself on CPU for ``onnx2torch_rnn::recurrent``, ``onnx2torch_rnn::dynamic_quantize_lstm``
and the int8 helpers that modules/quantized.py calls in eager inference. Without either (no compiler), or with
``ONNX2TORCH_RNN_NATIVE=0``, nothing is registered, a warning says why once, and the ops run their Python
implementations (recurrent/runtime.py, modules/quantized.py), which compute the same numbers. ``variant()`` says
which variant runs and ``library()`` from where.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import warnings
from pathlib import Path

import torch

from . import build

logger = logging.getLogger(__name__)

FOLDER = Path(__file__).parent
FILES = tuple(FOLDER / name for name in (*build.SOURCES, *build.HEADERS))  # every file the build reads
ENVIRONMENT = "ONNX2TORCH_RNN_NATIVE"  # "0": never build or load the kernel (the Python implementation runs)
CPU_ENVIRONMENT = "ONNX2TORCH_RNN_CPU"  # a variant's name: run that one (the tests run each this CPU can)

_lock = threading.Lock()  # one attempt at a time


def enabled() -> bool:
    return os.environ.get(ENVIRONMENT, "1") != "0"


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (none elsewhere: only the baseline variant counts as safe)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")),
                set())


def supported() -> list[str]:
    """The variants this CPU runs, best first."""
    have = cpu_flags()
    return [name for name, (_, needs) in build.variants().items() if have.issuperset(needs)]


def chosen() -> str:
    """The variant to load: ONNX2TORCH_RNN_CPU's, else the best this CPU runs."""
    forced = os.environ.get(CPU_ENVIRONMENT, "")
    if not forced:
        return supported()[0]
    if forced not in build.variants():
        raise ValueError(f"{CPU_ENVIRONMENT}={forced}: not a kernel variant here (one of "
                         f"{', '.join(build.variants())})")
    if forced not in supported():
        raise ValueError(f"{CPU_ENVIRONMENT}={forced}: this CPU cannot run it (it runs {', '.join(supported())})")
    return forced


def _name(variant: str) -> str:
    digest = hashlib.sha256()
    for path in FILES:
        digest.update(path.read_bytes())
    # the sources' folder too: torch's build file names the source path, so two checkouts (or venvs) of the same
    # sources sharing one build folder would rebuild each time the other had built
    digest.update(" ".join([*build.flags(variant), torch.__version__, str(FOLDER)]).encode())
    return f"onnx2torch_rnn_kernel_{variant}_{digest.hexdigest()[:16]}"


def load() -> bool:
    """Load the kernel (building it the first time where no prebuilt one fits); False, with one warning, where
    that is not possible."""
    with _lock:
        return _attempt() is not None


@functools.cache  # one attempt per process: a library once loaded stays registered with torch
def _attempt() -> tuple[str, str] | None:
    """(variant, library path) of the loaded kernel, or None."""
    return _try_load()


def loaded() -> bool:
    """Whether the kernel is registered (never builds)."""
    return _attempt.cache_info().currsize == 1 and _attempt() is not None


def variant() -> str | None:
    """The variant that runs ("avx512", "avx2", "baseline"; "native" off x86), None where no kernel is loaded."""
    return _attempt()[0] if loaded() else None


def library() -> str | None:
    """The loaded library's path: inside the package for a wheel's prebuilt kernel, else torch's extension cache."""
    return _attempt()[1] if loaded() else None


def prebuilt(variant: str) -> Path:
    """Where a wheel's library of this variant for the running torch lies (setup.py builds it there)."""
    return FOLDER / f"{build.library_name(variant, torch.__version__)}.so"


def _try_load() -> tuple[str, str] | None:
    if not enabled():
        logger.info("native recurrent kernel disabled by %s=0", ENVIRONMENT)
        return None
    name = chosen()
    path = prebuilt(name)
    if path.exists():
        torch.ops.load_library(str(path))
        return name, str(path)
    try:
        from torch.utils import cpp_extension

        built = cpp_extension.load(_name(name), [str(FOLDER / source) for source in build.SOURCES],
                                   extra_cflags=build.flags(name), extra_ldflags=list(build.LINK_FLAGS),
                                   is_python_module=False, verbose=logger.isEnabledFor(logging.DEBUG))
    except Exception as error:  # no compiler, no ninja, a failed build: the Python implementation runs instead
        warnings.warn(f"onnx2torch_rnn: the native recurrent kernel could not be built ({type(error).__name__}: "
                      f"{str(error).strip().splitlines()[-1] if str(error).strip() else error}); recurrent nodes run "
                      f"the Python implementation (same numbers, slower). Set {ENVIRONMENT}=0 to skip the attempt.",
                      RuntimeWarning, stacklevel=3)
        return None
    return name, str(built)
