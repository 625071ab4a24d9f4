"""The device's own ceilings, measured once per device and torch version: a square matmul per math
dtype and a large device-to-device copy. The session writes them beside its traces
(`<worker>.peaks.json`), so that an analysis, live or offline, reads achieved TFLOP/s, TB/s and MFU
against what this GPU does rather than a datasheet (`trainprof.analysis.peaks`).

    {"version": 1, "device": "NVIDIA H200", "torch": "2.11.0+cu130", "date": "2026-11-25",
     "how": "an 8192^3 matmul per dtype, a 1024 MiB device-to-device copy (read + write)",
     "matmul_tflops": {"bf16": 803.6, "fp16": 773.8, "tf32": 400.9, "fp32": 50.7}, "copy_tb_s": 4.29}

Measured at most once per (device name, torch version) on a machine: the result is cached in
`$TRAINPROF_CACHE_DIR/peaks.json` (default `$XDG_CACHE_HOME/trainprof`, else `~/.cache/trainprof`).
About 0.3 s of GPU time on an H200, out of the training loop (the session measures after its
profiler stopped). Never fails the caller: without CUDA (a CPU build), with too little free memory,
or on any error, there is no measurement and the analysis falls back to its table.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger("trainprof")

CACHE_DIR_ENV = "TRAINPROF_CACHE_DIR"
FORMAT_VERSION = 1

MATMUL_SIZES = (8192, 4096)
"""Square matmul sizes tried, largest first: 8192 reaches the tensor cores' plateau (H200: 804
TFLOP/s in bf16); 4096 when free memory is short."""
COPY_BYTES = 1 << 30
"""Bytes copied device to device (far beyond any L2 cache), halved while free memory is short."""
TIMED_MS = 20.0
"""GPU time each measurement runs for (after one warm-up call): a few ms of noise are a few percent."""
_FREE_MEMORY_SHARE = 0.5
"""A measurement uses at most half of the free GPU memory: the user's model is still alive."""


def cache_path() -> Path:
    """Where measured peaks are cached (module docstring)."""
    root = os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "trainprof"
    )
    return Path(root) / "peaks.json"


def current_device_peaks() -> dict[str, Any] | None:
    """The current CUDA device's peaks (format: module docstring): from the cache, else measured now
    and cached. None without CUDA, or when the measurement could not run."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        device = torch.cuda.get_device_name()
        key = f"{device} | torch {torch.__version__}"
        cache = _read_cache()
        found = cache.get(key)
        if isinstance(found, dict) and found.get("version") == FORMAT_VERSION:
            return found
        with warnings.catch_warnings():  # torch's notes on its TF32 settings are not the user's business
            warnings.simplefilter("ignore")
            measured = measure(torch)
        if measured is None:
            return None
        cache[key] = measured
        _write_json(cache_path(), cache)
        return measured
    except Exception as error:  # the peaks only refine a report: never fail the run over them
        logger.info("trainprof: device peaks not measured (%s: %s)", type(error).__name__, error)
        return None


def write_beside(run_dir: Path, worker: str, peaks: dict[str, Any]) -> Path | None:
    """Write `<run_dir>/<worker>.peaks.json`; None (logged) when it cannot be written."""
    from trainprof.files import PEAKS_SUFFIX

    path = Path(run_dir) / f"{worker}{PEAKS_SUFFIX}"
    try:
        _write_json(path, peaks)
    except OSError as error:
        logger.info("trainprof: %s not written (%s)", path, error)
        return None
    return path


def measure(torch: Any) -> dict[str, Any] | None:
    """Measure the current CUDA device: a matmul per math dtype it has, and a copy. None when even
    the smallest size does not fit in the free memory."""
    free, _ = torch.cuda.mem_get_info()
    budget = free * _FREE_MEMORY_SHARE
    size = next((n for n in MATMUL_SIZES if 3 * n * n * 4 <= budget), None)
    copy_bytes = COPY_BYTES
    while copy_bytes > (64 << 20) and 2 * copy_bytes > budget:
        copy_bytes //= 2
    if size is None or 2 * copy_bytes > budget:
        return None
    major, _ = torch.cuda.get_device_capability()
    dtypes = {"fp16": torch.float16, "fp32": torch.float32}
    if torch.cuda.is_bf16_supported():
        dtypes["bf16"] = torch.bfloat16
    if major >= 8:  # TF32 tensor cores: Ampere and later
        dtypes["tf32"] = torch.float32
    tflops = {}
    precision = torch.get_float32_matmul_precision()
    try:
        for label, dtype in dtypes.items():
            # "highest": fp32 matmuls stay fp32; "high": they may run TF32.
            torch.set_float32_matmul_precision("high" if label == "tf32" else "highest")
            tflops[label] = round(_matmul_tflops(torch, dtype, size), 1)
    finally:
        torch.set_float32_matmul_precision(precision)
    return {
        "version": FORMAT_VERSION,
        "device": torch.cuda.get_device_name(),
        "torch": str(torch.__version__),
        "date": time.strftime("%Y-%m-%d"),
        "how": f"an {size}^3 matmul per dtype, a {copy_bytes >> 20} MiB device-to-device copy (read + write)",
        "matmul_tflops": dict(sorted(tflops.items())),
        "copy_tb_s": round(_copy_tb_s(torch, copy_bytes), 3),
    }


def _matmul_tflops(torch: Any, dtype: Any, n: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    seconds = _seconds_per_call(torch, lambda: torch.mm(a, b))
    return 2.0 * n**3 / seconds / 1e12


def _copy_tb_s(torch: Any, nbytes: int) -> float:
    source = torch.empty(nbytes, device="cuda", dtype=torch.uint8).fill_(1)
    target = torch.empty_like(source)
    seconds = _seconds_per_call(torch, lambda: target.copy_(source))
    return 2.0 * nbytes / seconds / 1e12  # read + written


def _seconds_per_call(torch: Any, call) -> float:
    """GPU seconds per call: one warm-up, one timed call to size the run, then `TIMED_MS` of calls
    queued back to back between two CUDA events."""
    call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    once_ms = max(start.elapsed_time(end), 1e-3)
    calls = max(2, math.ceil(TIMED_MS / once_ms))
    start.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def _read_cache() -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        document = json.loads(cache_path().read_text(encoding="utf-8"))
        if isinstance(document, dict):
            return document
    return {}


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """Write atomically (`trainprof.files.write_atomically`): a full disk leaves no half-written file."""
    from trainprof.files import write_text_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(document, indent=1))
