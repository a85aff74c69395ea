"""Capture GDN prefill inputs from a live server, for replay through other kernels.

With RIG_GDN_CAPTURE=<dir> the plugin saves the first RIG_GDN_CAPTURE_N (default 4) prefill
calls of every GDN layer in every worker as `<dir>/<layer>.<pid>.<n>.safetensors`: the
tensors of GdnInputs (on CPU, states K-first and gathered per sequence before the call
updated them) and, as metadata, the layer, the call's number for that layer, the pid and the
kernel that served it.

Which layer: vLLM's CPU op is called without a layer name, so the caller's frames are searched
for the GDN layer object (a local `layer` or `self` with a string `prefix`, e.g.
"model.layers.0.linear_attn"); this holds for vLLM 0.32's CPU (`_cpu_gdn_attention_nonspec
(layer, ...)`) and CUDA (`QwenGatedDeltaNetAttention._forward_core(self, ...)`) paths, compiled
or eager, since both run inside an opaque custom op. If no such frame is found the layer is
recorded as "unknown-layer".
"""

import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from kernels.gdn_inputs import GdnInputs

DEFAULT_CALLS_PER_LAYER = 4
UNKNOWN_LAYER = "unknown-layer"
TENSOR_FIELDS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens")


@dataclass(frozen=True)
class CaptureMeta:
    layer: str
    call_index: int
    pid: int
    kernel: str


@dataclass(frozen=True)
class Capture:
    path: Path
    meta: CaptureMeta
    inputs: GdnInputs


def calling_layer_name(max_frames: int = 12) -> str:
    """The `prefix` of the nearest GDN layer object among the caller's frames."""
    frame = sys._getframe(1)
    for _ in range(max_frames):
        if frame is None:
            break
        for name in ("layer", "self"):
            prefix = getattr(frame.f_locals.get(name), "prefix", None)
            if isinstance(prefix, str) and prefix:
                return prefix
        frame = frame.f_back
    return UNKNOWN_LAYER


def save_capture(path: Path, inputs: GdnInputs, meta: CaptureMeta) -> None:
    tensors = {f: getattr(inputs, f).detach().cpu().contiguous() for f in TENSOR_FIELDS}
    metadata = {
        "layer": meta.layer,
        "call_index": str(meta.call_index),
        "pid": str(meta.pid),
        "kernel": meta.kernel,
        "use_qk_l2norm": str(inputs.use_qk_l2norm),
        "eps": repr(inputs.eps),
        "scale": repr(inputs.scale),
    }
    temporary = path.with_name(path.name + ".tmp")
    save_file(tensors, str(temporary), metadata=metadata)
    os.replace(temporary, path)


def load_capture(path: Path) -> Capture:
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    inputs = GdnInputs(
        **{f: tensors[f] for f in TENSOR_FIELDS},
        use_qk_l2norm=metadata["use_qk_l2norm"] == "True",
        eps=float(metadata["eps"]),
        scale=float(metadata["scale"]),
    )
    meta = CaptureMeta(
        layer=metadata["layer"],
        call_index=int(metadata["call_index"]),
        pid=int(metadata["pid"]),
        kernel=metadata["kernel"],
    )
    return Capture(path=path, meta=meta, inputs=inputs)


def list_captures(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


class CaptureWriter:
    """Saves the first `calls_per_layer` prefill calls of each layer seen by this process."""

    def __init__(self, directory: Path, calls_per_layer: int, kernel: str) -> None:
        self.directory = directory
        self.calls_per_layer = calls_per_layer
        self.kernel = kernel
        self.saved: Counter[str] = Counter()
        directory.mkdir(parents=True, exist_ok=True)

    def wants(self, layer: str) -> bool:
        return self.saved[layer] < self.calls_per_layer

    def save(self, layer: str, inputs: GdnInputs) -> Path:
        index = self.saved[layer]
        self.saved[layer] += 1
        pid = os.getpid()
        path = self.directory / f"{layer}.{pid}.{index}.safetensors"
        save_capture(path, inputs, CaptureMeta(layer, index, pid, self.kernel))
        return path


def capture_writer_from_env(kernel: str) -> CaptureWriter | None:
    directory = os.environ.get("RIG_GDN_CAPTURE")
    if not directory:
        return None
    calls = int(os.environ.get("RIG_GDN_CAPTURE_N", DEFAULT_CALLS_PER_LAYER))
    return CaptureWriter(Path(directory), calls, kernel)
