"""Timing one function honestly: the seeds' ``time_pytorch_function``, done right.

The seed timed one call between two CUDA events after a few warm-up calls. One call is noise;
this module times many calls queued back to back (the GPU runs behind the host, as in training)
in several samples, and reports the median and the interquartile range of the samples:

    from trainprof import bench

    timing = bench.time_fn(lambda: torch.nn.functional.gelu(x), bytes_per_call=2 * x.nbytes,
                           copy_bytes_per_s=bench.measure_copy_bandwidth())
    timing.median_ms, timing.iqr_ms, timing.fraction_of_copy_bandwidth

- Clock: CUDA events on a CUDA device (GPU time of the queued calls); ``time.perf_counter`` of
  the host on a CPU, and ``Timing.clock`` says which (``"cuda-events"`` or ``"host"``).
- ``flush_l2=True`` overwrites a buffer larger than the L2 cache before every call and times each
  call on its own (what ``triton.testing.do_bench`` does). That measures a cold cache, but the GPU
  then waits for the host to launch every call: with several launches per call (autograd), that
  host gap is part of the figure. Use it for single-kernel calls on inputs smaller than L2.
- Throughput is a fraction of what the same device did in the same process
  (``measure_copy_bandwidth``, ``measure_matmul_peak``), never of a datasheet table.
- ``host_time`` measures the host's cost of launching a call (µs per call, no sync between
  calls), which the GPU figure hides when the GPU is the slower side; ``host_times`` measures
  several side by side, round by round, and ``paired_ratio`` compares two of them per round.

Every ``torch.cuda`` call is behind a device check: on a CPU build they raise.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

import torch

CLOCK_CUDA = "cuda-events"
CLOCK_HOST = "host"

# Bigger than any current GPU's L2 (H100 50 MB, H200 60 MB, B200 126 MB): overwriting it evicts
# the previous call's data.
L2_FLUSH_BYTES = 256 * 1024 * 1024

_T = TypeVar("_T")


@dataclass(frozen=True)
class Timing:
    """Per-call times of one function: the median and spread of ``samples_ms``, and throughput."""

    clock: str
    """``"cuda-events"`` (GPU time of queued calls) or ``"host"`` (``time.perf_counter``)."""
    device: str
    samples_ms: list[float]
    """Milliseconds per call, one value per sample (each the mean over ``calls_per_sample`` calls)."""
    calls_per_sample: int
    flushed_l2: bool
    median_ms: float
    q1_ms: float
    q3_ms: float
    iqr_ms: float
    min_ms: float
    bytes_per_call: float | None = None
    flops_per_call: float | None = None
    bytes_per_s: float | None = None
    flops_per_s: float | None = None
    fraction_of_copy_bandwidth: float | None = None
    """``bytes_per_s`` over ``measure_copy_bandwidth()`` of the same device, when both are given."""
    fraction_of_matmul_peak: float | None = None
    """``flops_per_s`` over ``measure_matmul_peak()`` of the same device, when both are given."""

    @property
    def median_us(self) -> float:
        """The median in microseconds (host launch costs read better in µs)."""
        return self.median_ms * 1e3

    def to_dict(self) -> dict:
        """Every field, JSON-ready."""
        return asdict(self)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device``; None means CUDA when available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def is_cuda(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device this process can use (False on a CPU build)."""
    return device.type == "cuda" and torch.cuda.is_available()


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work; a no-op off CUDA."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def summarize(
    samples_ms: list[float],
    *,
    clock: str,
    device: str,
    calls_per_sample: int = 1,
    flushed_l2: bool = False,
    bytes_per_call: float | None = None,
    flops_per_call: float | None = None,
    copy_bytes_per_s: float | None = None,
    matmul_flops_per_s: float | None = None,
) -> Timing:
    """A ``Timing`` from per-call samples: median, quartiles (inclusive method), throughput."""
    if not samples_ms:
        raise ValueError("no samples to summarize")
    if len(samples_ms) >= 2:
        q1, _, q3 = statistics.quantiles(samples_ms, n=4, method="inclusive")
    else:
        q1 = q3 = samples_ms[0]
    median_ms = statistics.median(samples_ms)
    seconds = median_ms / 1e3
    bytes_per_s = bytes_per_call / seconds if bytes_per_call and seconds > 0 else None
    flops_per_s = flops_per_call / seconds if flops_per_call and seconds > 0 else None
    copy_fraction = bytes_per_s / copy_bytes_per_s if bytes_per_s and copy_bytes_per_s else None
    matmul_fraction = flops_per_s / matmul_flops_per_s if flops_per_s and matmul_flops_per_s else None
    return Timing(
        clock=clock,
        device=device,
        samples_ms=list(samples_ms),
        calls_per_sample=calls_per_sample,
        flushed_l2=flushed_l2,
        median_ms=median_ms,
        q1_ms=q1,
        q3_ms=q3,
        iqr_ms=q3 - q1,
        min_ms=min(samples_ms),
        bytes_per_call=bytes_per_call,
        flops_per_call=flops_per_call,
        bytes_per_s=bytes_per_s,
        flops_per_s=flops_per_s,
        fraction_of_copy_bandwidth=copy_fraction,
        fraction_of_matmul_peak=matmul_fraction,
    )


