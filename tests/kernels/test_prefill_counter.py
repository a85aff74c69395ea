"""The prefill counter: one server's shared stats folder and id, the marker and stats a process
publishes from load on, counting that survives a removed folder, RIG_GDN_TIME's seconds, and the
reference renamed once vLLM built its op. No vLLM needed."""

import os
import shutil
import time
from pathlib import Path

import pytest

from kernels import prefill_counter
from kernels.prefill_counter import new_counter
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


def test_calls_are_timed_only_with_rig_gdn_time(counter_env, monkeypatch):
    untimed = new_counter("ns4", SHA, "cpu")
    assert untimed.call(time.sleep, 0.02) is None and untimed.seconds == 0.0

    monkeypatch.setenv("RIG_GDN_TIME", "1")
    counter = new_counter("ns4", SHA, "cpu")
    assert counter.call(lambda delay: time.sleep(delay) or "out", 0.02) == "out"
    assert counter.calls == 1 and counter.seconds >= 0.02
    (stats,) = read_stats(counter_env / "stats")  # both counters are this process's file
    assert (stats.calls, stats.seconds) == (1, counter.seconds)


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
