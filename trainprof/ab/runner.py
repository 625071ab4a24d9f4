"""How fast is each variant? Runs the variants' steps interleaved, times blocks of them, checks
loss parity, profiles one step each and diffs it against the reference, and returns an ``ABResult``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from trainprof import bench
from trainprof.ab.parity import PARITY_NOISE_FACTOR, PARITY_RTOL, allowed_drift, measure_twin_drift, rel_diffs
from trainprof.ab.prediction import PREDICTION_DIR, annotate_swappable, predict
from trainprof.ab.results import ABResult, VariantResult
from trainprof.ab.steps import StepFactory, StepFn, VariantRun, build, run_steps
from trainprof.ab.variants import DEFAULT_VARIANTS, Variant, liger_available
from trainprof.capture import torch_noise

logger = logging.getLogger(__name__)


def median_ci(samples: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free CI of the median: (low, high, coverage), from order statistics.

    The interval [x_(k), x_(n+1-k)] covers the median with probability P(k <= B <= n-k),
    B ~ Binomial(n, 1/2); the largest k reaching ``level`` is taken. With too few samples for
    ``level`` the interval is [min, max] and its (lower) coverage is returned.
    """
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")

    def coverage(k: int) -> float:  # 1-based k
        return sum(math.comb(n, i) for i in range(k, n - k + 1)) / 2**n

    best = 1
    for k in range(1, n // 2 + 1):
        if coverage(k) >= level:
            best = k
        else:
            break
    return ordered[best - 1], ordered[n - best], coverage(best)


def compare_intervals(reference: VariantResult, variant: VariantResult) -> str:
    """`faster`/`slower` when the variant's CI of the median lies wholly below/above the reference's,
    else `cannot tell apart` (overlapping intervals: the blocks do not show a difference)."""
    if variant.ci_high_ms < reference.ci_low_ms:
        return "faster"
    if variant.ci_low_ms > reference.ci_high_ms:
        return "slower"
    return "cannot tell apart"


def _resident_bytes(model: torch.nn.Module | None, step: StepFn) -> int:
    """Bytes of the model's parameters and gradients, and of optimizer state reachable from them."""
    if model is None:
        return 0
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        for tensor in (param, param.grad):
            if tensor is not None and id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    optimizer = getattr(step, "optimizer", None)
    if isinstance(optimizer, torch.optim.Optimizer):
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and id(value) not in seen:
                    seen.add(id(value))
                    total += value.numel() * value.element_size()
    return total


def run(
    step_fn_factory: StepFactory,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    *,
    steps: int = 20,
    warmup: int = 3,
    block: int = 2,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    tokens_per_step: int | None = None,
    flops_per_step: float | None = None,
    log_dir: str | Path | None = None,
    profile: bool = True,
    label: str = "custom",
    config: dict | None = None,
) -> ABResult:
    """Run ``step_fn_factory``'s step in each variant, interleaved; return what was measured.

    ``step_fn_factory(variant)`` builds a fresh model from the same seed and state, calls
    ``variant.apply(model)``, and returns ``step(i) -> loss`` (or ``(step, model)``; with the model,
    peak memory counts its tensors and the fused prediction can be made). ``steps`` steps per
    variant in all (the first ``warmup`` untimed), then, with ``profile``, two more under
    torch.profiler (one warm-up, one recorded). ``precision`` ("fp32" or "bf16") picks the parity
    tolerance and the matmul peak's dtype. ``log_dir`` keeps each variant's trace in
    ``log_dir/<variant>/``; without it traces go to a temporary folder that is removed.
    """
    if precision not in PARITY_RTOL:
        raise ValueError(f"precision must be one of {tuple(PARITY_RTOL)}, got {precision!r}")
    if steps <= warmup or block < 1:
        raise ValueError(
            f"need steps > warmup and block >= 1 (got steps={steps}, warmup={warmup}, block={block})"
        )
    parsed = [Variant.parse(name) for name in variants]
    if len({v.name for v in parsed}) != len(parsed) or not parsed:
        raise ValueError(f"variants must be distinct and at least one: {list(variants)}")
    skipped = {}
    if any(v.liger for v in parsed) and not liger_available():
        skipped = {v.name: "liger-kernel is not importable here" for v in parsed if v.liger}
        parsed = [v for v in parsed if not v.liger]
    dev = bench.resolve_device(device)
    cuda = bench.is_cuda(dev)

    started = time.perf_counter()

    def progress(what: str) -> None:  # phase lines for long runs (`trainprof ab` prints them)
        logger.info("trainprof ab: %s (%.1f s)", what, time.perf_counter() - started)

    runs = []
    for variant in parsed:
        # A variant that cannot be built or fails its warm-up steps (e.g. a compile error) is
        # skipped with the reason; the first variant is the reference and must work.
        try:
            run = VariantRun(variant, *build(step_fn_factory, variant))
            run_steps(run, warmup)  # warm-up (and compilation) before any timing
            bench.synchronize(dev)
            progress(f"{variant.name} built and warmed up")
        except Exception as error:
            if not runs:
                raise
            logger.warning("trainprof.ab: variant %s skipped: %r", variant.name, error)
            skipped[variant.name] = f"failed: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            continue
        runs.append(run)

    clock = bench.Clock(dev)
    rounds = math.ceil((steps - warmup) / block)
    for round_index in range(rounds):
        for run in bench.rotated(runs, round_index):  # no variant always runs first
            count = min(block, steps - run.next_index)
            if count <= 0:
                continue
            if cuda:
                allocated = torch.cuda.memory_allocated(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            clock.mark()
            run_steps(run, count)
            clock.mark()
            run.marks.append((len(clock.marks) - 2, len(clock.marks) - 1, count))
            if cuda:
                run.peak_rise_bytes = max(
                    run.peak_rise_bytes, torch.cuda.max_memory_allocated(dev) - allocated
                )
    bench.synchronize(dev)
    progress(f"{rounds} timed rounds done")
    reference_losses = torch.stack(runs[0].losses).cpu().tolist()
    twin_drift = measure_twin_drift(step_fn_factory, runs[0], reference_losses, precision)
    allowed = allowed_drift(twin_drift, len(reference_losses), precision)
    progress("parity noise twin done")

    matmul_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    peak_flops = bench.measure_matmul_peak(matmul_dtype, dev)
    copy_bandwidth = bench.measure_copy_bandwidth(dev)
    datasheet_flops = _datasheet_peak(dev, precision)
    # MFU as the field reports it (and `trainprof analyze` does): against the datasheet's dense peak,
    # the measured one beside it; a device the table lacks has only the measured one.
    mfu_peak = datasheet_flops or peak_flops
    progress("matmul peak and copy bandwidth measured")

    results = []
    reference_ms: float | None = None
    for run in runs:
        blocks_ms = [clock.elapsed_ms(a, b) / count for a, b, count in run.marks]
        median_ms = bench.summarize(blocks_ms, clock=bench.CLOCK_HOST, device=str(dev)).median_ms
        low, high, coverage = median_ci(blocks_ms)
        losses = torch.stack(run.losses).cpu().tolist()
        if reference_ms is None:
            reference_ms = median_ms
        drift = rel_diffs(losses, reference_losses)
        max_rel = max(drift) if drift else None
        finite = all(math.isfinite(x) for x in losses)
        results.append(
            VariantResult(
                name=run.variant.name,
                notes=list(run.variant.notes),
                blocks_ms=[round(x, 4) for x in blocks_ms],
                median_ms=round(median_ms, 4),
                ci_low_ms=round(low, 4),
                ci_high_ms=round(high, 4),
                ci_coverage=round(coverage, 4),
                speedup=round(reference_ms / median_ms, 4) if median_ms > 0 else None,
                tokens_per_s=round(tokens_per_step / (median_ms / 1e3), 1) if tokens_per_step else None,
                mfu=round(flops_per_step / (median_ms / 1e3) / mfu_peak, 4) if flops_per_step else None,
                mfu_achievable=round(flops_per_step / (median_ms / 1e3) / peak_flops, 4)
                if flops_per_step
                else None,
                peak_memory_bytes=(_resident_bytes(run.model, run.step) + run.peak_rise_bytes)
                if cuda
                else None,
                losses=[round(x, 6) for x in losses],
                parity_max_rel_diff=max_rel,
                parity_ok=finite and bool(drift) and all(d <= a for d, a in zip(drift, allowed, strict=True)),
                parity_tolerance=allowed[-1] if allowed else None,
            )
        )

    for result in results[1:]:
        result.vs_reference = compare_intervals(results[0], result)

    diffs_out: dict[str, dict] = {}
    prediction = None
    if profile:
        try:
            diffs_out, prediction = _profile_and_diff(runs, results, log_dir, dev, copy_bandwidth, progress)
        except Exception as error:  # the timings stand without the profiles; say why they are missing
            logger.warning("trainprof.ab: profiling failed: %r", error)
            skipped["profile"] = f"failed: {type(error).__name__}: {' '.join(str(error).split())[:300]}"

    return ABResult(
        model=label,
        device=_device_name(dev),
        clock=clock_name(dev),
        config=dict(
            config or {},
            steps=steps,
            warmup=warmup,
            block=block,
            precision=precision,
            tokens_per_step=tokens_per_step,
            flops_per_step=flops_per_step,
        ),
        method=_method(precision, cuda),
        variants=results,
        skipped=skipped,
        diffs=diffs_out,
        prediction=prediction,
        matmul_peak_flops=peak_flops,
        copy_bytes_per_s=copy_bandwidth,
        datasheet_peak_flops=datasheet_flops,
        parity_noise_floor=max(twin_drift) if twin_drift else None,
    )


def _profile_and_diff(
    runs: list[VariantRun],
    results: list[VariantResult],
    log_dir: str | Path | None,
    device: torch.device,
    copy_bandwidth: float,
    progress: Callable[[str], None],
) -> tuple[dict[str, dict], dict | None]:
    """One profiled step per variant, each diffed against the first; the fused prediction.

    The prediction needs the first variant's step once more with module hooks (their profiler
    ranges and autograd nodes would otherwise show in the diff), kept in ``PREDICTION_DIR``.
    """
    from trainprof.analysis.diff import diff_traces

    with _trace_root(log_dir) as root:
        for run, result in zip(runs, results, strict=True):
            _profile_step(run, root / run.variant.slug, device)
            progress(f"{run.variant.name} profiled")
            result.trace_dir = str(root / run.variant.slug) if log_dir is not None else None
        reference = root / runs[0].variant.slug
        diffs = {
            run.variant.name: _trimmed(
                diff_traces(
                    reference, root / run.variant.slug, names=(runs[0].variant.name, run.variant.name)
                ).to_dict()
            )
            for run in runs[1:]
        }
        progress("diffs done")
        if runs[0].model is None or not any(run.variant.fused for run in runs):
            return diffs, None
        try:  # the diffs stand without the prediction (e.g. a module whose backward hooks fail)
            with annotate_swappable(runs[0].model) as seen:
                _profile_step(runs[0], root / PREDICTION_DIR, device)
            prediction = predict(root / PREDICTION_DIR, seen, copy_bandwidth, results)
            progress("fused prediction done")
            return diffs, prediction
        except Exception as error:
            logger.warning("trainprof.ab: fused prediction failed: %r", error)
            reason = f"failed: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            return diffs, {"available": False, "reason": reason}


def _datasheet_peak(device: torch.device, precision: str) -> float | None:
    """FLOP/s of the datasheet's dense matmul peak for the step's math dtype on `device`
    (`trainprof.analysis.peaks.KNOWN_DEVICES`, the table the analysis reads), or None."""
    from trainprof.analysis.peaks import datasheet_tflops

    if not bench.is_cuda(device):
        return None
    if precision == "bf16":
        dtype = "bf16"
    else:  # fp32 matmuls run TF32 when the process allows it
        dtype = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    properties = torch.cuda.get_device_properties(device)
    tflops = datasheet_tflops(properties.name, dtype, properties.total_memory)
    return tflops * 1e12 if tflops else None


def clock_name(device: torch.device) -> str:
    """The clock ``run`` times with on ``device``."""
    return bench.CLOCK_CUDA if bench.is_cuda(device) else bench.CLOCK_HOST


def _device_name(device: torch.device) -> str:
    if bench.is_cuda(device):
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device} ({torch.get_num_threads()} threads)"


def _method(precision: str, cuda: bool) -> dict:
    return {
        "timing": (
            "CUDA events around blocks of steps queued with no sync inside (GPU time)"
            if cuda
            else "host time.perf_counter around blocks of steps: a CPU run, so host times"
        ),
        "interleaving": "variants run in blocks, the order rotated each round, after untimed warm-up steps",
        "ci": "distribution-free CI of the median of block ms/step (order statistics, binomial "
        "coverage), labelled with its coverage: 95% from 6 blocks; fewer blocks: [min, max], whose "
        "coverage is lower (2 blocks: 50%); variants whose intervals overlap the reference's: "
        "cannot tell apart",
        "mfu": "FLOPs per step over median step time over the datasheet's dense matmul peak of the "
        "step's dtype (trainprof.analysis.peaks.KNOWN_DEVICES, as trainprof analyze reads it; the peak "
        "measured in this process where the table lacks the device); mfu_achievable: over the matmul "
        "peak measured in this process (bench.measure_matmul_peak)",
        "flops": "HF models: 6*N*tokens + 12*L*d*T*tokens (PaLM appendix B: N = parameters outside "
        "embedding lookups, lm_head counted; attention scores and values with full T, no "
        "causal discount; L layers, d hidden size, T sequence length)",
        "dropout": "HF models: every dropout probability of the config set to 0 (masks would differ)",
        "parity": "at every step |loss - reference loss| / |reference loss| <= the larger of "
        f"{PARITY_RTOL[precision]} ({precision}) and {PARITY_NOISE_FACTOR:g}x the largest drift so far "
        "of the reference run again with its weights moved by one rounding step before every step "
        "(see trainprof.ab.PARITY_NOISE_FACTOR)",
        "peak_memory": (
            "resident parameters, gradients and optimizer state of the variant plus the largest "
            "rise of allocated memory during its blocks"
            if cuda
            else "not measured on a CPU"
        ),
    }


@contextlib.contextmanager
def _trace_root(log_dir: str | Path | None) -> Iterator[Path]:
    if log_dir is not None:
        root = Path(log_dir)
        root.mkdir(parents=True, exist_ok=True)
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="trainprof-ab-") as tmp:
        yield Path(tmp)


