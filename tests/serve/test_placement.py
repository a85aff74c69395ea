"""Placement rules for any number of GPUs and tensor-parallel sizes, CPU core splits, and how
a level's requests and concurrency are sharded over replica pairs."""

import pytest

from rig.serve.placement import (
    PlacementError,
    load_schedule,
    place_on_cpus,
    place_on_gpus,
    shard,
)

SIDES = ("reference", "candidate")


def gpus_of(placement, label):
    return placement.slot(label).gpus


@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_server_gets_tp_gpus_and_simultaneous_servers_never_share(gpus, tp):
    if gpus < tp:
        with pytest.raises(PlacementError, match=f"needs {tp} GPUs per side; {gpus} available"):
            place_on_gpus(gpus, tp, SIDES, copies=1)
        return
    placement = place_on_gpus(gpus, tp, SIDES, copies=1)
    assert all(len(slot.gpus) == tp for slot in placement.slots)
    assert all(0 <= g < gpus for slot in placement.slots for g in slot.gpus)
    expected_pairs = max(gpus // (2 * tp), 1)
    assert placement.replicas == expected_pairs
    assert len(placement.slots) == 2 * expected_pairs
    for phase in placement.phases:
        used = [g for label in phase for g in placement.slot(label).gpus]
        assert len(used) == len(set(used)), f"servers of one phase share a GPU: {phase}"
    if gpus >= 2 * tp:
        assert placement.mode == "simultaneous" and len(placement.phases) == 1
    else:
        assert placement.mode == "sequential"
        assert placement.phases == (("reference",), ("candidate",))


def test_eight_gpus_tp2_give_two_replica_pairs_on_disjoint_gpus():
    placement = place_on_gpus(8, 2, SIDES, copies=1)
    assert [slot.label for slot in placement.slots] == [
        "reference",
        "candidate",
        "reference-1",
        "candidate-1",
    ]
    assert gpus_of(placement, "reference") == (0, 1)
    assert gpus_of(placement, "candidate-1") == (6, 7)
    assert place_on_gpus(8, 2, SIDES, copies=1, replicas=1).replicas == 1
    with pytest.raises(PlacementError, match="3 replica pairs need 12 GPUs"):
        place_on_gpus(8, 2, SIDES, copies=1, replicas=3)
    shared = place_on_gpus(8, 2, SIDES, copies=2, replicas=3)
    assert shared.mode == "shared" and len(shared.slots) == 6


def test_one_gpu_is_shared_when_the_model_fits_twice():
    shared = place_on_gpus(1, 1, SIDES, copies=2)
    assert shared.mode == "shared" and shared.phases == (("reference", "candidate"),)
    assert all(slot.gpus == (0,) and slot.gpu_memory_fraction for slot in shared.slots)
    assert sum(slot.gpu_memory_fraction for slot in shared.slots) < 0.9
    assert place_on_gpus(1, 1, SIDES, copies=2, share=False).mode == "sequential"
    with pytest.raises(PlacementError, match="2 servers per GPU do not fit"):
        place_on_gpus(1, 1, SIDES, copies=1, share=True)


def test_two_gpus_hold_two_replica_pairs_of_a_small_model():
    placement = place_on_gpus(2, 1, SIDES, copies=4, replicas=2)
    assert placement.mode == "shared" and placement.replicas == 2
    on_gpu = {slot.label: slot.gpus for slot in placement.slots}
    assert on_gpu == {
        "reference": (0,),
        "candidate": (1,),
        "reference-1": (0,),
        "candidate-1": (1,),
    }
    assert {slot.gpu_memory_fraction for slot in placement.slots} == {0.44}


def test_a_single_launched_side_takes_its_replicas_alone():
    placement = place_on_gpus(4, 1, ("candidate",), copies=2)
    assert [slot.label for slot in placement.slots] == ["candidate", "candidate-1"]
    assert len(place_on_gpus(1, 1, ("candidate",), copies=2).slots) == 1


def test_cpu_cores_are_split_when_each_side_gets_one():
    placement = place_on_cpus((0, 1, 2, 3), SIDES)
    assert placement.slot("reference").cpus == (0, 1)
    assert placement.slot("candidate").cpus == (2, 3)
    assert place_on_cpus((5,), SIDES).phases == (("reference",), ("candidate",))


def test_sharding_keeps_every_request_once_and_deals_out_the_concurrency():
    shards = shard(count=10, replicas=2, concurrency=5)
    assert shards == [([0, 2, 4, 6, 8], 3), ([1, 3, 5, 7, 9], 2)]
    assert shard(count=5, replicas=4, concurrency=2) == [([0, 2, 4], 1), ([1, 3], 1)]
    assert shard(count=3, replicas=1, concurrency=8) == [([0, 1, 2], 8)]
    for count, replicas, concurrency in [(200, 2, 16), (7, 3, 200), (1, 8, 1)]:
        shards = shard(count, replicas, concurrency)
        assert sorted(i for indices, _ in shards for i in indices) == list(range(count))
        assert sum(c for _, c in shards) == concurrency


def test_gated_waves_apply_above_c1_and_never_to_request_pairs():
    alternate = load_schedule("auto", "shared", 2, [1, 16], paced=False, waves=True)
    assert (alternate.in_waves(1), alternate.in_waves(16)) == (False, True)
    assert alternate.describe().endswith("C>1 in gated waves of C (TTFT from the release)")
    together = load_schedule("auto", "simultaneous", 2, [1, 4], paced=False, waves=True)
    assert together.kind == "together" and together.in_waves(4)
    plain = load_schedule("auto", "shared", 2, [1, 16], paced=False)
    assert not plain.in_waves(16) and "waves" not in plain.describe()
