"""Converter registry keyed on (domain, op_type, since_version).

A converter registered for since_version 13 of an op serves every opset whose schema for that op is the version-13
one (resolved through ``onnx.defs``), so a model at opset 17 finds it unless the op changed in between. Domains
unknown to ``onnx.defs`` resolve to the highest registered version not above the model's opset.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import NamedTuple

import onnx

from .node import Converted, OnnxNode

Converter = Callable[[OnnxNode, "ConversionContext"], Converted]  # noqa: F821 - defined in builder

ONNX_DOMAINS = ("", "ai.onnx")

# Ops that must never be evaluated at conversion time, even when all their inputs are constants.
NOT_FOLDABLE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                          "Bernoulli", "Dropout",
                          "Loop"})  # a constant trip count of 10**12 would hang conversion


def normalize_domain(domain: str) -> str:
    return "" if domain in ONNX_DOMAINS else domain


class OperationKey(NamedTuple):
    domain: str
    op_type: str
    version: int


_CONVERTERS: dict[OperationKey, Converter] = {}
_STATIC: dict[OperationKey, frozenset[int]] = {}  # the inputs each converter declares static


def register_converter(
    op_type: str, versions: int | Iterable[int], domain: str = "", *, replace: bool = False,
    static: Iterable[int] | None = None,
) -> Callable[[Converter], Converter]:
    """Decorator registering a converter for one or several since_versions of an op.

    Registering a key that already has a converter is an error unless ``replace=True`` (to override a built-in).
    ``static``: the indices of the inputs that steer the computation (shapes, axes, pads, k, ...), which the converter
    reads with ``ctx.static(node, index)``: a value known at conversion is baked into the module, otherwise the module
    reads it at run time. Without ``static`` a replacement keeps the declaration of the converter it replaces (a
    wrapper that calls the built-in reads what the built-in reads).
    """
    versions = (versions,) if isinstance(versions, int) else tuple(versions)
    domain = normalize_domain(domain)

    def decorate(converter: Converter) -> Converter:
        keys = [OperationKey(domain, op_type, v) for v in versions]
        taken = [key for key in keys if key in _CONVERTERS]
        if taken and not replace:
            raise ValueError(f"converter already registered for {taken}; pass replace=True to override it")
        for key in keys:
            _CONVERTERS[key] = converter
            if static is not None or key not in _STATIC:
                _STATIC[key] = frozenset(static or ())
        return converter

    return decorate


def static_inputs(domain: str, op_type: str, version: int) -> frozenset[int]:
    """The inputs the converter registered for (domain, op_type, since_version) declares static."""
    return _STATIC.get(OperationKey(normalize_domain(domain), op_type, version), frozenset())


def schema_for(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The schema onnx.defs has for an op at an opset, or None (a custom domain's op, unless its schema has been
    registered with ``onnx.defs.register_schema``: also after a lookup that found none)."""
    try:
        return _found_schema(normalize_domain(domain), op_type, opset)
    except onnx.defs.SchemaError:
        return None


# onnx's lookup costs about 6 us, asked several times for every node of a graph. Only schemas found are cached (a
# miss raises, which functools.cache does not keep), so a schema registered later is seen; one deregistered after a
# lookup found it is not noticed.
@functools.cache
def _found_schema(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema:
    return onnx.defs.get_schema(op_type, opset, domain)


def resolve(domain: str, op_type: str, opset: int) -> tuple[Converter, int] | None:
    """The converter for an op at a model opset and the since_version it is registered under, or None."""
    domain = normalize_domain(domain)
    schema = schema_for(domain, op_type, opset)
    if schema is not None:
        key = OperationKey(domain, op_type, schema.since_version)
        return (_CONVERTERS[key], key.version) if key in _CONVERTERS else None
    versions = [k.version for k in _CONVERTERS if k.domain == domain and k.op_type == op_type and k.version <= opset]
    if not versions:
        return None
    return _CONVERTERS[OperationKey(domain, op_type, max(versions))], max(versions)


def registered() -> dict[OperationKey, Converter]:
    """A copy of the registry, e.g. for generating operators.md."""
    return dict(_CONVERTERS)
