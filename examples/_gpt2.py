"""What the three framework examples share: the GPT-2 model, random token data, the command line,
and a printout of where trainprof's summary went and which syncs it found.

GPT-2 small (124M) on a GPU; a tiny GPT-2 with `--small` (the default without CUDA) so that each
example also runs on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}  # recorded: optimizer steps 2, 3 and 4
ACCUMULATION = 2


def parser(description: str) -> argparse.ArgumentParser:
    """The options every example takes."""
    cuda = torch.cuda.is_available()
    options = argparse.ArgumentParser(description=description)
    options.add_argument("--fixed", action="store_true", help="apply the trainprof catalog's fixes")
    options.add_argument("--steps", type=int, default=8, help="optimizer steps (default 8)")
    options.add_argument("--small", action="store_true", default=not cuda,
                         help="a tiny GPT-2 (default without CUDA) instead of GPT-2 small")
    options.add_argument("--batch-size", type=int, default=8 if cuda else 2, help="per micro-batch")
    options.add_argument("--seq-len", type=int, default=512 if cuda else 32)
    options.add_argument("--log-dir", default="log", help="trainprof's log folder (default log)")
    options.add_argument("--run-name", default=None, help="trainprof's run folder name")
    return options


def gpt2(small: bool):
    """GPT-2 small (12 layers, d=768, 124M parameters) from its config, or a tiny one; no download."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if small:
        config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=128,
                            bos_token_id=0, eos_token_id=0)
    else:
        config = GPT2Config()  # the GPT-2 small shape
    return GPT2LMHeadModel(config)


def token_samples(args: argparse.Namespace, vocab_size: int) -> list[dict[str, torch.Tensor]]:
    """Random sequences as {input_ids, labels} on the host (the DataLoader moves them): one
    `--batch-size` micro-batch per accumulation step of each of `--steps` optimizer steps."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(args.batch_size * ACCUMULATION * args.steps):
        ids = torch.randint(0, vocab_size, (args.seq_len,), generator=generator)
        samples.append({"input_ids": ids, "labels": ids.clone()})
    return samples


def print_outcome(stack: str, fixed: bool, sess) -> None:
    """Where the summary went, and each sync finding: cause, via, where, count per step, fix."""
    summaries = sorted(Path(sess.run_dir).glob("summary*.json"))
    print(f"\n[{stack}{' --fixed' if fixed else ''}] trainprof run folder: {sess.run_dir}")
    if not summaries:
        print(f"[{stack}] no summary was written (verdict: {sess.summary.verdict})")
        return
    print(f"[{stack}] summary: {summaries[0]}")
    findings = json.loads(summaries[0].read_text()).get("findings", [])
    syncs = [f for f in findings if f.get("kind") == "sync_point"]
    print(f"[{stack}] verdict: {sess.summary.verdict}; sync findings: {len(syncs)}")
    for finding in syncs:
        print(f"  - {finding.get('per_step')}/step  cause={finding.get('cause')}  op={finding.get('op')}\n"
              f"    via={_frame(finding.get('via'))}\n    where={_frame(finding.get('where'))}\n"
              f"    fix={str(finding.get('fix'))[:200]}")
    print(f"TRAINPROF_RUN_DIR={sess.run_dir}")  # read by benchmarks/stacks_on_gpu.sh


def _frame(frame) -> str:
    if not frame:
        return "-"
    where = f"{frame.get('file')}:{frame.get('line')} {frame.get('function')}"
    library = " ".join(str(part) for part in (frame.get("library"), frame.get("version")) if part)
    return f"{where} [{library}]" if library else where
