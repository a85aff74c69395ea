#!/usr/bin/env bash
# The profiled block on one H200 or H100 (docs/report.md, "Where the time went"): tiny-qwen35,
# FLA against ns4, both sides on one GPU, eager, C=1, one token out, gpu-long's 2K/8K/10K-token
# prompts; the rig with --profile (one block of 6 requests a side under vLLM's torch profiler,
# after two timed blocks), then, with GDN_SHARE=1, benchmarks/gdn_share.py on the same prompts
# (each side's server alone, every GDN call timed between two device synchronisations), to
# compare the profile's GDN share with its. From the project root on the device, once vLLM's
# CUDA build is in /tmp/vllm-site (benchmarks/gpu_speed_session.sh's call 1, then this with
# carry .whl1 and rig.egg-info, which installs it when missing):
#   bash benchmarks/gpu_profile_session.sh            # about 3 minutes: the profiled run
#   GDN_SHARE=1 bash benchmarks/gpu_profile_session.sh  # a second call: gdn_share.py as well
# Prints each side's GDN share and top kernels (summary.md's profile block) and gdn_share.py's
# table; copies summary.md, profile.csv, perf.csv, manifest.json, each side's worker trace
# (gzipped, a few MB) and gdn_share.py's CSV to $OUT.
set -uo pipefail
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-/tmp/out}
RESULTS=/tmp/profile-results
export PYTHONPATH=/tmp/vllm-site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 VLLM_CACHE_ROOT=/tmp/vllm-cache
SHORT=(--set workload.concurrency=[1] --set workload.repeats=2 --set workload.max_tokens=1
    --set workload.requests_per_level=6 --set workload.warmup_requests=3
    --set model.enforce_eager=true --set profile.requests=6)

nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
if [ ! -d /tmp/vllm-site/vllm ]; then
    CARRY=.whl1 bash .whl1/remote_install.sh || exit 2
fi
mkdir -p "$OUT" "$RESULTS"
started=$(date +%s)
"$PY" -m rig.models.tiny_qwen35 || exit 2
if [ "${GDN_SHARE:-0}" = 1 ]; then
    "$PY" benchmarks/gdn_share.py scenarios/gpu-long.yaml --tokens 2500,10000,12400 \
        --repeats 2 --csv "$OUT/gdn-share.csv" 2>&1 | grep -v '^  Sample'
    echo "== gdn_share.py done at $(( $(date +%s) - started )) s"
    exit 0
fi
"$PY" -m rig.run scenarios/gpu-long.yaml --no-cache --profile --run-id profiled \
    --set results_dir="$RESULTS" "${SHORT[@]}" > "$OUT/run.log" 2>&1
echo "== rig exit $? at $(( $(date +%s) - started )) s"
run=$RESULTS/profiled
sed -n '/^Profiled block/,/^| level/p' "$run/summary.md"
grep -m1 'from the profiled share' "$run/summary.md"
for name in summary.md profile.csv perf.csv manifest.json; do cp "$run/$name" "$OUT/" 2>/dev/null; done
for side in reference candidate; do
    mkdir -p "$OUT/profile/$side"
    cp "$run/profile/$side"/*rank*.pt.trace.json.gz "$run/profile/$side/block.json" \
        "$OUT/profile/$side/" 2>/dev/null
    tail -c 20000 "$run/server-$side.log" > "$OUT/server-$side.log.tail" 2>/dev/null
done
tail -n 5 "$OUT/run.log"
