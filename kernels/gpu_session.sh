#!/usr/bin/env bash
# One H200 session for the Triton nsR: kernel gates on CUDA, the GPU kernel tests, the bench.
# From the repository root, with the fla-core wheel carried to .whl/:
#     bash kernels/gpu_session.sh
# BENCH_ARGS passes options to the bench, e.g. BENCH_ARGS="--variants default,walk-bv64".
# Logs and CSVs go to $OUT (else results/kernels/gpu-session/). Each step has its own time
# limit (8 minutes at most, about 4-5 expected); a failing step does not stop the next one.
set -uo pipefail

WHEEL=${FLA_WHEEL:-.whl/fla_core-0.6.0-py3-none-any.whl}
LOGS=${OUT:-results/kernels/gpu-session}
SITE=/tmp/rig-kernel-site
mkdir -p "$LOGS" "$SITE"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in /opt/torch/.venv/bin/python3 python3; do
        if "$candidate" -c "import torch, triton" 2>/dev/null; then PY=$candidate; break; fi
    done
fi
[ -n "$PY" ] || { echo "gpu_session: no python with torch and triton" >&2; exit 2; }

# fla-core is pure Python: unpack the wheel instead of installing it.
if [ -f "$WHEEL" ]; then
    "$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$WHEEL" "$SITE"
else
    echo "gpu_session: $WHEEL missing: FLA columns and FLA checks will be absent" >&2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# vLLM's own FLA copy, when an earlier command unpacked vLLM there (.whl/remote_install.sh).
if [ -d /tmp/vllm-site ]; then export PYTHONPATH="$PYTHONPATH:/tmp/vllm-site"; fi
# pydantic (the test suite's conftest imports rig): from carried wheels (.whl/pydantic*.whl and
# what it needs) or the carried dependency bundle, after the image's own packages on the path.
if ! "$PY" -c "import pydantic" 2>/dev/null; then
    if ls .whl/pydantic-*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl \
        .whl/typing_inspection-*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE-deps" \
            .whl/pydantic*.whl .whl/annotated_types*.whl .whl/typing_inspection*.whl
    elif [ -f .whl/deps-site-py312.tar.xz ]; then
        "$PY" - "$SITE-deps" <<'PYEOF'
import sys, tarfile
wanted = ("pydantic", "annotated_types", "typing_inspection", "typing_extensions")
with tarfile.open(".whl/deps-site-py312.tar.xz", "r:xz") as bundle:
    members = [m for m in bundle if m.name.removeprefix("./").startswith(wanted)]
    bundle.extractall(sys.argv[1], members=members)
PYEOF
    fi
    export PYTHONPATH="$PYTHONPATH:$SITE-deps"
fi

{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
        --format=csv
    "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    "$PY" -c "import fla; print('fla-core', fla.__version__)"
} 2>&1 | tee "$LOGS/environment.txt"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $LOGS/NAME.log
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local status=$?
    echo "== $name: exit $status in $((SECONDS - started)) s (log $LOGS/$name.log)"
    return $status
}

# STEPS picks some of them (e.g. STEPS="check pytest"); a lease's call lasts 10 minutes at most.
for name in ${STEPS:-bench check pytest}; do
    case $name in
        # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
        bench) step bench 270 "$PY" -m kernels.bench --csv "$LOGS/bench.csv" ${BENCH_ARGS:-} ;;
        check) step check 200 "$PY" -m kernels.check --device cuda --csv "$LOGS/check-cuda-ns4.csv" ;;
        pytest) step pytest 120 "$PY" -m pytest -m gpu tests/kernels -q -p no:cacheprovider ;;
        *) echo "gpu_session: unknown step $name" >&2 ;;
    esac
done

[ -f "$LOGS/check.log" ] && { echo "== check (tail)"; tail -n 6 "$LOGS/check.log"; }
[ -f "$LOGS/pytest.log" ] && { echo "== pytest (tail)"; tail -n 15 "$LOGS/pytest.log"; }
[ -f "$LOGS/bench.log" ] && { echo "== bench (summary)"; sed -n '/copy bandwidth/,$p' "$LOGS/bench.log"; }
