"""The profiled block (`profile:` in a scenario, or `--profile`): after a server's timed blocks,
one more block at the profile's level with vLLM's torch profiler on, each side in turn so that
neither's trace holds the other's load. Its requests are sent and dropped: none is in
requests.jsonl, none in a speed interval (a profiled block is slower than a timed one).
What it leaves is the traces vLLM writes under profile/<server>/ and profile/<server>/block.json
(what was sent, how long it took); rig/run/conclude reads them back for the verdict."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rig.load.profiler import ProfilerUnavailable, start_profile, stop_profile
from rig.records import SideJob
from rig.run.pair_load import send_level
from rig.run.state import RunContext
from rig.scenario.config import SIDES, Scenario
from rig.scenario.profile_config import profile_level
from rig.scenario.workload import level_requests
from rig.serve.profiler_flags import PROFILE_DIR, profile_dir
from rig.serve.servers import Server, ServerError
from rig.verdict.profile_report import (
    BLOCK_FILE,
    ProfiledBlock,
    ProfileResult,
    TraceFile,
    side_profile,
)

TAG = "profile-"  # the profiled block's request ids: profile-c<level>-r0-<n>


def run_profiled_block(ctx: RunContext, servers: dict[str, Server]) -> None:
    """Each side's first server profiled over one block, the reference first."""
    profile = ctx.scenario.profile
    if profile is None:
        return
    level = profile_level(ctx.scenario.workload.concurrency, profile)
    for side in SIDES:
        for label, server in servers.items():
            if server.plan.side == side and server.plan.replica == 0 and server.plan.url is None:
                profile_one(ctx, label, server, level, profile.requests)


def profile_one(ctx: RunContext, label: str, server: Server, level: int, requests: int) -> None:
    """One server's profiled block; a profiler that will not start or stop stops the run."""
    workload = ctx.scenario.workload
    target = server.target()
    specs = level_requests(
        workload,
        ctx.prompts,
        level=level,
        repeat=0,
        side=target.side,
        run_id=ctx.run_id,
        tag=TAG,
        count=requests,
    )
    folder = profile_dir(ctx.run_dir, label)
    for stale in traces_of(folder):  # an interrupted run's, resumed: this block's alone count
        stale.unlink()
    print(f"rig: profiling {label}: {requests} requests at C={level}, not timed", flush=True)
    try:
        start_profile(target)
        started = time.monotonic()
        results = send_level(
            {label: server},
            level,
            [SideJob(target, specs, level)],
            timeout_s=workload.timeout_s,
            progress=False,
        )
        sent_s = time.monotonic() - started
        stop_profile(target)
    except ProfilerUnavailable as exc:
        raise ServerError(f"profile: {exc}") from None
    records = [record for side_records in results.values() for record in side_records]
    block = ProfiledBlock(
        label=label,
        side=target.side,
        level=level,
        requests=len(records),
        failed=sum(record.error is not None for record in records),
        seconds=sent_s,
        trace_write_s=time.monotonic() - started - sent_s,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / BLOCK_FILE).write_text(json.dumps(block.to_json(), indent=2))


def traces_of(folder: Path) -> list[Path]:
    """A server's worker traces; the API server's own CPU trace (`...async_llm...`) has no
    kernels and is left out."""
    found = sorted(folder.glob("*.pt.trace.json*"))
    return [path for path in found if "async_llm" not in path.name]


def read_profile(run_dir: Path, scenario: Scenario) -> ProfileResult | None:
    """The profiled blocks' records and traces, as verdict reads them; None without a profile
    or when no server got to its profiled block (a run stopped before it)."""
    if scenario.profile is None:
        return None
    sides = []
    for folder in sorted((run_dir / PROFILE_DIR).glob("*")):
        block_file = folder / BLOCK_FILE
        if not block_file.is_file():
            continue
        block = ProfiledBlock.from_json(json.loads(block_file.read_text()))
        traces = [
            (TraceFile(str(path.relative_to(run_dir)), path.stat().st_size), path.read_bytes())
            for path in traces_of(folder)
        ]
        sides.append(side_profile(block, traces))
    if not sides:
        return None
    sides.sort(key=lambda s: SIDES.index(s.block.side) if s.block.side in SIDES else len(SIDES))
    return ProfileResult(
        profile_level(scenario.workload.concurrency, scenario.profile), tuple(sides)
    )
