"""An embedded model's cache folder: built once, whole or not at all; keyed by its code."""

import pytest

from rig.models.checkpoint import ensure_built, sources_sha256


def _build(out):
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"weights")


def test_a_build_lands_whole_and_is_reused(tmp_path):
    final = tmp_path / "cache" / "key"
    calls = []
    assert ensure_built(final, lambda out: calls.append(_build(out))) == final
    assert ensure_built(final, lambda out: calls.append(_build(out))) == final
    assert len(calls) == 1 and (final / "model.safetensors").read_bytes() == b"weights"
    assert [p.name for p in final.parent.iterdir()] == ["key"]


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    final = tmp_path / "cache" / "key"

    def broken(out):
        _build(out)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_built(final, broken)
    assert list(final.parent.iterdir()) == []


def test_the_source_hash_covers_every_module_named():
    one = sources_sha256("rig.models.checkpoint")
    assert one == sources_sha256("rig.models.checkpoint")
    assert one != sources_sha256("rig.models.checkpoint", "rig.models.qwen3_next")
