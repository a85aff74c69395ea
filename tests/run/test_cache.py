"""The golden cache: its key follows the reference's configuration, knows the model by what its
files hold (not where or when they were made) and never shows its secrets; an entry keeps what
the verdict needs of the reference, its replay's top-k included."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import rig.run.cache
from kernels.proof import InitialStateCounts
from rig.records import ForcedLogprobs, ForcedSequence
from rig.run.cache import ENTRY_FORMAT, GoldenCache, GoldenEntry, golden_key, model_digest
from rig.scenario.config import Scenario
from rig.scenario.prompts import ChatMessage, Prompt
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
from rig.verdict.evidence import SideKernel

REPO = Path(__file__).resolve().parents[2]


def key_of(tmp_path, api_key: str | None) -> tuple[str, dict]:
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1]},
            "reference": {"api_key": api_key, "env": {"HF_TOKEN": "hf_secret"}},
        }
    )
    plan = plan_servers(scenario, "org/model", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    prompts = [Prompt(id="p", messages=(ChatMessage("user", "hello"),), source="test")]
    return golden_key(scenario, plan.servers["reference"], "org/model", prompts)


def test_the_key_changes_with_the_api_key_but_its_fields_never_hold_it(tmp_path):
    key, fields = key_of(tmp_path, "sk-first")
    other, _ = key_of(tmp_path, "sk-second")
    assert key != other
    stored = json.dumps(fields)
    assert "sk-first" not in stored and "hf_secret" not in stored
    assert fields["env"]["VLLM_API_KEY"].startswith("sha256:")


def test_an_entry_keeps_the_references_replay_with_its_top_k(tmp_path, make_record):
    """A later candidate's divergences are classified from the cached reference replay."""
    sequences = [ForcedSequence("p", (1, 2), (3, 4)), ForcedSequence("q", (1,), (5,))]
    forced = {
        0: ForcedLogprobs((None, -1.0, -0.5, -0.25), ({3: -0.5, 9: -0.75}, {4: -0.25, 8: -2.0})),
        1: ForcedLogprobs(error="RuntimeError: answered 500"),
    }
    entry = GoldenEntry(
        source_run="run-1",
        records=[make_record("reference", "q0", token_ids=[3, 4])],
        sequences=sequences,
        forced=forced,
        kernel=SideKernel("reference", "vllm-cpu-native", 4),
        timings={"wall_s": 1.0},
    )
    cache = GoldenCache(tmp_path / "golden")
    cache.store("k", {"model": "m"}, entry)
    back = cache.load("k")
    assert back.forced == forced  # int token ids survive JSON
    assert back.sequences == sequences and back.records == entry.records
    assert cache.load("other") is None
    assert back.kernel == entry.kernel  # stored before initial states were counted: none


def test_an_entry_keeps_the_references_initial_state_counts(tmp_path):
    counts = InitialStateCounts(3, 5, 700, 9, 1000)
    kernel = SideKernel("reference", "vllm-cpu-native", 4, "d", ("ab",), counts)
    entry = GoldenEntry("run-1", [], [], {}, kernel, {})
    cache = GoldenCache(tmp_path / "golden")
    cache.store("k", {"model": "m"}, entry)
    assert cache.load("k").kernel == kernel


def test_the_key_follows_the_replay_top_k_and_the_entry_format(tmp_path):
    _, fields = key_of(tmp_path, None)
    assert fields["drift"]["top_logprobs"] == 5
    assert fields["entry_format"] == ENTRY_FORMAT >= 2


