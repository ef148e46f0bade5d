"""Freed memory kept for the next inference call, as onnxruntime's arena keeps it.

glibc's malloc serves a large block (from 128 KiB, rising to the largest block freed so far, at most 32 MiB) with a
fresh mmap, and gives the top of its heap back to the OS as soon as twice that is free. A model whose intermediates are
megabytes then takes a page fault on every 4 KiB of them on every call: text2tashkeel's attention (two nodes of 2M
float32 each) costs 15 ms of thread CPU a call that way against 6 ms with the memory kept (onnxruntime: 5.5 ms).

So the first inference call of a converted graph (executor.py) sets, once per process, malloc's mmap threshold to
glibc's own ceiling (32 MiB: smaller blocks come from the heap and are reused) and its trim threshold to 128 MiB (the
free heap top it keeps). Process-wide, as onnxruntime's arena is for its sessions: the process may hold up to that
much freed memory. Nothing changes where the C library is not glibc, where the user tuned malloc
(``MALLOC_*`` or ``GLIBC_TUNABLES`` in the environment, or another allocator preloaded) or set
``ONNX2TORCH_RNN_KEEP_MEMORY=0``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
OPT_OUT = "ONNX2TORCH_RNN_KEEP_MEMORY"


def user_tuned_by(name: str) -> bool:
    """Whether this environment variable says how malloc should behave."""
    return name in ("GLIBC_TUNABLES", "LD_PRELOAD") or name.startswith("MALLOC_")


def user_tuned() -> bool:
    """Whether the user tuned malloc or said that this module should not."""
    return os.environ.get(OPT_OUT) == "0" or any(map(user_tuned_by, os.environ))


@functools.cache  # once per process
def keep_freed_memory() -> bool:
    """Set glibc's thresholds as the module docstring says; whether they were set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or user_tuned():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mapped = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    trimmed = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(mapped and trimmed)
