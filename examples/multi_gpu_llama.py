"""DDP and FSDP2 on a ~1B Llama over NCCL, each plain, with a planted straggler and with a planted
no-overlap setting, under trainprof: the multi-GPU check of trainprof's distributed analysis.

    torchrun --nproc_per_node=2 examples/multi_gpu_llama.py --out results/multi_gpu   # two GPUs
    torchrun --nproc_per_node=2 examples/multi_gpu_llama.py --out /tmp/mg --tiny      # CPU, gloo

Twelve cases run one after the other in one process group, each in its own session and run folder
(`OUT/<mode>-<case>/`: every rank's trace and report, and rank 0's cross-rank report):

    ddp-plain          DistributedDataParallel, 25 MB buckets, gradient_as_bucket_view
    ddp-straggler      the same; the last rank sleeps --straggler-ms before each step
    ddp-no-overlap     one bucket (bucket_cap_mb=100000): its all-reduce starts after backward
    fsdp2-plain        fully_shard per decoder layer and at the root, bf16 parameters, fp32 reduce
    fsdp2-straggler    the same; the last rank sleeps --straggler-ms before each step
    fsdp2-no-overlap   fully_shard at the root only: all parameters gathered before the first layer
    fsdp2-coarse       fully_shard per 4 decoder layers (fewer, larger units: less hook and DTensor host
                       time per step, larger all-gathers)
    fsdp2-keep-gathered  per layer, reshard_after_forward=False: no all-gather in backward, more memory
    ddp-accumulate     two micro-batches of half the batch per step, gradients all-reduced after each
    ddp-accumulate-nosync  the same, the first micro-batch inside `model.no_sync()` (the fix)
    ddp-uneven         the last rank's sequences 1.5x as long: more work on one rank (a real straggler)
    ddp-comm           one sequence of 256 tokens per rank: little compute for 1.1B parameters' gradients

What trainprof should say: no straggler and mostly hidden communication in the plain cases; the
last rank named the straggler (host-bound, in `time.sleep`) with the others waiting in collectives;
exposed communication with DDP's `bucket_cap_mb` and FSDP's per-layer wrapping in the fixes.
Rank 0 writes `OUT/results.json`: per case the unprofiled step time (ms, median of --steps steps
timed before the session), the verdict, communication and exposed communication per step, the
straggler, the findings and the cross-rank report's path.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import trainprof

CASES = ("ddp-plain", "ddp-straggler", "ddp-no-overlap", "fsdp2-plain", "fsdp2-straggler", "fsdp2-no-overlap",
         "fsdp2-coarse", "fsdp2-keep-gathered", "ddp-accumulate", "ddp-accumulate-nosync", "ddp-uneven",
         "ddp-comm")
UNEVEN = 1.5
"""`ddp-uneven`: the last rank's sequences are this many times the others' (more work per step)."""
COARSE_LAYERS = 4
"""Decoder layers per FSDP2 unit in `fsdp2-coarse`."""
SCHEDULE = {"wait": 2, "warmup": 2, "active": 3}
UNPROFILED = 6
"""Steps after the window, which the session times un-profiled (with the first forward of each)."""
# TinyLlama-1.1B's shape (hidden 2048, 22 layers, grouped-query attention with 4 KV heads): 1.1B params.
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
            "max_position_embeddings": 2048}
LLAMA_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the results folder")
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama (CPU, gloo) to try the script")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--steps", type=int, default=5, help="unprofiled steps timed before each session")
    parser.add_argument("--batch", type=int, default=None, help="sequences per rank (default 4; tiny 2)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens a sequence (default 2048; tiny 64)")
    parser.add_argument("--straggler-ms", type=float, default=150.0)
    return parser.parse_args()


def _model(tiny: bool, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**(LLAMA_TINY if tiny else LLAMA_1B))
    torch.manual_seed(0)
    with device:  # initialised where it runs: 1.1B parameters initialised on a CPU take seconds
        return LlamaForCausalLM(config)


def _wrap(case: str, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    if case.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel

        bucket_mb = 100_000 if case.endswith("no-overlap") else 25
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if device.type == "cuda" else MixedPrecisionPolicy()
    reshard = not case.endswith("keep-gathered")
    layers = list(model.model.layers)
    if case.endswith("coarse"):  # one unit per COARSE_LAYERS layers: fewer, larger units
        for first in range(0, len(layers), COARSE_LAYERS):
            unit = layers[first : first + COARSE_LAYERS]
            fully_shard(unit, mp_policy=policy, reshard_after_forward=reshard)
    elif not case.endswith("no-overlap"):
        for layer in layers:
            fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
    return model


def _run_case(case: str, args: argparse.Namespace, device: torch.device, out: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = device.type == "cuda"
    model = _wrap(case, _model(args.tiny, device), device)
    # fused AdamW for DDP's plain tensors; FSDP2's sharded DTensor parameters take the foreach one
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda and case.startswith("ddp"))
    batch = args.batch or (2 if args.tiny else 4)
    seq_len = args.seq_len or (64 if args.tiny else 2048)
    if case == "ddp-comm":
        batch, seq_len = 1, min(seq_len, 256)
    if case == "ddp-uneven" and rank == world - 1:
        seq_len = int(seq_len * UNEVEN)  # PLANT: more tokens on one rank
    micro_batches = 2 if case.startswith("ddp-accumulate") else 1
    vocab = (LLAMA_TINY if args.tiny else LLAMA_1B)["vocab_size"]
    generator = torch.Generator().manual_seed(rank)
    tokens = [torch.randint(0, vocab, (batch, seq_len), generator=generator).to(device) for _ in range(4)]
    straggler = case.endswith("straggler") and rank == world - 1

    def step(i: int) -> None:
        if straggler:
            time.sleep(args.straggler_ms / 1e3)  # PLANT: a slow input pipeline on one rank
        ids = tokens[i % len(tokens)]
        for micro, part in enumerate(ids.chunk(micro_batches)):
            # PLANT (ddp-accumulate): every micro-batch all-reduces; the fix skips all but the last
            skip = case.endswith("nosync") and micro < micro_batches - 1
            with model.no_sync() if skip else contextlib.nullcontext(), torch.autocast(
                    device.type, dtype=torch.bfloat16, enabled=cuda and case.startswith("ddp")):
                loss = model(input_ids=part, labels=part).loss / micro_batches
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for i in range(args.steps + 1):  # the first step warms up (allocations, NCCL communicators)
        _sync(device)
        start = time.perf_counter()
        step(i)
        _sync(device)
        if i:
            times.append(1e3 * (time.perf_counter() - start))
    # the window, then UNPROFILED steps the session times without the profiler
    recorded = sum(SCHEDULE.values()) + UNPROFILED
    with trainprof.session(log_dir=out, run_name=case, profile_memory=False, console=rank == 0,
                           gather_timeout_s=300, **SCHEDULE) as session:
        for i in range(recorded):
            step(i)
    return _result(case, session, statistics.median(times))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _result(case: str, session: trainprof.Session, unprofiled_ms: float) -> dict:
    summary = session.summary
    cross = session.cross_rank
    return {
        "case": case,
        "unprofiled_step_ms": round(unprofiled_ms, 2),
        "verdict": summary.verdict,
        "verdict_caveat": summary.verdict_caveat,
        "verdict_by_trace": summary.verdict_by_trace,
        "session_unprofiled_step_ms": summary.unprofiled_step_ms,
        "profiled_step_ms": summary.mean_step_ms,
        "comm_ms_per_step": summary.comm_ms_per_step,
        "comm_exposed_ms_per_step": summary.comm_exposed_ms_per_step,
        "comm_hidden_pct": summary.comm_hidden_pct,
        "straggler_rank": cross.straggler_rank if cross is not None else None,
        "step_skew_ms": cross.step_skew_ms if cross is not None else None,
        "ranks": [row.to_dict() for row in cross.ranks] if cross is not None else [],
        "findings": [{"kind": f.kind, "severity": f.severity, "rank": f.rank, "title": f.title, "fix": f.fix,
                      "gpu_ms_per_step": f.gpu_ms_per_step,
                      "predicted_step_ms": getattr(f.details, "predicted_step_ms", None)}
                     for f in session.findings if f.kind not in ("top_kernels", "module_costs")],
        "cross_rank_report": str(session.written.get("ranks_report", "")),
    }


def main() -> None:
    args = _arguments()
    cuda = torch.cuda.is_available() and not args.tiny
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    out = Path(args.out)
    results = []
    for case in args.cases.split(","):
        if case not in CASES:
            raise SystemExit(f"unknown case {case!r}; known: {', '.join(CASES)}")
        results.append(_run_case(case, args, device, out))
        gc.collect()  # the case's model and optimizer, before the next one's
        if cuda:
            torch.cuda.empty_cache()
        if dist.get_rank() == 0:  # after each case: a later failure keeps the earlier results
            meta = {"device": torch.cuda.get_device_name(device) if cuda else "cpu",
                    "world_size": dist.get_world_size(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d %H:%M %Z")}
            (out / "results.json").write_text(json.dumps({**meta, "cases": results}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
