"""Built-in converters, one module per op family; importing them registers them."""

from . import elementwise, linalg, nn, recurrent, reduce, shape  # noqa: F401
