"""The commands the README and docs/*.md show still exist, checked without starting a server.

Every line of their `sh` blocks (and every `$ ` line of their other blocks) that runs `python -m
rig...`, `python -m kernels...`, `rig <command>`, `python benchmarks/...` or `make <target>`:
a pipeline run (`python -m rig.run`, `rig run`, `rig plan`) is planned with `--plan` (and
`--assume-gpus 8 --assume-gpu-gib 80` for a model that needs GPUs), every other python command
answers `--help` naming each option the page uses, and a make target exists (`make -n`). The
pages' relative links resolve, and the README links every page of docs/.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = (README, *sorted((REPO / "docs").glob("*.md")))
SHELL_BLOCKS = ("sh", "bash", "shell")
FENCE = re.compile(r"^\s*```\s*(\S*)\s*$")
PYTHONS = ("python", "python3")
RIG_COMMANDS = ("run", "plan", "compare", "bisect")
# `--plan` builds no embedded model (it plans from the folder the run would build it in). A
# scenario with a third-party prompt set (fetched from a registry) goes through --help.
EMBEDDED_MODELS = ("tiny", "tiny-lm", "tiny-gdn", "tiny-qwen35", "qwen35-control", "qwen35-deep")
# What a page's example names that this machine does not have: a plan may stop on these, with
# exit 2 and nothing else in its error line (the scenario and every --set key still checked).
PLACEHOLDERS = ("/venvs/", "/models/", "mypkg", "cutedsl")


@dataclass(frozen=True)
class Documented:
    page: str
    line: int
    text: str
    error: str | None = None  # the `rig: error:` line the page shows right after the command

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _commands_in(page: Path) -> list[Documented]:
    """The documented command lines of one page, continuation lines joined."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(REPO).as_posix()
    found: list[Documented] = []
    language = None  # None: outside a fenced block
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence.group(1)
            continue
        if language is None:
            continue
        text = line.strip()
        if text.startswith("$ "):
            text = text[2:]
        elif language not in SHELL_BLOCKS:
            continue
        start = number
        while text.endswith("\\") and number < len(lines):
            text = text[:-1] + " " + lines[number].strip()
            number += 1
        if not _is_documented_command(text):
            continue
        following = lines[number].strip() if number < len(lines) else ""
        error = following if following.startswith("rig: error:") else None
        found.append(Documented(name, start, text, error))
    return found


def _words(text: str) -> list[str]:
    words = shlex.split(text, comments=True)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)  # FOO=1 python -m ...
    return words


def _is_documented_command(text: str) -> bool:
    words = _words(text)
    if len(words) >= 2 and words[0] in PYTHONS:
        if words[1] == "-m" and len(words) >= 3:
            return words[2].split(".")[0] in ("rig", "kernels")
        return words[1].startswith("benchmarks/")
    if words[:1] == ["rig"]:
        return len(words) >= 2 and words[1] in RIG_COMMANDS
    return words[:1] == ["make"]


DOCUMENTED = [command for page in PAGES for command in _commands_in(page)]


