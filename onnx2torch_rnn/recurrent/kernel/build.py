"""What the native kernel is built from and for: its libraries and their sources, its flags and the CPU variants it
is compiled for.

Read by the loader (``kernel/__init__.py``: the variant this CPU runs, built on first use where no prebuilt library
exists) and by setup.py (every variant, into the wheel), which loads this file alone: standard library only.
"""

from __future__ import annotations

import platform
import re

# The libraries, each compiled from its sources into every variant: (name, sources, built against PyTorch's stable
# ABI). A stable library (torch/csrc/stable only) serves every torch from STABLE_ABI on; another one would serve only
# the torch it was built with (another one builds it on first use). Add a new .cpp file to one of them.
LIBRARIES = (("recurrent", ("recurrent.cpp",), True),
             ("int8", ("dynamic_quantize_lstm.cpp", "quantized_ops.cpp", "conv_integer.cpp", "quantize_linear.cpp",
                       "qlinear.cpp"), True))
SOURCES = tuple(source for _, sources, _ in LIBRARIES for source in sources)
HEADERS = ("config.h", "vec.h", "int8.h")  # included by them: they count in the first-use build's name, ship in wheels
# The stable ABI the stable libraries target (TORCH_TARGET_VERSION; pyproject's lowest torch): they load in this
# torch and every later one, and are not loaded by an older one (which builds them on first use).
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


def stable(library: str) -> bool:
    return next(is_stable for name, _, is_stable in LIBRARIES if name == library)


def flags(variant: str, library: str) -> list[str]:
    major, minor = STABLE_ABI
    target = [f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000"] if stable(library) else []
    return [*COMMON_FLAGS, *variants()[variant][0], *target]


def library_name(library: str, variant: str, torch_version: str) -> str:
    """A prebuilt library's name (without .so): a stable one's says the stable ABI it needs, another's the torch it
    was built against, the only one it runs under."""
    if stable(library):
        return f"{library}_{variant}_abi{STABLE_ABI[0]}_{STABLE_ABI[1]}"
    return f"{library}_{variant}_torch{re.sub(r'[^0-9A-Za-z]', '_', torch_version)}"
