"""Inference calls of a converted graph without nn.Module.__call__ per node.

fx's generated forward calls each node's module as ``self.<child>(...)``: Module.__getattr__, Module.__call__ and
its hook checks, then the child's forward. That is most of a small node's cost (a VAD's 40-55 nodes, GTCRN's 365:
the call through fx and __call__ took 15-30% of a whole call). ``install`` wraps a converted GraphModule's forward:
an inference call (no grad; not compiling, exporting or tracing) where no child of the graph has hooks and no global
hooks are set runs the same generated code with ``self`` standing for a namespace whose attribute for each child is
that child's bound forward and whose attribute for each parameter or buffer the graph reads is that tensor (every
other name is read from the GraphModule); where the graph computes values from its inputs' sizes and its constants
only (initial states of zeros), that code with those values kept per sizes (signature_kept.py). Any other call runs
fx's forward as it is. The namespace is made on first use and again when a child, a parameter or a buffer of the
graph is replaced, or the graph's code is written again. A converted graph is a ``Graph``: fx's
GraphModule whose forward stays wrapped when fx writes it again (a graph edit's recompile, a deepcopy, unpickling;
pickling itself recompiles the original). The wrapper also keeps a small model's torch ops on one thread at
inference (threads.py), where the model is marked for it, and on its first fast call keeps malloc's freed memory for
the next calls (allocator.py).
"""

from __future__ import annotations

import functools
import operator
from types import MappingProxyType

import torch
from torch import fx, nn

from . import allocator, threads
from .signature_kept import kept_forward
from .torch_compat import module_internals, parameter_dict, unpickle_graph_module


def _linear(child: nn.Linear):
    parameters = parameter_dict(child)
    return lambda input: _LINEAR(input, parameters["weight"], parameters["bias"])


def _layer_norm(child: nn.LayerNorm):
    parameters = parameter_dict(child)
    return lambda input: torch.layer_norm(input, child.normalized_shape, parameters["weight"], parameters["bias"],
                                          child.eps)


_LINEAR = torch.nn.functional.linear  # a builtin: the C++ binding
# The torch modules the converters make whose forward is one functional call on their own parameters: that call,
# the same op without nn.Module.__getattr__ for each parameter and F's Python layer (nn.Linear 4.3 -> 2.8 us,
# nn.LayerNorm 4.8 -> 2.75, thread CPU), the parameters read from the module's dict at each call (replacing one is
# seen).
_DIRECT_FORWARDS = MappingProxyType({nn.Linear: _linear, nn.LayerNorm: _layer_norm})


def _forward(child: nn.Module):
    """What the fast call runs for ``child``: its direct forward (_DIRECT_FORWARDS) or its bound forward."""
    direct = _DIRECT_FORWARDS.get(type(child))
    return child.forward if direct is None else direct(child)


class _Namespace:
    """``self`` of a fast call: the children's bound forwards (or direct ones: _DIRECT_FORWARDS) and the parameters
    and buffers the graph reads (``get_attr`` nodes: a read through nn.Module.__getattr__ costs ~1 us); other names
    from the GraphModule."""

    def __init__(self, module: fx.GraphModule):
        self.__dict__.update({name: _forward(child) for name, child in module.named_children()})
        self.__dict__.update({name: value for name in _read_attributes(module)
                              for value in [module._parameters.get(name, module._buffers.get(name))]
                              if value is not None})
        self.__dict__[" module"] = module  # not an identifier: no graph name can reach it

    def __getattr__(self, name: str):
        return getattr(self.__dict__[" module"], name)


