#!/usr/bin/env bash
# The kernel-speed control on one H200 or H100 (docs/perf-control.md), in one device session:
# vLLM 0.26.0's CUDA build from the two transfers of ../shared/gpu, the GPU tests of the
# plugin's timing and of the GPU-timeline delay, qwen35-control built there, then in a process
# session of its own (it outlives the device call that started it), from a copy of the project
# under /tmp (the device copies the working tree again at every call):
#   benchmarks/perf_control.py --scenario scenarios/gpu-speed.yaml with A/A, a GPU-timeline
#   delay sized to predict +3 % of TTFT, and ns4 (all compiled, CUDA graphs), the GPU's busy
#   share sampled by nvidia-smi all along; then ns3 on the same model (text only).
# From the project root on the device:
#   call 1: mkdir -p /tmp/vllm-parts && cp .whl0/*.part00 /tmp/vllm-parts/        (carry .whl0)
#   call 2: bash benchmarks/gpu_speed_session.sh start [SECONDS]   (carry .whl1, rig.egg-info)
#   then:   bash benchmarks/gpu_speed_session.sh wait SECONDS      (until it says finished)
# JOB=benchmarks/gpu_jobs/NAME.sh runs that script (from the copy under /tmp/rig, with $PY,
# $RESULTS and the environment above) instead of the speed control.
# Each prints the log's tail and packs the results into two archives under $OUT: summary.tar.xz
# (summaries, perf.csv, manifests, counters, drift, mismatches, the GPU's busy samples: small,
# written first) and records.tar.xz (requests, replays, server-log tails). Packing takes a few
# seconds; give the call's timeout_s 30 s more than `wait`'s SECONDS. (On 2026-12-07 one xz -6
# stream of everything outlasted two calls' limits, and the matrix's summary never came back.)
set -uo pipefail
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
WORK=/tmp/rig
RESULTS=/tmp/speed-results
LOG=/tmp/speed-control.log
CONTROL=${CONTROL_ARGS:---comparisons aa,gpu,ns4 --gpu-delay-pct 3}

export PYTHONPATH=/tmp/vllm-site:$WORK HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 VLLM_CACHE_ROOT=/tmp/vllm-cache

running() { pgrep -f "gpu_speed_session.sh job" >/dev/null; }

report() {
    tail -n 30 "$LOG" 2>/dev/null
    mapfile -t runs < <(find "$RESULTS" -name server_counters.jsonl -printf '%h\n' 2>/dev/null)
    [ ${#runs[@]} -gt 0 ] && (cd "$WORK" && "$PY" benchmarks/gpu_busy.py \
        "$RESULTS/gpu-busy.csv" "${runs[@]}" 2>&1 | tail -n 24)
    out=${OUT:-/tmp/out}
    mkdir -p "$out"
    cp "$LOG" "$out/control.log" 2>/dev/null
    cp "$RESULTS/gpu-speed/summary.md" "$out/summary.md" 2>/dev/null
    # the bulky records apart from the rest; each server log's last 200 kB (a log a live server
    # still writes is read, never cut)
    bulky=(--exclude='kernel-stats' --exclude='report.html' --exclude='*.log' --exclude='bench')
    records=(--exclude='requests.jsonl' --exclude='requests.csv' --exclude='replay.jsonl'
        --exclude='junit.xml')
    (cd "$RESULTS" 2>/dev/null && tar "${bulky[@]}" "${records[@]}" -cf - . \
        | xz -1 -T0 > "$out/summary.tar.xz")
    stage=/tmp/stage && rm -rf "$stage" && mkdir -p "$stage"
    (cd "$RESULTS" 2>/dev/null && find . -name '*.log' | while read -r log; do
        mkdir -p "$stage/$(dirname "$log")" && tail -c 200000 "$log" > "$stage/$log"; done
     find . \( -name requests.jsonl -o -name requests.csv -o -name replay.jsonl \) \
        -exec cp --parents {} "$stage" \;)
    (cd "$stage" && tar -cf - . | xz -1 -T0 > "$out/records.tar.xz")
    if running; then echo "== still running"; else echo "== finished"; fi
}

sample_busy() {
    mkdir -p "$RESULTS"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader \
        -lms 500 > "$RESULTS/gpu-busy.csv" 2>&1 &
}

job() {
    cd "$WORK" || exit 2
    started=$(date +%s)
    "$PY" -m rig.models.qwen35_control
    echo "== qwen35-control built in $(( $(date +%s) - started )) s"
    # shellcheck disable=SC2086  # CONTROL is a list of options
    "$PY" benchmarks/perf_control.py --scenario scenarios/gpu-speed.yaml $CONTROL \
        --results-dir "$RESULTS" --run-id gpu-speed
    echo "== perf control done at $(( $(date +%s) - started )) s"
    "$PY" -m rig.run scenarios/gpu-speed.yaml --no-cache --run-id ns3 \
        --set results_dir="$RESULTS/gpu-speed" --set candidate.kernel=ns3 \
        --set workload.concurrency=[1] --set workload.repeats=1 \
        --set workload.speed_resolution_pct=null --set workload.requests_per_level=12
    echo "== ns3 done at $(( $(date +%s) - started )) s"
}

case ${1:-} in
start)
    nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv
    if [ ! -d /tmp/vllm-site/vllm ]; then
        CARRY=.whl1 bash .whl1/remote_install.sh || exit 2
    fi
    rm -rf "$WORK" && mkdir -p "$WORK"
    tar --exclude=./.whl0 --exclude=./.whl1 -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" || exit 2
    "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_prefill_counter.py \
        tests/kernels/test_registry.py 2>&1 | tail -n 4
    setsid nohup bash "$0" job > "$LOG" 2>&1 < /dev/null &
    sleep "${2:-0}"
    report
    ;;
job)
    sample_busy
    if [ -n "${JOB:-}" ]; then
        cd "$WORK" && mkdir -p "$RESULTS" && PY=$PY RESULTS=$RESULTS bash "$JOB"
    else
        job
    fi
    ;;
wait)
    for _ in $(seq "${2:-60}"); do running || break; sleep 1; done
    report
    ;;
*)
    echo "usage: $0 start [SECONDS] | wait SECONDS" >&2
    exit 2
    ;;
esac
