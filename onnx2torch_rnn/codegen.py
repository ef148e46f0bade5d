"""A converted model as standalone PyTorch code: ``OUTDIR/model.py`` and ``OUTDIR/weights.pt``.

``model.py`` defines ``class Model(nn.Module)`` (submodules, then the forward that torch.fx generated) and
``load(weights=None) -> Model``. Each submodule is rebuilt by a call to its constructor: this library's modules with
the arguments they were built with (every one keeps them: ``modules.common.Module``), torch.nn modules from their
public attributes (``_TORCH_MODULES``: the types converters create; any other type is an error, not a guess).
Nothing outside this library is patched or recorded. Tensor arguments are written as placeholders of the same shape
(zeros where the tensor is all zeros, else ones; tiny tensors literally), since ``load`` replaces every parameter and
buffer with the saved one. After writing, the files are loaded back and compared with the converted module (types,
attributes, every tensor): whatever the code cannot rebuild is an error here, not a surprise later.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import logging
import math
import operator
import os
import re
import sys
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import fx, nn

from ._version import __version__
from .builder import build, sanitize
from .errors import Onnx2TorchError, OutputExistsError
from .loading import LoadedModel, ModelSource, load_model
from .modules import packed
from .modules.common import TensorStub, constructor_arguments, kept
from .torch_compat import buffer_dict, fx_builtin_imports, parameter_dict

CODE_FILE, WEIGHTS_FILE, PROGRAM_FILE = "model.py", "weights.pt", "model.pt2"


class CodegenError(Onnx2TorchError):
    """The converted module cannot be written as code (e.g. a module type whose constructor arguments are unknown)."""


# ----------------------------------------------------------------------------------------------- names

# Namespaces for objects without an importable qualified name (torch's C functions, Tensor methods), as the generated
# code spells them.
_NAMESPACES = (("torch", torch), ("F", F), ("torch.Tensor", torch.Tensor), ("nn", nn), ("torch.special", torch.special),
               ("torch.linalg", torch.linalg), ("operator", operator), ("math", math))
_ALIASES = MappingProxyType({"torch": "import torch", "nn": "from torch import nn",
                             "F": "import torch.nn.functional as F", "operator": "import operator",
                             "math": "import math"})


class _Names:
    """The names model.py uses: import statements, the names fx's forward code binds after them, class names."""

    def __init__(self):
        self.imports: dict[str, str] = {}  # name used in the code -> import statement
        self.bound: dict[str, object] = {}  # name used in the code -> the object it names
        self.assignments: list[str] = []  # names that fx's forward code uses for functions, bound after imports
        self.taken: set[str] = {"Model", "load", "WEIGHTS", "Path", "Mapping", "os", *_ALIASES}  # classes, fixed names

    def namespace(self, prefix: str) -> str:
        root = prefix.split(".")[0]
        self.imports[root] = _ALIASES[root]
        return prefix

    def new_class(self, name: str, exact: bool = False) -> str:
        """A class name not used yet, based on ``name`` (``exact``: ``name`` itself, a reserved one)."""
        name = name if exact else _unique(name, self.taken | self.bound.keys())
        self.taken.add(name)
        return name

    def reference(self, obj: object, where: str) -> str:
        """An expression naming a class, function or module-level object, with its import registered.

        Objects of this library (or any non-torch package) are imported by qualified name; torch's are spelled
        ``torch.x``, ``nn.X``, ``F.x``, ``torch.Tensor.x``, ... as people write them.
        """
        if obj is torch:
            return self.namespace("torch")
        if isinstance(obj, type) and issubclass(obj, nn.Module) and getattr(nn, obj.__name__, None) is obj:
            return f"{self.namespace('nn')}.{obj.__name__}"
        module_name, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
        importable = bool(module_name) and "<" not in qualname and _resolve(module_name, qualname) is obj
        if importable and not module_name.startswith("torch"):
            return self._import(module_name, qualname)
        name = getattr(obj, "__name__", None)
        for prefix, namespace in _NAMESPACES:
            if name and getattr(namespace, name, None) is obj:
                return f"{self.namespace(prefix)}.{name}"
        if importable:
            return self._import(module_name, qualname)
        raise CodegenError(f"{where}: {obj!r} has no importable name (a lambda or local function?); give the "
                           "module a module-level function instead")

    def forward_globals(self, code: fx.graph.PythonCode, where: str) -> None:
        """Bind the globals that fx's forward code ``code`` uses: imports, or assignments after them."""
        # names the code reads (not keyword names: `device=x.device` needs no `device`)
        used = {n.id for n in ast.walk(ast.parse(code.src.strip())) if isinstance(n, ast.Name)}
        fx_builtins = fx_builtin_imports()
        for global_name, obj in code.globals.items():
            if global_name not in used:
                continue
            if global_name in fx_builtins:
                statement = fx_builtins[global_name]
                if statement.startswith(("import ", "from ")):
                    self.imports.setdefault(global_name, statement)
                elif statement not in self.assignments:
                    self.assignments.append(statement)
            else:
                expression = self.reference(obj, where)
                if expression != global_name:
                    self.assignments.append(f"{global_name} = {expression}")

    def _import(self, module_name: str, qualname: str) -> str:
        top, _, rest = qualname.partition(".")
        alias = self._bind(top, _resolve(module_name, top), f"from {module_name} import {top}")
        return alias + (f".{rest}" if rest else "")

    def _bind(self, name: str, obj: object, statement: str) -> str:
        alias, n = name, 1
        while (alias in self.bound and self.bound[alias] is not obj) or alias in self.taken:
            alias, n = f"{name}_{n}", n + 1
        if alias not in self.bound:
            self.bound[alias] = obj
            self.imports[alias] = statement + (f" as {alias}" if alias != name else "")
        return alias


