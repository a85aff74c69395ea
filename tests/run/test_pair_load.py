"""A level sent from each Ray pair's own node, without Ray: each pair's call gets that pair's jobs
only, its records stream to the journal's callback as they finish (once each), and the answers
come back as one machine's would (records per side, pair by pair)."""

import rig.run.pair_load
from rig.records import SideJob
from rig.run.pair_load import send_level
from rig.serve.hardware import Hardware
from rig.serve.ray_pairs import RayServer
from rig.serve.servers import Server
from tests.run_fakes import run_context

FOUR_GPUS = Hardware(gpu_count=4, cpu_ids=(0, 1), gpu_ids=("0", "1", "2", "3"))


def test_each_pairs_jobs_run_on_its_node_and_come_back_in_order(tmp_path, monkeypatch, make_record):
    plan = run_context(tmp_path, FOUR_GPUS, placement={"replicas": 2}).plan
    sent, ran_on = [], []

    def fake_run_level(jobs, concurrency, *, on_record=None, progress=True, **options):
        sent.append(([job.target.label for job in jobs], concurrency, progress))
        answer = {
            job.target.side: [
                make_record(job.target.side, f"{job.target.label}-{i}") for i in (0, 1)
            ]
            for job in jobs
        }
        for record in (r for records in answer.values() for r in records):
            on_record(record)
        return answer

    def fake_on_nodes(servers, calls, on_record):
        ran_on.extend(calls)
        return {replica: call(on_record) for replica, call in calls.items()}

    monkeypatch.setattr(rig.run.pair_load, "run_level", fake_run_level)
    monkeypatch.setattr(rig.run.pair_load, "run_on_pair_nodes", fake_on_nodes)
    servers = {label: RayServer(server) for label, server in plan.servers.items()}
    jobs = [SideJob(server.target(), [], 1) for server in servers.values()]
    kept = []
    answer = send_level(servers, 2, jobs, on_record=kept.append, timeout_s=5.0, progress=True)
    assert ran_on == [0, 1]
    assert sent == [
        (["reference", "candidate"], 2, False),
        (["reference-1", "candidate-1"], 2, False),
    ]
    ids = ["reference-0", "reference-1", "reference-1-0", "reference-1-1"]
    assert [record.request_id for record in answer["reference"]] == ids
    assert sorted(record.request_id for record in kept) == sorted(
        record.request_id for records in answer.values() for record in records
    )  # each once, as it finished


def test_servers_on_this_machine_send_from_here(tmp_path, monkeypatch):
    plan = run_context(tmp_path).plan
    monkeypatch.setattr(rig.run.pair_load, "run_level", lambda jobs, c, **options: {"here": c})
    monkeypatch.setattr(rig.run.pair_load, "run_on_pair_nodes", None)  # never asked for
    servers = {label: Server(server) for label, server in plan.servers.items()}
    assert send_level(servers, 3, [], timeout_s=5.0) == {"here": 3}
