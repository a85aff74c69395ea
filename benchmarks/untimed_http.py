"""The untimed client (rig.untimed_http, urllib) against aiohttp, the client it replaced, on the
rig's untimed traffic to two stub servers (rig.stub.server, each in its own process):

    one call   GET /health, called synchronously (a health poll, the waves' pause and resume,
               /version): urllib, and aiohttp in an event loop of its own per call
    /metrics   GET /metrics the same two ways
    replay     the teacher-forced replay (prompt_logprobs, top-5) of N sequences on both sides,
               C of them in flight per side: rig.load.replay_client, and the same requests
               (and the same reading of the answers) from one aiohttp session

    python benchmarks/untimed_http.py [--sequences 64] [--levels 1,16] [--calls 200]

Medians in ms (one call, /metrics) and wall seconds (replay); the stubs answer at once, so what
is measured is the client.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

import aiohttp
from bench_client import Stub

from rig.load.replay_client import forced_answer, forced_body, replay_forced
from rig.load.replay_records import ForcedSequence
from rig.records import ServerTarget
from rig.untimed_http import call

PROMPT_TOKENS, COMPLETION_TOKENS, TOP_K = 512, 32, 5


def _aiohttp_get(url: str) -> bytes:
    async def get() -> bytes:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return await response.read()

    return asyncio.run(get())


def _median_ms(function: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _aiohttp_replay(sequences: list[ForcedSequence], targets: list[ServerTarget], c: int) -> None:
    async def replay() -> None:
        in_flight = asyncio.Semaphore(c)
        async with aiohttp.ClientSession() as session:

            async def one(target: ServerTarget, sequence: ForcedSequence, index: int) -> None:
                body = forced_body(target, sequence, f"bench.{target.side}.{index}", TOP_K)
                async with session.post(f"{target.base_url}/v1/completions", json=body) as r:
                    forced_answer(await r.json(), sequence, TOP_K)

            async def on_both(index: int, sequence: ForcedSequence) -> None:
                async with in_flight:
                    await asyncio.gather(*(one(t, sequence, index) for t in targets))

            await asyncio.gather(*(on_both(i, s) for i, s in enumerate(sequences)))

    asyncio.run(replay())


def _seconds(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--levels", default="1,16")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    stubs = [Stub(ttft_ms=1, itl_ms=1, tokens=1) for _ in range(2)]
    try:
        url = stubs[0].url
        rows = [
            ("one call", "ms", lambda get: _median_ms(lambda: get(f"{url}/health"), args.calls))
        ]
        rows.append(("/metrics", "ms", lambda get: _median_ms(lambda: get(f"{url}/metrics"), 50)))
        table = ["| traffic | unit | rig.untimed_http (urllib) | aiohttp |", "|---|---|---|---|"]
        urllib_get = lambda u: call("GET", u, timeout_s=30).body  # noqa: E731
        for name, unit, measure in rows:
            table.append(f"| {name} | {unit} | {measure(urllib_get):.2f} | "
                         f"{measure(_aiohttp_get):.2f} |")  # fmt: skip
        targets = [
            ServerTarget(s, stub.url, "stub") for s, stub in zip(("a", "b"), stubs, strict=True)
        ]
        prompt = tuple(range(100, 100 + PROMPT_TOKENS))
        completion = tuple(range(COMPLETION_TOKENS))
        sequences = [ForcedSequence(f"p{i}", prompt, completion) for i in range(args.sequences)]
        for c in (int(level) for level in args.levels.split(",")):
            ours = _seconds(lambda c=c: replay_forced(sequences, targets, "bench", TOP_K, c))
            theirs = _seconds(lambda c=c: _aiohttp_replay(sequences, targets, c))
            table.append(f"| replay, {args.sequences} sequences, C={c} | s | {ours:.2f} | "
                         f"{theirs:.2f} |")  # fmt: skip
        print("\n".join(table))
    finally:
        for stub in stubs:
            stub.stop()


if __name__ == "__main__":
    main()
