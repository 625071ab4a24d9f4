#!/usr/bin/env bash
# Issue #7's evidence: the three framework examples under trainprof on a GPU, each plain and with
# the trainprof catalog's fixes (--fixed), so the closing note can list every sync finding and
# say whether the catalog's fix removed it.
#
#   bash benchmarks/stacks_on_gpu.sh OUT [example options, e.g. --steps 10]
#
# Writes into OUT (7 files, each under 16 MB):
#   stacks_reports.tar.gz          per run: summary*.json, report*.md, the example's stdout
#   <stack>_<plain|fixed>.pt.trace.json.gz   one trace per run (6)
# Runs on a CPU too (tiny GPT-2, seconds per run), which is how it is tested.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/stacks_on_gpu.sh OUT [example options]}
shift
PY=${PYTHON:-python}
MAX_BYTES=$((15 * 1024 * 1024))
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$WORK/pack"
status=0
for stack in hf_trainer lightning_gpt2 accelerate_loop; do
    for variant in plain fixed; do
        name=${stack}_${variant}
        flags=()
        [ "$variant" = fixed ] && flags=(--fixed)
        echo "=== $name"
        if ! "$PY" "examples/$stack.py" "${flags[@]}" --log-dir "$WORK/log" --run-name "$name" "$@" \
            > "$WORK/$name.out" 2>&1; then
            echo "$name FAILED"
            status=1
        fi
        # The example's own printout: verdict and each sync (cause, via, where, per step, fix).
        sed -n '/trainprof run folder:/,$p' "$WORK/$name.out"
        mkdir -p "$WORK/pack/$name"
        cp "$WORK/$name.out" "$WORK/pack/$name/stdout.txt"
        cp "$WORK/log/$name"/summary*.json "$WORK/log/$name"/report*.md "$WORK/pack/$name/" 2>/dev/null \
            || { echo "$name: no summary/report written"; status=1; }
        trace=$(ls "$WORK/log/$name"/*.pt.trace.json.gz 2>/dev/null | head -n 1)
        if [ -z "$trace" ]; then
            echo "$name: no trace written"
            status=1
        elif [ "$(stat -c %s "$trace")" -gt "$MAX_BYTES" ]; then
            echo "$name: trace is $(stat -c %s "$trace") bytes, over 15 MB: not copied"
        else
            cp "$trace" "$OUT/$name.pt.trace.json.gz"
        fi
    done
done
tar czf "$OUT/stacks_reports.tar.gz" -C "$WORK/pack" .
ls -l "$OUT"
exit $status
