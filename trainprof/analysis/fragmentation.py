"""Question 5d: does fragmentation, rather than the live tensors, set the memory peak?

The caching allocator keeps freed blocks for reuse. A cached block serves a later request only if
it is large enough, so when the requests change size (variable sequence lengths, a batch that grows)
the cache fills with blocks too small for them while new segments are reserved beside them: the
device's memory then runs out at a reserve well above the tensors' peak. Over the recorded steps:

    reserved peak   the largest `Total Reserved` (what the device gave the process)
    allocated peak  the largest `Total Allocated` (what the tensors needed)
    cached          reserved peak - allocated peak  (held by no tensor when it was most needed)

and from the session's allocator state as the window ended (`<worker>.memory.json`): the cudaMalloc
retries (`num_alloc_retries`: the allocator ran out, freed its whole cache and tried again),
out-of-memory errors, segments and the free memory stranded in split blocks.

The `memory_fragmentation` finding is made when `cached` is at least `fragmentation_min_share` of
the reserved peak and the reserve presses on the device (`memory_pressure_share` of it) or the
allocator retried, unless its segments are already expandable. Its fix is
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: one segment per stream that grows and shrinks by
pages, so freed memory serves a request of any size and the reserve follows the tensors; the bytes
it saves are at most `cached`.
"""

from __future__ import annotations

from trainprof.analysis.memory import MemoryProfile
from trainprof.analysis.records import Finding, Record, Where
from trainprof.analysis.severity import severity_for
from trainprof.analysis.step_basis import StepBasis
from trainprof.analysis.thresholds import Thresholds
from trainprof.trace.memory_file import AllocatorState

EXPANDABLE_SETTING = "expandable_segments:True"
FIX = (
    "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment before CUDA starts "
    "(before the first CUDA call; `export` it or set os.environ at the top of the script): the "
    "allocator then grows one segment per stream by pages instead of caching fixed-size segments, "
    "so freed memory serves requests of any size. Padding variable-length batches to a few fixed "
    "lengths (bucketing) also lets cached blocks be reused."
)


class Fragmentation(Record, frozen=True):
    """The allocator's reserve against the tensors over the recorded steps (module docstring):
    `allocated_peak_bytes`, `reserved_peak_bytes`, `cached_bytes` and `cached_pct` (of the reserved
    peak), `device_bytes` and `reserved_device_pct` (None without the device's memory); from the
    session's allocator state at the window's end (None without it): `num_alloc_retries`,
    `num_ooms` (both since the process started), `segments`, `inactive_split_bytes`,
    `largest_free_block_bytes`; `expandable_segments` (from the segments, else the run's
    `alloc_conf`; None: unknown) and `alloc_conf` (`PYTORCH_CUDA_ALLOC_CONF` in the run)."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int
    cached_bytes: int
    cached_pct: float
    device_bytes: int | None = None
    reserved_device_pct: float | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    segments: int | None = None
    inactive_split_bytes: int | None = None
    largest_free_block_bytes: int | None = None
    expandable_segments: bool | None = None
    alloc_conf: str | None = None


def fragmentation(
    profile: MemoryProfile | None,
    device_bytes: int | None,
    state: AllocatorState | None = None,
    alloc_conf: str | None = None,
) -> Fragmentation | None:
    """The reserve against the tensors (module docstring); None without a reserved total in the trace."""
    if profile is None or profile.reserved_peak_bytes is None or profile.reserved_peak_bytes <= 0:
        return None
    reserved, allocated = profile.reserved_peak_bytes, profile.peak_bytes
    cached = max(reserved - allocated, 0)
    stats = state.stats if state is not None else None
    segments = state.segments if state is not None else None
    expandable = segments.expandable if segments is not None and segments.count else None
    if expandable is None and alloc_conf is not None:
        expandable = EXPANDABLE_SETTING.lower() in alloc_conf.replace(" ", "").lower()
    return Fragmentation(
        allocated_peak_bytes=int(allocated),
        reserved_peak_bytes=int(reserved),
        cached_bytes=int(cached),
        cached_pct=round(100.0 * cached / reserved, 2),
        device_bytes=device_bytes,
        reserved_device_pct=round(100.0 * reserved / device_bytes, 2) if device_bytes else None,
        num_alloc_retries=stats.num_alloc_retries if stats is not None else None,
        num_ooms=stats.num_ooms if stats is not None else None,
        segments=stats.segments if stats is not None else (segments.count if segments is not None else None),
        inactive_split_bytes=stats.inactive_split_bytes if stats is not None else None,
        largest_free_block_bytes=segments.largest_free_block_bytes if segments is not None else None,
        expandable_segments=expandable,
        alloc_conf=alloc_conf,
    )


def fragments(facts: Fragmentation | None, thresholds: Thresholds) -> bool:
    """Whether fragmentation sets the peak (module docstring)."""
    if facts is None or facts.expandable_segments:
        return False
    if facts.cached_bytes < thresholds.fragmentation_min_share * facts.reserved_peak_bytes:
        return False
    pressed = facts.device_bytes is not None and (
        facts.reserved_peak_bytes >= thresholds.memory_pressure_share * facts.device_bytes)
    return pressed or bool(facts.num_alloc_retries)


def fragmentation_finding(
    facts: Fragmentation | None, basis: StepBasis, rank: int | None, thresholds: Thresholds
) -> Finding | None:
    """The `memory_fragmentation` finding (module docstring), or None."""
    if facts is None or not fragments(facts, thresholds):
        return None
    gib = 1024**3
    retries = facts.num_alloc_retries
    share = facts.reserved_device_pct
    title = (
        f"Fragmentation sets the memory peak: the allocator reserved {facts.reserved_peak_bytes / gib:.2f} "
        "GiB" + (f" ({share:.0f}% of the device)" if share is not None else "")
        + f" for at most {facts.allocated_peak_bytes / gib:.2f} GiB of tensors: "
        f"{facts.cached_bytes / gib:.2f} GiB ({facts.cached_pct:.0f}%) held no tensor at the peak"
        + (f"; {retries} cudaMalloc retries (the cache flushed to make room)" if retries else "")
        + f"; expandable segments would give back up to {facts.cached_bytes / gib:.2f} GiB"
    )
    return Finding(
        kind="memory_fragmentation",
        title=title,
        # Memory buys a larger batch or model, not GPU time in this step: no time at stake.
        severity=severity_for(0.0, basis.judged_ms, thresholds),
        op=None,
        where=Where(),
        count=1,
        per_step=1.0,
        cost_ms=0.0,
        fix=FIX,
        rank=rank,
        cause="cached blocks too small or split for the requests (sizes that change between steps)",
        gpu_ms_per_step=0.0,
        details=FragmentationDetails(facts=facts, memory_saved_bytes=facts.cached_bytes),
    )


class FragmentationDetails(Record, frozen=True):
    """The fragmentation finding's evidence: the facts, and the most its fix would give back."""

    facts: Fragmentation
    memory_saved_bytes: int
