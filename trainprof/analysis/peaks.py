"""What the device can do: its matmul rate per math dtype and its copy bandwidth, the ceilings that
achieved TFLOP/s, TB/s and MFU are read against.

Two sources, in this order: the rates the session measured on the device itself (`<worker>.peaks.json`
beside the trace, `trainprof.capture.peaks`), else `KNOWN_DEVICES` below, matched on the trace's
`deviceProperties` name. Every figure the analysis derives says which source it used.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from trainprof.analysis.result import Record
from trainprof.trace import Trace

MATH_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""The math dtypes peaks are given for: fp32 without tensor cores (TF32 off), TF32, bf16, fp16, fp8."""


class DevicePeaks(Record, frozen=True):
    """A device's ceilings: dense matmul TFLOP/s per math dtype (`MATH_DTYPES`; a dtype the device
    lacks is absent) and copy bandwidth in TB/s (bytes read plus written per second).

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

    def flops_per_s(self, dtype: str | None) -> float | None:
        """The matmul peak of `dtype` in FLOP/s, or None when unknown."""
        value = self.matmul_tflops.get(dtype or "")
        return value * 1e12 if value else None

    @property
    def bytes_per_s(self) -> float | None:
        """The copy bandwidth in bytes/s, or None when unknown."""
        return self.copy_tb_s * 1e12 if self.copy_tb_s else None

    @property
    def label(self) -> str:
        """One line for a report: `measured on this device (...)` or `table: ...`."""
        return f"{self.source}: {self.detail}"


class Origin(NamedTuple):
    """Where a `KNOWN_DEVICES` row's figures come from: in a word (`short`) and in full (`detail`)."""

    short: str
    detail: str


class KnownDevice(NamedTuple):
    """One row of `KNOWN_DEVICES`: the devices whose trace name matches `pattern` (a regex searched in
    `deviceProperties.name`; `min_memory_gib`, when set, also requires that much `totalGlobalMem`)."""

    pattern: str
    label: str
    origin: Origin
    matmul_tflops: dict[str, float]
    copy_tb_s: float
    min_memory_gib: float = 0.0


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
        _MEASURED_H200,
        {"bf16": 804.0, "fp16": 773.0, "tf32": 404.0, "fp32": 50.5},
        4.30,
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
    KnownDevice(
        r"H100",
        "NVIDIA H100 SXM",
        _NVIDIA,
        {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9},
        3.35,
    ),
    KnownDevice(
        r"B200",
        "NVIDIA B200",
        _NVIDIA,
        {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0, "fp8": 4500.0},
        8.0,
    ),
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
    else the table's row for the device's name; None for an unknown device (or no GPU)."""
    props = trace.device_properties[0] if trace.device_properties else {}
    name = props.get("name") if isinstance(props.get("name"), str) else None
    measured = measured_peaks(trace.device_peaks, name) if trace.device_peaks else None
    if measured is not None:
        return measured
    if name is None:
        return None
    memory = props.get("totalGlobalMem")
    row = known_device(name, memory if isinstance(memory, (int, float)) else None)
    if row is None:
        return None
    return DevicePeaks(
        device=name,
        source="table",
        detail=f"{row.label}, {row.origin.detail}",
        matmul_tflops=dict(row.matmul_tflops),
        copy_tb_s=row.copy_tb_s,
        short_label=f"{_without_vendor(row.label)} {row.origin.short}",
    )


def measured_peaks(document: dict, trace_device: str | None) -> DevicePeaks | None:
    """A `<worker>.peaks.json` document as peaks (format: `trainprof.capture.peaks`); None when it
    holds no usable rate, or was measured on another device than the trace's."""
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
    return DevicePeaks(
        device=device,
        source="measured",
        detail=f"on this device by the session ({how})" if how else "on this device by the session",
        matmul_tflops=tflops,
        copy_tb_s=float(copy) if _positive(copy) else None,
        short_label=f"{_without_vendor(device)} (measured)",
    )


def _positive(value) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )
