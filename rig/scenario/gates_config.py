"""The scenario's `gates:` key: what fails a run, and what makes it INVALID."""

from __future__ import annotations

from pydantic import Field

from rig.scenario.strict import StrictModel


class GatesConfig(StrictModel):
    """What fails the run. Thresholds are in nats (natural-log probability units)."""

    max_substantive_divergences: int = Field(0, ge=0)
    near_tie_margin: float = Field(0.25, ge=0)
    allow_near_ties_beyond_aa: int = Field(-1, description="-1: any number of near-ties is fine")
    allow_self_check_beyond_aa: int = Field(
        -1, description="requests the candidate writes otherwise alone, beyond A/A's; -1: not gated"
    )
    max_mean_drift: float | None = Field(0.1, ge=0)
    max_request_drift: float | None = Field(None, ge=0)
    max_mean_prompt_drift: float | None = Field(
        None, ge=0, description="mean |Δlogprob| over the forced prompt positions"
    )
    calibration_drift: float | None = Field(
        None, ge=0, description="mean drift of a known-correct kernel pair on this model"
    )
    max_drift_over_floor: float | None = Field(
        None,
        gt=0,
        description="mean drift <= this x the floor, max(A/A mean drift, calibration_drift)",
    )
    max_pathologies: int = Field(0, ge=0)
    max_prefix_cache_hits: int = Field(0, ge=0)
    min_prefix_cache_hits: int | None = Field(
        None, gt=0, description="workload.conversations: cached prompt tokens each side must show"
    )
    max_perf_regression_pct: float | None = None
    require_candidate_kernel: bool = True
    require_initial_state: bool = Field(
        False, description="INVALID unless both sides prefilled from a non-zero GDN state"
    )
