#!/usr/bin/env bash
# The GPU evidence of the multi-GPU issue that one GPU can give (and, with 2 or 4 GPUs, all of it):
#   bash benchmarks/rank_checks_on_gpu.sh OUT_DIR
# 1. benchmarks.profiler_event_cost: the profiler's added host time per recorded op / Python call;
# 2. examples/multi_gpu_llama.py on every GPU of the machine (torchrun, one process a GPU): DDP and
#    FSDP2 cases, results.json and the FSDP2 cases' traces (tarred, no reports);
# 3. tests/gpu/test_arrival_gpu.py: the un-profiled first-forward marks as the GPU ran them.
set -uo pipefail
out=${1:?usage: rank_checks_on_gpu.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off (KINDS.md: a program using it can take the host's GPUs out of service)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/trainprof-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/trainprof-site"
fi
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
echo "gpus $gpus; $(date -u)" | tee -a "$out/device.txt"
[ -n "${SKIP_EVENT_COST:-}" ] || timeout 120 python3 -m benchmarks.profiler_event_cost \
  --out "$out/profiler_event_cost.h200.json" > /dev/null || echo "profiler_event_cost failed" | tee -a "$out/device.txt"
timeout "${EXAMPLE_S:-420}" torchrun --nproc_per_node="$gpus" examples/multi_gpu_llama.py --out /tmp/mg \
  --cases "${CASES:-ddp-plain,fsdp2-plain,fsdp2-coarse,fsdp2-keep-gathered,fsdp2-no-overlap}" \
  > "$out/multi_gpu_llama.log" 2>&1 || echo "multi_gpu_llama exit $?" | tee -a "$out/device.txt"
cp /tmp/mg/results.json "$out/multi_gpu_llama.$gpus-gpu.json" 2>/dev/null
[ -z "${RESHARD:-}" ] || timeout 150 torchrun --nproc_per_node="$gpus" -m benchmarks.fsdp2_reshard \
  --out "$out/fsdp2_reshard.$gpus-gpu.json" > /dev/null 2>&1 || echo "fsdp2_reshard failed" | tee -a "$out/device.txt"
# each kept case's traces and sidecars (no reports; KEEP: all by default), one tar a case, under 15 MiB
for case in /tmp/mg/*/; do
  name=$(basename "$case")
  [ -z "${KEEP:-}" ] || [[ " $KEEP " == *" $name "* ]] || continue
  tar cf "$out/$name.tar" -C /tmp/mg --exclude='*.html' --exclude='*.md' --exclude='*.json.gz.tmp' "$name"
  [ "$(stat -c %s "$out/$name.tar")" -lt 15728640 ] || { echo "$name.tar too large, dropped" >> "$out/device.txt"; rm "$out/$name.tar"; }
done
tail -n 40 "$out/multi_gpu_llama.log" >> "$out/device.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_arrival_gpu.py 2>&1 | tail -n 15 \
  >> "$out/device.txt"
rm -f "$out/multi_gpu_llama.log"
ls -la "$out"
