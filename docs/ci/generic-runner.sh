#!/usr/bin/env bash
# One plain shell step for any CI (GitLab, Buildkite, Jenkins, a cron job on a GPU box): run a
# rig scenario on the pull request's tree, keep the report, and turn the rig's exit code into
# the step's status. Copy it, set MODEL / SCENARIO / TP, call it from the CI's script step.
#
#   MODEL=Qwen/Qwen3.5-397B-A17B-FP8 SCENARIO=scenarios/lowconc.yaml \
#     RUN_ID=pr-123 bash docs/ci/generic-runner.sh
#
# TP=N sets the tensor-parallel size; without it the rig fits one to the GPUs' memory.
#
# Exit codes (the rig's own; README, "Everyday use"):
#   0  every gate holds                          -> pass
#   1  NOT equivalent, or a gate on the candidate failed (performance)   -> fail: the kernel
#   2  the run could not be made (bad input, a server died)             -> fail: the machine
#   3  INVALID: no kernel proof, both sides ran one kernel, wrong reference backend, prefix-cache
#      hits                                                              -> fail: the setup
# so a dashboard can tell a broken kernel (1) from a broken setup (2, 3).
#
# --no-cache: the golden cache (.cache/golden) keeps the reference's results, so a second run
# starts only the candidate's server; but a cached reference was measured at another time, and
# the report then gives no speed word ("speed: not comparable"). Pass NO_CACHE=1 when the run
# must answer "is it faster?" (a release check, the PR's last run); leave it off while iterating
# on the text. A CI machine without a persistent .cache gets no cache anyway.
set -uo pipefail
cd "$(dirname "$0")/../.."

SCENARIO=${SCENARIO:-scenarios/lowconc.yaml}
RUN_ID=${RUN_ID:-ci-$(date +%Y%m%d-%H%M%S)}
args=("$SCENARIO" --run-id "$RUN_ID")
[ -n "${MODEL:-}" ] && args+=(--set "model.name=$MODEL")
[ -n "${TP:-}" ] && args+=(--set "model.tensor_parallel_size=$TP")
[ "${NO_CACHE:-0}" = 1 ] && args+=(--no-cache)

make venv || exit 2
.venv/bin/python -m rig.run "${args[@]}"
status=$?
case $status in
  0) echo "rig: PASS" ;;
  1) echo "rig: FAIL: the candidate is not equivalent (or a gate on it failed)" ;;
  2) echo "rig: ERROR: the run could not be made; see the log above" ;;
  3) echo "rig: INVALID: the comparison cannot vouch for the kernel; see the gates" ;;
esac
echo "rig: report in results/$RUN_ID/ (summary.md for a comment, report.html to attach)"
exit "$status"
