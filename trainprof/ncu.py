"""`trainprof ncu [options] RUN -- COMMAND`: Nsight Compute on the top kernels of a profiled run,
its figures joined to the run's kernel table.

    trainprof ncu --top 5 log/run-20261125-101500 -- python train.py --steps 30

1. The run's analysis gives its kernels by GPU time (the top-kernels table of the report).
2. Nsight Compute runs COMMAND once, collecting only kernels whose function name matches the top
   N names (``--kernel-name regex:^(a|b|...)$``), after ``--launch-skip`` matching launches (past
   warm-up and compilation) and for ``--launch-count`` of them, with ``--clock-control none`` (the
   GPU's clocks as they are, as training runs) and the sections that hold the figures below.
3. The report's details page, as CSV, is parsed (:func:`parse_details_csv`): per kernel, memory
   and compute throughput as % of the device's peak (Speed Of Light), achieved occupancy, duration,
   and the rules Nsight Compute fired with their estimated speedup (tail effect, stalls on long
   scoreboards, uncoalesced global accesses, ...).
4. :func:`join` puts them beside each kernel's share of the run's GPU time.

Kernels are matched by their function name (no namespace, template or argument list), which is
what ncu's ``--kernel-name-base function`` filters on: every instantiation of a template kernel
counts as one. ncu counts ``--launch-skip`` and ``--launch-count`` over all matching launches
together, so a kernel launched far more often than the others takes most of the count: raise
``--launch-count`` or narrow ``--regex`` to reach the rest. ``--csv FILE`` parses a details page
saved before instead of running anything. The command's arguments: `trainprof.cli.ncu`.
"""

from __future__ import annotations

# csv and subprocess are imported where they are used: every `trainprof` command imports this module
# with the ncu command's parser (`trainprof.cli.ncu`).
import io
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import msgspec

#: Sections collected: Speed Of Light (throughputs, duration), occupancy, launch statistics (the
#: tail-effect rule), warp states (stall rules), source counters (the uncoalesced-access rules).
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SourceCounters")
#: The details page's metric names read, by the field they fill.
METRICS = {
    "memory_pct": "Memory Throughput",
    "compute_pct": "Compute (SM) Throughput",
    "achieved_occupancy_pct": "Achieved Occupancy",
    "duration": "Duration",
}
#: Duration units as ncu prints them (``--print-units base`` gives ns), to microseconds.
_TIME_UNITS_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6}
#: Rule types kept as hints: optimisation advice and warnings (not INF, which restates a figure).
HINT_TYPES = ("OPT", "WRN")


class NcuError(RuntimeError):
    """ncu is missing, failed, or its output holds no profiled kernel; the message says which."""


def kernel_base_name(name: str) -> str:
    """A kernel's function name, as ncu's ``--kernel-name-base function`` names it: no return
    type, namespace, template arguments or argument list.

    ``void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, ...)``
    -> ``vectorized_layer_norm_kernel``; ``triton_per_fused_add_0`` stays as it is.
    """
    text = name.replace("(anonymous namespace)", "anonymous_namespace").strip()
    text = re.sub(r"^void\s+", "", text)
    depth, cut = 0, len(text)
    for index, char in enumerate(text):  # the argument list: the first "(" outside <...>
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(0, depth - 1)
        elif char == "(" and depth == 0:
            cut = index
            break
    text = text[:cut]
    bare, depth = [], 0
    for char in text:  # drop template arguments, nested ones included
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            bare.append(char)
    return "".join(bare).split("::")[-1].strip() or name


def kernel_regex(names: Sequence[str]) -> str:
    """ncu's ``--kernel-name`` value matching exactly these kernels' function names."""
    bases = sorted({kernel_base_name(name) for name in names})
    return "regex:^(" + "|".join(re.escape(base) for base in bases) + ")$"


def ncu_command(
    command: Sequence[str],
    names: Sequence[str],
    report: Path,
    launch_skip: int,
    launch_count: int,
    ncu: str = "ncu",
    sections: Sequence[str] = SECTIONS,
    regex: str | None = None,
) -> list[str]:
    """The ncu command line that profiles ``command``'s launches of ``names`` into ``report``."""
    line = [ncu, "--clock-control", "none", "--target-processes", "all", "--kernel-name-base", "function"]
    line += ["--kernel-name", regex or kernel_regex(names)]
    line += ["--launch-skip", str(launch_skip), "--launch-count", str(launch_count)]
    for section in sections:
        line += ["--section", section]
    return [*line, "--export", str(report), "--force-overwrite", *command]


def import_command(report: Path, ncu: str = "ncu") -> list[str]:
    """The ncu command line that prints ``report``'s details page as CSV, in base units."""
    return [ncu, "--import", str(report), "--csv", "--page", "details", "--print-units", "base"]


class NcuHint(msgspec.Struct):
    """A rule Nsight Compute fired on a kernel."""

    rule: str
    type: str
    """"OPT" (optimisation advice) or "WRN" (a warning)."""
    description: str
    estimated_speedup_pct: float | None
    """ncu's estimate of the kernel's speedup if the cause went away, % (global or local, as it says)."""


class NcuKernel(msgspec.Struct):
    """One kernel function's figures, averaged over its profiled launches."""

    name: str
    """Its function name (``kernel_base_name``)."""
    launches: int
    duration_us: float | None = None
    memory_pct: float | None = None
    """Memory throughput, % of the device's peak (Speed Of Light)."""
    compute_pct: float | None = None
    """Compute (SM) throughput, % of the device's peak."""
    achieved_occupancy_pct: float | None = None
    hints: list[NcuHint] = msgspec.field(default_factory=list)
    block_size: str = ""
    grid_size: str = ""


