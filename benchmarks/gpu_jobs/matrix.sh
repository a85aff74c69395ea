#!/usr/bin/env bash
# The seeds' high-concurrency matrix on one GPU (issue 44, docs/perf-control.md), in one device
# job (JOB=benchmarks/gpu_jobs/matrix.sh bash benchmarks/gpu_speed_session.sh start N):
# the model built there, then scenarios/gpu-matrix.yaml (FLA against ns4, compiled, CUDA
# graphs) at C = 16-200, every headline interval asked to be within ±2 % within a shared load
# budget, then the A/A and the GPU-timeline control (600 us a prefill call, which predicted +3 %
# of TTFT on gpu-speed.yaml) at C = 16, 64, 200. MATRIX_BUDGET_S, CONTROL_BUDGET_S and
# GPU_DELAY_US change them; MATRIX_LEVELS (e.g. [16,64,200]) and MATRIX_REPEATS cut the matrix
# down to fit the device time left; CONTROL_COMPARISONS (default aa,gpu) orders the control's
# runs, so that the one that matters most finishes first; MATRIX_ONLY=1 stops after the matrix.
# MATRIX_MODEL (default qwen35-control) serves another embedded model in every run: qwen35-deep
# has the same text and four times the GPU work a step (rig/models/qwen35_deep.py), for a decode
# that qwen35-control leaves to the host (docs/perf-control.md, 2026-12-07).
set -uo pipefail
started=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - started )) s"; }
model=${MATRIX_MODEL:-qwen35-control}
"$PY" -m "rig.models.${model//-/_}"
stamp "$model built"
"$PY" -m rig.run scenarios/gpu-matrix.yaml --no-cache --run-id matrix-ns4 \
    --set results_dir="$RESULTS/gpu-matrix" --set model.name="$model" \
    --set "workload.concurrency=${MATRIX_LEVELS:-[16,32,64,128,136,144,160,176,192,200]}" \
    --set workload.repeats="${MATRIX_REPEATS:-4}" --set workload.speed_resolution_pct=2 \
    --set workload.speed_budget_s="${MATRIX_BUDGET_S:-150}"
stamp "ns4 matrix done"
[ -n "${MATRIX_ONLY:-}" ] && exit 0
"$PY" benchmarks/perf_control.py --scenario scenarios/gpu-matrix.yaml \
    --comparisons "${CONTROL_COMPARISONS:-aa,gpu}" --gpu-delay-us "${GPU_DELAY_US:-600}" \
    --results-dir "$RESULTS" --run-id matrix-control \
    --set 'workload.concurrency=[16,64,200]' --set workload.repeats=4 --set model.name="$model" \
    --set workload.speed_resolution_pct=2 \
    --set workload.speed_budget_s="${CONTROL_BUDGET_S:-90}"
stamp "A/A and GPU-timeline control done"
