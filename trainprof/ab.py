"""A/B runs: one training step in several variants (bare, fused, liger, compile, fused+compile),
timed side by side, with loss parity, MFU, peak memory, a profiled step each and their diff.

    import trainprof

    def factory(variant):                         # called once per variant
        torch.manual_seed(0)
        model = variant.apply(build_model())      # fused_layers.swap / Liger / torch.compile as named
        optimizer = torch.optim.AdamW(model.parameters())
        def step(i):                              # the i-th step: same data for every variant
            loss = model(batches[i % 4]).loss
            loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
            return loss
        return step                               # or (step, model): enables the fused prediction
    result = trainprof.ab(factory, variants=("bare", "fused"), steps=30)
    result.to_dict()

How it measures (every choice is stated in the result's ``method``):
- Variants run interleaved in blocks of ``block`` steps, the order rotated every round, after
  ``warmup`` untimed steps each (torch.compile compiles there). A block is timed between two
  CUDA events with no sync inside (host ``perf_counter`` on a CPU, and ``clock`` says so).
- ms/step: the median of the blocks' ms/step; its 95% CI is distribution-free (order statistics of
  the blocks, binomial coverage); with too few blocks for 95% the CI is [min, max] with its coverage.
- Loss parity: every variant's loss at every step against the first variant's (same seed, same
  data); the allowed relative difference is the precision's ``PARITY_RTOL`` or, where training
  compounds rounding further, ten times the drift of the reference run again with its weights moved
  by one rounding step before every step (``PARITY_NOISE_FACTOR``).
- MFU: the step's FLOPs (``model_flops_per_step``) over the median step time, over the matmul peak
  ``trainprof.bench.measure_matmul_peak`` measured in the same process.
- Peak memory (CUDA): the variant's resident tensors (parameters, gradients, optimizer state) plus
  the largest rise of allocated memory during its blocks.
- One step per variant is profiled; ``trainprof.analysis.diff`` compares each with the first.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
import logging
import math
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trainprof import bench

logger = logging.getLogger(__name__)

PARTS = ("fused", "liger", "compile")
DEFAULT_VARIANTS = ("bare", "fused", "compile", "fused+compile")

#: Allowed relative difference of a variant's loss from the reference variant's, at every step, at
#: the least. fp32: the fused kernels reduce in another order (differences ~1e-7 per op); over tens
#: of Adam steps these compound but stay far below 1e-3. bf16 (parameters or autocast): 8
#: significand bits, a rounding step of 2^-8 = 0.4% per value; two correct implementations round
#: differently, so 2e-2 (about five bf16 rounding steps).
PARITY_RTOL = {"fp32": 1e-3, "bf16": 2e-2}

#: Training compounds rounding differences, and with bf16 *parameters* far beyond PARITY_RTOL: on an
#: H200 (2026-11-22/23, Llama 1B, 50 steps) Liger drifted 0.076 from the bare run and torch.compile
#: 0.070-0.076. So each run also measures its own noise floor: the reference variant again, with
#: every parameter moved by one rounding step of the precision (a relative 2^-8 in bf16, 2^-23 in
#: fp32, random signs) before every step. A variant is at parity when, at every step, its drift
#: from the reference stays within PARITY_RTOL or PARITY_NOISE_FACTOR times the largest drift of
#: that twin up to that step: a wrong kernel stands out in the first steps, before the twin moves.
#: An order of magnitude, because another rounding order at every step drifted 2-3x as fast as the
#: twin in a chaotic test (tests/test_ab.py, the logistic map), while a wrong op differs by far more
#: than rounding from its first step on.
PARITY_NOISE_FACTOR = 10.0
_ROUNDING_STEP = {"fp32": 2.0**-23, "bf16": 2.0**-8}

#: Named when the fused prediction is computed: profiler ranges around what swap would replace.
REPLACED_RANGE = "trainprof.ab.replaced"
KEPT_RANGE = "trainprof.ab.kept"
#: Folder (under the log dir) of the first variant's annotated step that the prediction reads.
PREDICTION_DIR = "_prediction"


@dataclass
class Variant:
    """One variant: which of fused_layers.swap, Liger's patch and torch.compile it applies."""

    name: str
    fused: bool = False
    liger: bool = False
    compile: bool = False
    notes: list[str] = field(default_factory=list)
    """What ``apply`` did (e.g. the swap record's summary), for the report."""

    @classmethod
    def parse(cls, name: str) -> Variant:
        """``"bare"`` or parts of ``PARTS`` joined by ``+``: ``"fused+compile"``."""
        name = name.strip()
        parts = [] if name == "bare" else name.split("+")
        unknown = [p for p in parts if p not in PARTS]
        if not name or unknown or len(set(parts)) != len(parts) or ("fused" in parts and "liger" in parts):
            raise ValueError(
                f"variant {name!r}: expected 'bare' or some of {PARTS} joined by '+' "
                "(fused and liger exclusive)"
            )
        return cls(name, "fused" in parts, "liger" in parts, "compile" in parts)

    @property
    def slug(self) -> str:
        """The name as a file name: no '+' or '.' (trace worker names end at the first dot)."""
        return self.name.replace("+", "-")

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Apply this variant to ``model`` (in place for swap/Liger); returns the model to call."""
        if self.fused:
            import fused_layers

            record = fused_layers.swap(model)
            self.notes.append(f"fused_layers.swap: {record.summary()}")
        if self.liger:
            self.notes.append(f"liger: {apply_liger(model)}")
        if self.compile:
            model = torch.compile(model)
            self.notes.append("torch.compile(model) (default mode); the optimizer step runs eager")
        return model


def liger_available() -> bool:
    """Whether liger-kernel can be imported here."""
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception:
        return False
    return True


def apply_liger(model: torch.nn.Module) -> str:
    """Liger-Kernel's patch of the ops fused_layers.swap also replaces, on this instance only.

    RMSNorm, SwiGLU/GeGLU MLPs and RoPE through ``_apply_liger_kernel_to_instance`` (the model
    families Liger knows; cross-entropy and fused linear cross-entropy off, as swap has none), then
    any ``torch.nn.LayerNorm`` left becomes ``LigerLayerNorm`` sharing its Parameters (GPT-2: Liger
    has LayerNorm only, no plain GELU). Liger's family patch also rebinds classes and functions in
    the ``transformers`` modeling module; they are restored, so later models are built unpatched
    and other models keep Hugging Face's functions. Its RoPE (a rebound ``apply_rotary_pos_emb``)
    is then routed to this model's modules whose forward calls it, the way swap routes the fused
    one (``fused_layers.routing``; eager only: under torch.compile Hugging Face's function runs).
    """
    from liger_kernel.transformers import LigerLayerNorm
    from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

    modeling = sys.modules.get(type(model).__module__)
    saved = dict(vars(modeling)) if modeling is not None else {}
    before = {name: type(m).__name__ + m._get_name() for name, m in model.named_modules()}
    rebound_functions = {}
    try:
        _apply_liger_kernel_to_instance(
            model=model,
            rope=True,
            cross_entropy=False,
            fused_linear_cross_entropy=False,
            rms_norm=True,
            swiglu=True,
            geglu=True,
            layer_norm=True,
        )
    finally:
        for key, value in saved.items():
            if vars(modeling).get(key) is not value:
                if callable(value) and not isinstance(value, type):
                    rebound_functions[key] = vars(modeling).get(key)
                setattr(modeling, key, value)
    routed = _route_functions(model, modeling, rebound_functions) if modeling is not None else 0
    patched = sum(
        1 for name, m in model.named_modules() if before.get(name) != type(m).__name__ + m._get_name()
    )
    layer_norms = 0
    for path, module in list(model.named_modules()):
        if (
            type(module) is torch.nn.LayerNorm
            and len(module.normalized_shape) == 1
            and module.weight is not None
        ):
            liger = LigerLayerNorm(module.normalized_shape[0], eps=module.eps, bias=module.bias is not None)
            liger.weight = module.weight
            # Liger's kernel always adds a bias: a LayerNorm without one gets a frozen zero bias.
            liger.bias = (
                module.bias
                if module.bias is not None
                else torch.nn.Parameter(torch.zeros_like(module.weight), requires_grad=False)
            )
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent), name, liger)
            layer_norms += 1
    return (
        f"patched {patched} modules by family, LayerNorm -> LigerLayerNorm x{layer_norms}, "
        f"{', '.join(sorted(rebound_functions)) or 'no function'} routed to Liger's in {routed} modules"
    )


def _route_functions(model: torch.nn.Module, modeling, functions: dict) -> int:
    """Route each rebound global of ``modeling`` to its replacement in the modules of ``model``
    whose class's forward (defined in ``modeling``) calls it by name; returns how many modules.

    A forward under decorators (transformers 5.24 wraps ``LlamaAttention.forward`` in
    ``deprecate_kwarg``) is read through its ``__wrapped__`` chain: the wrapper's own code names none
    of the body's globals.
    """
    from fused_layers import routing

    routed = set()
    for module in model.modules():
        forward = inspect.unwrap(type(module).forward)
        if getattr(forward, "__module__", None) != modeling.__name__:
            continue
        for name, replacement in functions.items():
            if callable(replacement) and name in forward.__code__.co_names:
                routing.route_function(module, modeling, name, replacement)
                routed.add(id(module))
    return len(routed)


# ---- statistics --------------------------------------------------------------------------------


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


# ---- the run -----------------------------------------------------------------------------------


StepFn = Callable[[int], torch.Tensor]
StepFactory = Callable[[Variant], "StepFn | tuple[StepFn, torch.nn.Module]"]


@dataclass
class VariantResult:
    """One variant's figures; times in ms per step on ``ABResult.clock``."""

    name: str
    notes: list[str]
    blocks_ms: list[float]
    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    ci_coverage: float
    speedup: float | None
    """Reference variant's median over this one's."""
    tokens_per_s: float | None
    mfu: float | None
    peak_memory_bytes: int | None
    losses: list[float]
    parity_max_rel_diff: float | None
    parity_ok: bool | None
    parity_tolerance: float | None = None
    """The allowed relative difference at the last step (PARITY_NOISE_FACTOR's comment)."""
    trace_dir: str | None = None


@dataclass
class ABResult:
    """Everything one A/B run measured; ``to_dict()`` is ``trainprof ab --json``."""

    model: str
    device: str
    clock: str
    """``"cuda-events"`` (GPU time between events) or ``"host"`` (CPU run: host times)."""
    config: dict
    method: dict
    variants: list[VariantResult]
    skipped: dict[str, str]
    diffs: dict[str, dict]
    """Variant name -> ``TraceDiff.to_dict()`` of its profiled step against the reference's."""
    prediction: dict | None
    matmul_peak_flops: float | None
    copy_bytes_per_s: float | None
    parity_noise_floor: float | None = None
    """Max relative loss difference of the reference from its twin nudged by a rounding step per step."""

    @property
    def reference(self) -> VariantResult:
        """The first variant: what speedups, parity and diffs compare with."""
        return self.variants[0]

    def variant(self, name: str) -> VariantResult:
        """The result of one variant by name."""
        return next(v for v in self.variants if v.name == name)

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)


@dataclass
class _Run:
    variant: Variant
    step: StepFn
    model: torch.nn.Module | None
    next_index: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)
    marks: list[tuple[int, int, int]] = field(default_factory=list)  # (first mark, second mark, steps)
    peak_rise_bytes: int = 0


def _autocast_off() -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


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


def _build(factory: StepFactory, variant: Variant) -> tuple[StepFn, torch.nn.Module | None]:
    """The variant's step function, and its model when the factory returns `(step, model)`."""
    built = factory(variant)
    return built if isinstance(built, tuple) else (built, None)


def _rel_diffs(losses: list[float], reference: list[float]) -> list[float]:
    return [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True)]


def _allowed_drift(twin_drift: list[float] | None, steps: int, precision: str) -> list[float]:
    """Per step, the largest relative loss difference at parity (PARITY_NOISE_FACTOR's comment)."""
    floor = PARITY_RTOL[precision]
    if twin_drift is None:
        return [floor] * steps
    envelope = itertools.accumulate(twin_drift, max)
    return [max(floor, PARITY_NOISE_FACTOR * d) for d in envelope]


def _twin_drift(
    factory: StepFactory, reference: _Run, losses: list[float], precision: str
) -> list[float] | None:
    """Per step, how far the reference drifts from itself when its weights move by one rounding step
    before every step (as a different implementation rounds differently at every step).

    None when the factory gives no model to perturb, or the twin fails (the fixed tolerance holds).
    """
    try:
        step, model = _build(factory, reference.variant)
        if model is None:
            return None
        generators: dict[torch.device, torch.Generator] = {}  # drawn where the weights are: a 1B
        # model's signs drawn on the host and copied over cost seconds per step

        def nudged_step(i: int) -> torch.Tensor:
            with torch.no_grad():
                for param in model.parameters():
                    if param.device not in generators:
                        generators[param.device] = torch.Generator(param.device).manual_seed(0)
                    signs = torch.randint(
                        0, 2, param.shape, generator=generators[param.device], device=param.device,
                        dtype=torch.int8,
                    )
                    param.copy_(param.float() * (1 + (signs * 2 - 1) * _ROUNDING_STEP[precision]))
            return step(i)

        twin = _Run(reference.variant, nudged_step, model)
        _run_steps(twin, len(losses))
        return _rel_diffs(torch.stack(twin.losses).cpu().tolist(), losses)
    except Exception as error:  # the fixed tolerance still judges parity; say why there is no floor
        logger.warning("trainprof.ab: no parity noise floor: %r", error)
        return None


