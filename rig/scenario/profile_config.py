"""The scenario's `profile:` key: one extra block, profiled on both sides, after the timed ones."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from rig.scenario.strict import StrictModel

DEFAULT_PROFILE_REQUESTS = 8


class ProfileConfig(StrictModel):
    """A torch profiler trace of each side, captured by vLLM's own hooks (`--profiler-config`,
    `/start_profile`, `/stop_profile`) around one block of `requests` at concurrency `level`.
    The block is slower than an unprofiled one, so none of its requests is timed or kept."""

    level: int | None = Field(
        None, gt=0, description="a level of workload.concurrency; default: the first"
    )
    requests: int = Field(DEFAULT_PROFILE_REQUESTS, gt=0, description="requests in the block")


class Workload(Protocol):
    """What the check reads of workload.* (rig.scenario.config.WorkloadConfig, which imports
    this module)."""

    concurrency: list[int]
    conversations: object | None


def profile_problem(workload: Workload, profile: ProfileConfig | None) -> str | None:
    """Why the profiled block cannot run, in one line; None when it can."""
    if profile is None:
        return None
    if workload.conversations is not None:
        return "profile: a conversation's turns wait on each other's answers; profile prompts"
    concurrency = workload.concurrency
    if profile.level is None or profile.level in concurrency:
        return None
    return f"profile.level {profile.level} is not a level of workload.concurrency {concurrency}"


def profile_level(concurrency: list[int], profile: ProfileConfig) -> int:
    """The profiled block's concurrency."""
    return profile.level if profile.level is not None else concurrency[0]
