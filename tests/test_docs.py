"""The documentation agrees with the code.

- Every scenario key the pages name in inline code as `section.key` (or `section.key: value`,
  `section.key=value`) is a field of the scenario's pydantic models (rig/scenario/config.py,
  rig/scenario/gates_config.py), and a value given for a field that takes a fixed set of words
  is one of them.
- Every key of those models is in docs/scenarios.md's table of keys, and every shipped scenario
  file in its table of scenarios.
- Every file results/README.md names is one the run writes (rig/report/files.py's
  REPORT_FILES, or a path the run's code builds under the run folder), and every file the run
  writes is named there.
- GDN, FLA, ns3 and ns4 are defined where a page first uses them.
"""

from __future__ import annotations

import ast
import importlib
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from rig import PROJECT_ROOT
from rig.report.files import REPORT_FILES
from rig.scenario.config import Scenario

REPO = PROJECT_ROOT
PAGES = (
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "results" / "README.md",
    REPO / "benchmarks" / "README.md",
    REPO / "kernels" / "README.md",
    REPO / "prompts" / "README.md",
)
SCENARIO_FILES = (
    *sorted((REPO / "scenarios").glob("*.yaml")),
    *sorted((REPO / "scenarios" / "presets").glob("*.yaml")),
)
FENCE = re.compile(r"^\s*```")
# an inline code span: no backtick inside, no blank line inside
SPAN = re.compile(r"`((?:[^`\n]|\n(?![ \t]*\n))+)`")
FILE_EXTENSIONS = {"csv", "json", "jsonl", "md", "py", "yaml", "yml", "html", "xml", "txt", "log"}


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _prose(text: str) -> str:
    """A page without its fenced code blocks."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        kept.append("" if fenced else line)
    return "\n".join(kept)


def _spans(path: Path) -> list[str]:
    """The inline code of a page, or of a YAML file's comments."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".yaml":
        text = "\n".join(line.partition("#")[2] for line in text.splitlines() if "#" in line)
    return SPAN.findall(_prose(text))


# --- scenario keys --------------------------------------------------------------------------


