"""The bisect's comparison on synthetic captures: the first GDN call beyond its bound is named,
with the side closer to the float64 recurrence; upstream divergences and clean pairs are told
apart; a run folder it cannot use is one `rig: error:` line."""

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import SecretStr

from kernels.capture import Capture, CaptureMeta
from kernels.cases import CPU_SHAPE, correlated_key_inputs
from kernels.runners import VLLM_CPU_REFERENCE
from rig.records import REQUESTS_FILE, ExitCode, ServerTarget, empty_record
from rig.run import bisect
from rig.scenario.config import SIDES
from rig.scenario.loader import load_scenario
from rig.serve.servers import Server

LAYERS = ("model.layers.0.linear_attn", "model.layers.2.linear_attn")


def _captures(kernel: str, calls: int = 2, shift_layer2: float = 0.0) -> list[Capture]:
    captures = []
    for call in range(calls):
        for number, layer in enumerate(LAYERS):
            inputs = correlated_key_inputs(CPU_SHAPE, seed=10 * call + number)
            if layer == LAYERS[1] and shift_layer2:
                inputs = replace(inputs, v=inputs.v + shift_layer2)
            meta = CaptureMeta(layer=layer, call_index=call + 3, pid=1, kernel=kernel)
            captures.append(Capture(path=Path(f"{layer}.{call}"), meta=meta, inputs=inputs))
    return captures


def _result(calls: list[bisect.CallComparison]) -> bisect.BisectResult:
    return bisect.BisectResult("c1-r0-0001", "p", {"reference": "", "candidate": ""}, calls)


def test_ns3_is_traced_to_the_first_layers_first_call_and_the_reference_is_closer():
    calls = bisect.compare_calls(_captures(VLLM_CPU_REFERENCE), _captures("ns3"))
    assert [(c.layer, c.call) for c in calls] == [
        (LAYERS[0], 0),
        (LAYERS[1], 0),
        (LAYERS[0], 1),
        (LAYERS[1], 1),
    ]
    first = _result(calls).first_divergent
    assert (first.layer, first.call) == (LAYERS[0], 0)
    assert first.inputs_agree and first.output_beyond_bound
    assert first.closer_to_float64 == "reference"
    assert "model.layers.0.linear_attn call 0" in _result(calls).verdict()


def test_ns4_stays_within_every_bound():
    calls = bisect.compare_calls(_captures(VLLM_CPU_REFERENCE), _captures("ns4"))
    assert all(c.inputs_agree and not c.output_beyond_bound for c in calls)
    assert all(c.bound >= bisect.BOUND_FLOOR for c in calls)
    assert _result(calls).first_divergent is None
    assert "not in a GDN kernel" in _result(calls).verdict()


def test_inputs_that_differ_first_point_upstream_of_the_gdn_kernels():
    calls = bisect.compare_calls(_captures(VLLM_CPU_REFERENCE), _captures("ns4", shift_layer2=0.5))
    first = _result(calls).first_divergent
    assert (first.layer, first.call) == (LAYERS[1], 0)
    assert not first.inputs_agree
    assert "upstream" in _result(calls).verdict()


def test_request_spec_rebuilds_the_runs_request_from_its_record(tmp_path, make_record):
    """Where the request sat comes from the run's own record, not from its id's spelling."""
    scenario = load_scenario(Path("scenarios/lm-control.yaml"))
    run = bisect.FinishedRun(tmp_path, scenario, "unused")
    records = [
        make_record("reference", "renamed-7", level=4, repeat=0, index=7),
        make_record("reference", "warmup-3", warmup=True),
    ]
    (tmp_path / REQUESTS_FILE).write_text("".join(r.to_json() + "\n" for r in records))
    spec = bisect.request_spec(run, "renamed-7", "candidate", "bisect-x")
    assert (spec.level, spec.repeat, spec.index) == (4, 0, 7)
    assert spec.messages is not None and spec.prompt_id
    assert "bisect-x" in spec.cache_salt
    for not_timed in ("warmup-3", "c4-r0-0007"):
        with pytest.raises(bisect.BisectError, match="not one of the run's timed requests"):
            bisect.request_spec(run, not_timed, "candidate", "bisect-x")


def test_the_first_substantive_divergence_is_found_in_the_runs_records(tmp_path, make_record):
    scenario = load_scenario(Path("scenarios/lm-control.yaml"))
    records = [make_record("reference", f"q{i}") for i in range(3)]
    records += [make_record("candidate", "q0"), make_record("candidate", "q1")]
    records.append(make_record("candidate", "q2", text="something else"))
    (tmp_path / REQUESTS_FILE).write_text("".join(r.to_json() + "\n" for r in records))
    run = bisect.FinishedRun(tmp_path, scenario, "unused")
    assert run.first_substantive_request() == "q2"


def test_conversation_turns_are_refused(tmp_path):
    """A turn sent alone to fresh servers would not start from its cached state."""
    run = bisect.FinishedRun(tmp_path, load_scenario(Path("scenarios/multi-turn.yaml")), "x")
    with pytest.raises(bisect.BisectError, match="does not replay conversation turns"):
        bisect.request_spec(run, "c2-r0-0002", "candidate", "bisect-x")


def test_a_folder_without_a_run_is_one_error_line(tmp_path, capsys):
    assert bisect.main([str(tmp_path)]) == ExitCode.ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rig: error:") and "manifest.json" in err[0]


def test_a_run_without_divergences_has_nothing_to_bisect(tmp_path, capsys, make_record):
    scenario = load_scenario(Path("scenarios/lm-control.yaml"))
    manifest = {"scenario": json.loads(scenario.model_dump_json()), "model_path": "m"}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    identical = [make_record(side, "q0") for side in SIDES]
    (tmp_path / REQUESTS_FILE).write_text("".join(r.to_json() + "\n" for r in identical))
    assert bisect.main([str(tmp_path)]) == ExitCode.ERROR
    assert "no divergent pair" in capsys.readouterr().err


def test_the_bisect_sends_each_side_its_api_key(tmp_path, monkeypatch, make_record):
    """The bisect's servers get VLLM_API_KEY from the scenario; its requests must carry it."""
    scenario = load_scenario(Path("scenarios/lm-control.yaml"))
    keyed = {
        side: scenario.side(side).model_copy(update={"api_key": SecretStr(f"sk-{side}")})
        for side in SIDES
    }
    run = bisect.FinishedRun(tmp_path, scenario.model_copy(update=keyed), "model")
    record = make_record("reference", "c4-r0-0007", level=4, repeat=0, index=7)
    (tmp_path / REQUESTS_FILE).write_text(record.to_json() + "\n")
    sent: dict[str, ServerTarget] = {}

    @contextlib.contextmanager
    def servers_not_started(plans, startup_timeout_s):
        yield {plan.side: Server(plan) for plan in plans}

    def answer(jobs, concurrency, **kwargs):
        (job,) = jobs
        sent[job.target.side] = job.target
        return {job.target.side: [empty_record(job.target, job.specs[0])]}

    monkeypatch.setattr(bisect, "ServerSet", servers_not_started)
    monkeypatch.setattr(bisect, "run_level", answer)
    bisect.capture_request(run, "c4-r0-0007", tmp_path / "bisect")
    assert {side: t.api_key.get_secret_value() for side, t in sent.items()} == {
        side: f"sk-{side}" for side in SIDES
    }
