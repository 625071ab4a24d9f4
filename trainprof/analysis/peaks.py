"""What the device can do: its matmul rate per math dtype and its copy bandwidth, the ceilings that
achieved TFLOP/s, TB/s and MFU are read against, twice over.

- Achievable: the rates the session measured on the device itself (`<worker>.peaks.json` beside the
  trace, `trainprof.capture.peaks`), else this project's measurement of such a device, else its
  datasheet (`KNOWN_DEVICES`, matched on the trace's `deviceProperties` name). A measurement is a
  floor of what the device does, not a ceiling: where the trace's own kernels beat it, the best of
  them is the achievable rate (`busy.kernel_work`), so no share of it passes 100%.
- Datasheet: the vendor's dense (no sparsity) matmul rate per dtype and memory bandwidth. MFU is
  read against it, as torchtitan, Megatron-LM and nanoGPT report it; and it is the physical ceiling:
  counted work that would pass it is a miscount (or data served from cache), so it counts as unknown.

Every figure the analysis derives says which source it used.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple, TypeGuard

from trainprof.analysis.records import Record
from trainprof.trace import Trace

MATH_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""The math dtypes peaks are given for: fp32 without tensor cores (TF32 off), TF32, bf16, fp16, fp8."""


class DevicePeaks(Record, frozen=True):
    """A device's ceilings: dense matmul TFLOP/s per math dtype (`MATH_DTYPES`; a dtype the device
    lacks is absent) and copy bandwidth in TB/s (bytes read plus written per second), twice over.

    `matmul_tflops` and `copy_tb_s` are what the device achieves: measured (by the session on this
    device, or by this project on one like it), raised to the best rate the trace's own kernels show
    where they beat it (`raised`: dtype or `copy` -> that rate; `busy.kernel_work`), else the
    datasheet's; shares of peak, and every prediction, are read against them. `datasheet_tflops`
    and `datasheet_tb_s` are the vendor's dense figures (`{}` / None for a device the table lacks):
    what the field reads MFU against (torchtitan, Megatron, nanoGPT), and the physical ceiling no
    kernel's counted work may pass (work that seems to is a miscount or a cache hit: unknown).

    `source` is `measured` (by the session, on this device) or `table` (`KNOWN_DEVICES`);
    `detail` says which measurement or which row and its origin, for the report; `short_label` is a
    few words for a headline (`H200 (measured)`, `H100 SXM datasheet`).
    """

    device: str
    source: str
    detail: str
    matmul_tflops: dict[str, float]
    copy_tb_s: float | None
    short_label: str
    datasheet_tflops: dict[str, float] = {}
    datasheet_tb_s: float | None = None
    raised: dict[str, float] = {}

    def flops_per_s(self, dtype: str | None) -> float | None:
        """The achievable matmul rate of `dtype` in FLOP/s, or None when unknown."""
        value = self.matmul_tflops.get(dtype or "")
        return value * 1e12 if value else None

    def datasheet_flops_per_s(self, dtype: str | None) -> float | None:
        """The datasheet's dense matmul rate of `dtype` in FLOP/s, or None when unknown."""
        value = self.datasheet_tflops.get(dtype or "")
        return value * 1e12 if value else None

    @property
    def bytes_per_s(self) -> float | None:
        """The achievable copy bandwidth in bytes/s, or None when unknown."""
        return self.copy_tb_s * 1e12 if self.copy_tb_s else None

    @property
    def datasheet_bytes_per_s(self) -> float | None:
        """The datasheet's memory bandwidth in bytes/s, or None when unknown."""
        return self.datasheet_tb_s * 1e12 if self.datasheet_tb_s else None

    @property
    def label(self) -> str:
        """One line for a report: `measured on this device (...)` or `table: ...`."""
        raised = ", ".join(
            f"{key} {rate:,.2f} TB/s" if key == "copy" else f"{key} {rate:,.0f} TFLOP/s"
            for key, rate in self.raised.items()
        )
        text = f"{self.source}: {self.detail}"
        if raised:
            text += f"; raised to the best rate of this trace's own kernels: {raised}"
        if self.datasheet_tflops:
            text += f"; MFU against the datasheet's dense {_rates_text(self.datasheet_tflops)}"
        return text


def _rates_text(tflops: dict[str, float]) -> str:
    return ", ".join(f"{dtype} {rate:,.0f}" for dtype, rate in tflops.items()) + " TFLOP/s"


class Origin(NamedTuple):
    """Where a `KNOWN_DEVICES` row's figures come from: in a word (`short`) and in full (`detail`)."""

    short: str
    detail: str


