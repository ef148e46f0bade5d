"""What the native kernel is built from and for: its libraries and their sources, its flags and the CPU variants it
is compiled for.

Read by the loader (``kernel/__init__.py``: the variant this CPU runs, built on first use where no prebuilt library
exists) and by setup.py (every variant, into the wheel), which loads this file alone: standard library only.
"""

from __future__ import annotations

import platform

# The libraries, each compiled from its sources into every variant: (name, sources). Both are built against PyTorch's
# stable ABI (torch/csrc/stable only: TORCH_STABLE_ONLY in each source), so one build serves every torch from
# STABLE_ABI on. Add a new .cpp file to one of them.
LIBRARIES = (("recurrent", ("recurrent.cpp",)),
             ("int8", ("dynamic_quantize_lstm.cpp", "quantized_ops.cpp", "conv_integer.cpp", "quantize_linear.cpp",
                       "qlinear.cpp")))
SOURCES = tuple(source for _, sources in LIBRARIES for source in sources)
# included by them: they count in the first-use build's name, ship in wheels
HEADERS = ("config.h", "empty.h", "stack.h", "vec.h", "int8.h")
# The stable ABI the libraries target (TORCH_TARGET_VERSION; pyproject's lowest torch): they load in this torch and
# every later one, and are not loaded by an older one (which builds them on first use).
STABLE_ABI = (2, 13)
# -fopenmp: at::parallel_for is inline OpenMP code, serial without it; the OpenMP runtime it binds to at load time
# is the libgomp.so.1 torch has already loaded (same soname), so there is one thread pool.
COMMON_FLAGS = ("-O3", "-fno-math-errno", "-fopenmp")
LINK_FLAGS = ("-fopenmp",)

# The variants, best first: the x86-64 micro-architecture levels that change the kernel's code (vectors of one
# AVX-512 register, of one AVX2 register with FMA, of one SSE2 register), each with the /proc/cpuinfo flags a CPU
# needs to run it (ATen's CPU capabilities AVX512, AVX2 and DEFAULT are the same split). avx512 also takes VNNI, the
# int8 kernel's products (dynamic_quantize_lstm.cpp: 3-8x faster than without): AVX-512 CPUs without it (Skylake-SP
# and -X) run avx2. Another machine has one variant, built on first use for that CPU.
_V3 = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
X86_VARIANTS = (
    ("avx512", ("-march=x86-64-v4", "-mavx512vnni"),
     (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni")),
    ("avx2", ("-march=x86-64-v3",), _V3),
    ("baseline", ("-march=x86-64",), ()),
)
OTHER_VARIANTS = (("native", ("-march=native",), ()),)


def variants() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """This platform's variants, best first: name -> (flags, CPU features it needs)."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return {name: (flags, needs) for name, flags, needs in (X86_VARIANTS if x86 else OTHER_VARIANTS)}


def flags(variant: str) -> list[str]:
    major, minor = STABLE_ABI
    return [*COMMON_FLAGS, *variants()[variant][0], f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000"]


def library_name(library: str, variant: str) -> str:
    """A prebuilt library's name (without .so): it says the stable ABI it needs."""
    return f"{library}_{variant}_abi{STABLE_ABI[0]}_{STABLE_ABI[1]}"
