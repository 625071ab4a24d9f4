#!/usr/bin/env bash
# Round two of the GPU-busy rules on a GPU, in one call of under 5 minutes:
#   OUT=/tmp/busy-round-two bash benchmarks/busy_round_two_on_gpu.sh
# Records each habit of `benchmarks.busy_round_two` and its fix (a trainprof.session window each, the
# steps timed without the profiler), analyses every run and writes, under $OUT: results.json (per
# habit: the rule, predicted and measured gain, whether the finding is gone after the fix; per
# variant: median step, verdict, findings), traces.tar.gz (the run folders, at most 15 MiB),
# device.txt and log.txt (the habits' output). DEADLINE_S (220) bounds the habits' processes; the
# analysis and the archive follow.
set -uo pipefail
out=${OUT:-/tmp/busy-round-two}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRAINPROF_CACHE_DIR=${TRAINPROF_CACHE_DIR:-/tmp/busy-round-two-cache}  # peaks measured once
if compgen -G ".whl/*.whl" >/dev/null; then  # wheels the image lacks (msgspec, isal), when carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/trainprof-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/trainprof-site"
fi
python3 setup.py build_ext --inplace -q >/dev/null 2>&1 || echo "no C scanner built: traces load through msgspec"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, triton, transformers, msgspec; print('torch', torch.__version__, 'triton', \
triton.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$out/device.txt"
timeout 265 python3 -m benchmarks.busy_round_two --out "$out" --deadline-s "${DEADLINE_S:-220}"
echo "rc=$? results: $out/results.json, traces: $out/traces.tar.gz"
