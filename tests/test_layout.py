"""The layout says the pipeline: packages import only from the stages before them, no module
imports itself round a cycle, no module outgrows one sitting (400 lines), every rig module has
its mirrored tests/<package>/test_<module>.py (but those UNMIRRORED names), and each stage does
its own job: HTTP on the wire only in load/ (and serve/'s health check), through two clients
(the timed one on raw sockets, rig.untimed_http for the rest), pandas only where the typed
records become CSV tables (report/tables.py), report/ renders what verdict/ hands it, verdict/
does no network I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rig import PROJECT_ROOT

# Shared vocabulary first, then the stages in the order the data flows; stub serves the tests.
ORDER = (
    "rig",
    "rig.salts",
    "rig.secrets",
    "rig.untimed_http",
    "rig.records",
    "rig.interrupts",
    "rig.scenario",
    "rig.manifest_record",
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
HTTP_LIBRARIES = ("urllib.request", "urllib.error", "http.client", "aiohttp", "httpx", "requests")
UNTIMED_CLIENT = "rig.untimed_http"  # the one module that imports an HTTP library
UNTIMED_LIBRARIES = ("urllib.request", "urllib.error", "http.client")  # its one stack: stdlib
# Outside load/, the only modules that may speak HTTP (through the untimed client), and why:
# each asks whether something is up before any load, and nothing it reads goes into a result.
# They stay in serve/ because serve/ comes before load/: the server's own readiness is part of
# starting it, and preflight runs before any server does.
HEALTH_CHECKS = {
    "rig.serve.servers": "polls GET /health until a server it started is ready",
}
# The only rig modules that may import pandas, and why: everything else passes typed records.
TABLE_MODULES = {
    "rig.report.tables": "lays the typed records out as the CSV files, reads perf.csv back",
}
REPORT_INPUTS = (
    "rig.records",
    "rig.manifest_record",
    "rig.report",
    "rig.verdict",
)  # report/ renders these, nothing else
# verdict/ judges records it is given: it may read the stages before the servers (the shared
# records, the scenario, the manifest, the models) and the kernels' proof and backend names,
# never serve/, load/ or stub/, not even for a type or a constant (those live in rig.records).
VERDICT_INPUTS = (*ORDER[: ORDER.index("rig.serve")], "rig.verdict")
VERDICT_KERNEL_INPUTS = ("kernels.backends", "kernels.proof")


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


def _imported_names(source: str) -> set[str]:
    """Every name `source` imports, lazy imports included: the module, and for `from m import
    x` also m.x (x may be a submodule: `from urllib import request`)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _uses(source: str, libraries: tuple[str, ...]) -> list[str]:
    """The names of `libraries` (or their submodules) that `source` imports."""
    return sorted(
        name
        for name in _imported_names(source)
        if any(name == lib or name.startswith(f"{lib}.") for lib in libraries)
    )


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in packages)


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


def _stage_modules(*packages: str) -> dict[str, Path]:
    return {m: p for m, p in _modules().items() if _within(m, packages)}


def test_one_module_imports_an_http_library():
    """Untimed HTTP goes through rig.untimed_http, timed HTTP through rig.load.http_client's raw
    sockets: an HTTP library anywhere else would be a third client."""
    found = [
        f"{module} imports {', '.join(used)}"
        for module, path in _modules().items()
        if (used := _uses(path.read_text(encoding="utf-8"), HTTP_LIBRARIES))
        and module != UNTIMED_CLIENT
    ]
    assert not found


def test_the_untimed_client_is_one_stack():
    source = _modules()[UNTIMED_CLIENT].read_text(encoding="utf-8")
    assert _uses(source, HTTP_LIBRARIES) == sorted(UNTIMED_LIBRARIES)


def test_http_only_on_the_wire_and_in_health_checks():
    """load/ speaks HTTP to the servers; anywhere else the untimed client is a stage doing
    load/'s job, except the named health checks."""
    modules = _modules()
    found = [
        module
        for module, path in modules.items()
        if UNTIMED_CLIENT in _imports(path, modules)
        and not _within(module, ("rig.load",))
        and module not in HEALTH_CHECKS
    ]
    assert not found


def test_the_named_health_checks_exist_and_need_their_exception():
    modules = _modules()
    for module in HEALTH_CHECKS:
        assert UNTIMED_CLIENT in _imports(modules[module], modules), module


def test_pandas_only_at_the_csv_edge():
    """The verdict computes typed records and the report renders their fields; pandas only lays
    them out as CSV at the edge. kernels/ is a package of its own: its kernel-level checks
    print their own tables."""
    found = [
        module
        for module, path in _stage_modules("rig").items()
        if _uses(path.read_text(encoding="utf-8"), ("pandas",)) and module not in TABLE_MODULES
    ]
    assert not found