def _models(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (X, X | None, list[X])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _words(annotation: object) -> set[str] | None:
    """The values a field takes when it takes a fixed set of words (a Literal), else None."""
    if typing.get_origin(annotation) is typing.Literal:
        return {str(a) for a in typing.get_args(annotation)}
    args = typing.get_args(annotation)
    literal = [a for a in args if typing.get_origin(a) is typing.Literal]
    if literal and all(a is type(None) or a in literal for a in args):
        return {str(v) for a in literal for v in typing.get_args(a)} | {"null"}
    return None


SECTIONS = {
    name: _models(info.annotation)[0]
    for name, info in Scenario.model_fields.items()
    if _models(info.annotation)
}
KEY = re.compile(
    r"(?<![\w./<-])(" + "|".join(SECTIONS) + r")((?:\.[a-z_][a-z0-9_]*)+)"
    r"(\.\d)?(?:\s*[:=]\s*['\"]?([\w.+-]+))?"
)


def _field(section: str, dotted: str):
    """The pydantic field `section.dotted` names, or None."""
    model: type[BaseModel] | None = SECTIONS[section]
    info = None
    for part in dotted.split("."):
        if model is None or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        found = _models(info.annotation)
        model = found[0] if found else None
    return info


def _mentions() -> list[tuple[str, str, str, str | None]]:
    """(file, section, dotted key, value) for every `section.key` in the pages' inline code."""
    found = []
    for path in (*PAGES, *SCENARIO_FILES):
        for span in _spans(path):
            for match in KEY.finditer(span):
                section, dotted, module_path, value = match.groups()
                dotted = dotted.lstrip(".")
                if module_path or dotted.rsplit(".", 1)[-1] in FILE_EXTENSIONS:
                    continue  # model.layers.0.linear_attn, drift.csv: not scenario keys
                found.append((_name(path), section, dotted, value))
    return found


MENTIONS = _mentions()


def test_the_pages_name_scenario_keys():
    assert len(MENTIONS) > 100
    assert {section for _, section, _, _ in MENTIONS} == set(SECTIONS)


def test_every_scenario_key_the_pages_name_exists():
    unknown = sorted(
        {
            f"{page}: {section}.{key}"
            for page, section, key, _ in MENTIONS
            if not _field(section, key)
        }
    )
    assert not unknown, unknown


def test_every_value_the_pages_give_a_key_of_fixed_words_is_one_of_them():
    wrong = []
    for page, section, key, value in MENTIONS:
        field = _field(section, key)
        words = _words(field.annotation) if field is not None and value is not None else None
        if words is not None and value not in words:
            wrong.append(f"{page}: {section}.{key}: {value} (takes {', '.join(sorted(words))})")
    assert not wrong, wrong


def test_a_stale_key_or_value_is_caught():
    def problems(span: str) -> list[str]:
        out = []
        for match in KEY.finditer(span):
            section, dotted, _, value = match.groups()
            field = _field(section, dotted.lstrip("."))
            words = _words(field.annotation) if field is not None else None
            if field is None or (value is not None and words is not None and value not in words):
                out.append(span)
        return out

    assert problems("workload.schedule: apart")
    assert problems("--set workload.no_such_key=1")
    assert problems("gates.max_pathology")
    assert not problems("workload.schedule=alternate")
    assert not problems("--set candidate.kernel=ns4+drop-state")
    assert not problems("workload.conversations.prefix_tokens")


def _table(page: Path, heading: str) -> list[list[str]]:
    """The cells of the first table under `heading`."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not re.match(r"\|\s*-", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows and not line.startswith("|"):
            break
    return rows[1:]  # the header row off


SCENARIOS_PAGE = REPO / "docs" / "scenarios.md"


def _documented_keys() -> dict[str, set[str]]:
    """Per section, the names docs/scenarios.md's table of keys gives in inline code."""
    documented: dict[str, set[str]] = {}
    for first, *rest in _table(SCENARIOS_PAGE, "## Keys"):
        sections = {span.split(".")[0] for span in SPAN.findall(first)}
        names = set()
        for span in SPAN.findall(" | ".join([first, *rest])):
            names |= set(re.findall(r"[a-z_][a-z0-9_]*", span))
        for section in sections:
            documented.setdefault(section, set()).update(names)
    return documented


def _nested_fields(model: type[BaseModel]) -> set[str]:
    names = set(model.model_fields)
    for info in model.model_fields.values():
        for inner in _models(info.annotation):
            names |= _nested_fields(inner)
    return names


def test_every_scenario_key_is_in_the_table_of_keys():
    documented = _documented_keys()
    missing = [
        f"{section}.{key}"
        for section, model in SECTIONS.items()
        for key in sorted(_nested_fields(model))
        if key not in documented.get(section, set())
    ]
    missing += [
        key for key in Scenario.model_fields if key not in SECTIONS and key not in documented
    ]
    assert not missing, f"docs/scenarios.md's table of keys lacks {missing}"


def test_every_shipped_scenario_is_in_the_table_of_scenarios():
    listed = {
        SPAN.findall(first)[0] for first, *_ in _table(SCENARIOS_PAGE, "## The shipped scenarios")
    }
    shipped = {path.name for path in (REPO / "scenarios").glob("*.yaml")}
    assert listed == shipped


# --- the results folder ---------------------------------------------------------------------

ROOTS = ("run_dir",)  # the names a run folder goes by in the rig's code
HOLE = "<>"


def _module_constant(module: str, name: str) -> str | None:
    value = getattr(importlib.import_module(module), name, None)
    return value if isinstance(value, str) else None


class _RunPaths(ast.NodeVisitor):
    """The paths one module builds under a run folder: `run_dir / "x"`, `ctx.run_dir / NAME`,
    `run_dir / f"server-{label}.log"`, and what a name assigned one of those is joined to."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.bound: dict[str, str] = {}  # a local name -> its path under the run folder
        self.found: set[str] = set()

    def _part(self, node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return _module_constant(self.module, node.id) or HOLE
        if isinstance(node, ast.JoinedStr):
            return "".join(
                self._part(v) if isinstance(v, ast.Constant) else HOLE for v in node.values
            )
        return HOLE

    def path(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return "" if node.id in ROOTS else self.bound.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr in ROOTS:
            return ""
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Path" and node.args:
            return self.path(node.args[0])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left = self.path(node.left)
            if left is not None:
                return f"{left}/{self._part(node.right)}".lstrip("/")
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        path = self.path(node.value)
        for target in node.targets:
            if path is not None and isinstance(target, ast.Name):
                self.bound[target.id] = path
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        path = self.path(node)
        if path is not None and path != HOLE:  # `run_dir / name` over a loop: named elsewhere
            self.found.add(path)
        self.generic_visit(node)


def written_paths() -> set[str]:
    """What a run writes under results/<run-id>/: the report's files and every path the code
    builds under the run folder (holes `<>` where the name is computed)."""
    found = set(REPORT_FILES)
    for path in sorted((REPO / "rig").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        finder = _RunPaths(module)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for _ in range(2):  # names bound after their first use in the file
            finder.visit(tree)
        found |= finder.found
    return found


def documented_paths(page: Path) -> set[str]:
    """The files and folders a page names in inline code, the run folder's prefix taken off."""
    names = set()
    for span in _spans(page):
        span = re.sub(r"^results/<[^>]+>/", "", span.strip())
        if re.fullmatch(r"[\w<>.-]+(/[\w<>.-]+)*/?", span) and (
            "/" in span or re.search(r"\.[a-z]+$", span)
        ):
            names.add(span.rstrip("/"))
    return {n for n in names if n and not (REPO / n.split("/")[0]).exists()}  # not the repo's


def _pattern(path: str) -> re.Pattern:
    parts = re.split(r"<[^>]*>", path)
    return re.compile(".+".join(re.escape(part) for part in parts))


def _concrete(path: str) -> str:
    return re.sub(r"<[^>]*>", "x", path)


def _covers(documented: str, written: str) -> bool:
    return bool(
        _pattern(written).fullmatch(_concrete(documented))
        or _pattern(documented).fullmatch(_concrete(written))
        or re.fullmatch(_pattern(written).pattern + "/.+", _concrete(documented))
    )


RESULTS_README = REPO / "results" / "README.md"


def test_the_run_writes_what_the_code_says():
    written = written_paths()
    expected = {
        "requests.jsonl", "replay.jsonl", "scenario.resolved.json", "servers.json",
        "server_counters.jsonl", "faults.jsonl", "server-<>.log", "kernel-stats/<>", "bench/<>",
        "rig-error.txt", "report-error.txt", "bisect-<>/bisect.json",
    }  # fmt: skip
    assert expected <= written, expected - written


def test_every_file_results_readme_names_is_written():
    written = written_paths()
    unknown = [
        d
        for d in sorted(documented_paths(RESULTS_README))
        if not any(_covers(d, w) for w in written)
    ]
    assert not unknown, f"results/README.md names files no run writes: {unknown}"


def test_every_file_a_run_writes_is_in_results_readme():
    documented = documented_paths(RESULTS_README)
    missing = [w for w in sorted(written_paths()) if not any(_covers(d, w) for d in documented)]
    assert not missing, f"results/README.md does not name {missing}"


def test_a_file_the_run_does_not_write_is_caught():
    written = written_paths()
    assert not any(_covers("deltas.csv", w) for w in written)
    assert any(_covers("bench/<side>-c<level>.json", w) for w in written)
    assert any(_covers("server-<label>.log", w) for w in written)


# --- terms defined at first use -------------------------------------------------------------

TERMS = {  # the term as a page uses it, and what its definition says
    "GDN": (re.compile(r"\bGDN\b"), re.compile(r"Gated\s+DeltaNet")),
    "FLA": (re.compile(r"\bFLA\b"), re.compile(r"flash-linear-attention")),
    "ns4": (re.compile(r"\bns4\b", re.IGNORECASE), re.compile(r"Newton-Schulz")),
    "ns3": (re.compile(r"\bns3\b", re.IGNORECASE), re.compile(r"stop(?:s|ped)?\s+at\s+3\b")),
}
DEFINING_PAGES = (
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "benchmarks" / "README.md",
    REPO / "kernels" / "README.md",
)


def _paragraphs(page: Path) -> list[str]:
    """The page's prose, headings and fenced code left out, paragraph by paragraph."""
    lines = [line for line in _prose(page.read_text(encoding="utf-8")).splitlines()]
    text = "\n".join("" if line.lstrip().startswith("#") else line for line in lines)
    return re.split(r"\n[ \t]*\n", text)


def undefined_terms(paragraphs: list[str]) -> list[str]:
    """The terms whose first use comes before their definition: the text up to the end of the
    paragraph of the first use must hold the definition."""
    late = []
    for term, (use, definition) in TERMS.items():
        read = ""
        for paragraph in paragraphs:
            read += paragraph + "\n\n"
            if use.search(paragraph):
                if not definition.search(read):
                    late.append(term)
                break
    return late


@pytest.mark.parametrize("page", DEFINING_PAGES, ids=_name)
def test_terms_are_defined_where_a_page_first_uses_them(page):
    late = undefined_terms(_paragraphs(page))
    assert not late, f"{_name(page)} uses {late} before defining them"


def test_a_term_used_before_its_definition_is_caught():
    assert undefined_terms(["ns4 is fast.", "ns4: 4 Newton-Schulz rounds."]) == ["ns4"]
    assert undefined_terms(["GDN (Gated DeltaNet) prefill.", "More GDN."]) == []
