"""Reading a server's log: the faults it shows (OOM, CUDA errors, tracebacks, a dead engine, a
kernel compiled during inference), the first real exception behind a failed start, and how far
a start has got (a start under torch.compile and CUDA graphs takes minutes)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rig.records import JIT_COMPILE

LOG_FAULTS = {
    "out_of_memory": re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory", re.I),
    "cuda_error": re.compile(r"CUDA error|cudaError|illegal memory access|device-side assert"),
    "traceback": re.compile(r"^Traceback \(most recent call last\)", re.M),
    "engine_dead": re.compile(r"EngineDeadError|EngineCore encountered a fatal error"),
    # vllm.utils.jit_monitor: a kernel compiled while serving. Not a fault of the kernel, but the
    # level's timings include the compilation: the report flags that level.
    JIT_COMPILE: re.compile(r"during inference: .*consider extending warmup"),
}


@dataclass(frozen=True)
class LogFault:
    server: str  # the server label (`reference`, `candidate-1`): whose log showed it
    kind: str
    line: str


def scan_log(server: str, text: str) -> list[LogFault]:
    """Faults in a slice of a server log (the slice written during one level)."""
    faults = []
    for line in text.splitlines():
        for kind, pattern in LOG_FAULTS.items():
            if pattern.search(line):
                faults.append(LogFault(server=server, kind=kind, line=line.strip()[:300]))
    return faults


_ERROR_LINE = re.compile(r"(?:^|\] )(\w+(?:Error|Exception)): (.+)")
_WRAPPER_ERRORS = ("Engine core initialization failed", "WorkerProc failed")


def root_cause(log: str) -> str:
    """': <the first exception message in the log>', skipping vLLM's wrapper errors."""
    for line in log.splitlines():
        found = _ERROR_LINE.search(line)
        if found and not any(wrapper in line for wrapper in _WRAPPER_ERRORS):
            return f": {found.group(1)}: {found.group(2)[:300]}"
    return ""


# What vLLM's start logs as it goes (0.26 CUDA, 0.32 CPU), in the order it gets there.
STARTUP_PHASES = (
    ("loading weights", re.compile(r"Starting to load model|Loading weights|Loading safetensors")),
    ("weights loaded", re.compile(r"Model loading took|Loading weights took")),
    # not vLLM's "Enforce eager set, disabling torch.compile, CUDAGraphs" of an eager start
    (
        "torch.compile",
        re.compile(r"Dynamo bytecode transform|Compiling a graph|(?<!disabling )torch\.compile"),
    ),
    ("profiling memory", re.compile(r"Available KV cache memory|GPU KV cache size|KV cache size")),
    ("capturing CUDA graphs", re.compile(r"Capturing CUDA graph")),
    ("CUDA graphs captured", re.compile(r"Graph capturing finished")),
    ("warm-up done", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("API server starting", re.compile(r"Starting vLLM API server|Application startup complete")),
)


def startup_phase(log: str) -> str:
    """The furthest phase of a start the log shows ("starting" before the first)."""
    reached = "starting"
    for name, pattern in STARTUP_PHASES:
        if pattern.search(log):
            reached = name
    return reached
