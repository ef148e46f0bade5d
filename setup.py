"""The package's build (metadata: pyproject.toml). Where torch can be imported (the documented wheel build: README,
Installation, `pip wheel --no-build-isolation`), the native kernel's libraries are compiled too, once per CPU variant
(onnx2torch_rnn/recurrent/kernel/build.py), against that torch's stable ABI, into the wheel: they run under every
torch from build.STABLE_ABI on. Without torch (an isolated build, an editable
install) the package carries the kernel's sources only, and the kernel is built on first use."""

import copy
import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup

KERNEL = Path("onnx2torch_rnn", "recurrent", "kernel")


def kernel_build():
    """kernel/build.py alone: importing the package would need its dependencies at build time."""
    spec = importlib.util.spec_from_file_location("kernel_build", Path(__file__).parent / KERNEL / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_extensions() -> dict:
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("setup.py: torch is not importable here: the native kernel ships as sources (built on first use)",
              file=sys.stderr)
        return {}

    class Build(BuildExtension):
        def build_extension(self, ext):
            """Each library in its own folder: the variants compile the same sources, two or more at a time."""
            worker = copy.copy(self)
            worker.build_temp = str(Path(self.build_temp, ext.name))
            super(Build, worker).build_extension(ext)

    build = kernel_build()
    if "native" in build.variants():  # not x86: one variant, for the build machine's CPU alone
        print("setup.py: no prebuilt kernel for this platform (built on first use)", file=sys.stderr)
        return {}
    # no Python in the library (loaded with torch.ops.load_library): one wheel for every Python the package allows
    extensions = [CppExtension(".".join([*KERNEL.parts, build.library_name(library, variant)]),
                               [str(KERNEL / source) for source in sources],
                               extra_compile_args=[*build.flags(variant), "-g0"],
                               extra_link_args=[*build.LINK_FLAGS, "-s"],
                               py_limited_api=True)
                  for library, sources in build.LIBRARIES for variant in build.variants()]
    return {"ext_modules": extensions,
            "cmdclass": {"build_ext": Build.with_options(no_python_abi_suffix=True)},
            "options": {"build_ext": {"parallel": os.cpu_count() or 1}, "bdist_wheel": {"py_limited_api": "cp311"}}}


setup(**kernel_extensions())