def _number(text: str) -> float | None:
    """A metric value as ncu prints it ("1,215,000.00", "83.4", "n/a") as a float, or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_details_csv(text: str) -> list[NcuKernel]:
    """The kernels of an ncu details page in CSV (``--csv --page details``), in first-seen order.

    Lines before the header (``==PROF==`` messages of a live run) are skipped. Launches of one
    function are averaged; a rule is kept once per kernel, with the largest speedup estimated for it.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuError("no ncu details page in this CSV (expected a header starting with \"ID\")")
    import csv

    launches: dict[str, dict[str, dict]] = {}  # kernel -> launch ID -> {"metrics", "hints", ...}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID") or row.get("ID") == "ID":
            continue
        name = kernel_base_name(row.get("Kernel Name", ""))
        shape = {"block": row.get("Block Size", ""), "grid": row.get("Grid Size", "")}
        launch = launches.setdefault(name, {}).setdefault(row["ID"], {"metrics": {}, "hints": {}, **shape})
        rule = (row.get("Rule Name") or "").strip()
        if rule:
            if (row.get("Rule Type") or "").strip() in HINT_TYPES:
                launch["hints"][rule] = NcuHint(
                    rule,
                    row["Rule Type"].strip(),
                    " ".join((row.get("Rule Description") or "").split()),
                    _number(row.get("Estimated Speedup") or ""),
                )
            continue
        metric, value = row.get("Metric Name", ""), _number(row.get("Metric Value", ""))
        for field_name, wanted in METRICS.items():
            if metric == wanted and value is not None:
                if field_name == "duration":
                    value *= _TIME_UNITS_US.get((row.get("Metric Unit") or "ns").strip(), 1e-3)
                launch["metrics"][field_name] = value
    kernels = []
    for name, by_id in launches.items():
        kernel = NcuKernel(name, launches=len(by_id))
        first = next(iter(by_id.values()))
        kernel.block_size, kernel.grid_size = first["block"], first["grid"]
        for field_name in METRICS:
            values = [launch["metrics"].get(field_name) for launch in by_id.values()]
            values = [value for value in values if value is not None]
            if values:
                mean = round(sum(values) / len(values), 3)
                setattr(kernel, "duration_us" if field_name == "duration" else field_name, mean)
        hints: dict[str, NcuHint] = {}
        for launch in by_id.values():
            for rule, hint in launch["hints"].items():
                kept = hints.get(rule)
                if kept is None or (hint.estimated_speedup_pct or 0) > (kept.estimated_speedup_pct or 0):
                    hints[rule] = hint
        kernel.hints = sorted(hints.values(), key=lambda hint: -(hint.estimated_speedup_pct or 0))
        kernels.append(kernel)
    return kernels


class NcuRow(msgspec.Struct):
    """One kernel of the run's kernel table with Nsight Compute's figures beside it."""

    kernel: str
    """The name as the trace has it."""
    pct: float
    """Its share of the run's kernel time, %."""
    total_ms: float
    count: int
    ncu: NcuKernel | None
    """None: not profiled (no matching launch within the launch count)."""


def join(top_kernels: Sequence, ncu_kernels: Sequence[NcuKernel]) -> list[NcuRow]:
    """Each of ``top_kernels`` (the run's ``KernelTime`` rows: name, count, total_ms, pct) with the
    ncu figures of its function name."""
    by_name = {kernel.name: kernel for kernel in ncu_kernels}
    return [
        NcuRow(row.name, row.pct, row.total_ms, row.count, by_name.get(kernel_base_name(row.name)))
        for row in top_kernels
    ]


def top_kernels(run: str | Path, top: int) -> list:
    """The run's ``KernelTime`` rows, most GPU time first (the report's kernel table), at most ``top``."""
    from trainprof.analysis import analyze
    from trainprof.analysis.kernels import TopKernelsDetails

    analysis = analyze(run)
    for finding in analysis.findings:
        if isinstance(finding.details, TopKernelsDetails):
            return list(finding.details.kernels[:top])
    raise NcuError(f"{run}: the run's traces hold no GPU kernels in their steps")


def profile(
    command: Sequence[str],
    names: Sequence[str],
    out_dir: Path,
    launch_skip: int,
    launch_count: int,
    ncu: str = "ncu",
    regex: str | None = None,
) -> str:
    """Run ``command`` under ncu and return its details page as CSV (also saved as OUT/ncu.csv)."""
    import subprocess

    from trainprof.files import write_text_atomically

    executable = shutil.which(ncu)
    if executable is None:
        raise NcuError(f"{ncu!r} is not on PATH (Nsight Compute's command line; or pass --ncu PATH)")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "ncu"
    profiled = subprocess.run(
        ncu_command(command, names, report, launch_skip, launch_count, executable, regex=regex),
        capture_output=True,
        text=True,
    )
    write_text_atomically(out_dir / "ncu.log", profiled.stdout + profiled.stderr)
    if not (out_dir / "ncu.ncu-rep").exists():
        tail = " ".join((profiled.stdout + profiled.stderr).split()[-40:])
        raise NcuError(f"ncu wrote no report (exit {profiled.returncode}); its last words: {tail}")
    page = subprocess.run(import_command(out_dir / "ncu.ncu-rep", executable), capture_output=True, text=True)
    if page.returncode != 0:
        raise NcuError(f"ncu --import failed (exit {page.returncode}): {page.stderr.strip()[:300]}")
    write_text_atomically(out_dir / "ncu.csv", page.stdout)
    return page.stdout


def to_dict(rows: Sequence[NcuRow]) -> list[dict]:
    """JSON-ready rows."""
    return msgspec.to_builtins(list(rows))
