#!/usr/bin/env bash
# The kernel-speed control where the GPU is the bottleneck, at high concurrency (issue 44 item 6,
# docs/perf-control.md), in one device job
# (JOB=benchmarks/gpu_jobs/high_conc_control.sh bash benchmarks/gpu_speed_session.sh start N):
# qwen35-control built there, then benchmarks/perf_control.py on scenarios/gpu-speed.yaml (2K-10K
# -token prompts, 8 tokens out: prefill steps of the 10,240-token budget, the GPU's work) at
# C = 64 and 200, 200 requests a block, max_num_seqs 220 as the matrix serves: the GPU-timeline
# delay first (600 us a prefill call, sized on 2026-12-06 to predict about 3 %), then the A/A,
# then ns4, so that what matters most finishes first when device time runs out. LEVELS,
# REPEATS (stage-one blocks), BUDGET_S, GPU_DELAY_US and CONTROL_COMPARISONS change them.
set -uo pipefail
started=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - started )) s"; }
"$PY" -m rig.models.qwen35_control
stamp "qwen35-control built"
"$PY" benchmarks/perf_control.py --scenario scenarios/gpu-speed.yaml \
    --comparisons "${CONTROL_COMPARISONS:-gpu,aa,ns4}" --gpu-delay-us "${GPU_DELAY_US:-600}" \
    --results-dir "$RESULTS" --run-id high-conc \
    --set "workload.concurrency=${LEVELS:-[64,200]}" --set workload.requests_per_level=200 \
    --set model.max_num_seqs=220 --set workload.repeats="${REPEATS:-6}" \
    --set workload.speed_budget_s="${BUDGET_S:-20}"
stamp "high-concurrency control done"
