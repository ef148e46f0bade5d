"""A small converted model runs torch's own ops on one thread at inference; the recurrent kernel keeps the caller's.

On a busy machine (other processes on every core) an OpenMP region of a torch op ends by waiting for every thread of
its team, which the OS may not be running: at 2 threads, the bundled tagger (batch 8, 64 steps) took 40-80 ms
against 1.3 ms at 1 thread, its Gather 8-16 ms and its classifier's [8, 64, 64] @ [64, 5] product up to 37 ms. Ops
that small gain nothing from a second thread on an idle machine either. So the forward of a converted model whose
weights outside recurrent nodes are small (marked ``ONE_THREAD`` at conversion), called at inference (no grad,
nothing recording: executor.py's wrapper calls ``enter`` and ``leave``) on CPU tensors of few elements with more than
one thread, sets the calling thread's OpenMP and MKL thread counts to 1 for its duration:
both counts are per thread (other threads, and this one after the forward, keep theirs), torch's own parallel ops
read them, and torch.get_num_threads() says 1 inside. The recurrent kernel's calls (``caller_threads``) get the
caller's count back: the kernel's own threads do not collapse (kernel/recurrent.cpp, ``Job``).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable

import torch
from torch import Tensor

GLUE_WEIGHTS = 1 << 20  # a model with more weight elements outside its recurrent nodes keeps torch's threads
ONE_THREAD = "one_thread"  # the key of a converted graph's meta that marks it for this (builder.py)
INPUT_ELEMENTS = 1 << 18  # a call with more input elements keeps torch's threads

# Per thread, as torch's grad mode: for each converted forward in progress on this thread, the thread counts it
# replaced, (OpenMP, MKL), or None where it kept them.
_FORWARDS = threading.local()


@functools.cache  # the runtime's entry points, looked up once
def _runtime() -> tuple[Callable[[int], None], Callable[[int], int] | None] | None:
    """omp_set_num_threads and MKL's per-thread setter as torch loaded them; None where torch's parallel backend is
    not OpenMP or they cannot be found (nothing changes then)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        library = ctypes.CDLL(torch._C.__file__)  # its dependencies hold both (libgomp, libtorch_cpu's MKL)
        set_openmp = library.omp_set_num_threads
    except (OSError, AttributeError):
        return None
    set_openmp.argtypes, set_openmp.restype = [ctypes.c_int], None
    set_mkl = getattr(library, "MKL_Set_Num_Threads_Local", None)  # mkl_set_num_threads_local in mkl.h
    if set_mkl is not None:
        set_mkl.argtypes, set_mkl.restype = [ctypes.c_int], ctypes.c_int
    return set_openmp, set_mkl


def _small_call(args: tuple, kwargs: dict) -> bool:
    elements = 0
    for value in (*args, *kwargs.values()) if kwargs else args:  # a loop: this runs at every call
        if isinstance(value, Tensor):
            if not value.is_cpu:
                return False
            elements += value.numel()
    return elements <= INPUT_ELEMENTS


def enter(args: tuple, kwargs: dict) -> None:
    """At the start of an inference call (no grad, nothing recording: executor.py's wrapper) of a model marked
    ``ONE_THREAD``: one thread for torch's ops if the call is small and the caller runs more."""
    saved = None
    threads = torch.get_num_threads()  # first: at one thread nothing else needs asking (a call's fixed cost)
    runtime = _runtime() if threads > 1 else None
    if runtime is not None and _small_call(args, kwargs):
        set_openmp, set_mkl = runtime
        set_openmp(1)
        saved = (threads, set_mkl(1) if set_mkl else 0)
    try:
        _FORWARDS.stack.append(saved)
    except AttributeError:  # this thread's first call
        _FORWARDS.stack = [saved]


def leave() -> None:
    """At the end of that call, error or not: the counts ``enter`` replaced, back."""
    saved = _FORWARDS.stack.pop()
    if saved is not None:
        set_openmp, set_mkl = _runtime()
        set_openmp(saved[0])
        if set_mkl:
            set_mkl(saved[1])


def caller_threads(op: Callable, *args):
    """``op(*args)`` (a recurrent kernel call) with the thread count of the caller of the converted forward in
    progress on this thread, if that forward set it to 1."""
    stack = getattr(_FORWARDS, "stack", None)
    saved = stack[-1] if stack else None
    if saved is None:
        return op(*args)
    set_openmp = _runtime()[0]
    set_openmp(saved[0])
    try:
        return op(*args)
    finally:
        set_openmp(1)
