"""What a vLLM installation is, asked of its own interpreter.

    python -m rig.serve.install_probe [--kernel NAME]     one JSON line on stdout

rig/serve/installs.py runs this in a side's interpreter, with the environment its server will get,
so what it finds is what the server finds: the vLLM distribution, its version and, for a git
checkout, the commit and whether the tree has changes; torch and triton; where the rig's vLLM
plugin is found and whether it imports; which optional GDN backends are installed; and, with
--kernel, whether a user's kernel function imports and takes FLA's contract. Nothing is imported
but the standard library (and the plugin and kernel when asked), so a probe takes about a second.
"""

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

from rig.serve.vllm_entry import VLLM_DISTRIBUTIONS

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_VALUE = "kernels.vllm_plugin:register"
TORCH_DISTRIBUTIONS = ("torch",)
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton", "pytorch-triton-rocm")
GIT_TIMEOUT_S = 20


def _version(names: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(distribution, version) of the first of `names` installed, else (None, None)."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def checkout_state(location: Path | None) -> dict:
    """The git commit of the checkout holding `location` (an editable vLLM build), whether its
    tracked files have changes, and a hash of those changes; all None for a wheel install."""
    state = {"vllm_git_sha": None, "vllm_git_dirty": None, "vllm_diff_sha256": None}
    if location is None:
        return state
    root = next((p for p in (location, *location.parents) if (p / ".git").exists()), None)
    # A venv inside some other checkout (the rig's own .venv) is not a vLLM checkout.
    if root is None or not _git(root, "ls-files", "--", str(location / "__init__.py")):
        return state
    sha = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if sha is None:
        return state
    dirty = bool(status and status.strip())
    diff = _git(root, "diff", "HEAD") if dirty else None
    return {
        "vllm_git_sha": sha.strip(),
        "vllm_git_dirty": dirty,
        "vllm_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
    }


def _vllm_location() -> Path | None:
    """Where the `vllm` package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _plugin(try_import: bool) -> tuple[str | None, str | None]:
    """Where the rig's plugin entry point is found, and why it does not import (None: it does,
    or `try_import` is false)."""
    found = [
        ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.value == PLUGIN_VALUE
    ]
    if not found:
        return None, None
    dist = found[0].dist
    where = str(Path(dist.locate_file("")).absolute()) if dist is not None else "?"
    if not try_import:
        return where, None
    try:
        importlib.import_module(PLUGIN_VALUE.partition(":")[0])
    except Exception as error:  # the plugin's own imports: torch, prometheus_client
        return where, f"{type(error).__name__}: {error}"
    return where, None


def facts(with_plugin_import: bool = True) -> dict:
    """This interpreter's vLLM installation, as InstallFacts' fields."""
    distribution, vllm = _version(VLLM_DISTRIBUTIONS)
    location = _vllm_location()
    git = checkout_state(location)
    if git["vllm_git_sha"] is None and vllm:
        tag = re.search(r"\+g([0-9a-f]{7,40})", vllm)  # a source build's version names it
        git["vllm_git_sha"] = tag.group(1) if tag else None
    plugin, plugin_error = _plugin(try_import=with_plugin_import)
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "vllm": vllm,
        "vllm_distribution": distribution,
        "vllm_location": str(location) if location else None,
        **git,
        "torch": _version(TORCH_DISTRIBUTIONS)[1],
        "triton": _version(TRITON_DISTRIBUTIONS)[1],
        "plugin": plugin,
        "plugin_error": plugin_error,
        "flashinfer": importlib.util.find_spec("flashinfer") is not None,
        "cutedsl": importlib.util.find_spec("cutlass") is not None,
    }


def kernel_problem(name: str) -> str | None:
    """Why the kernel `name` cannot serve here (it does not resolve, import or take FLA's
    contract); None when it can."""
    from kernels.functions import KernelFunctionError
    from kernels.registry import UnknownKernelError, resolve_kernel

    try:
        spec = resolve_kernel(name)
        if spec.function is not None:
            spec.loaded_function()
    except (UnknownKernelError, KernelFunctionError) as error:
        return str(error)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.serve.install_probe", description=__doc__)
    parser.add_argument("--kernel", help="check that this kernel resolves and imports here")
    parser.add_argument("--no-facts", action="store_true", help="only check --kernel")
    args = parser.parse_args(argv)
    found = {} if args.no_facts else facts()
    if args.kernel:
        found["kernel_problem"] = kernel_problem(args.kernel)
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
