"""A checkpoint on disk: its size, and the shards its index names that a download left out."""

import json

from rig.serve.weights import INDEX_FILE, checkpoint_bytes, hf_hub_cache, missing_shards

GIB = 2**30


def test_checkpoint_size_comes_from_the_safetensors_index_else_the_files(tmp_path):
    assert checkpoint_bytes(tmp_path) is None
    (tmp_path / "a.safetensors").write_bytes(b"x" * 100)
    assert checkpoint_bytes(tmp_path) == 100
    index = {"metadata": {"total_size": 5 * GIB}, "weight_map": {}}
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    assert checkpoint_bytes(tmp_path) == 5 * GIB


def test_missing_shards_counts_each_shard_once_and_names_one(tmp_path):
    weight_map = {"w0": "s1.safetensors", "w1": "s1.safetensors", "w2": "s2.safetensors"}
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    missing = missing_shards(tmp_path)
    assert missing is not None and missing.named == 2
    assert (
        missing.describe()
        == f"2 of 2 shards its {INDEX_FILE} names are missing (e.g. s1.safetensors)"
    )
    (tmp_path / "s1.safetensors").write_bytes(b"x")
    (tmp_path / "s2.safetensors").write_bytes(b"x")
    assert missing_shards(tmp_path) is None


def test_no_index_or_an_unreadable_one_names_no_shards(tmp_path):
    assert missing_shards(tmp_path) is None
    (tmp_path / INDEX_FILE).write_text("{not json")
    assert missing_shards(tmp_path) is None and checkpoint_bytes(tmp_path) is None


def test_the_cache_is_hf_hub_cache_else_hf_home_hub(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hf_hub_cache() == tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hf_hub_cache() == tmp_path / "elsewhere"
