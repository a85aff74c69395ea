#!/usr/bin/env bash
# The profiled block's and the accuracy block's GPU checks in one device job
# (JOB=benchmarks/gpu_jobs/profile_accuracy.sh bash benchmarks/gpu_speed_session.sh start N):
# benchmarks/gpu_profile_session.sh (FLA against ns4 on tiny-qwen35, the profiled block and its
# traces), tests/e2e/test_gpu_accuracy.py (ns3 caught by the accuracy gate alone), then
# benchmarks/gdn_share.py on the same prompts and tests/e2e/test_gpu_profile.py against its CSV.
# Everything lands under $RESULTS, which the session script packs into summary.tar.xz and
# records.tar.xz.
set -uo pipefail
started=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - started )) s"; }
OUT=$RESULTS/profile bash benchmarks/gpu_profile_session.sh 2>&1 | tee "$RESULTS/profile.txt"
stamp "profiled block done"
RIG_GPU_EVIDENCE_DIR=$RESULTS/accuracy "$PY" -m pytest -q -s -p no:cacheprovider -m gpu \
    tests/e2e/test_gpu_accuracy.py 2>&1 | tail -n 60 | tee "$RESULTS/accuracy.txt"
stamp "accuracy test done"
GDN_SHARE=1 OUT=$RESULTS/profile bash benchmarks/gpu_profile_session.sh 2>&1 \
    | tee "$RESULTS/gdn-share.txt"
stamp "gdn_share done"
RIG_GDN_SHARE_CSV=$RESULTS/profile/gdn-share.csv "$PY" -m pytest -q -s -p no:cacheprovider \
    -m gpu tests/e2e/test_gpu_profile.py 2>&1 | tail -n 60 | tee "$RESULTS/profile-test.txt"
stamp "profile test done"
