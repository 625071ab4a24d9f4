#!/usr/bin/env bash
# The fused loss, the compile choices and `trainprof ab` on a GPU, in two calls of under 10 minutes:
#   bash benchmarks/loss_and_compile_on_gpu.sh first    # CUDA build, GPU tests, compile choices +
#                                                       # Inductor's code, the fused linear
#                                                       # cross-entropy benchmark, ncu, numba
#   bash benchmarks/loss_and_compile_on_gpu.sh second   # trainprof ab on GPT-2 124M, Llama 1B (32k)
#                                                       # and Llama-3.2-1B's shape (128k, Liger's defaults)
# Results go to /tmp/loss-compile-<part>/ and, tarred after every step (a call stopped at its limit
# still returns what was done), to $OUT/<part>.tar.gz. Each step is bounded by its own limit and by the
# part's deadline. `second` reads the compile choices `first` measured from
# benchmarks/results/compile_choice_cache.h200.json when it is there (a fresh machine).
set -uo pipefail
part=${1:?usage: loss_and_compile_on_gpu.sh first|second}
out=${OUT:-/tmp/loss-compile-out}
work=/tmp/loss-compile-$part
mkdir -p "$work" "$out"
export PYTHONUNBUFFERED=1 FUSED_LAYERS_CACHE_DIR=$work/cache
mkdir -p "$FUSED_LAYERS_CACHE_DIR"
deadline=$(( $(date +%s) + ${DEADLINE_S:-560} ))

step() {  # step NAME LIMIT_S command...: bounded, logged, summarised, tarred
  local name=$1 limit=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  (( left < limit )) && limit=$left
  if (( limit < 10 )); then echo "$name: skipped (deadline)" | tee -a "$work/steps.txt"; return; fi
  local start=$(date +%s)
  timeout "$limit" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $(( $(date +%s) - start )) s (limit $limit)" | tee -a "$work/steps.txt"
  tail -n 25 "$work/$name.log"
  tar czf "$out/$part.tar.gz" -C /tmp "loss-compile-$part" 2>/dev/null
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$work/device.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$work/device.txt"

case $part in
  first)
    step build 150 python3 -c "from fused_layers.backends.cuda import build; build.load_extension(); print('built')"
    step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_fusedce_gpu.py \
      tests/gpu/test_linear_cross_entropy_gpu.py tests/gpu/test_swap_gpu.py
    step compile_choice 170 python3 -m benchmarks.compile_choice --out "$work/compile_choice"
    cp "$FUSED_LAYERS_CACHE_DIR/compile_choice.json" "$work/compile_choice_cache.json" 2>/dev/null
    step flce 140 python3 -m benchmarks.linear_cross_entropy --out "$work/flce" --repeats 15 \
      --contenders ours,ours_c1024,ours_s4096,liger,compile,ours_compiled
    step ncu_profile 60 python3 -m trainprof run --log-dir "$work/ncu_log" --run-name llama --quiet \
      examples/fused_llama_loop.py
    step ncu 120 python3 -m trainprof ncu --top 6 --launch-skip 30 --launch-count 18 --out "$work/ncu" \
      "$work/ncu_log/llama" -- python3 examples/fused_llama_loop.py
    step numba 60 python3 -m benchmarks.numba_gelu --out "$work/numba"
    cat "$work/compile_choice/compile_choice.md" "$work/flce/linear_cross_entropy.md" 2>/dev/null | tail -n 40
    ;;
  second)
    [ -f benchmarks/results/compile_choice_cache.h200.json ] && \
      cp benchmarks/results/compile_choice_cache.h200.json "$FUSED_LAYERS_CACHE_DIR/compile_choice.json"
    step build 150 python3 -c "from fused_layers.backends.cuda import build; build.load_extension(); print('built')"
    for model in llama-1b gpt2-124m llama-1b-32k; do
      step "ab_$model" 220 python3 -m benchmarks.ab_models --out "$work/ab" --models "$model" \
        --variants per-model --no-profile --timeout 215
    done
    cp "$FUSED_LAYERS_CACHE_DIR/compile_choice.json" "$work/compile_choice_cache.json" 2>/dev/null
    step numba 60 python3 -m benchmarks.numba_gelu --out "$work/numba"
    step numba_test 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_fusedce_gpu.py -k numba
    cat "$work"/ab/*.md 2>/dev/null | grep -E "^\| |fused_layers.swap|liger:" | head -n 60
    ;;
esac
cat "$work/steps.txt"