def _profile_step(run: VariantRun, trace_dir: Path, device: torch.device) -> None:
    """Two steps under torch.profiler: one warm-up, one recorded (``ProfilerStep#1``).

    The device is synchronised before the recorded step: else the recorded window also holds the
    GPU tail of the warm-up step, whose kernels have no launch in the trace and count by their start
    time (a GPU-bound Llama step showed 2,881 kernels "per step", twice its own). Not after it: a
    sync inside the recorded step would show as the step's own. So the recorded step's "step ms" is
    its host window, which for a GPU-bound step ends before the GPU has run its work (counted by
    launch); ``ABResult``'s ms/step is the measured time.
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    from trainprof.capture.export import export_window

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.is_cuda(device) else [])
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob("*.pt.trace.json*"):
        old.unlink()
    worker = trace_dir.name.strip("_")
    cycle_filter = torch_noise.ignore_cycle_warning()
    try:
        # trainprof's own two steps: torch's start/stop lines are filtered (trainprof.capture.torch_noise)
        with torch_noise.quiet_torch_stderr(), profile(
            activities=activities, schedule=schedule(wait=0, warmup=1, active=1),
            on_trace_ready=lambda profiler: export_window(profiler, trace_dir, worker),
        ) as prof:
            run_steps(run, 1)
            bench.synchronize(device)
            prof.step()
            run_steps(run, 1)
            prof.step()
    finally:
        torch_noise.restore(cycle_filter)
    bench.synchronize(device)


def _trimmed(diff: dict, limit: int = 40) -> dict:
    """A diff with its unchanged rows dropped and at most ``limit`` rows per table."""
    for key in ("ops", "kernels"):
        diff[key] = [row for row in diff[key] if row["status"] != "same"][:limit]
    return diff
