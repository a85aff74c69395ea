"""The reference side from and into the golden cache: a later candidate iteration on the same
reference starts only its own server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rig.records import Side
from rig.run.cache import DIGESTS_FILE, GoldenCache, GoldenEntry, golden_key
from rig.run.state import RunJournal
from rig.scenario.config import Scenario
from rig.scenario.prompts import Prompt
from rig.serve.plan import LaunchPlan
from rig.verdict.evidence import SideKernel


@dataclass(frozen=True)
class GoldenLookup:
    """This run's cache key, and the entry found under it (None: the reference runs)."""

    key: str
    fields: dict
    entry: GoldenEntry | None


def lookup_golden(
    cache: GoldenCache | None,
    scenario: Scenario,
    plan: LaunchPlan,
    model_path: str,
    prompts: list[Prompt],
) -> GoldenLookup:
    """The cache serves runs without an A/A control or a profile (they need the reference
    server) whose reference the rig starts itself (an attached server is not what the key
    describes)."""
    memo = cache.root / DIGESTS_FILE if cache is not None else None
    key, fields = golden_key(scenario, plan.servers[Side.REFERENCE], model_path, prompts, memo)
    usable = (
        cache is not None
        and not scenario.control.aa
        and scenario.profile is None  # a profile is of a server running here
        and plan.servers[Side.REFERENCE].url is None
    )
    return GoldenLookup(key, fields, cache.load(key) if usable else None)


def take_golden(journal: RunJournal, golden: GoldenEntry, plan: LaunchPlan) -> LaunchPlan:
    """Take the reference side from the cache; returns the plan without the reference's
    servers, so only the candidate's start."""
    state = journal.state
    state.records += golden.records
    for record in golden.records:
        journal.sink(record)
    state.sequences = golden.sequences
    state.forced[Side.REFERENCE] = golden.forced
    return plan.without(Side.REFERENCE)


def store_golden(
    cache: GoldenCache | None,
    lookup: GoldenLookup,
    run_id: str,
    journal: RunJournal,
    plan: LaunchPlan,
    side_kernels: Callable[[], dict[str, SideKernel]],
) -> None:
    """Keep this run's reference results for the next candidate iteration. `side_kernels`
    (read from the servers' proofs, perhaps their logs) is read only when the rest allows."""
    state = journal.state
    reference = [r for r in state.records if r.side == Side.REFERENCE]
    if (
        cache is None
        or lookup.entry is not None
        or plan.servers[Side.REFERENCE].url is not None  # not what the key describes
        or Side.REFERENCE not in side_kernels()
        or any(r.error is not None for r in reference)
    ):
        return  # only complete, clean reference results are worth reusing
    entry = GoldenEntry(
        source_run=run_id,
        records=reference,
        sequences=state.sequences,
        forced=state.forced.get(Side.REFERENCE, {}),
        kernel=side_kernels()[Side.REFERENCE],
        timings=dict(state.timings),
    )
    folder = cache.store(lookup.key, lookup.fields, entry)
    print(f"rig: reference results stored in the golden cache: {folder}", flush=True)


def _server_time(timings: dict[str, float]) -> float:
    return sum(v for k, v in timings.items() if k.endswith("_server_s"))


def cost_comparison(first: dict[str, float], now: dict[str, float]) -> str:
    """Wall time and server time of this run next to the run that filled the cache."""
    wall_ratio = now["wall_s"] / first["wall_s"] if first.get("wall_s") else float("nan")
    first_servers, servers = _server_time(first), _server_time(now)
    server_ratio = servers / first_servers if first_servers else float("nan")
    return (
        f"rig: cost of this verdict: wall {now['wall_s']:.1f} s vs {first.get('wall_s', 0):.1f} s "
        f"for the run that filled the cache ({wall_ratio:.2f}x); server time {servers:.1f} s vs "
        f"{first_servers:.1f} s ({server_ratio:.2f}x)"
    )
