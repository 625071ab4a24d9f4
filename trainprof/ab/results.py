"""What one A/B run measured: per variant and for the whole run, the typed records whose
``to_dict()`` is ``trainprof ab --json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
    """Model FLOPs per second over the datasheet's dense matmul peak (``ABResult.datasheet_peak_flops``;
    the measured one where the device is not in the table), as ``trainprof analyze`` reads MFU."""
    peak_memory_bytes: int | None
    losses: list[float]
    parity_max_rel_diff: float | None
    parity_ok: bool | None
    parity_tolerance: float | None = None
    mfu_achievable: float | None = None
    """The same over the matmul peak measured in this process (``ABResult.matmul_peak_flops``)."""
    """The allowed relative difference at the last step (PARITY_NOISE_FACTOR's comment)."""
    trace_dir: str | None = None
    vs_reference: str | None = None
    """``faster`` or ``slower`` than the reference variant when the two CIs do not overlap, else
    ``cannot tell apart`` (more steps narrow the intervals); None for the reference itself."""


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
    datasheet_peak_flops: float | None = None
    """The datasheet's dense matmul peak of the step's dtype on this device; None off the table."""
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