class _State:
    """What the namespace was made for (``values``: the children, the graph's own parameters and buffers), the
    children's forward hook dicts, and the namespace (None: the graph reads a child's attributes, so a bound forward
    cannot stand for it). Never copied nor pickled: a copy makes its own."""

    __slots__ = ("forward", "hooks", "namespace", "values")

    def __init__(self, module: fx.GraphModule, values: tuple):
        self.values = values
        # backward hooks need not be seen: at inference (no grad) nn.Module.__call__ sets none up
        self.hooks = tuple(hooks for child in module._modules.values()
                           for hooks in (child._forward_pre_hooks, child._forward_hooks))
        self.namespace = _Namespace(module) if _calls_children_only(module) else None
        # the graph's code with what depends only on the inputs' sizes kept per sizes (signature_kept.py)
        self.forward = None if self.namespace is None else kept_forward(module, self.namespace)

    def made_for(self, values: tuple) -> bool:
        return len(values) == len(self.values) and all(map(operator.is_, values, self.values))

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return type(None), ()


def _values(module: fx.GraphModule) -> tuple:
    """What a namespace depends on: replacing a child, a parameter or a buffer (an assignment, ``.to()``,
    ``load_state_dict(assign=True)``) changes it."""
    return (*module._modules.values(), *module._parameters.values(), *module._buffers.values())


def _read_attributes(module: fx.GraphModule) -> set[str]:
    return {node.target for node in module.graph.nodes if node.op == "get_attr" and "." not in node.target}


def _calls_children_only(module: fx.GraphModule) -> bool:
    """Whether the graph uses its children only by calling them (targets without dots)."""
    children = set(module._modules)
    for node in module.graph.nodes:
        if node.op == "call_module" and "." in node.target:
            return False
        if node.op == "get_attr" and node.target.split(".")[0] in children:
            return False
    return True


def _global_hooks() -> bool:
    """Whether a global forward hook is set (backward ones need not be seen: see _State)."""
    return bool(module_internals._global_forward_hooks or module_internals._global_forward_pre_hooks)


def _inference() -> bool:
    """Whether this is an inference call that nothing records (no grad, not compiling, exporting or tracing)."""
    return not (torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
                or torch.jit.is_tracing() or fx._symbolic_trace.is_fx_symbolic_tracing())


def _fast_state(module: fx.GraphModule) -> _State | None:
    """The state of a fast call of ``module`` (an inference call), or None where the call must be fx's as
    written."""
    if _global_hooks():
        return None
    values = _values(module)
    state = module.__dict__.get("_fast_state")
    if state is None or not state.made_for(values):
        state = module.__dict__["_fast_state"] = _State(module, values)
        allocator.keep_freed_memory()
    return None if any(state.hooks) or state.namespace is None else state


def _wrap(cls: type) -> None:
    """Wrap the forward fx generated for ``cls`` (a graph's own class: fx makes one per GraphModule)."""
    generated = cls.forward

    @functools.wraps(generated)  # the signature stays the graph's (torch.export binds inputs by name)
    def forward(self, *args, **kwargs):
        if not _inference():
            return generated(self, *args, **kwargs)
        state = _fast_state(self)
        own, run = (self, generated) if state is None else (state.namespace, state.forward or generated)
        if not self.meta.get(threads.ONE_THREAD):
            return run(own, *args, **kwargs)
        threads.enter(args, kwargs)
        try:
            return run(own, *args, **kwargs)
        finally:
            threads.leave()

    forward.__code__ = forward.__code__.replace()  # a code object per graph, as fx's: torch.compile caches per code
    cls.forward = forward


class Graph(fx.GraphModule):
    """A converted graph (see the module docstring)."""

    def recompile(self):
        self.__dict__.pop("_fast_state", None)  # made from the graph's code
        code = super().recompile()
        _wrap(type(self))
        return code

    def __reduce__(self):
        meta = dict(self.meta)  # fx's unpickling starts from an empty meta (the signature to_onnx reads is there)
        _, (body, import_block) = super().__reduce__()
        return _unpickled, (body, import_block, meta)


def _unpickled(body: dict, import_block: str, meta: dict) -> fx.GraphModule:
    module = unpickle_graph_module(body, import_block, Graph)
    module.meta.update(meta)
    return module


def installed(module: nn.Module) -> bool:
    """Whether ``module``'s forward is this wrapper (tests)."""
    return getattr(type(module).forward, "__wrapped__", None) is not None and isinstance(module, fx.GraphModule)
