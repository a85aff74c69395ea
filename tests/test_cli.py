"""The `rig` console script dispatches to the pipeline's entry points."""

import pytest

from rig import cli


def test_each_command_reaches_its_entry_point(monkeypatch):
    seen = []
    monkeypatch.setattr("rig.run.pipeline.main", lambda argv: seen.append(("run", argv)) or 0)
    monkeypatch.setattr(
        "rig.run.compare_runs.main", lambda argv: seen.append(("compare", argv)) or 0
    )
    assert cli.main(["run", "s.yaml", "--set", "a=1"]) == 0
    assert cli.main(["plan", "s.yaml", "--assume-gpus", "8"]) == 0
    assert cli.main(["compare", "a", "b"]) == 0
    assert seen == [
        ("run", ["s.yaml", "--set", "a=1"]),
        ("run", ["s.yaml", "--assume-gpus", "8", "--plan"]),
        ("compare", ["a", "b"]),
    ]


@pytest.mark.parametrize("argv, code", [([], 2), (["launch"], 2), (["--help"], 0)])
def test_no_or_an_unknown_command_prints_the_usage(argv, code, capsys):
    assert cli.main(argv) == code
    out = capsys.readouterr()
    assert "rig plan SCENARIO" in out.out + out.err