def _rig_console() -> list[str]:
    """The `rig` console script as pyproject.toml declares it, run by this interpreter."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["rig"].split(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}(sys.argv[1:]))"
    return [sys.executable, "-c", code]


def _model_of(scenario: Path, args: list[str]) -> tuple[str | None, bool]:
    """The model a run would serve (the scenario's, or an override's) and whether the scenario
    fetches a third-party prompt set."""
    data = yaml.safe_load(scenario.read_text(encoding="utf-8")) or {}
    model = (data.get("model") or {}).get("name")
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "--set" and value.split("=", 1)[0] in ("model", "model.name"):
            model = value.split("=", 1)[1]
    return model, "prompt_set" in yaml.safe_dump(data.get("workload") or {})


@dataclass(frozen=True)
class Check:
    argv: tuple[str, ...]
    mode: str  # "plan", "help" or "make"
    options: tuple[str, ...] = ()  # what --help must name


def _help(entry: list[str], args: list[str]) -> Check:
    options = tuple(sorted({a.split("=", 1)[0] for a in args if a.startswith("--")}))
    return Check((*entry, "--help"), "help", options)


def _plan(entry: list[str], args: list[str], plan_flag: bool) -> Check:
    scenario = next((a for a in args if not a.startswith("-")), None)
    path = REPO / scenario if scenario else None
    if path is None or not path.is_file() or "--resume" in args:
        return _help(entry, args)  # a placeholder (SCENARIO) or a run to resume
    model, prompt_set = _model_of(path, args)
    if prompt_set:
        return _help(entry, args)
    extra = ["--plan"] if plan_flag and "--plan" not in args else []
    if model not in EMBEDDED_MODELS and "--assume-gpus" not in args:
        # a preset or checkpoint: plan for a node of H100s (their memory sizes the TP)
        extra += ["--assume-gpus", "8", "--assume-gpu-gib", "80"]
    return Check((*entry, *args, *extra), "plan")


def check_for(command: Documented) -> Check:
    words = _words(command.text)
    if words[0] == "make":
        return Check(("make", "-n", *words[1:]), "make")
    if words[0] == "rig":
        entry = [*_rig_console(), words[1]]
        if words[1] in ("run", "plan"):
            return _plan(entry, words[2:], plan_flag=words[1] == "run")
        return _help(entry, words[2:])
    if words[1] == "-m":
        entry = [sys.executable, "-m", words[2]]
        if words[2] == "rig.run":
            return _plan(entry, words[3:], plan_flag=True)
        return _help(entry, words[3:])
    return _help([sys.executable, words[1]], words[2:])


def _run(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """Every distinct check run once, as many at a time as there are cores."""
    argvs = sorted({check_for(command).argv for command in DOCUMENTED})
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(argvs, pool.map(_run, argvs), strict=True))


def _explained(error_line: str, documented: str | None) -> bool:
    """An exit 2 a page accounts for: the error it shows, or a placeholder it names."""
    if documented is not None:
        shown = re.split(r"\s*\(\.\.\.\)|\s*\.\.\.", documented)[0]
        return error_line.startswith(shown)
    problems = error_line.removeprefix("rig: error:").split("; ")
    return all(
        any(p in problem for p in PLACEHOLDERS) and "key '" not in problem for problem in problems
    )


def assert_works(check: Check, done: subprocess.CompletedProcess, error: str | None) -> None:
    said = f"{' '.join(check.argv[-12:])}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    if check.mode == "plan" and done.returncode == 2:
        errors = [line for line in done.stderr.splitlines() if line.startswith("rig: error:")]
        assert len(errors) == 1 and _explained(errors[0], error), said
        assert "Traceback" not in done.stderr, said
        return
    assert done.returncode == 0, said
    if check.mode == "help":
        missing = [option for option in check.options if option not in done.stdout]
        assert not missing, f"--help names none of {missing}: {said}"
    if check.mode == "plan":
        assert "levels: C=" in done.stdout, said


@pytest.mark.parametrize("command", DOCUMENTED, ids=lambda c: c.id)
def test_each_documented_command_still_works(command, results):
    check = check_for(command)
    assert_works(check, results[check.argv], command.error)


def test_the_pages_show_commands_of_every_kind():
    kinds = {check_for(command).mode for command in DOCUMENTED}
    assert kinds == {"plan", "help", "make"}
    in_readme = [c for c in DOCUMENTED if c.page == "README.md"]
    assert len(in_readme) >= 15, in_readme
    assert {"make e2e", "make test"} <= {c.text.split("#")[0].strip() for c in in_readme}


@pytest.mark.parametrize(
    "text",
    [
        "python -m rig.no_such_module",
        "python -m kernels.check --no-such-option 1",
        "python -m rig.run scenarios/smoke.yaml --set workload.no_such_key=1",
        "make no-such-target",
    ],
)
def test_a_command_that_is_gone_fails_the_check(text):
    check = check_for(Documented("README.md", 1, text))
    with pytest.raises(AssertionError):
        assert_works(check, _run(check.argv), None)


def test_a_plan_error_is_excused_only_by_a_placeholder_or_the_page():
    assert _explained("rig: error: candidate.python /venvs/x/bin/python: no such file", None)
    assert not _explained("rig: error: scenarios/x.yaml: unknown key 'candidate.pyton'", None)
    assert not _explained("rig: error: /venvs/a: no such file; port 80 is in use", None)
    shown = "rig: error: Qwen needs 2 GPUs per side; the hub is unreachable (...)"
    assert _explained("rig: error: Qwen needs 2 GPUs per side; the hub is unreachable (x)", shown)


# What the pages' prose names, in inline code or not: `python -m <module>`, repository paths and
# `make <target>`. Cheaper than a subprocess each: the module's spec, the file, the Makefile rule.
PROSE_MODULE = re.compile(r"python3? -m ((?:rig|kernels)(?:\.\w+)*)")
PROSE_PATH = re.compile(
    r"(?<![\w./<-])((?:rig|kernels|tests|benchmarks|scenarios|prompts|docs)/[\w./-]*\w"
    r"\.(?:py|yaml|yml|md|sh|jsonl|png))"
)
PROSE_TARGET = re.compile(r"`make ([a-z][\w-]*)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_module_path_and_make_target_the_prose_names_exists(page):
    text = page.read_text(encoding="utf-8")
    rules = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))
    gone = [
        m for m in sorted(set(PROSE_MODULE.findall(text))) if importlib.util.find_spec(m) is None
    ]
    gone += [path for path in sorted(set(PROSE_PATH.findall(text))) if not (REPO / path).exists()]
    gone += [f"make {t}" for t in sorted(set(PROSE_TARGET.findall(text))) if t not in rules]
    assert not gone, gone


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's ids for a page's headings."""
    ids, in_block = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        in_block ^= bool(FENCE.match(line))
        heading = None if in_block else re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            ids.add(text.replace(" ", "-"))
    return ids


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        headings = _anchors(resolved) if resolved.suffix == ".md" and resolved.exists() else None
        if not resolved.exists() or (anchor and headings is not None and anchor not in headings):
            broken.append(target)
    assert not broken, broken


def test_the_readme_links_every_page_of_docs():
    linked = {
        (README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())
    }
    pages = {page.resolve() for page in PAGES if page != README}
    assert pages <= linked, sorted(p.name for p in pages - linked)
    assert (REPO / "kernels" / "README.md").resolve() in linked
    assert (REPO / "benchmarks" / "README.md").resolve() in linked
