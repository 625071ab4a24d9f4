"""Does `reshard_after_forward=False` win what trainprof's `fsdp_host` finding predicts? (GPU.)

    torchrun --nproc_per_node=N -m benchmarks.fsdp2_reshard --out FILE.json [--rounds 3]

A Llama 1.1B (TinyLlama's shape, as examples/multi_gpu_llama.py), FSDP2 per decoder layer and at the
root, bf16 parameters and fp32 reduction, built twice: `reshard_after_forward=True` (FSDP2's default)
and `False`. First one `trainprof.session` over the default (wait 1, warm-up 1, 2 recorded steps, 8
un-profiled ones): its `fsdp_host` finding's predicted gain. Then the two in turn, `--rounds` times,
each round `--steps` steps timed from one synchronize to the next after a warm-up step: the measured
gain is the median over rounds of (default - kept gathered) step medians, with each round's figure.
Peak memory of each, from the allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
            "max_position_embeddings": 2048}


def _model(reshard: bool, device: torch.device) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_1B))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
    return model


def _stepper(model: torch.nn.Module, device: torch.device, batch: int, seq_len: int):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, LLAMA_1B["vocab_size"], (batch, seq_len), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _timed(step, steps: int) -> list[float]:
    step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    import trainprof

    steps = {}
    peaks = {}
    for reshard in (True, False):  # each one's peak above what was allocated before it was built
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        steps[reshard] = _stepper(_model(reshard, device), device, args.batch, args.seq_len)
        _timed(steps[reshard], 2)
        peaks[reshard] = torch.cuda.max_memory_allocated(device) - before
    with tempfile.TemporaryDirectory() as scratch:
        with trainprof.session(log_dir=scratch, run_name="fsdp2", wait=1, warmup=1, active=2, console=False,
                               tensorboard_scalars=False, gather_timeout_s=120) as session:
            for _ in range(12):
                steps[True]()
        finding = next((f for f in session.findings if f.kind == "fsdp_host"), None)
    rounds = []
    for _ in range(args.rounds):
        default = statistics.median(_timed(steps[True], args.steps))
        kept = statistics.median(_timed(steps[False], args.steps))
        rounds.append({"default_ms": round(default, 2), "kept_gathered_ms": round(kept, 2),
                       "gain_ms": round(default - kept, 2)})
    if dist.get_rank() == 0:
        result = {
            "device": torch.cuda.get_device_name(device),
            "world_size": dist.get_world_size(),
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "batch": args.batch,
            "seq_len": args.seq_len,
            "predicted_gain_ms": finding.gpu_ms_per_step if finding is not None else None,
            "finding": None if finding is None else {
                "severity": finding.severity, "title": finding.title, "fix": finding.fix,
                "details": finding.details.to_dict(),
            },
            "verdict": session.summary.verdict,
            "unprofiled_step_ms": session.summary.unprofiled_step_ms,
            "measured_gain_ms": round(statistics.median(r["gain_ms"] for r in rounds), 2),
            "rounds": rounds,
            "peak_allocated_bytes": {"default": peaks[True], "kept_gathered": peaks[False]},
        }
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
