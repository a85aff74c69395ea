"""The run's state on disk: records as whole lines, side files, and what --resume keeps."""

import errno
import json

import pytest

from rig.records import REQUESTS_FILE, LevelFault, ServerDelta
from rig.run.state import (
    FAULTS_FILE,
    SERVER_COUNTERS_FILE,
    RecordSink,
    RunState,
    append_jsonl,
    finished,
    read_jsonl,
    resume_from_disk,
)
from tests.run_fakes import open_journal


def write_records(path, records) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(record.to_json() + "\n" for record in records)


def test_resume_keeps_finished_levels_and_their_faults_but_not_a_level_whose_server_died(
    tmp_path, make_record
):
    write_records(
        tmp_path / REQUESTS_FILE,
        [
            make_record(side, f"c{level}-r0-0000", level=level)
            for level in (1, 2)
            for side in ("reference", "candidate")
        ],
    )
    append_jsonl(tmp_path / FAULTS_FILE, LevelFault("candidate", 1, "traceback", "Traceback"))
    append_jsonl(tmp_path / FAULTS_FILE, LevelFault("candidate", 2, "server_died", "exit 9"))
    resumed = resume_from_disk(tmp_path, expected=1)
    assert resumed.done_levels == {(1, 0)}
    assert [f.kind for f in resumed.state.faults] == ["traceback"]
    assert {r.level for r in resumed.state.records} == {1}
    assert "server_died" not in (tmp_path / FAULTS_FILE).read_text()
    kept = (tmp_path / REQUESTS_FILE).read_text().splitlines()
    assert [json.loads(line)["level"] for line in kept] == [1, 1]


def test_resume_runs_again_a_level_one_side_did_not_finish(tmp_path, make_record, capsys):
    records = [
        make_record(side, f"c1-r0-000{i}") for side in ("reference", "candidate") for i in (0, 1)
    ]
    records[-1] = make_record("candidate", "c1-r0-0001", error="cancelled: interrupted")
    write_records(tmp_path / REQUESTS_FILE, records + [make_record("reference", "c2", level=2)])
    append_jsonl(tmp_path / SERVER_COUNTERS_FILE, ServerDelta("reference", 1, 0, 4.0, 0.0))
    resumed = resume_from_disk(tmp_path, expected=2)
    assert resumed.done_levels == set()
    assert resumed.state.records == [] and resumed.state.server_deltas == []
    assert (tmp_path / SERVER_COUNTERS_FILE).read_text() == ""
    assert "0 finished level(s) kept (0 records)" in capsys.readouterr().out


def test_a_cancelled_record_is_not_finished(make_record):
    assert finished(make_record(error="HTTP 500"))
    assert not finished(make_record(error="cancelled: level timeout"))


class DiskFullAfter:
    """A file handle that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, handle, room: int) -> None:
        self.handle, self.room = handle, room

    def fileno(self) -> int:
        return self.handle.fileno()

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = self.handle.write(data[: self.room])
        self.room -= taken
        return taken

    def close(self) -> None:
        self.handle.close()


def test_a_record_the_disk_cannot_take_is_cut_back_out(tmp_path, make_record):
    path = tmp_path / REQUESTS_FILE
    first = make_record("reference", "q0")
    room = len(first.to_json()) + 1 + 10  # the first line and ten bytes of the second
    with open(path, "ab", buffering=0) as handle:
        sink = RecordSink(path, DiskFullAfter(handle, room))
        sink(first)
        with pytest.raises(OSError, match="requests.jsonl: No space left"):
            sink(make_record("reference", "q1"))
    assert path.read_text() == first.to_json() + "\n"


def test_the_journal_keeps_state_and_files_together(tmp_path, make_record):
    state = RunState()
    journal = open_journal(tmp_path, state)
    journal.keep_record(make_record("candidate", "q0"))
    journal.record_fault(LevelFault("candidate", 1, "oom", "CUDA out of memory", "q0"))
    journal.record_server_delta(ServerDelta("candidate", 1, 0, 8.0, 0.0, 3))
    journal.sink.close()
    assert [r.request_id for r in state.records] == ["q0"]
    assert (tmp_path / REQUESTS_FILE).read_text().count("\n") == 1
    assert read_jsonl(tmp_path / FAULTS_FILE, LevelFault) == state.faults
    assert read_jsonl(tmp_path / SERVER_COUNTERS_FILE, ServerDelta) == state.server_deltas
    assert read_jsonl(tmp_path / "absent.jsonl", LevelFault) == []


def test_timings_add_up_over_restarts():
    state = RunState()
    state.add_timing("reference_server_s", 2.0)
    state.add_timing("reference_server_s", 3.5)
    assert state.timings == {"reference_server_s": 5.5}