def _run_steps(run: _Run, count: int) -> None:
    for _ in range(count):
        loss = run.step(run.next_index)
        run.losses.append(loss.detach().float().reshape(()))
        run.next_index += 1


def ab(
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
            run = _Run(variant, *_build(step_fn_factory, variant))
            _run_steps(run, warmup)  # warm-up (and compilation) before any timing
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
        shift = round_index % len(runs)
        for run in runs[shift:] + runs[:shift]:  # rotated: no variant always runs first
            count = min(block, steps - run.next_index)
            if count <= 0:
                continue
            if cuda:
                allocated = torch.cuda.memory_allocated(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            clock.mark()
            _run_steps(run, count)
            clock.mark()
            run.marks.append((len(clock.marks) - 2, len(clock.marks) - 1, count))
            if cuda:
                run.peak_rise_bytes = max(
                    run.peak_rise_bytes, torch.cuda.max_memory_allocated(dev) - allocated
                )
    bench.synchronize(dev)
    progress(f"{rounds} timed rounds done")
    reference_losses = torch.stack(runs[0].losses).cpu().tolist()
    twin_drift = _twin_drift(step_fn_factory, runs[0], reference_losses, precision)
    allowed = _allowed_drift(twin_drift, len(reference_losses), precision)
    progress("parity noise twin done")

    matmul_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    peak_flops = bench.measure_matmul_peak(matmul_dtype, dev)
    copy_bandwidth = bench.measure_copy_bandwidth(dev)
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
        drift = _rel_diffs(losses, reference_losses)
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
                mfu=round(flops_per_step / (median_ms / 1e3) / peak_flops, 4) if flops_per_step else None,
                peak_memory_bytes=(_resident_bytes(run.model, run.step) + run.peak_rise_bytes)
                if cuda
                else None,
                losses=[round(x, 6) for x in losses],
                parity_max_rel_diff=max_rel,
                parity_ok=finite and bool(drift) and all(d <= a for d, a in zip(drift, allowed, strict=True)),
                parity_tolerance=allowed[-1] if allowed else None,
            )
        )

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
        parity_noise_floor=max(twin_drift) if twin_drift else None,
    )


