"""The layout says the pipeline: packages import only from the stages before them, no module
imports itself round a cycle, and no module outgrows one sitting (400 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

from rig import PROJECT_ROOT

# Shared vocabulary first, then the stages in the order the data flows; stub serves the tests.
ORDER = (
    "rig",
    "rig.salts",
    "rig.secrets",
    "rig.records",
    "rig.interrupts",
    "rig.scenario",
    "rig.models",
    "rig.serve",
    "rig.load",
    "rig.stub",
    "rig.verdict",
    "rig.report",
    "rig.run",
    "rig.cli",
)
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for root in ("rig", "kernels"):
        for path in sorted((PROJECT_ROOT / root).rglob("*.py")):
            parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, at any depth of its code (lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "rig" else parts[0]


def test_packages_import_only_the_stages_before_them():
    modules = _modules()
    backwards = []
    for module, path in modules.items():
        if not module.startswith("rig"):
            continue
        for imported in _imports(path, modules):
            mine, theirs = _package(module), _package(imported)
            if theirs.startswith("rig") and ORDER.index(theirs) > ORDER.index(mine):
                backwards.append(f"{module} imports {imported}")
    assert not backwards


def test_no_import_cycle():
    modules = _modules()
    graph = {module: _imports(path, modules) for module, path in modules.items()}
    done: set[str] = set()

    def visit(module: str, trail: tuple[str, ...]) -> None:
        if module in trail:
            raise AssertionError(" -> ".join((*trail[trail.index(module) :], module)))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*trail, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_no_module_over_400_lines():
    long = {
        f"{module}: {lines}"
        for module, path in _modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long


def test_every_package_says_its_job():
    for module, path in _modules().items():
        if path.name == "__init__.py" and module.startswith("rig."):
            assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), module
