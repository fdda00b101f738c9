"""The layout's rules: no import cycles, a pure core, shells that do not import each other,
small bench scripts over a shared harness, test modules that import no other.

Modules are cut by concept, whatever their length; what a length cap was meant to guard
is checked here instead. The import contracts themselves are run by lint-imports
(`tests/test_project.py`); this module checks that they are still declared.
"""

from __future__ import annotations

import ast
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "router", "push_service", "socket_gateway")
BENCH_LIMIT = 400


def _python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


# ---------------------------------------------------------------------- import cycles


def _our_modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the four packages and the Python SDK (a
    package is its `__init__`)."""
    modules = {}
    for p in _python_files():
        rel = p.relative_to(ROOT)
        if rel.parts[:3] == ("clients", "python", "imroute_client"):
            rel = rel.relative_to("clients/python")  # the SDK, its own distribution
        elif rel.parts[0] not in PACKAGES:
            continue
        parts = rel.with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = p
    return modules


def _import_statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, wherever it stands: at the top, in a function, in a
    TYPE_CHECKING block."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _ours(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that `name` names: the longest of ours it starts with."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]
) -> Iterator[str | None]:
    """The modules of ours an import statement names (None for one not ours)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield _ours(alias.name, modules)
        return
    base = node.module or ""
    if node.level:
        # Relative: from the module's package (a package is its own).
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    for alias in node.names:
        # `from pkg import module` names the module, `from module import name` the module.
        full = f"{base}.{alias.name}"
        yield full if full in modules else _ours(base, modules)


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports.

    An edge goes to the module a statement names and to the packages above it that the
    import runs (their `__init__`), except the importer's own packages, which are
    loaded before it: a package whose `__init__` re-exports a module that imports back
    into a sibling would otherwise close a cycle only the import order hides. Every
    statement counts, those under `if TYPE_CHECKING:` and those
    inside functions too: an import that only the type checker runs, or one deferred to
    a call, hides a cycle from the interpreter but not from the reader, who still needs
    both modules to understand either (the two cycles this test was written against were
    each closed by a TYPE_CHECKING import).
    """
    modules = _our_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        own = _packages_above(module) | ({module} if is_package else set())
        for node in _import_statements(tree):
            for target in _targets(module, is_package, node, modules):
                if target is None:
                    continue
                runs = {target} | {p for p in _packages_above(target) if p in modules}
                graph[module] |= runs - own - {module}
    return graph


def _packages_above(module: str) -> set[str]:
    """`a.b.c` -> {`a`, `a.b`}: the packages whose `__init__` importing it runs first."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles_and_only_them() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"f"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_an_import_names_the_module_and_runs_the_packages_above_it() -> None:
    modules = {m: Path() for m in ("a", "a.b", "a.b.c", "a.d")}
    relative = ast.parse("from .c import x\nfrom . import c\nfrom ..d import y").body
    found = [t for n in relative for t in _targets("a.b.x", False, n, modules)]  # type: ignore[arg-type]
    assert found == ["a.b.c", "a.b.c", "a.d"]
    assert _packages_above("a.b.c") == {"a", "a.b"}


def test_no_import_cycles() -> None:
    graph = _import_graph()
    assert len(graph) > 100, "the import graph lost its modules"
    cycles = _cycles(graph)
    shown = "\n".join(
        f"  {' <-> '.join(c)}: "
        + "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c)
        for c in cycles
    )
    assert len(cycles) == 0, f"{len(cycles)} import cycle(s), cut them by concept:\n{shown}"


# ---------------------------------------------------------------------- import contracts


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def test_the_pure_core_contract_is_declared() -> None:
    """The modules that decide (rules, plans, codecs, clocks injected) import no I/O."""
    pure = _contracts()["the pure core decides without I/O"]
    assert pure["type"] == "forbidden"
    assert {"redis", "grpc", "sqlalchemy", "socket"} <= set(pure["forbidden_modules"])
    assert pure["source_modules"], "the pure core lost its modules"


def test_the_shells_independence_contract_is_declared() -> None:
    """push_service and socket_gateway are shells over router and shared, never each other."""
    shells = _contracts()["the two shells never import each other"]
    assert shells["type"] == "independence"
    assert set(shells["modules"]) == {"push_service", "socket_gateway"}


# ---------------------------------------------------------------------- bench


def test_every_bench_script_is_under_400_lines() -> None:
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if p.relative_to(ROOT).parts[0] == "bench" and (n := _lines(p)) >= BENCH_LIMIT
    }
    assert not too_long, f"move shared code into bench/harness: {too_long}"


def test_no_bench_imports_the_tests_or_edits_sys_path() -> None:
    offenders = []
    for p in _python_files():
        if p.relative_to(ROOT).parts[0] != "bench":
            continue
        text = p.read_text(encoding="utf-8")
        lines = [line.strip() for line in text.splitlines()]
        if "sys.path.insert(" in text or any(
            line.startswith(("from tests", "import tests")) for line in lines
        ):
            offenders.append(str(p.relative_to(ROOT)))
    assert not offenders, f"benches import the packages, never tests/ or sys.path: {offenders}"


def test_no_test_module_imports_another() -> None:
    """What two test modules share lives in a helper module (docs/development.md, "Notes"):
    a test module that imports another runs that module's imports and fixtures for a
    helper, and ties the two files' names together."""
    offenders = []
    for p in _python_files():
        rel = p.relative_to(ROOT)
        if rel.parts[0] != "tests" and rel.parts[:3] != ("clients", "python", "tests"):
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"), str(p))
        for node in _import_statements(tree):
            names = [a.name for a in node.names]  # `import tests.x.test_y`, `from . import test_y`
            if isinstance(node, ast.ImportFrom):
                names.append(node.module or "")
            if any(name.rsplit(".", 1)[-1].startswith("test_") for name in names):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"import helpers from a helper module, not a test module: {offenders}"