def _profile_and_diff(
    runs: list[_Run],
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
            run.variant.name: _trimmed(diff_traces(reference, root / run.variant.slug).to_dict())
            for run in runs[1:]
        }
        progress("diffs done")
        if runs[0].model is None or not any(run.variant.fused for run in runs):
            return diffs, None
        try:  # the diffs stand without the prediction (e.g. a module whose backward hooks fail)
            with _annotate_swappable(runs[0].model) as seen:
                _profile_step(runs[0], root / PREDICTION_DIR, device)
            prediction = _predict(root / PREDICTION_DIR, seen, copy_bandwidth, results)
            progress("fused prediction done")
            return diffs, prediction
        except Exception as error:
            logger.warning("trainprof.ab: fused prediction failed: %r", error)
            reason = f"failed: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            return diffs, {"available": False, "reason": reason}


def clock_name(device: torch.device) -> str:
    """The clock ``ab`` times with on ``device``."""
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
        "ci": "95% distribution-free CI of the median of block ms/step (order statistics, binomial "
        "coverage); fewer than 6 blocks: [min, max] with its coverage",
        "mfu": "FLOPs per step over median step time over the matmul peak measured in this process "
        "(bench.measure_matmul_peak)",
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


def _profile_step(run: _Run, trace_dir: Path, device: torch.device) -> None:
    """Two steps under torch.profiler: one warm-up, one recorded (``ProfilerStep#1``).

    The device is synchronised before the recorded step: else the recorded window also holds the
    GPU tail of the warm-up step, whose kernels have no launch in the trace and count by their start
    time (a GPU-bound Llama step showed 2,881 kernels "per step", twice its own). Not after it: a
    sync inside the recorded step would show as the step's own. So the recorded step's "step ms" is
    its host window, which for a GPU-bound step ends before the GPU has run its work (counted by
    launch); ``ABResult``'s ms/step is the measured time.
    """
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.is_cuda(device) else [])
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob("*.pt.trace.json*"):
        old.unlink()
    handler = tensorboard_trace_handler(str(trace_dir), worker_name=trace_dir.name.strip("_"), use_gzip=True)
    with profile(
        activities=activities, schedule=schedule(wait=0, warmup=1, active=1), on_trace_ready=handler
    ) as prof:
        _run_steps(run, 1)
        bench.synchronize(device)
        prof.step()
        _run_steps(run, 1)
        prof.step()
    bench.synchronize(device)


