"""Where each server runs: which GPUs (or CPU cores) every side of every replica pair gets, and
which servers run at the same time.

Rules, for N GPUs and tensor-parallel size TP (a server always spans TP GPUs):
  - R replica pairs (`replicas`, default N // (2*TP), at least 1) need 2*R groups of TP GPUs:
    with that many, every server has its own and all run at once, the requests sharded over
    the pairs.
  - With fewer, servers share groups when the model fits that many times in a group's free
    memory (each gets a fraction of it): one H200 holds both sides of a small model.
  - Otherwise one pair, the sides one after the other on the same GPUs.
  - N < TP: no placement (PlacementError says how many GPUs a side needs).
Without GPUs, both sides at once on disjoint CPU cores when there are at least two, else one
after the other. Attaching to servers on other nodes is the scenario's `url` path: those sides
take no GPUs here. On a Ray cluster (`placement.backend: ray`), each pair on one node, the pairs
spread over the nodes (place_on_nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rig.records import server_label
from rig.serve.hardware import Hardware

SHARED_GPU_MEMORY_BUDGET = 0.88  # split between the servers sharing a GPU; room for contexts


@dataclass(frozen=True)
class LoadSchedule:
    """When each side's timed requests run. `together`: both sides at once (each on its own
    hardware, or one side only); `alternate`: one side at a time, blocks ordered ABBA so that
    drift cancels, and at `pair_levels` (C=1, unpaced) request by request, each pair back to
    back; `apart`: the sides' servers start one after the other (not up at once). `waves`:
    at the other levels each server gets its requests in gated waves (rig.load.waves)."""

    kind: Literal["together", "alternate", "apart"]
    pair_levels: tuple[int, ...] = ()
    reason: str = ""
    waves: bool = False

    def in_waves(self, level: int) -> bool:
        """Whether a level's requests go in gated waves: C>1, not request pairs."""
        return self.waves and level > 1 and level not in self.pair_levels

    def describe(self) -> str:
        text = {
            "together": "sides timed together",
            "alternate": "sides timed in turn (blocks ABBA",
            "apart": "sides timed apart (servers one after the other)",
        }[self.kind]
        if self.kind == "alternate":
            pairs = ", ".join(f"C={c}" for c in self.pair_levels)
            text += f"; request pairs back to back at {pairs})" if pairs else ")"
        text = f"{text}: {self.reason}" if self.reason else text
        return text + ("; C>1 in gated waves of C (TTFT from the release)" if self.waves else "")


def load_schedule(
    requested: str,
    mode: str,
    sides: int,
    concurrency: list[int],
    paced: bool,
    waves: bool = False,
) -> LoadSchedule:
    """The schedule a placement allows: sides that share GPUs are never timed at once (each
    would time the other's work too), sides on their own hardware are; `requested` (auto,
    together, alternate) can ask for either where both sides' servers are up at once."""
    if mode == "sequential":
        return LoadSchedule("apart", reason="the sides do not fit at once", waves=waves)
    if sides < 2:
        return LoadSchedule("together", reason="one side runs here", waves=waves)
    if requested == "together" or (requested == "auto" and mode != "shared"):
        why = "as asked" if requested == "together" else "each side on its own hardware"
        return LoadSchedule("together", reason=why, waves=waves)
    why = "as asked" if requested == "alternate" else "the sides share GPUs"
    pair_levels = () if paced else tuple(c for c in concurrency if c == 1)
    return LoadSchedule("alternate", pair_levels, why, waves)


class PlacementError(ValueError):
    """No placement fits; the message is one line meant for the user."""


@dataclass(frozen=True)
class ClusterNode:
    """One live node of a Ray cluster and what it declares (rig.serve.ray_cluster reads them)."""

    node_id: str
    address: str
    cpus: int
    gpus: int

    def describe(self) -> str:
        return f"node {self.node_id[:8]} ({self.address})"


@dataclass(frozen=True)
class Slot:
    """One server: a side of one replica pair, and the devices it may use."""

    side: str
    replica: int
    gpus: tuple[int, ...] = ()  # indices into the GPUs this process sees
    cpus: tuple[int, ...] = ()
    gpu_memory_fraction: float | None = None  # set when the GPUs are shared with another server
    node: ClusterNode | None = None  # the Ray node of its pair; its GPUs are the ones Ray gives
    gpu_count: int = 0  # with a node: how many GPUs Ray gives it

    @property
    def label(self) -> str:
        return server_label(self.side, self.replica)