class Measured(NamedTuple):
    """What this project measured on a device of a `KNOWN_DEVICES` row: the rates it achieves."""

    matmul_tflops: dict[str, float]
    copy_tb_s: float
    origin: Origin


class KnownDevice(NamedTuple):
    """One row of `KNOWN_DEVICES`: the devices whose trace name matches `pattern` (a regex searched in
    `deviceProperties.name`; `min_memory_gib`, when set, also requires that much `totalGlobalMem`).

    `matmul_tflops` (dense, per math dtype) and `memory_tb_s` are the vendor's datasheet (`origin`);
    `measured`, where this project measured such a device, is what it achieves (else the datasheet
    stands in for it)."""

    pattern: str
    label: str
    origin: Origin
    matmul_tflops: dict[str, float]
    memory_tb_s: float
    min_memory_gib: float = 0.0
    measured: Measured | None = None


_MEASURED_H200 = Origin(
    "(measured)",
    "measured by this project on the lent H200, torch 2.11, 2026-11-25: an 8192^3 matmul per dtype, "
    "a 4 GiB device-to-device copy (tests/fixtures/busy/timings.json)",
)
_NVIDIA = Origin(
    "datasheet", "NVIDIA datasheet, dense (no sparsity); memory bandwidth, a copy reaches ~90% of it"
)
_AMD = Origin("datasheet", "AMD datasheet, dense (no sparsity); memory bandwidth, a copy reaches ~90% of it")


# The A100's dense matmul peaks: the same chip in its PCIe, 80 GB SXM and 40 GB forms.
_A100_TFLOPS = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}
# The H100 SXM and H200 share the chip and its clocks: the same dense matmul peaks (NVIDIA's datasheets
# print twice these, with 2:4 sparsity); the H200's HBM3e gives it 4.8 TB/s against 3.35.
_HOPPER_SXM_TFLOPS = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9}
# B200 and B300 (HGX, per GPU): the same 16-bit, TF32 and fp8 dense rates; 8 TB/s of HBM3e.
_BLACKWELL_TFLOPS = {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0, "fp8": 4500.0}


def _without_vendor(device: str) -> str:
    """`H100 SXM` for `NVIDIA H100 SXM`: the short label leaves the vendor out."""
    for vendor in ("NVIDIA ", "AMD "):
        device = device.removeprefix(vendor)
    return device

KNOWN_DEVICES: tuple[KnownDevice, ...] = (
    # First match wins: specific names before the families that contain them.
    KnownDevice(
        r"H200",
        "NVIDIA H200",
        _NVIDIA,
        _HOPPER_SXM_TFLOPS,
        4.8,
        measured=Measured({"bf16": 804.0, "fp16": 773.0, "tf32": 404.0, "fp32": 50.5}, 4.30, _MEASURED_H200),
    ),
    KnownDevice(
        r"H100.*PCIe",
        "NVIDIA H100 PCIe",
        _NVIDIA,
        {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2, "fp8": 1513.0},
        2.0,
    ),
    KnownDevice(
        r"H100.*NVL",
        "NVIDIA H100 NVL",
        _NVIDIA,
        {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0, "fp8": 1671.0},
        3.9,
    ),
    KnownDevice(r"H100", "NVIDIA H100 SXM", _NVIDIA, _HOPPER_SXM_TFLOPS, 3.35),
    KnownDevice(r"B300", "NVIDIA B300", _NVIDIA, _BLACKWELL_TFLOPS, 8.0),
    KnownDevice(r"B200", "NVIDIA B200", _NVIDIA, _BLACKWELL_TFLOPS, 8.0),
    KnownDevice(
        r"A100.*PCIe",
        "NVIDIA A100 80GB PCIe",
        _NVIDIA,
        _A100_TFLOPS,
        1.935,
        min_memory_gib=60,
    ),
    KnownDevice(
        r"A100",
        "NVIDIA A100 80GB SXM",
        _NVIDIA,
        _A100_TFLOPS,
        2.039,
        min_memory_gib=60,
    ),
    KnownDevice(
        r"A100",
        "NVIDIA A100 40GB",
        _NVIDIA,
        _A100_TFLOPS,
        1.555,
    ),
    KnownDevice(
        r"L40S",
        "NVIDIA L40S",
        _NVIDIA,
        {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6, "fp8": 733.0},
        0.864,
    ),
    KnownDevice(
        r"\bL4\b",
        "NVIDIA L4",
        _NVIDIA,
        {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3, "fp8": 242.0},
        0.3,
    ),
    KnownDevice(r"V100.*PCIE", "NVIDIA V100 PCIe", _NVIDIA, {"fp16": 112.0, "fp32": 14.0}, 0.9),
    KnownDevice(r"V100", "NVIDIA V100 SXM2", _NVIDIA, {"fp16": 125.0, "fp32": 15.7}, 0.9),
    # GeForce Turing: fp16 tensor cores at half rate with the fp32 accumulation cuBLAS uses.
    KnownDevice(r"RTX 2080 Ti", "NVIDIA GeForce RTX 2080 Ti", _NVIDIA, {"fp16": 53.8, "fp32": 13.4}, 0.616),
    KnownDevice(
        r"MI300X",
        "AMD Instinct MI300X",
        _AMD,
        {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4, "fp8": 2614.9},
        5.3,
    ),
)


