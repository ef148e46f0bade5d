"""The native CPU kernel of the recurrent op: built on first use, cached, and registered as the op's CPU
implementation.

``load()`` compiles the kernel's sources (recurrent.cpp; the int8 ops in dynamic_quantize_lstm.cpp and
quantized_ops.cpp) with torch.utils.cpp_extension (ninja, optimised for this CPU) into torch's extension cache, under
a name that holds a hash of the sources, their folder and the flags (another version of the sources never reuses a
stale build), and loads it; the library registers itself on CPU for ``onnx2torch_rnn::recurrent``,
``onnx2torch_rnn::dynamic_quantize_lstm`` and the int8 helpers that modules/quantized.py calls in eager inference.
Without a compiler (or with ``ONNX2TORCH_RNN_NATIVE=0``) nothing is registered, a warning says why once, and the ops
run their Python implementations (recurrent/runtime.py, modules/quantized.py), which compute the same numbers.
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

logger = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("recurrent.cpp", "dynamic_quantize_lstm.cpp",
                                                              "quantized_ops.cpp", "config.h", "vec.h", "int8.h"))
COMPILED = tuple(path for path in SOURCES if path.suffix == ".cpp")
# -fopenmp: at::parallel_for is inline OpenMP code, serial without it; the OpenMP runtime it binds to at load time
# is the libgomp.so.1 torch has already loaded (same soname), so there is one thread pool.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp")
ENVIRONMENT = "ONNX2TORCH_RNN_NATIVE"  # "0": never build or load the kernel (the Python implementation runs)

_lock = threading.Lock()  # one attempt at a time


def enabled() -> bool:
    return os.environ.get(ENVIRONMENT, "1") != "0"


def _name() -> str:
    digest = hashlib.sha256()
    for path in SOURCES:
        digest.update(path.read_bytes())
    # the sources' folder too: torch's build file names the source path, so two checkouts (or venvs) of the same
    # sources sharing one build folder would rebuild each time the other had built
    digest.update(" ".join([*FLAGS, torch.__version__, str(SOURCES[0].parent)]).encode())
    return f"onnx2torch_rnn_kernel_{digest.hexdigest()[:16]}"


def load() -> bool:
    """Build (first time only) and load the kernel; False, with one warning, where that is not possible."""
    with _lock:
        return _attempt()


@functools.cache  # one attempt per process: a library once loaded stays registered with torch
def _attempt() -> bool:
    return _try_load()


def loaded() -> bool:
    """Whether the kernel is registered (never builds)."""
    return _attempt.cache_info().currsize == 1 and _attempt()


def _try_load() -> bool:
    if not enabled():
        logger.info("native recurrent kernel disabled by %s=0", ENVIRONMENT)
        return False
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(_name(), [str(path) for path in COMPILED], extra_cflags=list(FLAGS),
                           extra_ldflags=["-fopenmp"], is_python_module=False,
                           verbose=logger.isEnabledFor(logging.DEBUG))
    except Exception as error:  # no compiler, no ninja, a failed build: the Python implementation runs instead
        warnings.warn(f"onnx2torch_rnn: the native recurrent kernel could not be built ({type(error).__name__}: "
                      f"{str(error).strip().splitlines()[-1] if str(error).strip() else error}); recurrent nodes run "
                      f"the Python implementation (same numbers, slower). Set {ENVIRONMENT}=0 to skip the attempt.",
                      RuntimeWarning, stacklevel=3)
        return False
    return True
