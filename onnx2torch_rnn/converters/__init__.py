"""Built-in converters, one module per op family; importing them registers them."""

from . import control_flow, elementwise, linalg, nn, recurrent, reduce, sequence, shape  # noqa: F401
