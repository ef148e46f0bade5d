"""The package's modules import each other without cycles, no function in it is over 80 lines, and no module holds
mutable state at module level besides the registries.

The graph is read from the source with ast: an edge for every import of a module of the package, at module level or
inside a function. An import inside a function (deferred) runs later, but a cycle it closes is still a cycle: the
two modules cannot be understood, tested or loaded one without the other, and which one loads first decides whether
a name is there yet. So deferred imports count too; they are for what is costly or optional to load, never for
hiding a cycle.

Importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first: those are edges too, except a package that holds the
importing module (it is already being imported when its submodules run).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import onnx2torch_rnn

ROOT = Path(onnx2torch_rnn.__file__).parent
PACKAGE = ROOT.name


def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package (a package's name -> its __init__.py)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _packages_above(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of the package, line) for each import in ``path``, the packages it runs first included."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]  # what `from . import` names
    targets = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:  # `from ..x import y` in a.b.c: a.x
                package = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*package, node.module] if node.module else package)
            # `from package import submodule` imports the submodule; `from module import name` the module
            targets += [(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base, node.lineno)
                        for alias in node.names]
    edges = []
    for target, line in targets:
        running = [p for p in _packages_above(target) if p not in _packages_above(name)]
        edges += [(module, line) for module in [*running, target] if module in known and module != name]
    return edges


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}."""
    known = modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        graph[name] = {}
        for target, line in _imported(name, path, known):
            graph[name].setdefault(target, line)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle (its modules in import order, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        path.append(module)
        for target in graph.get(module, {}):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    return next((cycle for module in sorted(graph) if (cycle := visit(module))), None)


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in itertools.pairwise(cycle)] if cycle else []
    assert cycle is None, "import cycle:\n  " + "\n  ".join(steps)


def test_the_cycle_check_sees_deferred_and_package_imports():
    graph = import_graph()
    assert f"{PACKAGE}.registry" in graph[f"{PACKAGE}.converters.recurrent"]  # from ..registry import ...
    assert f"{PACKAGE}.converters" not in graph[f"{PACKAGE}.converters.recurrent"]  # its own package
    assert f"{PACKAGE}.modules" in graph[f"{PACKAGE}.dequantize"]  # from .modules.quantized runs modules first
    assert f"{PACKAGE}.builder" in graph[f"{PACKAGE}.cli"]  # inside a function
    assert find_cycle({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 2, "b": 3}}) is None


MAX_FUNCTION_LINES = 80


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method over MAX_FUNCTION_LINES lines."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_is_over_80_lines():
    """Functions that need more are doing several things: each should be its own function."""
    found = [f"{path.relative_to(ROOT.parent)}:{line} {name} ({length} lines)"
             for path in modules().values() for name, line, length in long_functions(path.read_text())]
    assert not found, "\n".join(found)


def test_the_length_check_sees_a_long_function():
    body = "\n".join(f"    x{k} = {k}" for k in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def long():\n{body}\n") == [("long", 1, MAX_FUNCTION_LINES + 1)]
    assert long_functions(f"def short():\n{body[:-len(body.splitlines()[-1]) - 1]}\n") == []


# The registries are the package's only module-level mutable state: converters with their static inputs, patterns.
REGISTRIES = {"registry._CONVERTERS", "registry._STATIC", "passes._PATTERNS"}
_MUTABLE_DISPLAYS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
_MUTABLE_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deque"}


def mutable_globals(source: str) -> list[tuple[str, int]]:
    """(name, line) of each module-level name bound to a dict, list or set (or a call that makes one), in the
    module's own statements (under if/try/with too, not in functions or classes); ``__all__`` aside."""
    found, statements = [], list(ast.parse(source).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.If | ast.Try | ast.With):
            statements += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                           *(s for handler in getattr(node, "handlers", []) for s in handler.body)]
            continue
        value = getattr(node, "value", None) if isinstance(node, ast.Assign | ast.AnnAssign) else None
        call = isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None))
        if isinstance(value, _MUTABLE_DISPLAYS) or call in _MUTABLE_CALLS:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [(t.id, node.lineno) for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
    return sorted(found, key=lambda item: item[1])


def test_no_module_level_mutable_state_besides_the_registries():
    """Tables are constant (MappingProxyType, frozenset, tuple); a cache is a documented functools.cache (of a pure
    function, or the kernel's one load attempt), or the kernel's packed weights (recurrent/op.py: PACKS, by weight
    identity and version). Mutable globals are state that one conversion leaves to the next,
    or one thread to another."""
    found = {f"{name.removeprefix(PACKAGE + '.')}.{variable}" for name, path in modules().items()
             for variable, _ in mutable_globals(path.read_text())}
    assert found == REGISTRIES, sorted(found - REGISTRIES)


def test_the_state_check_sees_mutable_globals():
    source = """
import collections
A = {}
B: list[int] = [1]
C = (1, 2)
D = collections.defaultdict(list)
E = frozenset({1})
if True:
    F = set()
def f():
    G = {}
class K:
    H = []
__all__ = ["A"]
"""
    assert mutable_globals(source) == [("A", 3), ("B", 4), ("D", 6), ("F", 9)]


def _test_modules_imported(source: str) -> list[str]:
    """The test modules (tests...test_*) that ``source`` imports."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [n for n in names if n.split(".")[0] == "tests" and n.split(".")[-1].startswith("test_")]


def test_no_test_module_imports_another():
    """Shared test code lives in helper modules (tests/helpers.py, tests/*_models.py), not in test modules."""
    tests = Path(__file__).parent
    found = {str(p.relative_to(tests)): _test_modules_imported(p.read_text()) for p in tests.rglob("test_*.py")}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_test_import_check_sees_one():
    assert _test_modules_imported("from tests.converters.test_nn import x\nimport tests.helpers\n") == [
        "tests.converters.test_nn"]
