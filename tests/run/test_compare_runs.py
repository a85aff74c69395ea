import pytest

from rig.load.replay_records import REPLAY_FILE, ForcedLogprobs, ForcedSequence, write_replay
from rig.records import REQUESTS_FILE, TokenLogprob
from rig.run.compare_runs import main as compare_main
from rig.run.compare_runs import side_records
from tests.verdict.test_compare import pair_at_third_token

# --- comparing stored runs ---------------------------------------------------------------------


def store(run_dir, records):
    run_dir.mkdir()
    lines = "".join(record.to_json() + "\n" for record in records)
    (run_dir / REQUESTS_FILE).write_text(lines, encoding="utf-8")
    return run_dir


def test_read_records_keeps_one_side_without_warmups(make_record, tmp_path):
    top = {3: -0.5, 4: -0.9}
    records = [
        make_record("reference", "q0", token_ids=[3], logprobs=[TokenLogprob(3, -0.5, top)]),
        make_record("reference", "warmup-q0", warmup=True),
        make_record("candidate", "q0"),
    ]
    (record,) = side_records(store(tmp_path / "run", records), "reference")
    assert record.request_id == "q0"
    assert record.logprobs == [TokenLogprob(3, -0.5, top)]  # int token ids survive JSON


def test_read_records_errors(make_record, tmp_path):
    with pytest.raises(FileNotFoundError, match=REQUESTS_FILE):
        side_records(tmp_path, "reference")
    run = store(tmp_path / "run", [make_record("reference", "q0")])
    with pytest.raises(ValueError, match="'candidate'"):
        side_records(run, "candidate")


def test_main_compares_two_stored_runs(make_record, tmp_path, capsys):
    run_a = store(tmp_path / "a", [make_record("reference", f"q{i}") for i in range(2)])
    same = store(tmp_path / "b", [make_record("candidate", f"q{i}") for i in range(2)])
    assert compare_main([str(run_a), str(same)]) == 0
    assert "2 pairs, 2 identical" in capsys.readouterr().out
    other = store(
        tmp_path / "c",
        [make_record("candidate", "q0"), make_record("candidate", "q1", text="else")],
    )
    assert compare_main([str(run_a), str(other)]) == 3  # no replay: no margin to judge by
    assert "0 substantive, 1 unclassified" in capsys.readouterr().out


def test_main_classifies_from_the_runs_replays(make_record, tmp_path, capsys):
    """Each side's top-k from its own run's replay.jsonl, found by the reference completion."""
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.6}, {9: -0.5, 3: -0.6})
    sequence = ForcedSequence("p0", (7,), (1, 2, 3, 4))
    runs = {}
    for name, side, record in (("a", "reference", ref), ("b", "candidate", cand)):
        runs[name] = store(tmp_path / name, [record])
        positions = replayed[side][sequence.key]
        answer = ForcedLogprobs(
            (None, *(p.logprob for p in positions)), tuple(p.top for p in positions)
        )
        write_replay(runs[name] / REPLAY_FILE, [sequence], {side: {0: answer}})
    assert compare_main([str(runs["a"]), str(runs["b"])]) == 0
    assert "1 near-tie, 0 substantive" in capsys.readouterr().out
    (runs["b"] / REPLAY_FILE).unlink()
    assert compare_main([str(runs["a"]), str(runs["b"])]) == 3
    assert "token 2 (unclassified" in capsys.readouterr().out


def test_main_fails_when_requests_failed(make_record, tmp_path, capsys):
    run_a = store(tmp_path / "a", [make_record("reference", "q0")])
    failed = store(tmp_path / "b", [make_record("candidate", "q0", text="", error="timeout: x")])
    assert compare_main([str(run_a), str(failed)]) == 1
    assert "1 with a failed request" in capsys.readouterr().out


def test_main_reports_a_missing_run(tmp_path, capsys):
    assert compare_main([str(tmp_path / "nope"), str(tmp_path / "nope")]) == 2
    assert "rig: error" in capsys.readouterr().err