def _format_imports(statements: set[str]) -> str:
    """Import statements merged per module and grouped as isort does: standard library, torch, the rest."""
    plain, names = set(), defaultdict(set)
    for statement in statements:
        if statement.startswith("from "):
            module, _, imported = statement.removeprefix("from ").partition(" import ")
            names[module].add(imported)
        else:
            plain.add(statement)
    groups = defaultdict(list)
    for module in {s.split()[1] for s in plain} | names.keys():
        root = module.split(".")[0]
        group = 0 if root in sys.stdlib_module_names else 1 if root == "torch" else 2
        groups[group] += sorted(s for s in plain if s.split()[1] == module)
        if module in names:
            groups[group].append(f"from {module} import {', '.join(sorted(names[module]))}")
    return "\n\n".join("\n".join(sorted(groups[g], key=lambda s: (s.startswith("from"), s.split()[1])))
                       for g in sorted(groups))


def _resolve(module_name: str, qualname: str) -> object:
    try:
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError):
        return None


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    return candidate


# ----------------------------------------------------------------------------------------------- values

class _Values:
    """Python source for constructor arguments; modules among them are written by ``module`` (a callback)."""

    def __init__(self, names: _Names, module: Callable[[nn.Module, str], str]):
        self.names, self.module = names, module

    def literal(self, value: object, where: str) -> str:
        if value is None or isinstance(value, bool | int | str):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
        if isinstance(value, torch.Tensor | TensorStub):
            return self._tensor(kept(value))
        if isinstance(value, enum.Enum):
            return f"{self.names.reference(type(value), where)}.{value.name}"
        if isinstance(value, torch.dtype | torch.device):
            self.names.namespace("torch")
            return str(value) if isinstance(value, torch.dtype) else f"torch.device({str(value)!r})"
        if isinstance(value, nn.Module):
            return self.module(value, where)
        if isinstance(value, list | tuple):  # torch.Size and other tuple types are written as tuples
            items = [self.literal(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return f"[{', '.join(items)}]" if isinstance(value, list) else \
                f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self.literal(k, where)}: {self.literal(v, f'{where}[{k!r}]')}"
                                   for k, v in value.items()) + "}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = [f"{f.name}={self.literal(getattr(value, f.name), f'{where}.{f.name}')}"
                      for f in dataclasses.fields(value) if f.init]
            return f"{self.names.reference(type(value), where)}({', '.join(fields)})"
        if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalars
            return self.literal(value.item(), where)
        if inspect.isroutine(value) or isinstance(value, type):
            return self.names.reference(value, where)
        return self._from_attributes(value, where)

    def _from_attributes(self, value: object, where: str) -> str:
        """A constructor call for an object that keeps each constructor argument as an attribute of that name."""
        try:
            parameters = inspect.signature(type(value)).parameters.values()
        except (TypeError, ValueError):
            parameters = None
        if parameters is None or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or not hasattr(value, p.name)
                                     for p in parameters):
            raise CodegenError(f"{where}: cannot write a {type(value).__name__} value as code")
        arguments = [f"{p.name}={self.literal(getattr(value, p.name), f'{where}.{p.name}')}" for p in parameters]
        return f"{self.names.reference(type(value), where)}({', '.join(arguments)})"

    def _tensor(self, tensor: torch.Tensor | TensorStub) -> str:
        """A small tensor literally; a large one (a TensorStub by now) as a placeholder of its shape and dtype."""
        self.names.namespace("torch")
        dtype = "" if tensor.dtype == torch.float32 else f", dtype={tensor.dtype}"
        if isinstance(tensor, TensorStub):
            return f"torch.{'zeros' if tensor.zeros else 'ones'}({_sizes(tensor.shape)}{dtype})"
        return f"torch.tensor({tensor.tolist()!r}{dtype})"


