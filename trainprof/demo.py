"""The demo behind `trainprof demo` / `make demo`: a small GPT-2-shaped model, trained for a few
steps under a session, with three habits common in real loops that the report should point at;
and, on a machine without a GPU, the report of a real GPU run shipped with trainprof
(`trainprof.samples`), so that what a newcomer sees first is a GPU's report, not `cpu-only`.

This file's loop counts as user code for sync capture (see trainprof.capture.syncs).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainprof.session import Session, session

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.result import Analysis

SAMPLE_FOLDER = "h200-llama-sample"
"""Where, under the demo's log folder, the shipped GPU run's report.html goes."""


class DemoUnavailable(RuntimeError):
    """The demo cannot run here (no CUDA for `--device cuda`, or the `hf` extra missing); one line."""


def demo_device(device: str | None = None) -> str:
    """The device the demo trains on (`device`, else cuda when there is a GPU, else cpu).

    Raises `DemoUnavailable` when `device="cuda"` has no GPU or transformers is not installed.
    """
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise DemoUnavailable("--device cuda: this torch sees no CUDA GPU (a CPU build, or no driver); "
                              "use --device cpu")
    try:
        import transformers  # noqa: F401 (the demo's model)
    except ImportError as exc:
        raise DemoUnavailable(f"the demo needs transformers ({exc}): pip install 'trainprof[hf]'") from None
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def run_demo(
    steps: int = 8, log_dir: str = "log", device: str | None = None, console: bool = True
) -> Session:
    """Train for `steps` steps (profiled: wait 1, warmup 1, active 3) and return the finished session
    (`console`: print the report; the files are written either way).

    Raises `DemoUnavailable` as `demo_device` does.
    """
    import torch

    device = demo_device(device)
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()  # config notes about unused tokens are not the point

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=128,
                        bos_token_id=0, eos_token_id=0)
    # Small enough for 2 CPU cores (~0.15 s a step); on a GPU the habits below dominate the step.
    batch_size, seq_len = (8, 128) if device == "cuda" else (4, 64)
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    losses = []
    with session(log_dir=log_dir, wait=1, warmup=1, active=3, console=console) as sess:  # a fresh run-...
        for _ in range(steps):
            batch = torch.randint(0, config.vocab_size, (batch_size, seq_len))
            ids = batch.to(device)  # habit: a pageable host-to-device copy (blocks the CPU on a GPU)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if grad_norm.item() > 100.0:  # habit: a sync to look at the gradient norm
                continue
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())  # habit: a sync each step, for logging
    return sess


def gpu_sample_report(log_dir: str = "log") -> tuple[Analysis, Path]:
    """Analyse the shipped H200 run (`trainprof.samples`) and write its report.html under `log_dir`
    (`SAMPLE_FOLDER/report.html`, where `tensorboard --logdir log` lists it too); returns the
    analysis and the file written."""
    from trainprof.analysis import analyze
    from trainprof.report.html import write_html
    from trainprof.samples import sample_path

    analysis = analyze(sample_path(), views=True)
    folder = Path(log_dir) / SAMPLE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return analysis, write_html(analysis, folder / "report.html")
