#!/usr/bin/env bash
# Everything that needs a GPU, in one go (how the figures in BENCHMARKS.md were taken):
#   bash benchmarks/run_on_gpu.sh OUT_DIR [checks] [overhead] [fused_layers] [sweep]
# checks:       tests/gpu, the planted-sync example (each sync's exact line), the demo on the GPU;
# overhead:     the session-overhead benchmark;
# fused_layers: python -m benchmarks.kernels (FUSED_OPS=layer_norm,rms_norm limits the ops);
# sweep:        python -m benchmarks.norm_backward_sweep (launch settings of the norm backward kernels);
# launch:       python -m benchmarks.kernels --launch (norm fwd+bwd: host vs GPU kernel time per call).
# Uses the python3 on PATH and whatever torch/triton/transformers it has; wheels in .whl/ (e.g.
# msgspec, liger-kernel) are installed into a scratch folder first when present.
set -uo pipefail
out=${1:?usage: run_on_gpu.sh OUT_DIR [checks] [fused_layers]}
shift
parts=${*:-checks overhead fused_layers}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/trainprof-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/trainprof-site"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/device.txt"
for part in $parts; do
  case $part in
    checks)
      python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -n 25 | tee "$out/gpu_tests.log"
      python3 examples/planted_syncs.py --out "$out/planted_syncs.json" --log-dir /tmp/trainprof-log \
        2>&1 | tee "$out/planted_syncs.log"
      python3 -m trainprof demo --log-dir /tmp/trainprof-log 2>&1 | tail -n 40 | tee "$out/demo.log"
      ;;
    overhead)
      python3 -m benchmarks.session_overhead --out "$out" 2>&1 | tail -n 30 | tee "$out/session_overhead.log"
      ;;
    fused_layers)
      python3 -m benchmarks.kernels --out "$out/fused_layers" ${FUSED_OPS:+--ops "$FUSED_OPS"} \
        2>&1 | tail -n 70 | tee "$out/fused_layers.log"
      ;;
    launch)
      python3 -m benchmarks.kernels --launch --out "$out/norm_launch" 2>&1 | tail -n 20 \
        | tee "$out/norm_launch.log"
      ;;
    sweep)
      python3 -m benchmarks.norm_backward_sweep --out "$out/norm_backward_sweep.json" 2>&1 | tail -n 20 \
        | tee "$out/norm_backward_sweep.log"
      ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