def _sizes(shape: tuple[int, ...]) -> str:
    return ", ".join(map(str, shape)) or "()"


# ----------------------------------------------------------------------------------------------- torch.nn modules

def _same_per_axis(sizes: tuple) -> object:
    """(3, 3) as 3, as people write a convolution's sizes (torch expands it back)."""
    return sizes[0] if isinstance(sizes, tuple) and len(set(sizes)) == 1 else sizes


def _conv(m: nn.modules.conv._ConvNd) -> dict:
    arguments = {"in_channels": m.in_channels, "out_channels": m.out_channels,
                 "kernel_size": _same_per_axis(m.kernel_size), "stride": _same_per_axis(m.stride),
                 "padding": _same_per_axis(m.padding), "dilation": _same_per_axis(m.dilation), "groups": m.groups,
                 "bias": m.bias is not None, "padding_mode": m.padding_mode}
    if m.transposed:
        arguments["output_padding"] = _same_per_axis(m.output_padding)
    return arguments


def _norm(m: nn.modules.batchnorm._NormBase) -> dict:
    return {"num_features": m.num_features, "eps": m.eps, "momentum": m.momentum, "affine": m.affine,
            "track_running_stats": m.track_running_stats}


# The torch.nn module types converters create, each with its constructor arguments read from its public attributes
# (the packed convolutions are nn.Conv1d / nn.Conv2d with an inference path, and take their arguments). Exact types
# only: another subclass may take other arguments. Parameters and buffers are not arguments: the code builds
# them on the meta device and load() assigns the saved ones.
_TORCH_MODULES: Mapping[type[nn.Module], Callable[[nn.Module], dict]] = MappingProxyType({
    nn.Linear: lambda m: {"in_features": m.in_features, "out_features": m.out_features, "bias": m.bias is not None},
    **dict.fromkeys((packed.Conv1d, packed.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                     nn.ConvTranspose3d), _conv),
    **dict.fromkeys((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm1d, nn.InstanceNorm2d,
                     nn.InstanceNorm3d), _norm),
    nn.LayerNorm: lambda m: {"normalized_shape": m.normalized_shape, "eps": m.eps,
                             "elementwise_affine": m.elementwise_affine, "bias": m.bias is not None},
    nn.GroupNorm: lambda m: {"num_groups": m.num_groups, "num_channels": m.num_channels, "eps": m.eps,
                             "affine": m.affine},
    nn.PReLU: lambda m: {"num_parameters": m.num_parameters, "init": m.init},
    nn.Identity: lambda m: {},
    nn.Sequential: lambda m: {"args": list(m)},
})


def _torch_arguments(module: nn.Module, where: str) -> dict:
    """The constructor arguments of a torch.nn module of a type in ``_TORCH_MODULES``, with its device and dtype."""
    describe = _TORCH_MODULES.get(type(module))
    if describe is None:
        known = ", ".join(sorted(cls.__name__ for cls in _TORCH_MODULES))
        raise CodegenError(f"{where}: cannot write a {type(module).__module__}.{type(module).__qualname__}: codegen "
                           f"writes this library's modules (modules.common.Module keeps their arguments) and these "
                           f"torch.nn modules: {known}")
    arguments = describe(module)
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    if tensors:
        arguments["device"] = "meta"  # placeholders: load() assigns the saved tensors
        floating = [t.dtype for t in tensors if t.is_floating_point()]
        if floating and floating[0] != torch.float32:
            arguments["dtype"] = floating[0]
    return arguments


# ----------------------------------------------------------------------------------------------- modules, classes

class _Writer:
    """Builds the source of model.py: one class per GraphModule, a constructor call for every other module."""

    def __init__(self):
        self.names = _Names()
        self.values = _Values(self.names, self.module)
        self.classes: list[str] = []  # class definitions, nested bodies first

    def module(self, module: nn.Module, where: str) -> str:
        """A constructor call that rebuilds ``module`` (a class of its own for a GraphModule)."""
        if isinstance(module, fx.GraphModule):
            return f"{self.graph_class(module, where)}()"
        cls, recorded = type(module), constructor_arguments(module)
        if recorded is None:
            return self._call(cls, _torch_arguments(module, where), where, as_built=False)
        try:
            bound = inspect.signature(cls).bind(*recorded[0], **recorded[1])
        except (TypeError, ValueError) as error:
            raise CodegenError(f"{where}: cannot match the arguments of {cls.__name__}: {error}") from error
        return self._call(cls, bound.arguments, where, as_built=True)

    def _call(self, cls: type, arguments: Mapping[str, object], where: str, as_built: bool) -> str:
        """``cls(...)`` with ``arguments`` (parameter name -> value). ``as_built``: as the converter passed them, less
        None for a None default; otherwise as people write torch modules: required ones positional, defaults left
        out."""
        parameters = inspect.signature(cls).parameters
        unknown = arguments.keys() - parameters.keys()
        if unknown:
            raise CodegenError(f"{where}: {cls.__name__} takes no argument {sorted(unknown)}")
        spread = any(p.kind is p.VAR_POSITIONAL and arguments.get(n) for n, p in parameters.items())
        positional, keywords = [], []
        for name, p in parameters.items():
            if name not in arguments:
                continue
            value, here = arguments[name], f"{where}({name}=)"
            if p.kind is p.VAR_POSITIONAL:
                positional += [self.values.literal(v, here) for v in value]
            elif p.kind is p.VAR_KEYWORD:
                keywords += [f"{k}={self.values.literal(v, here)}" for k, v in value.items()]
            elif (p.kind is p.POSITIONAL_ONLY or (spread and p.kind is not p.KEYWORD_ONLY)
                  or (not as_built and p.default is p.empty)):
                positional.append(self.values.literal(value, here))
            elif not _is_default(value, p.default, as_built):
                keywords.append(f"{name}={self.values.literal(value, here)}")
        return f"{self.names.reference(cls, where)}({', '.join(positional + keywords)})"

    def graph_class(self, gm: fx.GraphModule, where: str, name: str | None = None) -> str:
        """Write a class for ``gm`` (its submodules, parameters and buffers, and fx's forward); returns its name."""
        name = self.names.new_class(name or sanitize(re.sub(r"\W+", "_", where)), exact=name is not None)
        body = self._submodules(gm, where) + self._tensors(gm)
        code = gm.graph.python_code(root_module="self")
        self.names.forward_globals(code, f"{where}.forward")
        init = "\n".join(f"        {line}" for line in "\n".join(body).splitlines()) or "        pass"
        forward = "\n".join(("    " + line).rstrip() for line in code.src.strip().splitlines())
        self.classes.append(f"class {name}(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                            f"{init}\n\n{forward}\n")
        self.names.namespace("nn")
        return name

    def _submodules(self, gm: fx.GraphModule, where: str) -> list[str]:
        """``self.child = Constructor(...)`` per child, commented with the ONNX node it came from."""
        origin = {n.target: n.meta.get("onnx") for n in gm.graph.nodes if n.op == "call_module"}
        lines = []
        for child_name, child in gm.named_children():
            meta = origin.get(child_name)
            if meta is None:
                comment = ""
            elif "replaces" in meta:  # a recognised recurrence
                comment = f"  # {meta['op_type']}: {len(meta['replaces'])} nodes from {meta['name']!r} on"
            else:
                comment = f"  # {meta['op_type']}-{meta['version']}" + (f" node {meta['name']!r}" if meta["name"]
                                                                         else "")
            lines.append(_wrap(f"self.{child_name} = ", self.module(child, f"{where}.{child_name}"), comment))
        return lines

    def _tensors(self, gm: fx.GraphModule) -> list[str]:
        """The GraphModule's own parameters and buffers, as meta placeholders of their shapes and dtypes."""
        self.names.namespace("torch")
        lines, parameters = [], parameter_dict(gm)
        for tensor_name, tensor in [*parameters.items(), *buffer_dict(gm).items()]:
            if tensor is None:
                continue
            dtype = "" if tensor.dtype == torch.float32 else f", dtype={tensor.dtype}"
            empty = f"torch.empty({_sizes(tensor.shape)}{dtype}, device='meta')"
            if tensor_name in parameters:
                frozen = "" if tensor.requires_grad else ", requires_grad=False"
                lines.append(f"self.{tensor_name} = {self.names.namespace('nn')}.Parameter({empty}{frozen})")
            else:
                lines.append(f"self.register_buffer({tensor_name!r}, {empty})")
        return lines

    def source(self, header: str) -> str:
        imports = {*self.names.imports.values(), "import os", "import torch", "from collections.abc import Mapping",
                   "from pathlib import Path", "from torch import nn"}
        definitions = "\n\n".join(self.classes)
        return f'''{header}

from __future__ import annotations

{_format_imports(imports)}
{"".join(chr(10) + line for line in self.names.assignments)}
WEIGHTS = Path(__file__).with_name({WEIGHTS_FILE!r})


{definitions}

def load(weights: str | os.PathLike | Mapping[str, torch.Tensor] | None = None) -> Model:
    """The model with its weights (a path or a state dict; default: {WEIGHTS_FILE} beside this file), in eval mode."""
    if not isinstance(weights, Mapping):
        weights = torch.load(WEIGHTS if weights is None else weights, weights_only=True)
    model = Model()
    model.load_state_dict(weights, assign=True)  # the saved tensors replace the placeholders, dtypes included
    return model.eval()
'''


def _is_default(value: object, default: object, as_built: bool) -> bool:
    if as_built:  # the converter's arguments are kept as passed: they are the ONNX attributes
        return value is None and default is None
    return value is default or (type(value) is type(default) and value == default)


def _wrap(target: str, call: str, comment: str, width: int = 112) -> str:
    """``target + call + comment``, with one argument per line when that is too long for one line."""
    if len(target) + len(call) + len(comment) <= width:
        return target + call + comment
    node = ast.parse(call, mode="eval").body
    arguments = [ast.get_source_segment(call, a) for a in [*node.args, *node.keywords]]
    callee = ast.get_source_segment(call, node.func)
    return f"{target}{callee}({comment}\n" + "".join(f"    {a},\n" for a in arguments) + ")"


def generate(module: fx.GraphModule, origin: str = "") -> str:
    """The source of model.py for a converted module (``origin``: the ONNX file's name, for the header)."""
    writer = _Writer()
    writer.graph_class(module, "Model", name="Model")
    header = f'''"""PyTorch code generated by onnx2torch-rnn {__version__}{f" from {origin}" if origin else ""}.

load() builds the model and fills in its weights from {WEIGHTS_FILE} (torch.load(..., weights_only=True)).
Model() alone builds the structure: its weights are placeholders until load_state_dict(..., assign=True).
Submodules come from onnx2torch_rnn.modules (constructor arguments are the ONNX node's attributes) and torch.nn.
"""'''
    return writer.source(header)


# ----------------------------------------------------------------------------------------------- files

def write(model: ModelSource | LoadedModel, outdir: str | os.PathLike, *, force: bool = False,
          progress: Callable[[int, int], None] | None = None, dequantize: bool = False,
          fuse: bool = True) -> fx.GraphModule:
    """Convert ``model`` and write OUTDIR/model.py and OUTDIR/weights.pt; returns the converted module. A
    LoadedModel is converted as it was loaded (``load_model(..., dequantize=True)`` dequantizes it).

    An existing non-empty OUTDIR needs ``force`` (OutputExistsError without; with it, only the files written here
    are replaced). The written code is loaded back and checked against the converted module (CodegenError when it
    differs).
    """
    outdir = Path(outdir)
    if outdir.exists() and (not outdir.is_dir() or any(outdir.iterdir())) and not force:
        raise OutputExistsError(outdir)
    if isinstance(model, LoadedModel) and dequantize:
        raise ValueError("a LoadedModel is dequantized when it is loaded: load_model(..., dequantize=True)")
    loaded = model if isinstance(model, LoadedModel) else load_model(model, dequantize=dequantize, single_use=True)
    module = build(loaded, progress, fuse=fuse)
    origin = model.source if isinstance(model, LoadedModel) else model
    source = generate(module, Path(origin).name if isinstance(origin, str | os.PathLike) else "")
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / PROGRAM_FILE).unlink(missing_ok=True)  # a program from an earlier run would not match
    (outdir / CODE_FILE).write_text(source)
    torch.save(module.state_dict(), outdir / WEIGHTS_FILE)
    verify(load_generated(outdir).load(), module)
    return module


def load_generated(outdir: str | os.PathLike):
    """Import OUTDIR/model.py as a fresh module object (not left in sys.modules)."""
    name = f"_onnx2torch_generated_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, Path(outdir) / CODE_FILE)
    code = importlib.util.module_from_spec(spec)
    sys.modules[name] = code  # dataclasses and typing look the module up while it executes
    try:
        spec.loader.exec_module(code)
    finally:
        del sys.modules[name]
    return code


def verify(rebuilt: nn.Module, original: nn.Module) -> None:
    """Raise CodegenError unless ``rebuilt`` has the submodules, attributes and tensors of ``original``."""
    problems = []
    mine, theirs = dict(rebuilt.named_modules()), dict(original.named_modules())
    if mine.keys() != theirs.keys():
        problems.append(f"submodules differ: {sorted(mine.keys() ^ theirs.keys())[:5]}")
    for name in theirs.keys() & mine.keys():
        a, b = mine[name], theirs[name]
        where = f"{name or 'the model'} ({type(b).__name__})"
        if isinstance(b, fx.GraphModule):
            continue  # its own class: compared through its submodules and tensors
        if type(a) is not type(b):
            problems.append(f"{where}: rebuilt as {type(a).__name__}")
        elif a.extra_repr() != b.extra_repr():
            problems.append(f"{where}: {a.extra_repr()!r} != {b.extra_repr()!r}")
        else:
            problems += [f"{where}: attribute {key} differs" for key in _plain_attributes(b)
                         if not _same(getattr(a, key, None), getattr(b, key))]
    for kind in ("named_parameters", "named_buffers"):
        # every name, also of a tensor that several modules share (a folded scale read by two nodes): the rebuilt
        # modules each have their own copy, so a listing without duplicates would name different ones
        mine_t, theirs_t = (dict(getattr(m, kind)(remove_duplicate=False)) for m in (rebuilt, original))
        if mine_t.keys() != theirs_t.keys():
            problems.append(f"{kind.removeprefix('named_')} differ: {sorted(mine_t.keys() ^ theirs_t.keys())[:5]}")
        for name in mine_t.keys() & theirs_t.keys():
            a, b = mine_t[name], theirs_t[name]
            same = not a.is_meta and (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad)
            if not (same and torch.equal(a, b)):
                problems.append(f"{name}: tensor differs")
    if problems:
        raise CodegenError("the generated code does not rebuild the converted module:\n  " + "\n  ".join(problems[:10]))


def _plain_attributes(module: nn.Module) -> list[str]:
    return [k for k, v in vars(module).items()
            if not k.startswith("_") and k != "training" and not isinstance(v, torch.Tensor | nn.Module)]


def _same(a: object, b: object) -> bool:
    """Equal, or of equal repr where the repr shows the content (objects without __eq__, numpy arrays)."""
    try:
        if bool(a == b):
            return True
    except Exception:
        pass
    return type(a) is type(b) and repr(a) == repr(b) and " at 0x" not in repr(a)


# ----------------------------------------------------------------------------------------------- torch.export

def export_program(module: nn.Module, args: tuple[torch.Tensor, ...], dynamic: Mapping[int, Mapping[int, str]],
                   path: str | os.PathLike) -> tuple[str, bool]:
    """Save ``torch.export.export(module, args)`` to ``path``; returns how its shapes were exported (for a message)
    and whether it calls this library's custom ops (then ``import onnx2torch_rnn`` must precede
    ``torch.export.load``).

    Axes in ``dynamic`` ({input position: {axis: symbolic name}}) are exported as dynamic; when that fails, static
    shapes are tried. The saved program is loaded back and checked against ``module`` on ``args``. Raises
    RuntimeError, with each attempt's reason, when no export works.
    """
    from torch.export import Dim

    attempts = []
    if any(dynamic.values()):
        shapes = tuple({axis: Dim.AUTO for axis in dynamic.get(i, {})} or None for i in range(len(args)))
        names = sorted({n for axes in dynamic.values() for n in axes.values()})
        attempts.append((shapes, f"dynamic dims: {', '.join(names)}"))
    attempts.append((None, "static shapes: " + ", ".join(str(list(a.shape)) for a in args)))
    errors = []
    for shapes, note in attempts:
        try:
            with quiet_torch():
                program = torch.export.export(module, args, dynamic_shapes=shapes)
            torch.export.save(program, path)
            with torch.no_grad():
                expected, actual = module(*args), torch.export.load(path).module()(*args)
            torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
        except Exception as error:
            Path(path).unlink(missing_ok=True)
            first_line = (str(error).strip().splitlines() or [""])[0]
            errors.append(f"with {note.split(':')[0]}: {type(error).__name__}: {first_line}")
            continue
        if shapes is not None and not program.range_constraints:
            note = "static shapes (torch.export specialised every dim)"
        return note, any(getattr(n.target, "namespace", None) == "onnx2torch_rnn" for n in program.graph.nodes)
    raise RuntimeError("torch.export failed " + "; ".join(errors))


class _FromThisThread(logging.Filter):
    """Drops torch's records below ERROR that the thread which made it logs."""

    def __init__(self):
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        torch_record = record.name == "torch" or record.name.startswith("torch.")
        return not (torch_record and record.thread == self.thread and record.levelno < logging.ERROR)


def _torch_handlers() -> set[logging.Handler]:
    """Every handler that a record of torch's loggers reaches."""
    manager = logging.Logger.manager
    loggers = [logging.getLogger("torch")] + [logger for name, logger in list(manager.loggerDict.items())
                                              if name.startswith("torch.") and isinstance(logger, logging.Logger)]
    handlers = set()
    for logger in loggers:
        while logger is not None:
            handlers.update(logger.handlers)
            logger = logger.parent if logger.propagate else None
    return handlers


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence what torch.export and torch.onnx log below ERROR while this thread runs them (a failure is reported
    in one line). Scoped: other threads' records and everything outside the block pass as before, no stream is
    redirected, no level changed."""
    drop, handlers = _FromThisThread(), _torch_handlers()
    for handler in handlers:
        handler.addFilter(drop)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)
