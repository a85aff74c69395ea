"""replay.jsonl: the replay's answers on disk, read back as the positions the verdict uses."""

from rig.load.replay_records import read_replay, write_replay
from rig.records import ForcedLogprobs, ForcedSequence, TokenLogprob
from rig.verdict.drift import forced_positions

SEQUENCE = ForcedSequence("p0", prompt_token_ids=(10, 11, 12), completion_token_ids=(13, 14, 15))


def test_replay_file_round_trips_the_positions(tmp_path):
    second = ForcedSequence("p1", (40, 41), (42, 43))
    answer = ForcedLogprobs((None, -1.0, -0.5, -0.25), ({42: -0.5, 7: -2.0}, {43: -0.25, 8: -1.5}))
    forced = {
        "reference": {0: ForcedLogprobs(error="boom"), 1: answer},
        "candidate": {1: answer},
    }
    path = tmp_path / "replay.jsonl"
    write_replay(path, [SEQUENCE, second], forced)
    back = read_replay(path)
    expected = forced_positions([SEQUENCE, second], {1: answer})
    assert back == {"reference": expected, "candidate": expected}
    assert back["reference"][("p1", (42, 43))][0] == TokenLogprob(42, -0.5, {42: -0.5, 7: -2.0})
    assert read_replay(tmp_path / "absent.jsonl") == {}
    assert ForcedLogprobs.from_json(answer.to_json()) == answer