def _trimmed(diff: dict, limit: int = 40) -> dict:
    """A diff with its unchanged rows dropped and at most ``limit`` rows per table."""
    for key in ("ops", "kernels"):
        diff[key] = [row for row in diff[key] if row["status"] != "same"][:limit]
    return diff


# ---- the fused prediction ------------------------------------------------------------------------


@dataclass
class _Swappable:
    """What swap would replace in the reference model, seen during its profiled step."""

    paths: dict[str, str] = field(default_factory=dict)  # module path -> op ("layer_norm", ...)
    bytes_per_call: list[float] = field(default_factory=list)  # fused op's fewest bytes, fwd + bwd


#: Fewest bytes a fused op moves per call, forward + backward, in units of its activation's size
#: (x for the norms and GELU; the gate projection's output for a gated MLP). Norms and GELU:
#: forward reads x and writes y (2), backward reads x and dy and writes dx (3). Gated MLP:
#: forward reads gate and up and writes h (3), backward reads gate, up, dh, writes dgate, dup (5).
#: Weights (one row) are negligible. RoPE, in units of q, k, q_embed and k_embed together (each
#: read or written once in each pass: forward reads q, k and writes q_embed, k_embed; backward
#: reads their grads and writes dq, dk), plus cos and sin, read once per (b, t) position in each
#: pass (``_rope_bytes``).
FUSED_BYTES_FACTOR = {"layer_norm": 5, "rms_norm": 5, "gelu": 5, "gated_mlp": 8, "rope": 2}
_KEPT_CHILDREN = {"gated_mlp": ("gate_proj", "up_proj", "down_proj")}