def known_device(name: str, memory_bytes: float | None = None) -> KnownDevice | None:
    """The `KNOWN_DEVICES` row for a device name (and memory size, for rows that need one), or None."""
    gib = (memory_bytes or 0) / 2**30
    for row in KNOWN_DEVICES:
        if re.search(row.pattern, name, re.IGNORECASE) and gib >= row.min_memory_gib:
            return row
    return None


def device_peaks(trace: Trace) -> DevicePeaks | None:
    """The peaks for a trace's device: measured by the session when it wrote them beside the trace,
    else the table's row for the device's name; None for an unknown device (or no GPU). Either way
    with the row's datasheet figures where the table knows the device."""
    props = trace.device_properties[0] if trace.device_properties else {}
    name = props.get("name") if isinstance(props.get("name"), str) else None
    memory = props.get("totalGlobalMem")
    memory = memory if isinstance(memory, (int, float)) and not isinstance(memory, bool) else None
    measured = measured_peaks(trace.device_peaks, name, memory) if trace.device_peaks else None
    if measured is not None:
        return measured
    if name is None:
        return None
    row = known_device(name, memory)
    if row is None:
        return None
    achieved = row.measured
    origin = achieved.origin if achieved is not None else row.origin
    return DevicePeaks(
        device=name,
        source="table",
        detail=f"{row.label}, {origin.detail}",
        matmul_tflops=dict(achieved.matmul_tflops if achieved is not None else row.matmul_tflops),
        copy_tb_s=achieved.copy_tb_s if achieved is not None else row.memory_tb_s,
        short_label=f"{_without_vendor(row.label)} {origin.short}",
        datasheet_tflops=dict(row.matmul_tflops),
        datasheet_tb_s=row.memory_tb_s,
    )


def measured_peaks(
    document: dict, trace_device: str | None, memory_bytes: float | None = None
) -> DevicePeaks | None:
    """A `<worker>.peaks.json` document as peaks (format: `trainprof.capture.peaks`), with the
    datasheet figures of its device's `KNOWN_DEVICES` row; None when it holds no usable rate, or was
    measured on another device than the trace's."""
    device = document.get("device")
    if not isinstance(device, str) or (trace_device is not None and device != trace_device):
        return None
    rates = document.get("matmul_tflops")
    rates = rates if isinstance(rates, dict) else {}
    tflops = {dtype: float(rates[dtype]) for dtype in MATH_DTYPES if _positive(rates.get(dtype))}
    copy = document.get("copy_tb_s")
    if not tflops and not _positive(copy):
        return None
    how = ", ".join(
        str(document[key]) for key in ("how", "torch", "date") if isinstance(document.get(key), str)
    )
    row = known_device(device, memory_bytes)
    return DevicePeaks(
        device=device,
        source="measured",
        detail=f"on this device by the session ({how})" if how else "on this device by the session",
        matmul_tflops=tflops,
        copy_tb_s=float(copy) if _positive(copy) else None,
        short_label=f"{_without_vendor(device)} (measured)",
        datasheet_tflops=dict(row.matmul_tflops) if row is not None else {},
        datasheet_tb_s=row.memory_tb_s if row is not None else None,
    )


def datasheet_tflops(device: str, dtype: str, memory_bytes: float | None = None) -> float | None:
    """The datasheet's dense matmul TFLOP/s of `dtype` on the device named `device` (a
    `KNOWN_DEVICES` row), or None: what `trainprof ab` and the analysis both read MFU against."""
    row = known_device(device, memory_bytes)
    return row.matmul_tflops.get(dtype) if row is not None else None


def _positive(value: object) -> TypeGuard[float]:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )
