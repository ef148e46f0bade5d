"""A converted model as standalone PyTorch code: ``OUTDIR/model.py`` and ``OUTDIR/weights.pt``.

``model.py`` defines ``class Model(nn.Module)`` (submodules, then the forward that torch.fx generated) and
``load(weights=None) -> Model``. The submodules are this library's modules (and torch's), each rebuilt by a call to
its constructor with the arguments the converter gave it: conversion runs with every module constructor recording its
arguments (``_recording``). Tensor arguments are written as placeholders of the same shape (zeros where the tensor is
all zeros, else ones; tiny tensors literally), since ``load`` replaces every parameter and buffer with the saved one.
After writing, the files are loaded back and compared with the converted module (types, attributes, every tensor):
whatever the code cannot rebuild is an error here, not a surprise later.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import functools
import importlib
import importlib.util
import inspect
import io
import logging
import math
import operator
import os
import re
import sys
import threading
import uuid
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import fx, nn

from .builder import build, sanitize
from .errors import Onnx2TorchError, OutputExistsError
from .loading import LoadedModel, ModelSource, load_model
from .torch_compat import buffer_dict, fx_builtin_imports, parameter_dict

CODE_FILE, WEIGHTS_FILE, PROGRAM_FILE = "model.py", "weights.pt", "model.pt2"
LITERAL_MAX_ELEMENTS = 8  # tensor arguments up to this size are written out; larger ones become placeholders


class CodegenError(Onnx2TorchError):
    """The converted module cannot be written as code (e.g. a module whose constructor arguments are unknown)."""


# ----------------------------------------------------------------------------------------------- recording

_RECORD_LOCK = threading.Lock()


def _module_classes() -> list[type]:
    """The module classes converters construct: this library's and torch.nn's (never a user's own classes)."""
    found, pending = {}, [nn.Module]  # a dict: a class with two module bases is listed once
    while pending:
        cls = pending.pop()
        found[cls] = None
        pending += cls.__subclasses__()
    return [cls for cls in found if cls.__module__.startswith(("onnx2torch_rnn.", "torch.nn.", "torch.fx."))]


def _recorder(init: Callable, records: weakref.WeakKeyDictionary) -> Callable:
    @functools.wraps(init)
    def recording_init(self, *args, **kwargs):
        if self not in records:  # the outermost __init__ (a subclass's) sees the caller's arguments
            records[self] = (args, kwargs)
        init(self, *args, **kwargs)

    return recording_init


@contextlib.contextmanager
def _recording() -> Iterator[weakref.WeakKeyDictionary]:
    """While active, every library or torch.nn module constructor records its arguments: ``records[module] =
    (args, kwargs)``.

    Each class that defines ``__init__`` gets a recording wrapper, restored on exit; the lock keeps two recordings
    (threads) from interleaving their wrappers.
    """
    with _RECORD_LOCK:
        records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        patched = []
        try:
            for cls in _module_classes():
                init = vars(cls).get("__init__")
                if init is not None:
                    cls.__init__ = _recorder(init, records)
                    patched.append((cls, init))
            yield records
        finally:
            for cls, init in reversed(patched):
                cls.__init__ = init


# ----------------------------------------------------------------------------------------------- code

# Namespaces for objects without an importable qualified name (torch's C functions, Tensor methods), as the generated
# code spells them.
_NAMESPACES = (("torch", torch), ("F", F), ("torch.Tensor", torch.Tensor), ("nn", nn), ("torch.special", torch.special),
               ("torch.linalg", torch.linalg), ("operator", operator), ("math", math))
_ALIASES = {"torch": "import torch", "nn": "from torch import nn", "F": "import torch.nn.functional as F",
            "operator": "import operator", "math": "import math"}


class _Writer:
    """Builds the source of model.py: imports, one class per GraphModule, constructor calls for the rest."""

    def __init__(self, records: Mapping[nn.Module, tuple[tuple, dict]]):
        self.records = records
        self.imports: dict[str, str] = {}  # name used in the code -> import statement
        self.bound: dict[str, object] = {}  # name used in the code -> the object it names
        self.classes: list[str] = []  # class definitions, nested bodies first
        self.assignments: list[str] = []  # names that fx's forward code uses for functions, bound after imports
        self.class_names: set[str] = {"Model", "load", "WEIGHTS", "Path", "Mapping", "os", *_ALIASES}

    # names -----------------------------------------------------------------------------------------------------

    def _namespace(self, prefix: str) -> str:
        root = prefix.split(".")[0]
        self.imports[root] = _ALIASES[root]
        return prefix

    def reference(self, obj: object, where: str) -> str:
        """An expression naming a class, function or module-level object, with its import registered.

        Objects of this library (or any non-torch package) are imported by qualified name; torch's are spelled
        ``torch.x``, ``nn.X``, ``F.x``, ``torch.Tensor.x``, ... as people write them.
        """
        if obj is torch:
            return self._namespace("torch")
        if isinstance(obj, type) and issubclass(obj, nn.Module) and getattr(nn, obj.__name__, None) is obj:
            return f"{self._namespace('nn')}.{obj.__name__}"
        module_name, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
        importable = bool(module_name) and "<" not in qualname and _resolve(module_name, qualname) is obj
        if importable and not module_name.startswith("torch"):
            return self._import(module_name, qualname)
        name = getattr(obj, "__name__", None)
        for prefix, namespace in _NAMESPACES:
            if name and getattr(namespace, name, None) is obj:
                return f"{self._namespace(prefix)}.{name}"
        if importable:
            return self._import(module_name, qualname)
        raise CodegenError(f"{where}: {obj!r} has no importable name (a lambda or local function?); give the "
                           "module a module-level function instead")

    def _import(self, module_name: str, qualname: str) -> str:
        top, _, rest = qualname.partition(".")
        alias = self._bind(top, _resolve(module_name, top), f"from {module_name} import {top}")
        return alias + (f".{rest}" if rest else "")

    def _bind(self, name: str, obj: object, statement: str) -> str:
        alias, n = name, 1
        while (alias in self.bound and self.bound[alias] is not obj) or alias in self.class_names:
            alias, n = f"{name}_{n}", n + 1
        if alias not in self.bound:
            self.bound[alias] = obj
            self.imports[alias] = statement + (f" as {alias}" if alias != name else "")
        return alias

    # values ----------------------------------------------------------------------------------------------------

    def literal(self, value: object, where: str) -> str:
        """Python source for a constructor argument."""
        if value is None or isinstance(value, bool | int | str):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
        if isinstance(value, enum.Enum):
            return f"{self.reference(type(value), where)}.{value.name}"
        if isinstance(value, torch.dtype | torch.device):
            self._namespace("torch")
            return str(value) if isinstance(value, torch.dtype) else f"torch.device({str(value)!r})"
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
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
            return f"{self.reference(type(value), where)}({', '.join(fields)})"
        if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalars
            return self.literal(value.item(), where)
        if inspect.isroutine(value) or isinstance(value, type):
            return self.reference(value, where)
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
        return f"{self.reference(type(value), where)}({', '.join(arguments)})"

    def _tensor(self, tensor: torch.Tensor) -> str:
        self._namespace("torch")
        dtype = "" if tensor.dtype == torch.float32 else f", dtype={tensor.dtype}"
        if tensor.is_meta or tensor.numel() > LITERAL_MAX_ELEMENTS:
            fill = "zeros" if tensor.is_meta or not bool(tensor.any()) else "ones"
            return f"torch.{fill}({_sizes(tensor.shape)}{dtype})"
        return f"torch.tensor({tensor.tolist()!r}{dtype})"

    # modules ---------------------------------------------------------------------------------------------------

    def module(self, module: nn.Module, where: str) -> str:
        """A constructor call that rebuilds ``module`` (a class of its own for a GraphModule)."""
        if isinstance(module, fx.GraphModule):
            return f"{self.graph_class(module, where)}()"
        record = self.records.get(module)
        if record is None:
            raise CodegenError(f"{where}: no constructor arguments were recorded for this {type(module).__name__} "
                               "(a module built outside the conversion, or copied)")
        cls = type(module)
        try:
            bound = inspect.signature(cls).bind(*record[0], **record[1])
        except (TypeError, ValueError) as error:
            raise CodegenError(f"{where}: cannot match the arguments of {cls.__name__}: {error}") from error
        positional, keywords = [], []
        parameters = inspect.signature(cls).parameters
        var_positional = any(p.kind is p.VAR_POSITIONAL and bound.arguments.get(n) for n, p in parameters.items())
        for name, value in bound.arguments.items():
            kind, default = parameters[name].kind, parameters[name].default
            here = f"{where}({name}=)"
            if kind is inspect.Parameter.VAR_POSITIONAL:
                positional += [self.literal(v, here) for v in value]
            elif kind is inspect.Parameter.VAR_KEYWORD:
                keywords += [f"{k}={self.literal(v, here)}" for k, v in value.items()]
            elif kind is inspect.Parameter.POSITIONAL_ONLY or (var_positional and kind is not kind.KEYWORD_ONLY):
                positional.append(self.literal(value, here))
            elif not (value is None and default is None):  # what the converter passed, less absent attributes
                keywords.append(f"{name}={self.literal(value, here)}")
        return f"{self.reference(cls, where)}({', '.join(positional + keywords)})"

    def graph_class(self, gm: fx.GraphModule, where: str, name: str | None = None) -> str:
        """Write a class for ``gm`` (its submodules, parameters and buffers, and fx's forward); returns its name."""
        name = name or _unique(sanitize(re.sub(r"\W+", "_", where)), self.class_names | self.bound.keys())
        self.class_names.add(name)
        origin = {n.target: n.meta.get("onnx") for n in gm.graph.nodes if n.op == "call_module"}
        body = []
        for child_name, child in gm.named_children():
            meta = origin.get(child_name)
            if meta is None:
                comment = ""
            elif "replaces" in meta:  # a recognised recurrence
                comment = f"  # {meta['op_type']}: {len(meta['replaces'])} nodes from {meta['name']!r} on"
            else:
                comment = f"  # {meta['op_type']}-{meta['version']}" + (f" node {meta['name']!r}" if meta["name"]
                                                                         else "")
            body.append(_wrap(f"self.{child_name} = ", self.module(child, f"{where}.{child_name}"), comment))
        self._namespace("torch")
        parameters = parameter_dict(gm)
        for tensor_name, tensor in [*parameters.items(), *buffer_dict(gm).items()]:
            if tensor is None:
                continue
            dtype = "" if tensor.dtype == torch.float32 else f", dtype={tensor.dtype}"
            empty = f"torch.empty({_sizes(tensor.shape)}{dtype}, device='meta')"
            if tensor_name in parameters:
                frozen = "" if tensor.requires_grad else ", requires_grad=False"
                body.append(f"self.{tensor_name} = {self._namespace('nn')}.Parameter({empty}{frozen})")
            else:
                body.append(f"self.register_buffer({tensor_name!r}, {empty})")
        code = gm.graph.python_code(root_module="self")
        used = set(re.findall(r"\b\w+\b", code.src))
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
                expression = self.reference(obj, f"{where}.forward")
                if expression != global_name:
                    self.assignments.append(f"{global_name} = {expression}")
        init = "\n".join(f"        {line}" for line in "\n".join(body).splitlines()) or "        pass"
        forward = "\n".join(("    " + line).rstrip() for line in code.src.strip().splitlines())
        self.classes.append(f"class {name}(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                            f"{init}\n\n{forward}\n")
        self._namespace("nn")
        return name

    def source(self, header: str) -> str:
        imports = {*self.imports.values(), "import os", "import torch", "from collections.abc import Mapping",
                   "from pathlib import Path", "from torch import nn"}
        definitions = "\n\n".join(self.classes)
        return f'''{header}

from __future__ import annotations

{_format_imports(imports)}
{"".join(chr(10) + line for line in self.assignments)}
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


def _wrap(target: str, call: str, comment: str, width: int = 112) -> str:
    """``target + call + comment``, with one argument per line when that is too long for one line."""
    if len(target) + len(call) + len(comment) <= width:
        return target + call + comment
    node = ast.parse(call, mode="eval").body
    arguments = [ast.get_source_segment(call, a) for a in [*node.args, *node.keywords]]
    callee = ast.get_source_segment(call, node.func)
    return f"{target}{callee}({comment}\n" + "".join(f"    {a},\n" for a in arguments) + ")"


def _sizes(shape: torch.Size) -> str:
    return ", ".join(map(str, shape)) or "()"


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def generate(module: fx.GraphModule, records: Mapping[nn.Module, tuple[tuple, dict]], origin: str = "") -> str:
    """The source of model.py for a module converted while ``_recording``."""
    from . import __version__

    writer = _Writer(records)
    writer.graph_class(module, "Model", name="Model")
    header = f'''"""PyTorch code generated by onnx2torch-rnn {__version__}{f" from {origin}" if origin else ""}.

load() builds the model and fills in its weights from {WEIGHTS_FILE} (torch.load(..., weights_only=True)).
Model() alone builds the structure: its weights are placeholders until load_state_dict(..., assign=True).
Submodules come from onnx2torch_rnn.modules (constructor arguments are the ONNX node's attributes) and torch.nn.
"""'''
    return writer.source(header)


# ----------------------------------------------------------------------------------------------- files

def convert_recording(model: ModelSource | LoadedModel, progress: Callable[[int, int], None] | None = None,
                      dequantize: bool = False, fuse: bool = True):
    """Convert ``model``, recording module constructor arguments: (GraphModule, records) for ``generate``. A
    LoadedModel is converted as it was loaded (``load_model(..., dequantize=True)`` dequantizes it)."""
    if isinstance(model, LoadedModel) and dequantize:
        raise ValueError("a LoadedModel is dequantized when it is loaded: load_model(..., dequantize=True)")
    loaded = model if isinstance(model, LoadedModel) else load_model(model, dequantize=dequantize)
    with _recording() as records:
        module = build(loaded, progress, fuse=fuse)
    return module, records


def write(model: ModelSource | LoadedModel, outdir: str | os.PathLike, *, force: bool = False,
          progress: Callable[[int, int], None] | None = None, dequantize: bool = False,
          fuse: bool = True) -> fx.GraphModule:
    """Convert ``model`` and write OUTDIR/model.py and OUTDIR/weights.pt; returns the converted module.

    An existing non-empty OUTDIR needs ``force`` (OutputExistsError without; with it, only the files written here
    are replaced). The written code is loaded back and checked against the converted module (CodegenError when it
    differs).
    """
    outdir = Path(outdir)
    if outdir.exists() and (not outdir.is_dir() or any(outdir.iterdir())) and not force:
        raise OutputExistsError(outdir)
    module, records = convert_recording(model, progress, dequantize, fuse)
    origin = model.source if isinstance(model, LoadedModel) else model
    source = generate(module, records, Path(origin).name if isinstance(origin, str | os.PathLike) else "")
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
        mine_t, theirs_t = dict(getattr(rebuilt, kind)()), dict(getattr(original, kind)())
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
            with _quiet():
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


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence what torch.export prints and logs while it tries (a failure is reported in one line)."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
