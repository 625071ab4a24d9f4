#!/usr/bin/env bash
# Issue #7's evidence: the three framework examples under trainprof on a GPU, each plain and with
# the trainprof catalog's fixes (--fixed), so the closing note can list every sync finding and
# say whether the catalog's fix removed it.
#
#   bash benchmarks/stacks_on_gpu.sh OUT [example options, e.g. --steps 10]
#
# Writes into OUT (7 files, each under 16 MB):
#   stacks_reports.tar.gz          versions.txt; per run: summary*.json, report*.md, the example's stdout
#   <stack>_<plain|fixed>.pt.trace.json.gz   one trace per run (6)
# Runs on a CPU too (tiny GPT-2, seconds per run), which is how it is tested.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/stacks_on_gpu.sh OUT [example options]}
shift
PY=${PYTHON:-python3}
MAX_BYTES=$((15 * 1024 * 1024))
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/pack"
# As benchmarks/run_on_gpu.sh: trainprof from this checkout, wheels in .whl/ (e.g. msgspec) first.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/trainprof-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/trainprof-site"
fi
"$PY" - > "$WORK/pack/versions.txt" 2>&1 <<'PYTHON'
import importlib
import torch
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
for name in ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning"):
    try:
        print(name, importlib.import_module(name).__version__)
    except ImportError:
        pass
PYTHON
cat "$WORK/pack/versions.txt"
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
