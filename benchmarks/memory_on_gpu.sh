#!/usr/bin/env bash
# Issue 36's device evidence (out-of-memory errors explained, the headroom's largest batch run,
# fragmentation with and without expandable segments), each part in its own process:
#
#   bash benchmarks/memory_on_gpu.sh [OUT]        # OUT defaults to $OUT; ~3-4 minutes on an H200
#
# Writes into OUT (7 files, each well under 16 MiB; what each field means: benchmarks/memory_checks.py):
#   oom_issue.json  oom_long_sequence.json  fragmentation_default.json  fragmentation_expandable.json
#   headroom.json   summary.json (every part's checks in one place; `all_passed`)   memory_checks.log
# A part that fails or runs past its limit still leaves its JSON (written after every stage).
set -uo pipefail
OUT=${1:-${OUT:?usage: bash benchmarks/memory_on_gpu.sh OUT (or set OUT)}}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
LOG_DIR=$(mktemp -d /tmp/trainprof-memory-checks.XXXXXX)  # the runs' traces stay here, not in OUT
trap 'rm -rf "$LOG_DIR"' EXIT
# As benchmarks/run_on_gpu.sh: trainprof from this checkout, wheels in .whl/ (e.g. msgspec) first.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/trainprof-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/trainprof-site"
fi
# The loader's C scanner (it reads the [memory] events' reserved totals); msgspec reads them without it.
"$PY" setup.py build_ext --inplace -q >/dev/null 2>&1 || echo "C scanner not built: msgspec reads the traces"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } \
    >> "$OUT/memory_checks.log" 2>&1

# run NAME LIMIT_S ALLOC_CONF PART: one part in a fresh process; ALLOC_CONF '-' runs it unset.
run() {
    local name=$1 limit=$2 conf=$3 part=$4 status
    echo "== $name (at most ${limit}s)" | tee -a "$OUT/memory_checks.log"
    if [ "$conf" = "-" ]; then
        env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF timeout -k 5 "$limit" \
            "$PY" -m benchmarks.memory_checks --part "$part" --out "$OUT/$name.json" --log-dir "$LOG_DIR" \
            >> "$OUT/memory_checks.log" 2>&1
    else
        env -u PYTORCH_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF="$conf" timeout -k 5 "$limit" \
            "$PY" -m benchmarks.memory_checks --part "$part" --out "$OUT/$name.json" --log-dir "$LOG_DIR" \
            >> "$OUT/memory_checks.log" 2>&1
    fi
    status=$?
    rm -f "$OUT/$name.json.tmp"
    echo "$name: exit $status" | tee -a "$OUT/memory_checks.log"
}

run oom_issue 55 - oom_issue
run oom_long_sequence 40 - oom_long_sequence
run fragmentation_default 30 - fragmentation
run fragmentation_expandable 30 expandable_segments:True fragmentation
run headroom 70 - headroom
"$PY" -m benchmarks.memory_checks --summarise "$OUT" | tee -a "$OUT/memory_checks.log"
# The log is for reading after a failure: keep its last 8 MiB.
tail -c 8388608 "$OUT/memory_checks.log" > "$OUT/memory_checks.log.cut" && mv "$OUT/memory_checks.log.cut" "$OUT/memory_checks.log"
