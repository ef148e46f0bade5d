"""The native CPU kernel of the recurrent op: loaded once per process and registered as the op's CPU
implementation, in the variant this CPU runs best.

The kernel is two libraries (build.py: LIBRARIES), ``recurrent`` and ``int8``, both built against PyTorch's stable
ABI. Each is compiled for several CPU variants (build.py: AVX-512, AVX2+FMA, baseline x86-64); ``load()`` picks the
best one this CPU supports, or the one ``ONNX2TORCH_RNN_CPU`` names, and loads each library, first found first:
- the prebuilt library of a wheel built with the kernel (setup.py), in every torch from build.STABLE_ABI on;
- else a build on first use: the sources compiled with torch.utils.cpp_extension (ninja) into torch's extension
  cache, under a name that holds a hash of the sources, their folder, the flags and torch's version (another
  version of the sources never reuses a stale build).
``recurrent`` implements on CPU the ops that ``onnx2torch_rnn::recurrent`` runs (recurrent/op.py), ``int8`` those
that ``onnx2torch_rnn::dynamic_quantize_lstm`` runs and the int8 helpers that modules/quantized.py calls in eager
inference (their packed weights kept in Python: recurrent/op.py's PACKS).
A library that cannot load (no compiler), or every one with ``ONNX2TORCH_RNN_NATIVE=0``, registers nothing, a
warning says why once, and its ops run their Python implementations (recurrent/runtime.py, modules/quantized.py),
which compute the same numbers. ``variant()`` says which variant runs and ``library()`` from where.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
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


def _name(variant: str, library: str = "recurrent") -> str:
    digest = hashlib.sha256()
    for path in FILES:
        digest.update(path.read_bytes())
    # the sources' folder too: torch's build file names the source path, so two checkouts (or venvs) of the same
    # sources sharing one build folder would rebuild each time the other had built
    digest.update(" ".join([*build.flags(variant), library, torch.__version__, str(FOLDER)]).encode())
    return f"onnx2torch_rnn_{library}_{variant}_{digest.hexdigest()[:16]}"


def load(library: str = "recurrent") -> bool:
    """Load the kernel (building a library the first time where no prebuilt one fits); whether ``library`` is
    loaded (False, with one warning, where that is not possible)."""
    return library in _loaded()


@functools.cache  # read without the lock once made (an int8 node asks at every eager call: the lock cost 0.2 us)
def _loaded() -> dict[str, str]:
    with _lock:  # one attempt: a second thread's first call waits for it
        return _attempt()[1]


@functools.cache  # one attempt per process: a library once loaded stays registered with torch
def _attempt() -> tuple[str | None, dict[str, str]]:
    """(variant, {library: path} of the libraries loaded)."""
    if not enabled():
        logger.info("native recurrent kernel disabled by %s=0", ENVIRONMENT)
        return None, {}
    name = chosen()
    paths = {library: path for library, _ in build.LIBRARIES if (path := _try_load(name, library))}
    return name, paths


def loaded(library: str = "recurrent") -> bool:
    """Whether ``library`` is registered (never builds)."""
    return _attempt.cache_info().currsize == 1 and library in _attempt()[1]


def variant() -> str | None:
    """The variant that runs ("avx512", "avx2", "baseline"; "native" off x86), None where no kernel is loaded."""
    return _attempt()[0] if loaded() else None


def library(name: str = "recurrent") -> str | None:
    """The loaded library's path: inside the package for a wheel's prebuilt kernel, else torch's extension cache."""
    return _attempt()[1].get(name) if loaded(name) else None


def torch_version() -> tuple[int, int]:
    return tuple(int(part) for part in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())


def prebuilt(variant: str, library: str = "recurrent") -> Path | None:
    """Where a wheel's library of this variant lies (setup.py builds it there), if the running torch can load it
    (build.STABLE_ABI or later)."""
    if torch_version() < build.STABLE_ABI:
        return None
    return FOLDER / f"{build.library_name(library, variant)}.so"


def _try_load(variant: str, library: str) -> str | None:
    """The path of ``library`` loaded (prebuilt, else built now), or None with a warning."""
    path = prebuilt(variant, library)
    if path and path.exists():
        torch.ops.load_library(str(path))
        return str(path)
    sources = next(sources for name, sources in build.LIBRARIES if name == library)
    try:
        from torch.utils import cpp_extension

        built = cpp_extension.load(_name(variant, library), [str(FOLDER / source) for source in sources],
                                   extra_cflags=build.flags(variant), extra_ldflags=list(build.LINK_FLAGS),
                                   is_python_module=False, verbose=logger.isEnabledFor(logging.DEBUG))
    except Exception as error:  # no compiler, no ninja, a failed build: the Python implementation runs instead
        warnings.warn(f"onnx2torch_rnn: the native kernel's {library} library could not be built "
                      f"({type(error).__name__}: "
                      f"{str(error).strip().splitlines()[-1] if str(error).strip() else error}); its nodes run "
                      f"the Python implementation (same numbers, slower). Set {ENVIRONMENT}=0 to skip the attempt.",
                      RuntimeWarning, stacklevel=4)
        return None
    return str(built)
