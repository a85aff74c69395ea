"""The prefill counter: one server's shared stats folder and id, the marker and stats a process
publishes from load on, counting that survives a removed folder, the time of every call (wall
clock on CPU, CUDA events read once the GPU passed them, RIG_GDN_TIME's synchronised timing),
and the reference renamed once vLLM built its op. No vLLM needed; CUDA only where marked gpu."""

import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from kernels import prefill_counter
from kernels.prefill_counter import PENDING_LIMIT, PROFILE_SCOPE, PrefillCounter, new_counter
from kernels.proof import read_stats

SHA = "0" * 64


@pytest.fixture
def counter_env(monkeypatch, tmp_path):
    """A stats folder and server id as the plugin's first process leaves them."""
    monkeypatch.setenv("RIG_GDN_STATS_DIR", str(tmp_path / "stats"))
    monkeypatch.setenv("RIG_GDN_SERVER_ID", "test-server")
    monkeypatch.delenv("RIG_GDN_TIME", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    return tmp_path


def test_first_process_makes_a_private_stats_folder_for_the_server(monkeypatch, tmp_path):
    monkeypatch.setattr(prefill_counter, "_private_stats_dir", None)
    monkeypatch.setenv("RIG_GDN_STATS_DIR", "")  # "" = unset; restored afterwards
    monkeypatch.setenv("RIG_GDN_SERVER_ID", "")
    prefill_counter.share_evidence_folder()
    folder, server = os.environ["RIG_GDN_STATS_DIR"], os.environ["RIG_GDN_SERVER_ID"]
    assert Path(folder).is_dir() and Path(folder).name.startswith("rig-gdn-stats-") and server
    prefill_counter.share_evidence_folder()  # what the engine core and workers inherit stays
    assert (os.environ["RIG_GDN_STATS_DIR"], os.environ["RIG_GDN_SERVER_ID"]) == (folder, server)
    prefill_counter._private_stats_dir.cleanup()

    monkeypatch.setenv("RIG_GDN_STATS_DIR", str(tmp_path))  # the user's folder is kept
    prefill_counter.share_evidence_folder()
    assert os.environ["RIG_GDN_STATS_DIR"] == str(tmp_path)


def test_a_new_counter_is_marked_and_published_before_any_call(counter_env, capsys):
    new_counter("ns4", SHA, "cpu")
    marker = capsys.readouterr().err
    assert f"[rig-gdn] kernel=ns4 source_sha256={SHA} pid={os.getpid()} platform=cpu" in marker
    (stats,) = read_stats(counter_env / "stats")
    assert (stats.kernel, stats.calls, stats.server, stats.seconds) == ("ns4", 0, "test-server", 0)


def test_counting_survives_a_removed_stats_folder(counter_env, capsys):
    counter = new_counter("vllm-cpu-native", SHA, "cpu")
    shutil.rmtree(counter_env / "stats")
    counter.record()
    counter.record()
    assert counter.calls == 2 and capsys.readouterr().err.count("stats not kept") == 1


def test_cpu_calls_are_timed_by_the_wall_clock(counter_env):
    counter = new_counter("ns4", SHA, "cpu")
    assert counter.call(lambda delay: time.sleep(delay) or "out", 0.02) == "out"
    assert (counter.calls, counter.timed_calls) == (1, 1) and counter.seconds >= 0.02
    (stats,) = read_stats(counter_env / "stats")
    assert (stats.calls, stats.timed_calls, stats.seconds, stats.compiles) == (
        1,
        1,
        counter.seconds,
        0,
    )


def test_rig_gdn_time_synchronises_around_each_call(counter_env, monkeypatch):
    monkeypatch.setenv("RIG_GDN_TIME", "1")
    events = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    counter = new_counter("ns4", SHA, "cuda")
    counter.call(lambda: events.append("op") or time.sleep(0.02))
    assert events == ["sync", "op", "sync"]
    assert (counter.calls, counter.timed_calls) == (1, 1) and counter.seconds >= 0.02


class FakeGpu:
    """CUDA as the counter sees it: a clock that queued work advances, and events on one stream
    that complete only once the test says the GPU got there."""

    def __init__(self) -> None:
        self.clock_ms = 0.0
        self.events: list[FakeEvent] = []
        self.capturing = False

    def event(self, enable_timing: bool = False) -> "FakeEvent":
        assert enable_timing
        return FakeEvent(self)

    def run(self, ms: float) -> str:
        self.clock_ms += ms
        return "out"

    def finish(self) -> None:
        for event in self.events:
            event.done = True


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu, self.at_ms, self.done = gpu, None, False

    def record(self) -> None:
        self.at_ms = self.gpu.clock_ms
        self.gpu.events.append(self)

    def query(self) -> bool:
        assert not self.gpu.capturing, "an event queried during a graph capture"
        return self.done

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.done and end.done
        return end.at_ms - self.at_ms


class CudaTensor:
    is_cuda = True


@pytest.fixture
def fake_gpu(monkeypatch) -> FakeGpu:
    gpu = FakeGpu()
    monkeypatch.setattr(torch.cuda, "Event", gpu.event)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: gpu.capturing)
    return gpu


def busy(gpu: FakeGpu):
    """A prefill op that queues `ms` of GPU work and returns at once."""
    return lambda tensor, ms: gpu.run(ms)


def test_cuda_calls_are_timed_once_the_gpu_passed_their_end_event(fake_gpu):
    counter = PrefillCounter("ns4", SHA, "cuda", None)
    op = busy(fake_gpu)
    assert counter.call(op, CudaTensor(), 30) == "out"
    assert (counter.calls, counter.timed_calls, len(counter.pending)) == (1, 0, 1)
    counter.call(op, CudaTensor(), ms=10)  # the tensor decides, positional or not
    assert (counter.calls, counter.timed_calls, len(counter.pending)) == (2, 0, 2)

    fake_gpu.finish()
    counter.call(op, CudaTensor(), 5)  # a later call reads the finished ones
    assert (counter.calls, counter.timed_calls, len(counter.pending)) == (3, 2, 1)
    assert counter.seconds == pytest.approx(0.040)
    fake_gpu.finish()
    counter.publish()  # so does a publish
    assert (counter.timed_calls, len(counter.pending)) == (3, 0)
    assert counter.seconds == pytest.approx(0.045)


def test_cuda_calls_in_a_graph_capture_are_counted_not_timed(fake_gpu):
    counter = PrefillCounter("ns4", SHA, "cuda", None)
    op = busy(fake_gpu)
    counter.call(op, CudaTensor(), 30)
    fake_gpu.finish()
    fake_gpu.capturing = True
    counter.call(op, CudaTensor(), 10)  # no events, and none queried (FakeEvent.query)
    assert (counter.calls, counter.timed_calls, len(fake_gpu.events)) == (2, 0, 2)
    fake_gpu.capturing = False
    counter.publish()
    assert (counter.timed_calls, counter.seconds) == (1, pytest.approx(0.030))


def test_cuda_timing_waiting_for_the_gpu_is_bounded(fake_gpu):
    counter = PrefillCounter("ns4", SHA, "cuda", None)
    op = busy(fake_gpu)
    for _ in range(PENDING_LIMIT + 5):
        counter.call(op, CudaTensor(), 1)
    assert len(counter.pending) == PENDING_LIMIT and counter.calls == PENDING_LIMIT + 5
    fake_gpu.finish()
    counter.publish()
    assert counter.timed_calls == PENDING_LIMIT  # the 5 oldest went untimed
    assert counter.seconds == pytest.approx(PENDING_LIMIT / 1000)


def gpu_sleep_cycles(ms: float) -> int:
    """torch.cuda._sleep cycles for about `ms` of GPU time on this GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * ms / start.elapsed_time(end))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_cuda_calls_are_timed_without_waiting_for_the_gpu():
    counter = PrefillCounter("ns4", SHA, "cuda", None)
    tensor = torch.ones(4, device="cuda")
    cycles = gpu_sleep_cycles(100)
    tensor + 1  # a kernel's first launch loads its module, which waits for the GPU
    torch.cuda.synchronize()

    def slow_kernel(x):
        torch.cuda._sleep(cycles)
        return x + 1

    started = time.perf_counter()
    result = counter.call(slow_kernel, tensor)
    assert time.perf_counter() - started < 0.05  # returned with the GPU still busy
    assert (counter.calls, counter.timed_calls) == (1, 0)
    torch.cuda.synchronize()
    counter.publish()
    assert counter.timed_calls == 1 and 0.08 < counter.seconds < 0.3
    assert torch.equal(result, torch.full((4,), 2.0, device="cuda"))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        counter.call(slow_kernel, tensor)
    assert (counter.calls, counter.timed_calls, len(counter.pending)) == (2, 1, 0)


def test_a_built_op_names_vllms_backend_and_marks_a_renamed_kernel_once(counter_env, capsys):
    counter = new_counter("vllm-cuda-reference", SHA, "cuda")
    capsys.readouterr()
    counter.built_op("vllm-triton", "triton", "auto")
    counter.built_op("vllm-triton", "triton", "auto")  # a second layer builds its op
    assert capsys.readouterr().err.count("[rig-gdn] kernel=vllm-triton") == 1
    (stats,) = read_stats(counter_env / "stats")
    assert (stats.kernel, stats.vllm_backend, stats.requested_backend, stats.calls) == (
        "vllm-triton",
        "triton",
        "auto",
        0,
    )


def test_initial_state_tallies_add_up_and_are_published(counter_env):
    counter = new_counter("ns4", SHA, "cpu")
    counter.saw_states(torch.tensor([1, 2, 700, 3, 900]))
    counter.saw_states(torch.tensor([0, 0, 0, 1, 64]))
    counter.saw_states(None)  # a call without states
    counter.record()
    (stats,) = read_stats(counter_env / "stats")
    assert (stats.initial_state.calls, stats.initial_state.sequences) == (1, 2)
    assert (stats.initial_state.tokens, stats.initial_state.all_tokens) == (700, 964)
    assert stats.initial_state.all_sequences == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tallies_come_back_without_waiting_for_the_gpu(counter_env):
    counter = new_counter("ns4", SHA, "cuda")
    counter.saw_states(torch.tensor([1, 1, 64, 2, 128], device="cuda"))
    torch.cuda.synchronize()
    counter.record()
    assert counter.tally == [1, 1, 64, 2, 128] and not counter.pending_tallies


def test_a_call_under_a_torch_profiler_runs_in_the_rig_scope(counter_env):
    """The scope a trace's GDN prefill time is read from; none when nothing records."""
    counter = new_counter("ns4", SHA, "cpu")
    op = lambda x: torch.ones(4) * x  # noqa: E731
    assert counter.call(op, 2.0).sum() == 8
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiled:
        assert counter.call(op, 3.0).sum() == 12
    names = [event.name for event in profiled.events()]
    assert names.count(f"{PROFILE_SCOPE}[ns4]") == 1 and "aten::mul" in names
    assert counter.calls == 2