def _rope_bytes(inputs: tuple, output: tuple) -> float:
    """The fused RoPE's fewest bytes, forward + backward, for a call (q, k, cos, sin) -> (q_embed, k_embed).

    q is (B, H, T, D) (unsqueeze_dim 1, as every caller of the swap table's rows passes), so a
    position's cos row has q.numel() / H elements; cos and sin are read in each of the two passes.
    """
    q, k, cos = inputs[:3]
    activations = sum(t.numel() * t.element_size() for t in (q, k, *output))
    tables = 2 * 2 * (q.numel() // max(q.shape[1], 1)) * cos.element_size()
    return FUSED_BYTES_FACTOR["rope"] * activations + tables


def _swappable_paths(model: torch.nn.Module) -> dict[str, str]:
    """Module path -> op, for what ``fused_layers.swap`` would replace (swapped, read, unswapped)."""
    import fused_layers

    record = fused_layers.swap(model)
    try:
        return dict(record.replaced_ops)
    finally:
        fused_layers.unswap(model, record)


class _CallModule(torch.nn.Module):
    """A function as a module, so module hooks can range its forward and backward."""

    def __init__(self, function: Callable) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args, **kwargs):
        return self.function(*args, **kwargs)


@contextlib.contextmanager
def _annotate_swappable(model: torch.nn.Module) -> Iterator[_Swappable]:
    """Profiler ranges around the forward and backward of each module swap would replace.

    ``REPLACED_RANGE`` wraps a replaced module's forward and backward (module hooks),
    ``KEPT_RANGE`` the children the fused module keeps (a gated MLP's Linears), so kernels can be
    attributed to what swap replaces. For RoPE, where swap reroutes the attention's
    ``apply_rotary_pos_emb`` rather than replacing a module, the same route sends this model's
    calls through a module around Hugging Face's function, whose hooks range it. Sizes for the
    fused cost are read in the forward hooks.
    """
    from torch.autograd.profiler import record_function

    from fused_layers import routing
    from fused_layers.swap import ROPE_FUNCTION

    seen = _Swappable(paths=_swappable_paths(model))
    handles = []
    routes = []
    rope_calls: dict[str, _CallModule] = {}  # modeling module name -> its ranged function

    def ranged(module: torch.nn.Module, name: str, on_output: Callable | None = None) -> None:
        open_ranges: list = []

        def enter(*_args) -> None:
            rf = record_function(name)
            rf.__enter__()
            open_ranges.append(rf)

        def leave() -> None:
            if open_ranges:
                open_ranges.pop().__exit__(None, None, None)

        def leave_forward(_module, inputs, output) -> None:
            if on_output is not None:
                on_output(inputs, output)
            leave()

        handles.append(module.register_forward_pre_hook(lambda m, args: enter()))
        handles.append(module.register_forward_hook(leave_forward))
        handles.append(module.register_full_backward_pre_hook(lambda m, grad_out: enter()))
        handles.append(module.register_full_backward_hook(lambda m, grad_in, grad_out: leave()))

    def on_rope(inputs, output) -> None:
        seen.bytes_per_call.append(_rope_bytes(inputs, output))

    try:  # a hook or route that fails to install must not stay behind
        for path, op in seen.paths.items():
            module = model.get_submodule(path)
            factor = FUSED_BYTES_FACTOR.get(op)
            if op == "rope":
                namespace = sys.modules[type(module).forward.__module__]
                call = rope_calls.get(namespace.__name__)
                if call is None:
                    call = rope_calls[namespace.__name__] = _CallModule(
                        routing.original_function(namespace, ROPE_FUNCTION)
                    )
                    ranged(call, REPLACED_RANGE, on_rope)
                routes.append(routing.route_function(module, namespace, ROPE_FUNCTION, call))
            elif op == "gated_mlp":

                def on_gate(_inputs, output, factor=factor) -> None:
                    seen.bytes_per_call.append(factor * output.numel() * output.element_size())

                ranged(module, REPLACED_RANGE)
                for child in _KEPT_CHILDREN[op]:
                    ranged(getattr(module, child), KEPT_RANGE, on_gate if child == "gate_proj" else None)
            else:

                def on_norm(inputs, _output, factor=factor) -> None:
                    if factor and inputs and isinstance(inputs[0], torch.Tensor):
                        seen.bytes_per_call.append(factor * inputs[0].numel() * inputs[0].element_size())

                ranged(module, REPLACED_RANGE, on_norm)
        yield seen
    finally:
        for handle in handles:
            handle.remove()
        for route in routes:
            route.remove()