@dataclass(frozen=True)
class Placement:
    mode: Literal["simultaneous", "sequential", "shared"]
    replicas: int
    slots: tuple[Slot, ...]
    phases: tuple[tuple[str, ...], ...]  # slot labels that run at the same time
    reason: str = ""  # why the servers run at once or in turn, in words

    def slot(self, label: str) -> Slot:
        return next(slot for slot in self.slots if slot.label == label)

    def describe(self) -> str:
        parts = []
        for slot in self.slots:
            devices = (
                "GPU " + ",".join(map(str, slot.gpus))
                if slot.gpus
                else ("cores " + ",".join(map(str, slot.cpus)) if slot.cpus else "shared CPU")
            )
            if slot.node is not None:
                held = f"{slot.gpu_count} GPU(s) from Ray" if slot.gpu_count else devices
                devices = f"{slot.node.describe()}, {held}"
            if slot.gpu_memory_fraction is not None:
                devices += f" ({slot.gpu_memory_fraction:.0%} of memory)"
            parts.append(f"{slot.label}: {devices}")
        pairs = f"{self.replicas} replica pairs, " if self.replicas > 1 else ""
        why = f" ({self.reason})" if self.reason else ""
        return f"{pairs}{self.mode}{why}; " + "; ".join(parts)


def describe_devices(slot: Slot, hardware: Hardware) -> str:
    """What the placement gave one server, in words, by the ids this machine knows its GPUs
    by (a ServerPlan's `devices`)."""
    if slot.node is not None:
        held = f"{slot.gpu_count} GPU(s) from Ray" if slot.gpu_count else "CPU"
        cores = f" cores {','.join(map(str, slot.cpus))}" if slot.cpus else ""
        return f"Ray {slot.node.describe()}, pair {slot.replica}: {held}{cores}"
    if slot.gpus:
        text = f"GPU {hardware.visible_devices(slot.gpus)}"
        if slot.gpu_memory_fraction is not None:
            text += f" (shared, {slot.gpu_memory_fraction:.0%} of memory)"
        return text
    return f"CPU cores {','.join(map(str, slot.cpus))}" if slot.cpus else "CPU"


@dataclass(frozen=True)
class Round:
    """One start of a phase's servers and the repeats they run before they stop."""

    servers: tuple[str, ...]
    repeats: tuple[int, ...]


def phase_rounds(phases: tuple[tuple[str, ...], ...], repeats: int) -> list[Round]:
    """Each phase once, running every repeat, when the sides run at the same time (one phase)
    or there is one repeat. With the sides one after the other and several repeats they are
    interleaved, reference r0, candidate r0, reference r1, ...: the servers restart for every
    repeat, so that a machine drifting over time slows both sides alike, not one."""
    if len(phases) < 2 or repeats < 2:
        return [Round(phase, tuple(range(repeats))) for phase in phases]
    return [Round(phase, (repeat,)) for repeat in range(repeats) for phase in phases]


