"""How much of a long prompt's prefill is GDN prefill, per kernel: what a kernel's speed-up can
be worth end to end.

Starts one server per side of a scenario (one after the other, so that each has the device to
itself) with the plugin timing every GDN prefill call between two device synchronisations
(RIG_GDN_TIME=1, so eager mode), sends each long prompt alone with one output token and a fresh
cache salt, and reads per request the client's latency and the GDN seconds the server's stats
grew by. Prints, per prompt length and side, the median latency, the median GDN time and their
ratio, and the reference/candidate ratios of both: the kernel ratio next to the serving ratio.

    python benchmarks/gdn_share.py [SCENARIO] [--tokens 2000,8000,10000] [--repeats 3]
        [--set KEY=VALUE ...] [--csv PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernels.proof import read_stats  # noqa: E402
from rig.load.http_client import ConnectionPool  # noqa: E402
from rig.load.request import send_request  # noqa: E402
from rig.records import RequestSpec, SamplingParams, ServerTarget  # noqa: E402
from rig.scenario.config import SIDES  # noqa: E402
from rig.scenario.loader import load_scenario  # noqa: E402
from rig.scenario.long_prompts import build_long_prompt  # noqa: E402
from rig.serve.hardware import Hardware  # noqa: E402
from rig.serve.preflight import preflight  # noqa: E402
from rig.serve.servers import ServerSet  # noqa: E402

TIME_ENV = "RIG_GDN_TIME"


@dataclass(frozen=True)
class Sample:
    side: str
    kernel: str
    target_tokens: int
    prompt_tokens: int
    latency_ms: float
    gdn_ms: float
    gdn_calls: int


def gdn_totals(stats_dir: Path) -> tuple[float, int]:
    stats = read_stats(stats_dir)
    return sum(s.seconds for s in stats), sum(s.calls for s in stats)


def complete(pool: ConnectionPool, target: ServerTarget, prompt: str) -> int:
    """One greedy completion of one token through the rig's own load client (the same bytes
    a run sends); returns the prompt's token count."""
    spec = RequestSpec(
        request_id=f"gdn-share-{uuid.uuid4().hex}",
        prompt_id="gdn-share",
        level=1,
        repeat=0,
        index=0,
        endpoint="completions",
        prompt=prompt,
        messages=None,
        cache_salt=f"gdn-share-{uuid.uuid4().hex}",
        sampling=SamplingParams(max_tokens=1),
    )
    record = asyncio.run(send_request(pool, target, spec, timeout_s=600))
    if record.error is not None or record.prompt_tokens is None:
        raise RuntimeError(f"{target.base_url}: {record.error}")
    return record.prompt_tokens


def measure_side(plan, tokens: list[int], repeats: int, timeout_s: float) -> list[Sample]:
    samples = []
    with ServerSet([plan], timeout_s) as servers:
        server = servers[plan.label].target()
        pool = ConnectionPool(server.base_url)
        prompts = {t: build_long_prompt(t, seed=0).text for t in tokens}
        for text in prompts.values():  # untimed: compilation and autotuning
            complete(pool, server, text)
        for _ in range(repeats):
            for target, text in prompts.items():
                seconds, calls = gdn_totals(plan.stats_dir)
                started = time.perf_counter()
                prompt_tokens = complete(pool, server, text)
                latency = time.perf_counter() - started
                after_seconds, after_calls = gdn_totals(plan.stats_dir)
                samples.append(
                    Sample(
                        side=plan.side,
                        kernel=plan.kernel or "vLLM's own",
                        target_tokens=target,
                        prompt_tokens=prompt_tokens,
                        latency_ms=latency * 1000,
                        gdn_ms=(after_seconds - seconds) * 1000,
                        gdn_calls=after_calls - calls,
                    )
                )
                print(f"  {samples[-1]}", flush=True)
    return samples


def share_table(samples: list[Sample]) -> pd.DataFrame:
    frame = pd.DataFrame([asdict(s) for s in samples])
    table = (
        frame.groupby(["target_tokens", "side", "kernel"])
        .agg(
            prompt_tokens=("prompt_tokens", "first"),
            latency_ms=("latency_ms", statistics.median),
            gdn_ms=("gdn_ms", statistics.median),
            gdn_calls=("gdn_calls", "median"),
        )
        .reset_index()
    )
    table["gdn_share_pct"] = 100 * table.gdn_ms / table.latency_ms
    return table


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Per prompt length: reference/candidate of the GDN time (the kernel ratio) and of the
    latency (the serving ratio)."""
    rows = []
    for target, group in table.groupby("target_tokens"):
        by_side = group.set_index("side")
        if not set(SIDES) <= set(by_side.index):
            continue
        ref, cand = by_side.loc["reference"], by_side.loc["candidate"]
        rows.append(
            {
                "target_tokens": target,
                "gdn_ratio_ref_over_cand": ref.gdn_ms / cand.gdn_ms,
                "latency_ratio_ref_over_cand": ref.latency_ms / cand.latency_ms,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", default="scenarios/gpu-long.yaml")
    parser.add_argument("--tokens", default="2000,8000,10000", help="long_tokens targets")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--csv", type=Path, default=Path("results/gdn-share.csv"))
    args = parser.parse_args(argv)
    overrides = [
        *args.overrides,
        "model.enforce_eager=true",  # the timing synchronises the device: no graph capture
        *(f"{side}.env.{TIME_ENV}='1'" for side in SIDES),
    ]
    scenario = load_scenario(Path(args.scenario), overrides)
    run_dir = Path("results") / f"gdn-share-{time.strftime('%Y%m%d-%H%M%S')}"
    checked = preflight(scenario, run_dir, Hardware.detect())
    tokens = [int(t) for t in args.tokens.split(",")]
    samples = []
    for side in SIDES:
        plan = checked.plan.side_servers(side)[0]
        print(f"gdn_share: {side} ({plan.kernel or 'vLLM own kernel'})", flush=True)
        samples += measure_side(plan, tokens, args.repeats, scenario.model.startup_timeout_s)
    table = share_table(samples)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.csv, index=False)
    with pd.option_context("display.width", 200):
        print(table.to_string(index=False, float_format="%.2f"))
        print(ratios(table).to_string(index=False, float_format="%.2f"))
    print(f"gdn_share: CSV {args.csv}; server logs in {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