def _predict(
    reference_dir: Path, seen: _Swappable, copy_bandwidth: float, results: list[VariantResult]
) -> dict:
    """The predicted gain of ``fused`` from the reference trace, beside the measured one."""
    from trainprof.analysis.diff import range_cost

    cost = range_cost(reference_dir, REPLACED_RANGE, KEPT_RANGE)
    calls = len(seen.bytes_per_call) / 2  # two profiled steps (one warm-up) ran the forward hooks
    fused_bytes_per_step = sum(seen.bytes_per_call) / 2
    fused_gpu_ms = fused_bytes_per_step / copy_bandwidth * 1e3
    reference = results[0]
    fused = next((r for r in results if r.name == "fused"), None)
    out = {
        "model": "GPU-bound step: the GPU time of the kernels inside what swap replaces (forward and "
        "backward, module hooks), minus the fused kernels' expected time (their fewest bytes, "
        "FUSED_BYTES_FACTOR, at the copy bandwidth measured in this run), is wall time saved",
        "replaced_modules": len(seen.paths),
        "replaced_calls_per_step": calls,
        **cost,
        "fused_expected_gpu_ms_per_step": round(fused_gpu_ms, 4),
        "fused_launches_per_step": 2 * calls,
    }
    if cost["kernels_per_step"] == 0:
        out.update(available=False, reason="no GPU kernels in the reference trace (a CPU run)")
        return out
    saved_ms = cost["gpu_ms_per_step"] - fused_gpu_ms
    predicted_ms = reference.median_ms - saved_ms
    out.update(
        available=True,
        predicted_saved_ms=round(saved_ms, 4),
        predicted_fused_ms=round(predicted_ms, 4),
        predicted_speedup=round(reference.median_ms / predicted_ms, 4) if predicted_ms > 0 else None,
    )
    if fused is not None:
        measured_saved = reference.median_ms - fused.median_ms
        out.update(
            measured_saved_ms=round(measured_saved, 4),
            measured_speedup=fused.speedup,
            saved_ratio=round(saved_ms / measured_saved, 3) if measured_saved else None,
        )
    return out


# ---- Hugging Face models from a config -------------------------------------------------------------


#: Presets: a config (no download) and the default batch x sequence.
PRESETS = {
    "gpt2-tiny": "CPU-sized GPT-2: 2 layers, d=64, 4 heads, vocab 512; B2 x T32",
    "gpt2-124m": "GPT-2 124M (GPT2Config defaults: 12 layers, d=768, vocab 50257); B8 x T1024",
    "llama-1b": "Llama-3.2-1B's shape: 16 layers, d=2048, MLP 8192, 32 heads / 8 KV heads, vocab 128256, "
    "tied embeddings; B4 x T2048",
}


class ModelNotFound(ValueError):
    """``--model`` names no preset, no local config and no cached Hugging Face config."""


def load_config(name: str):  # -> (transformers.PretrainedConfig, default batch, default seq)
    """The config of a preset, a local config path, or a cached Hugging Face config name (no download)."""
    import transformers

    if name == "gpt2-tiny":
        return (
            transformers.GPT2Config(
                n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, bos_token_id=0, eos_token_id=0
            ),
            2,
            32,
        )
    if name == "gpt2-124m":
        return transformers.GPT2Config(), 8, 1024
    if name == "llama-1b":
        return (
            transformers.LlamaConfig(
                hidden_size=2048,
                intermediate_size=8192,
                num_hidden_layers=16,
                num_attention_heads=32,
                num_key_value_heads=8,
                vocab_size=128256,
                max_position_embeddings=8192,
                tie_word_embeddings=True,
                rope_theta=500000.0,
                bos_token_id=0,
                eos_token_id=0,
            ),
            4,
            2048,
        )
    try:
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
    except Exception as error:
        raise ModelNotFound(
            f"--model {name}: not a preset ({', '.join(PRESETS)}), a local config, or a Hugging Face config "
            f"in the local cache (no download is made): {type(error).__name__}"
        ) from None
    positions = (
        getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512
    )
    return config, 4, min(512, positions)


