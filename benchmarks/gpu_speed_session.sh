#!/usr/bin/env bash
# The speed control on one H200 (docs/perf-control.md): vLLM 0.26.0's CUDA build from the two
# transfers of ../shared/gpu, then benchmarks/perf_control.py on scenarios/gpu-speed.yaml (A/A,
# a planted slowdown sized at 5 % of the A/A reference's TTFT, ns4) in a session of its own, so
# that it outlives the device call that started it, from a copy of the project under /tmp (the
# device copies the working tree again at every call). From the project root on the device:
#   call 1: mkdir -p /tmp/vllm-parts && cp .whl0/*.part00 /tmp/vllm-parts/        (carry .whl0)
#   call 2: bash benchmarks/gpu_speed_session.sh start [SECONDS]   (carry .whl1, rig.egg-info)
#   then:   bash benchmarks/gpu_speed_session.sh wait SECONDS      (until it says finished)
# Each prints the log's tail and copies the summary, the runs' perf.csv, records, server counters
# and logs to $OUT. KEEP_WORK=1: /tmp/rig already holds the project (unpacked in call 1 from a
# tarball of a commit), so the working tree the device copies is not used.
set -uo pipefail
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
WORK=/tmp/rig
RESULTS=/tmp/speed-results
LOG=/tmp/speed-control.log
ARGS=${CONTROL_ARGS:---comparisons aa,planted,ns4 --planted-pct 5}

export PYTHONPATH=/tmp/vllm-site:$WORK HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

running() { pgrep -f "benchmarks/perf_control.py" >/dev/null; }

report() {
    tail -n 25 "$LOG" 2>/dev/null
    mkdir -p "${OUT:-/tmp/out}"
    cp "$LOG" "${OUT:-/tmp/out}/control.log" 2>/dev/null
    for name in aa planted ns4; do
        for file in perf.csv requests.jsonl server_counters.jsonl manifest.json; do
            cp "$RESULTS/gpu-speed/$name/$file" "${OUT:-/tmp/out}/$name-$file" 2>/dev/null
        done
        cp "$RESULTS/gpu-speed/$name.log" "${OUT:-/tmp/out}/$name.log" 2>/dev/null
    done
    cp "$RESULTS/gpu-speed/summary.md" "${OUT:-/tmp/out}/summary.md" 2>/dev/null
    if running; then echo "== still running"; else echo "== finished"; fi
}

case ${1:-} in
start)
    nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
    if [ ! -d /tmp/vllm-site/vllm ]; then
        CARRY=.whl1 bash .whl1/remote_install.sh || exit 2
    fi
    if [ -z "${KEEP_WORK:-}" ]; then
        rm -rf "$WORK" && mkdir -p "$WORK"
        tar --exclude=./.whl0 --exclude=./.whl1 -cf - . | tar -xf - -C "$WORK"
    fi
    cd "$WORK" || exit 2
    "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_prefill_counter.py 2>&1 | tail -n 3
    # shellcheck disable=SC2086  # ARGS is a list of options
    setsid nohup "$PY" benchmarks/perf_control.py --scenario scenarios/gpu-speed.yaml $ARGS \
        --results-dir "$RESULTS" --run-id gpu-speed > "$LOG" 2>&1 < /dev/null &
    sleep "${2:-0}"
    report
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