class Clock:
    """Marks on one clock: CUDA events recorded in the stream, or host ``perf_counter`` readings."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = is_cuda(device)
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def elapsed_ms(self, first: int, second: int) -> float:
        """Milliseconds between mark ``first`` and mark ``second`` (after the device finished)."""
        if self.cuda:
            return self.marks[first].elapsed_time(self.marks[second])
        return (self.marks[second] - self.marks[first]) * 1e3


def _calls_for(fn: Callable[[], object], device: torch.device, target_ms: float) -> int:
    """How many calls make a sample of about ``target_ms`` (from one timed call)."""
    clock = Clock(device)
    clock.mark()
    fn()
    clock.mark()
    synchronize(device)
    one_ms = max(clock.elapsed_ms(0, 1), 1e-3)
    return max(1, int(target_ms / one_ms))


def time_fn(
    fn: Callable[[], object],
    *,
    device: str | torch.device | None = None,
    warmup: int = 3,
    samples: int = 7,
    calls_per_sample: int | None = None,
    target_ms: float = 25.0,
    flush_l2: bool = False,
    bytes_per_call: float | None = None,
    flops_per_call: float | None = None,
    copy_bytes_per_s: float | None = None,
    matmul_flops_per_s: float | None = None,
) -> Timing:
    """Time ``fn()`` per call: ``warmup`` calls, then ``samples`` samples of back-to-back calls.

    Without ``flush_l2`` the calls of all samples are queued back to back with a mark between
    samples and one sync at the end, so the GPU never waits for the host between samples; a sample
    has ``calls_per_sample`` calls (default: enough for about ``target_ms``). With ``flush_l2`` each
    sample is one call after a buffer of ``L2_FLUSH_BYTES`` is overwritten; the flush is outside
    the marks. ``bytes_per_call``/``flops_per_call`` give throughput, and with
    ``copy_bytes_per_s``/``matmul_flops_per_s`` (this device's own, measured) its fraction.
    """
    if samples < 1 or warmup < 0:
        raise ValueError(f"samples must be >= 1 and warmup >= 0 (got {samples}, {warmup})")
    dev = resolve_device(device)
    for _ in range(warmup):
        fn()
    synchronize(dev)
    clock = Clock(dev)
    if flush_l2:
        scratch = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
        per_call = []
        for _ in range(samples):
            scratch.zero_()
            clock.marks.clear()
            clock.mark()
            fn()
            clock.mark()
            synchronize(dev)
            per_call.append(clock.elapsed_ms(0, 1))
        calls = 1
    else:
        calls = calls_per_sample or _calls_for(fn, dev, target_ms)
        clock.mark()
        for _ in range(samples):
            for _ in range(calls):
                fn()
            clock.mark()
        synchronize(dev)
        per_call = [clock.elapsed_ms(i, i + 1) / calls for i in range(samples)]
    return summarize(
        per_call,
        clock=CLOCK_CUDA if clock.cuda else CLOCK_HOST,
        device=str(dev),
        calls_per_sample=calls,
        flushed_l2=flush_l2,
        bytes_per_call=bytes_per_call,
        flops_per_call=flops_per_call,
        copy_bytes_per_s=copy_bytes_per_s,
        matmul_flops_per_s=matmul_flops_per_s,
    )


def host_time(
    fn: Callable[[], object],
    *,
    device: str | torch.device | None = None,
    warmup: int = 3,
    samples: int = 7,
    calls_per_sample: int = 20,
) -> Timing:
    """The host's time per call of ``fn()``, with no sync between calls (launch cost, not GPU time).

    The device is drained before each sample (outside the timing), so a sample starts on an empty
    queue; keep ``calls_per_sample`` small enough that the calls' launches do not fill the CUDA
    launch queue (about a thousand kernels), or the host would wait for the GPU inside the timing.
    The clock is always ``"host"``; read ``median_us``.
    """
    return host_times(
        {"fn": fn}, device=device, warmup=warmup, rounds=samples, calls_per_sample=calls_per_sample
    )["fn"]


def host_times(
    fns: Mapping[str, Callable[[], object]],
    *,
    device: str | torch.device | None = None,
    warmup: int = 3,
    rounds: int = 15,
    calls_per_sample: int = 10,
    busy_gpu_ms: float | None = None,
) -> dict[str, Timing]:
    """``host_time`` of several functions side by side, for comparing them in one run.

    Each round takes one sample of every function, in an order rotated from round to round (A B C,
    B C A, ...), so that drift of the host (its clock speed, other processes) falls on all of them
    alike rather than on whichever was measured last. Sample ``i`` of each result comes from round
    ``i``: ``paired_ratio`` compares two of them round by round.

    ``busy_gpu_ms``: on CUDA, queue a spin kernel of that length before each sample (outside the
    timing), so the calls' launches all meet a busy GPU with work queued, as in a GPU-bound training
    step; without it each sample starts on an idle GPU. Launches cost more against a busy GPU (on
    the H200's host, eager LayerNorm forward+backward 318 µs a call against 278 from idle). Make it
    longer than a sample's host time.
    """
    if not fns:
        raise ValueError("no functions to time")
    dev = resolve_device(device)
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in rotated(names, round_index):
            fn = fns[name]
            synchronize(dev)
            if busy_gpu_ms:
                keep_gpu_busy(busy_gpu_ms, dev)
            start = time.perf_counter()
            for _ in range(calls_per_sample):
                fn()
            samples[name].append((time.perf_counter() - start) * 1e3 / calls_per_sample)
    synchronize(dev)
    return {
        name: summarize(per_call, clock=CLOCK_HOST, device=str(dev), calls_per_sample=calls_per_sample)
        for name, per_call in samples.items()
    }


def rotated(items: Sequence[_T], round_index: int) -> list[_T]:
    """``items`` in the order of round ``round_index``: rotated by one place each round (A B C,
    B C A, C A B, ...), so that none always runs first and drift falls on all of them alike."""
    shift = round_index % len(items)
    return [*items[shift:], *items[:shift]]


def keep_gpu_busy(ms: float, device: str | torch.device | None = None) -> None:
    """Queue a spin kernel of about ``ms`` milliseconds on the current stream; a no-op off CUDA."""
    dev = resolve_device(device)
    if is_cuda(dev):
        torch.cuda._sleep(int(_spin_cycles_per_ms(str(dev)) * ms))


@functools.cache
def _spin_cycles_per_ms(device: str) -> float:
    """GPU clock cycles of ``torch.cuda._sleep`` per millisecond, measured with CUDA events."""
    with torch.cuda.device(device):
        torch.cuda._sleep(1_000_000)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        return 10_000_000 / start.elapsed_time(end)


def paired_ratio(numerator: Timing, denominator: Timing) -> tuple[float, float, float]:
    """Median and quartiles (inclusive) of ``numerator``'s sample over ``denominator``'s, round by round.

    For two results of one ``host_times`` call: a median below 1 means the numerator was the cheaper
    one in most rounds.
    """
    if len(numerator.samples_ms) != len(denominator.samples_ms):
        raise ValueError("paired_ratio needs timings with one sample per round, from one host_times call")
    ratios = [a / b for a, b in zip(numerator.samples_ms, denominator.samples_ms, strict=True) if b > 0]
    if not ratios:
        raise ValueError("no positive samples to compare")
    if len(ratios) == 1:
        return ratios[0], ratios[0], ratios[0]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return median, q1, q3


@functools.cache
def _copy_bandwidth(device: str, nbytes: int) -> float:
    dev = torch.device(device)
    source = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
    target = torch.empty_like(source)
    timing = time_fn(lambda: target.copy_(source), device=dev, bytes_per_call=2 * source.nbytes)
    assert timing.bytes_per_s is not None  # set: bytes_per_call was given
    return timing.bytes_per_s


def measure_copy_bandwidth(device: str | torch.device | None = None, nbytes: int | None = None) -> float:
    """Bytes/s of a large device-to-device tensor copy on ``device``, read + written bytes counted.

    ``nbytes`` defaults to 1 GiB on a GPU (far beyond L2) and 64 MiB on a CPU. Measured once per
    process and size (cached), with ``time_fn``; the ceiling a memory-bound kernel is held against.
    """
    dev = resolve_device(device)
    size = nbytes or (1 << 30 if is_cuda(dev) else 64 << 20)
    return _copy_bandwidth(str(dev), size)


@functools.cache
def _matmul_peak(device: str, dtype: torch.dtype, n: int, allow_tf32: bool) -> float:
    # allow_tf32 is only part of the cache key: the matmul reads the global setting.
    dev = torch.device(device)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    timing = time_fn(lambda: torch.mm(a, b), device=dev, flops_per_call=2.0 * n**3)
    assert timing.flops_per_s is not None  # set: flops_per_call was given
    return timing.flops_per_s


def measure_matmul_peak(
    dtype: torch.dtype = torch.bfloat16, device: str | torch.device | None = None, n: int | None = None
) -> float:
    """FLOP/s of a square ``n x n`` matmul in ``dtype`` on ``device`` (2 n^3 FLOPs a call).

    ``n`` defaults to 8192 on a GPU (large enough to reach the tensor cores' plateau) and 512 on a
    CPU. fp32 on a GPU follows the current ``torch.backends.cuda.matmul.allow_tf32`` setting, as the
    measured training step does. Cached per process, device, dtype and size.
    """
    dev = resolve_device(device)
    size = n or (8192 if is_cuda(dev) else 512)
    allow_tf32 = is_cuda(dev) and torch.backends.cuda.matmul.allow_tf32
    return _matmul_peak(str(dev), dtype, size, allow_tf32)
