"""RunManifest as manifest.json: every field in JSON form, the scenario as the loader resolved
it, and what the run itself found added later."""

import dataclasses
import json

from rig.manifest_record import RunManifest, ServerManifest
from tests.report_synthetic import unit_manifest


def test_to_json_holds_every_field_and_the_scenario_as_json():
    data = unit_manifest("mine").to_json()
    assert set(data) == {f.name for f in dataclasses.fields(RunManifest)}
    assert data["scenario"]["name"] == "mine"
    assert data["scenario"]["workload"]["concurrency"] == [1]
    assert data["placement"]["mode"] == "simultaneous" and data["rig_git"]["dirty"] is False
    json.dumps(data)  # manifest.json is written from it as it is


def test_what_the_run_found_is_added_by_replace():
    server = ServerManifest(
        "candidate", 0, "0", ["vllm"], {}, "http://127.0.0.1:1", "c.log", "ns4", None
    )
    manifest = dataclasses.replace(
        unit_manifest(), servers={"candidate": server}, served_vllm={"candidate": "0.32.0"}
    )
    data = manifest.to_json()
    assert data["servers"]["candidate"]["kernel"] == "ns4"
    assert data["served_vllm"] == {"candidate": "0.32.0"} and data["golden_run"] is None