def model_flops_per_step(model: torch.nn.Module, config, batch: int, seq: int) -> float:
    """Training FLOPs of one step: (6 N + 12 L d T) x B x T (PaLM's formula; see ``_method``)."""
    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    lookup = {id(m.weight) for m in embeddings}
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    n = sum(p.numel() for p in model.parameters() if id(p) not in lookup)
    if output is not None and id(output.weight) in lookup:  # tied: the lm_head matmul still runs
        n += output.weight.numel()
    layers = config.num_hidden_layers
    hidden = config.hidden_size
    return float((6 * n + 12 * layers * hidden * seq) * batch * seq)


def hf_factory(
    config,
    *,
    batch: int,
    seq: int,
    device: torch.device,
    dtype: torch.dtype,
    autocast: bool,
    seed: int = 0,
    lr: float = 3e-4,
    distinct_batches: int = 4,
) -> tuple[StepFactory, torch.nn.Module]:
    """A step factory for a causal LM built from ``config``: every variant a deep copy of one model.

    Data: ``distinct_batches`` random token batches (seeded) cycled, so the loss falls over the run
    and parity is checked on a moving loss. AdamW (fused on CUDA), zero_grad(set_to_none=True).
    Returns the factory and the base model (for FLOPs).
    """
    import transformers

    transformers.logging.set_verbosity_error()
    # Dropout off: variants draw random numbers differently (torch.compile has its own RNG), so
    # masks would differ and loss parity would measure the masks, not the kernels.
    for key, value in config.to_dict().items():
        if (key.endswith("pdrop") or key.endswith("dropout")) and isinstance(value, float):
            setattr(config, key, 0.0)
    torch.manual_seed(seed)
    with torch.device(device):
        base = transformers.AutoModelForCausalLM.from_config(config)
    base = base.to(dtype).train()
    generator = torch.Generator().manual_seed(seed)
    batches = [
        torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(device)
        for _ in range(distinct_batches)
    ]
    cuda = bench.is_cuda(device)

    def factory(variant: Variant):
        model = copy.deepcopy(base)
        call = variant.apply(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=cuda or None)

        def step(i: int) -> torch.Tensor:
            ids = batches[i % len(batches)]
            context = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else _autocast_off()
            with context:
                loss = call(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        step.optimizer = optimizer
        return step, model

    return factory, base


def ab_model(
    name: str,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    *,
    steps: int = 20,
    warmup: int = 3,
    block: int = 2,
    batch: int | None = None,
    seq: int | None = None,
    dtype: str = "fp32",
    autocast: bool = False,
    device: str | torch.device | None = None,
    log_dir: str | Path | None = None,
    profile: bool = True,
) -> ABResult:
    """``trainprof ab --model NAME``: ``ab`` over a Hugging Face causal LM built from a config."""
    config, default_batch, default_seq = load_config(name)
    batch, seq = batch or default_batch, seq or default_seq
    dev = bench.resolve_device(device)
    param_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    factory, base = hf_factory(config, batch=batch, seq=seq, device=dev, dtype=param_dtype, autocast=autocast)
    flops = model_flops_per_step(base, config, batch, seq)
    started = time.time()
    result = ab(
        factory,
        variants,
        steps=steps,
        warmup=warmup,
        block=block,
        device=dev,
        precision="bf16" if (dtype == "bf16" or autocast) else "fp32",
        tokens_per_step=batch * seq,
        flops_per_step=flops,
        log_dir=log_dir,
        profile=profile,
        label=name,
        config={
            "batch": batch,
            "seq": seq,
            "dtype": dtype,
            "autocast": autocast,
            "parameters": sum(p.numel() for p in base.parameters()),
            "preset": PRESETS.get(name),
        },
    )
    result.config["wall_s"] = round(time.time() - started, 1)
    return result


class _CallableModule(types.ModuleType):
    """``trainprof.ab`` is this module; calling it runs ``ab`` (``trainprof.ab(factory, ...)``)."""

    def __call__(self, *args, **kwargs) -> ABResult:
        return ab(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
