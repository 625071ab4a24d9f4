"""Real GPU training traces shipped with trainprof, for `trainprof demo` on a machine without a GPU.

`h200_llama/`: one `trainprof.session` window (warm-up 1, active 2; stacks, shapes and memory on) of
a 4-layer Llama-1B-shaped model (hidden 2048, vocabulary 32,000), bf16, batch 4 x 2048 tokens,
AdamW, recorded by this project on an NVIDIA H200 (torch 2.11.0+cu130, transformers 5.17),
2026-11-25 (`python -m benchmarks.busy_scenarios`, scenario `llama_swap`, variant `bare`; the same
run as `tests/fixtures/busy/llama_swap/bare`). Its step took 42.7 ms without the profiler.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

H200_LLAMA = "h200_llama"
"""The sample of a GPU training run (module docstring)."""
H200_LLAMA_TITLE = "a 4-layer Llama-1B-shaped model training in bf16 on an NVIDIA H200"


def sample_path(name: str = H200_LLAMA) -> Path:
    """The folder of a shipped sample run (a trace and its sync sites), ready for `analyze`."""
    path = Path(str(resources.files("trainprof.samples").joinpath(name)))
    if not path.is_dir():
        raise FileNotFoundError(f"trainprof sample {name!r} is not installed (expected {path})")
    return path
