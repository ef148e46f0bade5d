"""onnx2torch_rnn: import ONNX models, recurrent ones exactly, as torch.fx GraphModules.

The whole public API: ``convert``, ``register_converter`` with ``OnnxNode`` / ``Converted`` for custom converters,
``register_pattern`` with ``GraphView`` / ``Fusion`` for custom recognition patterns,
``compare`` (the converted model against onnxruntime, with the first diverging node), ``to_onnx`` (a converted,
fine-tuned module back to ONNX, as a drop-in replacement of its model), ``compile_for_inference`` (the fastest
module for serving), ``compiled_steps`` (the exact path's cell steps compiled, for CUDA graphs), and the error types.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch
from torch import fx

from . import converters as _converters  # noqa: F401 - registers the built-in converters
from ._version import __version__ as __version__
from .builder import ConversionContext, build
from .checking import compare
from .errors import (
    ConversionError,
    ExportError,
    GraphConversionError,
    InvalidModelError,
    ModuleRunError,
    Onnx2TorchError,
    OutputExistsError,
    ReferenceRuntimeError,
    UnsupportedAttributeError,
    UnsupportedOperatorError,
    UnsupportedOpsetError,
    UnsupportedTypeError,
)
from .loading import ModelSource, load_model
from .node import Converted, OnnxNode
from .onnx_export import to_onnx
from .passes import Fusion, GraphView, register_pattern

# isort: off
# the built-in recognition patterns, registered in the order they run
from .passes import loops as _loops  # noqa: F401
from .passes import scans as _scans  # noqa: F401
from .passes import stacked as _stacked  # noqa: F401
from .passes import unrolled as _unrolled  # noqa: F401
from .passes import quantized as _quantized  # noqa: F401
from .passes import qlinear as _qlinear  # noqa: F401 - before qdq: it takes two of its groups
from .passes import qdq as _qdq  # noqa: F401
from .passes import linear as _linear  # noqa: F401 - last: a recurrence's own MatMul + Add is the recurrence's
# isort: on
from .recurrent import onnx_translation_table
from .recurrent.runtime import compiled_steps
from .registry import register_converter

__all__ = [
    "ConversionContext",
    "ConversionError",
    "Converted",
    "ExportError",
    "Fusion",
    "GraphConversionError",
    "GraphView",
    "InvalidModelError",
    "ModuleRunError",
    "Onnx2TorchError",
    "OnnxNode",
    "OutputExistsError",
    "ReferenceRuntimeError",
    "UnsupportedAttributeError",
    "UnsupportedOperatorError",
    "UnsupportedOpsetError",
    "UnsupportedTypeError",
    "compare",
    "compile_for_inference",
    "compiled_steps",
    "convert",
    "onnx_translation_table",
    "register_converter",
    "register_pattern",
    "to_onnx",
]


def convert(model: ModelSource, *, base_dir: str | os.PathLike | None = None,
            dequantize: bool = False, fuse: bool = True,
            constants: Mapping[str, object] | None = None) -> fx.GraphModule:
    """Convert an ONNX model (path, serialized bytes or ``onnx.ModelProto``) to a ``torch.fx.GraphModule``.

    The module's forward takes the graph inputs in ONNX order (or by their sanitised names) and returns one tensor,
    or a tuple in ONNX output order when the graph has several outputs. ``base_dir`` is the folder that holds the
    external data of a model given as bytes or ModelProto.

    A quantized model converts exactly (onnxruntime's integer arithmetic) by default; ``dequantize=True`` converts
    the float model it approximates instead, for fine-tuning: quantized weights become float parameters, activations
    are no longer quantized, quantized ops become float ops (DynamicQuantizeLSTM an ordinary LSTM).

    ``fuse`` (default) recognises recurrences that the exporter spelled out (e.g. torch.onnx's per-layer nodes with
    glue and zero initial states) and converts each as one recurrent module, exactly; ``fuse=False`` converts every
    node as written.

    ``constants`` binds graph inputs to values the caller always passes (``{"sr": 16000}``: numbers, arrays or
    tensors of the input's type and declared shape): the module no longer takes them, what they decide is folded at
    conversion (shapes, and an If on them becomes the branch taken: the other branch and its weights are gone), so a
    model whose If branches return different ranks compiles in one graph and exports. ``to_onnx`` writes the model
    without those inputs, or with them kept and unused (``keep_bound=True``).
    """
    loaded = load_model(model, base_dir, dequantize=dequantize, single_use=True, constants=constants)
    return build(loaded, fuse=fuse)


def compile_for_inference(module: torch.nn.Module, *, dynamic: bool | None = False) -> Callable:
    """The fastest way this library knows to run a converted module for inference: ``torch.compile`` with inductor's
    ``freezing`` (weights become constants of the compiled code: convolutions get packed weights, constant glue
    folds) on the module in eval mode. Call it under ``torch.inference_mode()`` or ``torch.no_grad()``.

    The module is frozen into the compiled code: its weights may be folded, and the code does not check the module's
    attributes on each call (their guards are dropped: a third of a small model's call, silero VAD's 2.4x
    onnxruntime -> 1.8x, CPU time), so after fine-tuning it or changing it, compile again. ``dynamic=False``
    (the default) compiles for the first call's shapes and recompiles for new ones, as serving at fixed sizes
    wants; ``dynamic=None`` lets torch mark sizes dynamic after a change. A server that calls with fixed shapes can
    also skip the guards' evaluation: ``torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)``
    (torch's documented stance; unsafe if anything the compiled code assumed changes).
    """
    module.eval()

    def inference(*args, **kwargs):
        # compiled as one frame with the module's call inline (a forward hook would be a frame of its own otherwise,
        # with its own guards to evaluate per call)
        return module(*args, **kwargs)

    # a code object per module: torch.compile keeps compiled code per code object, and without guards on the module
    # one shared code object would run the first module's code for every other (8 at most, then eager)
    inference.__code__ = inference.__code__.replace()
    return torch.compile(inference, dynamic=dynamic, options={
        "freezing": True, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
