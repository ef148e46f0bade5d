"""The bound on what folding allocates at conversion.

Folding runs a node's module on its constant inputs, so a model of a few bytes (ConstantOfShape of [10**12], an
Expand, Tile, Range, Pad, Resize or OneHot with a huge constant size, the outer product of two constant vectors)
would make ``convert()`` allocate without bound. While a node folds, every torch op is first run on meta tensors
(shapes only, nothing allocated); an output over FOLD_LIMIT_BYTES stops the fold, and the node is computed at run
time instead, as the model says.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

FOLD_LIMIT_BYTES = 1 << 30  # per tensor, views included: a folded constant is read whole by later converters


class FoldTooLarge(Exception):
    """A folded node would create a tensor over FOLD_LIMIT_BYTES."""


def _meta(value):
    return value.to("meta") if isinstance(value, torch.Tensor) else value


class FoldLimit(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        meta_kwargs = tree_map(_meta, kwargs)
        if any(a.name == "device" for a in func._schema.arguments):  # a factory op: build it on meta too
            meta_kwargs["device"] = torch.device("meta")
        try:
            shapes = func(*tree_map(_meta, args), **meta_kwargs)
        except Exception:  # no meta kernel, or the size depends on the data (nonzero, item): bounded by the inputs
            shapes = None
        size = sum(t.numel() * t.element_size() for t in tree_leaves(shapes) if isinstance(t, torch.Tensor))
        if size > FOLD_LIMIT_BYTES:
            raise FoldTooLarge(f"{func} would create {size} bytes")
        return func(*args, **kwargs)