def test_how_speed_is_measured_is_not_part_of_the_key(tmp_path):
    """The schedule, the resolution, its budget and the warm-up change how the sides are timed,
    not what the reference writes: a candidate run with other speed settings still hits."""

    def key(**workload) -> str:
        scenario = Scenario.model_validate(
            {
                "name": "t",
                "workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1]} | workload,
            }
        )
        hardware = Hardware(gpu_count=0, cpu_ids=(0, 1))
        plan = plan_servers(scenario, "org/model", tmp_path, hardware)
        prompt = Prompt(id="p", messages=(ChatMessage("user", "hi"),), source="test")
        return golden_key(scenario, plan.servers["reference"], "org/model", [prompt])[0]

    speed = {"schedule": "alternate", "speed_resolution_pct": 3, "repeats": 6}
    assert key(repeats=6) == key(**speed) == key(repeats=6, warmup_requests=0)
    assert key(repeats=6) != key(repeats=6, max_tokens=9)


def _model_folder(root: Path, weights: bytes, mtime: int) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    weights_file = root / "model.safetensors"
    weights_file.write_bytes(weights)
    os.utime(weights_file, ns=(mtime, mtime))
    return root


def test_the_model_is_known_by_what_its_files_hold(tmp_path, monkeypatch):
    """Two copies of one model, written at other times in other folders, have one digest; other
    weights do not. A large file is hashed once (the memo), and a hub snapshot's link names
    its blob's hash, which is taken without reading the file."""
    monkeypatch.setattr(rig.run.cache, "SMALL_FILE_BYTES", 4)  # every weight file is "large"
    memo = tmp_path / "memo.json"
    first = _model_folder(tmp_path / "a", b"weights-1", 1_000)
    again = _model_folder(tmp_path / "elsewhere" / "b", b"weights-1", 9_000_000_000)
    other = _model_folder(tmp_path / "c", b"weights-2", 1_000)
    assert model_digest(str(first), memo) == model_digest(str(again), memo)
    assert model_digest(str(first), memo) != model_digest(str(other), memo)
    assert len(json.loads(memo.read_text())) == 3  # one content hash per file state
    blob_hash = hashlib.sha256(b"weights-1").hexdigest()
    hub = tmp_path / "hub"
    (hub / "blobs").mkdir(parents=True)
    (hub / "blobs" / blob_hash).write_bytes(b"weights-1")
    snapshot = hub / "snapshots" / "main"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").symlink_to(hub / "blobs" / blob_hash)
    (hub / "blobs" / blob_hash).chmod(0)  # readable or not, its name is its hash
    assert model_digest(str(snapshot)) == model_digest(str(first), memo)


KEY_OF_A_CLONE = """
import sys
from pathlib import Path
from rig.models.embedded import ensure_embedded_model
from rig.run.cache import DIGESTS_FILE, golden_key
from rig.scenario.loader import load_scenario
from rig.scenario.workload import resolve_prompts
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
scenario = load_scenario(Path("scenarios/smoke.yaml"), [])
model = str(ensure_embedded_model("tiny").resolve())
plan = plan_servers(scenario, model, Path("results/run").resolve(), Hardware(0, (0, 1)))
prompts = resolve_prompts(scenario.workload)
memo = Path(sys.argv[1]) / DIGESTS_FILE
key, _ = golden_key(scenario, plan.servers["reference"], model, prompts, memo)
print(key)
"""


def test_two_clones_building_the_model_anew_share_a_golden_entry(tmp_path):
    """Two copies of the checkout at other paths, each building the embedded model in its own
    .cache at its own moment, computing the reference's key against one cache folder: one
    key, so the second clone's run takes the first one's reference."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    keys = []
    for name in ("clone-a", "elsewhere/clone-b"):
        clone = tmp_path / name
        for relative in filter(None, tracked):
            source = REPO / relative.decode()
            if source.is_file():
                (clone / relative.decode()).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, clone / relative.decode())
        done = subprocess.run(
            [sys.executable, "-c", KEY_OF_A_CLONE, str(tmp_path / "golden")],
            cwd=clone,
            env={**os.environ, "PYTHONPATH": str(clone)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert (clone / ".cache" / "tiny-model").is_dir()  # built anew in this clone
        keys.append(done.stdout.strip().splitlines()[-1])
    assert keys[0] == keys[1] and len(keys[0]) == 24
