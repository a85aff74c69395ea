"""A slowdown on the GPU's own timeline: the current stream kept busy for a given time after a
prefill call, with no host synchronisation. To the device this is a slower kernel: it adds to
the step only where the GPU, not the host, sets the step's pace, which is what a kernel-speed
control must show (a host sleep after a device sync shows in any regime, so it proves only the
statistics).

`torch.cuda._sleep(cycles)` spins one thread for a number of clock cycles; the cycles per
microsecond are measured once per device, by CUDA events around a spin (the one host wait, at
the first call, which vLLM makes in its profile run before it captures any graph).
"""

from __future__ import annotations

import torch

CALIBRATION_CYCLES = 4_000_000  # about 2 ms at an H100's or H200's boost clock
_cycles_per_us: dict[int, float] = {}


def cycles_per_microsecond() -> float:
    """The current device's spin rate, measured on first use."""
    device = torch.cuda.current_device()
    if device not in _cycles_per_us:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("gpu-delay: the first call came inside a CUDA graph capture")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(CALIBRATION_CYCLES)  # the clock ramps up first
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        _cycles_per_us[device] = CALIBRATION_CYCLES / (start.elapsed_time(end) * 1000.0)
    return _cycles_per_us[device]


def spin_stream(microseconds: float) -> None:
    """Queue about `microseconds` of spin on the current CUDA stream; returns at once."""
    torch.cuda._sleep(max(1, round(microseconds * cycles_per_microsecond())))