def test_the_named_table_modules_exist_and_need_their_exception():
    modules = _modules()
    for module in TABLE_MODULES:
        assert _uses(modules[module].read_text(encoding="utf-8"), ("pandas",)), module


def test_report_renders_only_what_verdict_hands_it():
    """No servers, machine, git or files of the run's inputs: what report/ shows comes in the
    RunOutcome (rig.records' types inside it)."""
    modules = _modules()
    found = [
        f"{module} imports {imported}"
        for module, path in _stage_modules("rig.report").items()
        for imported in sorted(_imports(path, modules))
        if not _within(imported, REPORT_INPUTS)
    ]
    assert not found


def test_verdict_reads_no_stage_that_serves_or_sends():
    """Types and constants that cross stages (the replay's records, the JIT-compile fault kind)
    come from rig.records, so verdict/ imports nothing of serve/, load/ or stub/."""
    modules = _modules()
    found = [
        f"{module} imports {imported}"
        for module, path in _stage_modules("rig.verdict").items()
        for imported in sorted(_imports(path, modules))
        if _package(imported) not in VERDICT_INPUTS and imported not in VERDICT_KERNEL_INPUTS
    ]
    assert not found


def test_verdict_does_no_network_io():
    """verdict/ computes on the records it is given: no HTTP library in it, nor in any project
    module it imports, at any depth."""
    modules = _modules()
    found = []
    for module in _stage_modules("rig.verdict"):
        seen, todo = set(), [module]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            if used := _uses(modules[current].read_text(encoding="utf-8"), HTTP_LIBRARIES):
                found.append(f"{module} reaches {current}, which imports {', '.join(used)}")
            todo.extend(_imports(modules[current], modules))
    assert not found


@pytest.mark.parametrize(
    "source",
    [
        "import aiohttp",
        "from urllib import request",
        "import urllib.request as fetch",
        "from http.client import HTTPConnection",
        "def later():\n    import httpx",
    ],
)
def test_an_http_import_is_seen_in_any_form(source):
    assert _uses(source, HTTP_LIBRARIES)


def test_what_speaks_no_http_is_not_taken_for_it():
    source = "import urllib.parse\nfrom http import HTTPStatus\nimport socket"
    assert not _uses(source, HTTP_LIBRARIES)


# rig modules without their mirrored test file yet, and the tests that import them meanwhile
# ("through ...": no test imports it; those reach it through the modules that use it). The list
# only shrinks: a module named here that gains its file, or is gone, must leave it.
UNMIRRORED = {
    "rig.run.__main__": "`python -m rig.run`'s entry; through tests/run/test_pipeline.py",
    "rig.models.qwen35_control": "through tests/e2e/test_gpu*.py (GPU-bound)",
    "rig.load.pairs": "through tests/run/test_pair_load.py",
    "rig.load.request": "tests/load/test_request_properties.py",
    "rig.report.assets": "through tests/report/test_html.py, tests/report/test_browser.py",
    "rig.report.mismatches": "tests/report/test_html.py",
    "rig.run.compare_speed": "tests/run/test_compare_runs.py",
    "rig.run.self_check": "through tests/e2e/test_self_check.py",
    "rig.serve.install_probe": "through tests/serve/test_installs.py",
    "rig.serve.plan_text": "tests/serve/test_preflight.py, tests/serve/test_sizing.py",
    "rig.serve.ray_cluster": "tests/serve/test_ray_pairs.py, tests/e2e/test_ray.py",
    "rig.stub.answers": "tests/stub/test_server.py",
    "rig.stub.wire": "through tests/stub/test_server.py",
    "rig.verdict.outcome": "tests/report/test_files.py",
    "rig.verdict.planted": "tests/verdict/test_perf.py",
    "rig.verdict.server_side": "through tests/verdict/test_perf.py",
}


def _mirror(module: str) -> Path:
    """tests/<package>/test_<module>.py for rig/<package>/<module>.py, tests/test_<module>.py
    for a top-level rig module."""
    *packages, name = module.split(".")[1:]
    return PROJECT_ROOT.joinpath("tests", *packages, f"test_{name}.py")


def test_every_rig_module_has_its_mirrored_test_file():
    modules = [m for m, p in _modules().items() if m.startswith("rig.") and p.name != "__init__.py"]
    missing = sorted(m for m in modules if not _mirror(m).is_file() and m not in UNMIRRORED)
    assert not missing, f"no tests/<pkg>/test_<module>.py for {missing}"


def test_the_unmirrored_list_only_shrinks():
    modules = _modules()
    stale = sorted(m for m in UNMIRRORED if m not in modules or _mirror(m).is_file())
    assert not stale, f"mirrored or gone, take them off UNMIRRORED: {stale}"
