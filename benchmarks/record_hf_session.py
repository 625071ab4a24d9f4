"""Record a Hugging Face `Trainer` run under `TrainprofCallback`, for the tests. Run on a GPU.

    python -m benchmarks.record_hf_session OUT_DIR

GPT-2 124M (random weights, vocabulary 50,257), bf16, batch 8 x 1024 tokens, 30 optimizer steps,
logging every 10, a pinned DataLoader; the callback's session records steps 2-3 (wait 1, warm-up 1,
active 2; shapes, memory, stack) and times the 26 steps after its window. OUT_DIR/log/hf/ is the
session's run folder (`tests/fixtures/stacks/hf_trainer_session` keeps its trace, sync sites and
peaks); the recorded and un-profiled steps, the verdict and the top findings are printed.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from trainprof.integrations.hf import TrainprofCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=1024))
    tokens = torch.Generator().manual_seed(0)
    data = []
    for _ in range(8 * 30):
        ids = torch.randint(0, 50257, (1024,), generator=tokens)
        data.append({"input_ids": ids, "labels": ids.clone()})
    training = TrainingArguments(
        output_dir=f"{args.out}/hf", per_device_train_batch_size=8, max_steps=30, bf16=True,
        logging_steps=10, report_to=[], save_strategy="no", dataloader_pin_memory=True,
    )
    callback = TrainprofCallback(log_dir=f"{args.out}/log", run_name="hf", wait=1, warmup=1, active=2,
                                 console=False)
    Trainer(model=model, args=training, train_dataset=data, callbacks=[callback]).train()
    session = callback.session
    summary = session.summary
    print("un-profiled steps", session.unprofiled_timing, [round(ms, 2) for ms in session.unprofiled_step_ms])
    print("verdict", summary.verdict, "recorded", summary.mean_step_ms)
    print("un-profiled", summary.unprofiled_step_ms)
    if session.analysis is not None:
        print("why", session.analysis.traces[0].verdict.why)
        for finding in session.analysis.findings[:6]:
            print(" ", finding.severity, finding.kind, finding.gpu_ms_per_step, finding.title[:160])
    return 0


if __name__ == "__main__":
    sys.exit(main())
