"""Built-in converters, one module per op family; importing them registers them."""

from . import (  # noqa: F401
    control_flow,
    elementwise,
    linalg,
    nn,
    onnxruntime_quantized,
    quantized,
    recurrent,
    reduce,
    sequence,
    shape,
)
