"""Requests and one-side runs against the paced stub, shared by the client's tests."""

from __future__ import annotations

from rig.load.engine import run_level
from rig.records import RequestRecord, RequestSpec, SamplingParams, ServerTarget, SideJob
from rig.stub.server import StubConfig

FAST = StubConfig(ttft_s=0.02, itl_s=0.005, output_tokens=5)


def spec(i: int, endpoint: str = "completions", level: int = 2, **sampling) -> RequestSpec:
    return RequestSpec(
        request_id=f"r{i}",
        prompt_id=f"p{i % 3}",
        level=level,
        repeat=0,
        index=i,
        endpoint=endpoint,  # type: ignore[arg-type]
        prompt=f"prompt number {i % 3}" if endpoint == "completions" else None,
        messages=({"role": "user", "content": f"hi {i}"},) if endpoint == "chat" else None,
        cache_salt=f"run1.{i}",
        sampling=SamplingParams(max_tokens=sampling.pop("max_tokens", 5), **sampling),
    )


def one_side(stub, specs, concurrency=2, side="reference", **options) -> list[RequestRecord]:
    job = SideJob(ServerTarget(side, stub.url, "stub"), specs)
    options.setdefault("timeout_s", 10)
    return run_level([job], concurrency, progress=False, **options)[side]