def place_on_gpus(
    gpu_count: int,
    tp: int,
    launched: tuple[str, ...],
    *,
    copies: int,
    replicas: int | None = None,
    share: bool | None = None,
) -> Placement:
    """Slots for the `launched` sides (a side may come from a cache or a URL instead).

    `copies`: how many servers of this model fit in the memory of one group of TP GPUs.
    """
    groups = gpu_count // tp
    if groups == 0:
        raise PlacementError(
            f"tensor_parallel_size={tp} needs {tp} GPUs per side; {gpu_count} available"
        )
    pairs = replicas or max(groups // 2, 1)
    count = pairs * len(launched)
    per_group = -(-count // groups)
    made = f"{_many(gpu_count, 'GPU')} make {_many(groups, 'group')} of TP{tp}"
    if per_group == 1:
        slots = [
            Slot(side, replica, _group(index, tp))
            for index, (replica, side) in enumerate(_servers(pairs, launched))
        ]
        return _one_phase("simultaneous", pairs, slots, f"{made}, one per server: all at once")
    if share is not False and per_group <= copies:
        fraction = round(SHARED_GPU_MEMORY_BUDGET / per_group, 2)
        slots = [
            Slot(side, replica, _group(index % groups, tp), (), fraction)
            for index, (replica, side) in enumerate(_servers(pairs, launched))
        ]
        why = f"{made} for {count} servers, and a group's memory holds {copies}"
        return _one_phase("shared", pairs, slots, f"{why}: at once, sharing")
    if share:
        raise PlacementError(
            f"share_gpus: {per_group} servers per GPU do not fit in the GPUs' free memory "
            f"(room for {copies})"
        )
    if pairs > 1:
        raise PlacementError(
            f"{pairs} replica pairs need {2 * tp * pairs} GPUs (TP{tp} per side) or GPUs they "
            f"can share; {gpu_count} available"
        )
    slots = [Slot(side, 0, _group(0, tp)) for side in launched]
    room = " (share_gpus: false)" if share is False else f", and a group's memory holds {copies}"
    why = f"{made} for {count} servers{room}: one side after the other"
    return Placement("sequential", 1, tuple(slots), tuple((s.label,) for s in slots), why)


def _many(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _servers(pairs: int, launched: tuple[str, ...]) -> list[tuple[int, str]]:
    return [(replica, side) for replica in range(pairs) for side in launched]


def _group(index: int, tp: int) -> tuple[int, ...]:
    return tuple(range(index * tp, (index + 1) * tp))


def place_on_cpus(cpu_ids: tuple[int, ...], launched: tuple[str, ...]) -> Placement:
    """Disjoint core sets when every side gets at least one, else one after the other."""
    count = len(launched)
    per_side = len(cpu_ids) // count if count else 0
    if count and per_side >= 1:
        slots = [
            Slot(side, 0, (), cpu_ids[i * per_side : (i + 1) * per_side])
            for i, side in enumerate(launched)
        ]
        return _one_phase("simultaneous", 1, slots, "cores split between the sides: at once")
    slots = [Slot(side, 0) for side in launched]
    why = "fewer cores than sides: one side after the other"
    return Placement("sequential", 1, tuple(slots), tuple((s.label,) for s in slots), why)


def side_resources(tp: int, on_gpus: bool) -> dict[str, float]:
    """What one server reserves on its node: TP GPUs, or one CPU on a cluster without GPUs
    (declare `--num-cpus` per node so that a node holds the pairs it should)."""
    return {"CPU": 1.0, "GPU": float(tp)} if on_gpus else {"CPU": 1.0}


def place_on_nodes(
    nodes: tuple[ClusterNode, ...], tp: int, launched: tuple[str, ...], replicas: int | None
) -> Placement:
    """Each replica pair on one node (both sides' resources there), pairs dealt over the nodes
    in turn so that they spread: pair r on the r-th node with room, a node's second pair only
    after every node has one. `replicas` defaults to one pair per node with room."""
    on_gpus = any(node.gpus for node in nodes)
    need, sides = side_resources(tp, on_gpus), max(len(launched), 1)
    room = [  # pairs each node holds (one CPU per server, and TP GPUs with GPUs)
        min(node.cpus // sides, node.gpus // (tp * sides)) if on_gpus else node.cpus // sides
        for node in nodes
    ]
    order = [
        node
        for turn in range(max(room, default=0))
        for node, n in zip(nodes, room, strict=True)
        if n > turn
    ]
    pairs = replicas or max(sum(1 for n in room if n), 1)
    if pairs > len(order) or not launched:
        each = " + ".join(f"{v:g} {k}" for k, v in need.items())
        held = ", ".join(f"{n.describe()}: {n.cpus} CPU, {n.gpus} GPU" for n in nodes)
        spans = on_gpus and tp > max(node.gpus for node in nodes)
        raise PlacementError(
            f"placement.backend=ray: {pairs} replica pairs need {len(launched)} x ({each}) "
            f"on one node each; the cluster holds {len(order)} ({held or 'no live node'})"
            + ("; a side spanning nodes is not built (docs/ray.md)" if spans else "")
        )
    sites = order[:pairs]
    slots = []
    for node in dict.fromkeys(sites):
        servers = [(r, side) for r, site in enumerate(sites) if site == node for side in launched]
        per_server = node.cpus // len(servers)  # the node's cores, split as on one machine
        for index, (replica, side) in enumerate(servers):
            cores = range(index * per_server, (index + 1) * per_server)
            cpus = () if on_gpus else tuple(cores)
            slots.append(Slot(side, replica, (), cpus, None, node, tp if on_gpus else 0))
    slots.sort(key=lambda slot: (slot.replica, launched.index(slot.side)))
    return _one_phase("simultaneous", pairs, slots, "each pair on one node: all at once")


def _one_phase(mode, replicas: int, slots: list[Slot], reason: str = "") -> Placement:
    phases = (tuple(slot.label for slot in slots),) if slots else ()
    return Placement(mode, replicas, tuple(slots), phases, reason)


def shard(count: int, replicas: int, concurrency: int) -> list[tuple[list[int], int]]:
    """Split a level's ordered requests (0..count-1) and its client concurrency across the
    replica pairs: request i goes to pair i % R, and the C slots are dealt out as evenly as
    possible. Pairs that would get no slot get no requests either."""
    used = max(1, min(replicas, concurrency))
    return [
        (list(range(replica, count, used)), concurrency // used + (replica < concurrency % used))
        for replica in range(used)
    ]
