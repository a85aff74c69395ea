"""Each side's own cache folders: where vLLM keeps what it compiled for the side, named by
everything the side serves differently, so that nothing compiled around one side's kernel is
loaded by the other side, and the side's next server finds it warm."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from rig.scenario.config import Scenario

CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"  # vLLM's torch.compile cache (and its other caches) live here
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
VLLM_CACHE = "~/.cache/vllm"  # vLLM's default for it


def compile_cache_root(scenario: Scenario, side: str, base: Path) -> Path:
    """The side's own vLLM cache folder under `base`: named by everything the side serves
    differently (kernel, backend, flags, environment, install), so that a graph vLLM compiled
    around one side's kernel is never loaded by the other side; sides that serve alike (an A/A
    run) share one, and a side's next run finds its own warm."""
    config = scenario.side(side)
    served = {
        "kernel": config.kernel,
        "backend": scenario.backend_of(side),
        "serve_args": config.serve_args,
        "env": sorted(config.env.items()),
        "install": [str(config.python), str(config.vllm_executable), config.command],
    }
    digest = hashlib.sha256(json.dumps(served, sort_keys=True, default=str).encode())
    return base / "rig" / digest.hexdigest()[:16]


def cache_env(
    scenario: Scenario, side: str, env: dict[str, str], eager_mode: bool
) -> dict[str, str]:
    """The side's own cache folders. Compiled, vLLM keeps its graphs and their inductor code in
    VLLM_CACHE_ROOT. Eager, vLLM still compiles its sampler's logprob gathering on the first
    logprobs request (the teacher-forced replay); inductor's default folder sits in the server's
    private TMPDIR, so that compile (about 15 s on one CPU core) would be redone by every
    server, and the side's inductor folder keeps it: the next server of that side starts warm."""
    base = Path(env.get(CACHE_ROOT_ENV) or os.environ.get(CACHE_ROOT_ENV) or VLLM_CACHE)
    root = compile_cache_root(scenario, side, base.expanduser())
    found = {CACHE_ROOT_ENV: str(root)}
    if eager_mode and not (env.get(INDUCTOR_CACHE_ENV) or os.environ.get(INDUCTOR_CACHE_ENV)):
        found[INDUCTOR_CACHE_ENV] = str(root / "inductor_cache")  # the folder vLLM's compile uses
    return found
