"""What the native kernel is built from and for: its sources, its flags and the CPU variants it is compiled for.

Read by the loader (``kernel/__init__.py``: the variant this CPU runs, built on first use where no prebuilt library
exists) and by setup.py (every variant, into the wheel), which loads this file alone: standard library only.
"""

from __future__ import annotations

import platform
import re

# compiled into the library, each into every variant: add a new .cpp file here
SOURCES = ("recurrent.cpp", "dynamic_quantize_lstm.cpp", "quantized_ops.cpp", "conv_integer.cpp",
           "quantize_linear.cpp", "qlinear.cpp")
HEADERS = ("config.h", "vec.h", "int8.h")  # included by them: they count in the first-use build's name, ship in wheels
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
    return [*COMMON_FLAGS, *variants()[variant][0]]


def library_name(variant: str, torch_version: str) -> str:
    """The prebuilt library's name (without .so): it runs only under the torch it was built against."""
    return f"recurrent_{variant}_torch{re.sub(r'[^0-9A-Za-z]', '_', torch_version)}"
