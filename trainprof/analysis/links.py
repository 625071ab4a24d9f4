"""The link a collective runs over, and its bandwidth: what a collective's bus bandwidth is held to.

A trace says which GPU recorded it (`deviceProperties[].name`) and how many GPUs its process saw
(the length of that list: the node's GPUs, unless `CUDA_VISIBLE_DEVICES` hid some); the collective's
record says how many ranks took part (`Group size`, else `distributedInfo.world_size`). A group no
larger than the GPUs the trace lists runs inside one node, over the GPU's own fabric (NVLink,
Infinity Fabric, or PCIe for cards without one); a larger group crosses the network, whose speed
no trace records: `NETWORK` assumes one 400 Gb/s NIC per GPU, and the link says so.

Bandwidths are per GPU and per direction, the figure NCCL's bus bandwidth is meant to approach
(nccl-tests `doc/PERFORMANCE.md`: "busbw ... should be compared to the hardware peak bandwidth").
Vendors quote NVLink and Infinity Fabric as both directions together: the table halves them.
"""

from __future__ import annotations

import re

import msgspec

from trainprof.analysis.records import Record


class LinkSpec(msgspec.Struct, frozen=True):
    """One row of `LINKS`: GPUs whose name matches `pattern` talk over `kind` at `gbps` GB/s per
    direction; `source` is where the figure comes from."""

    pattern: str
    kind: str
    gbps: float
    source: str


# First match wins: the specific variants (PCIe cards, NVL bridges, export parts) before their family.
LINKS: tuple[LinkSpec, ...] = (
    LinkSpec(r"\bG?B(100|200|300)\b", "NVLink 5", 900.0,
             "NVIDIA Blackwell (B200/GB200) datasheet: NVLink 1.8 TB/s per GPU, both directions"),
    LinkSpec(r"\bH100 NVL\b", "NVLink bridge", 300.0,
             "NVIDIA H100 NVL product brief: NVLink bridge 600 GB/s, both directions"),
    LinkSpec(r"\bH100\b.*\bPCIe\b", "PCIe 5.0 x16", 64.0,
             "NVIDIA H100 PCIe datasheet: PCIe Gen5 128 GB/s, both directions"),
    LinkSpec(r"\bH800\b", "NVLink 4 (H800)", 200.0,
             "NVIDIA H800 SXM: NVLink 400 GB/s, both directions"),
    LinkSpec(r"\b(GH200|H100|H200|H20)\b", "NVLink 4", 450.0,
             "NVIDIA H100/H200 SXM datasheets: NVLink 900 GB/s, both directions (18 links x 50 GB/s)"),
    LinkSpec(r"\bA800\b", "NVLink 3 (A800)", 200.0,
             "NVIDIA A800 SXM: NVLink 400 GB/s, both directions"),
    LinkSpec(r"\bA100\b.*\bPCIE\b", "PCIe 4.0 x16", 32.0,
             "NVIDIA A100 PCIe datasheet: PCIe Gen4 64 GB/s, both directions"),
    LinkSpec(r"\bA100\b", "NVLink 3", 300.0,
             "NVIDIA A100 SXM datasheet: NVLink 600 GB/s, both directions (12 links x 50 GB/s)"),
    LinkSpec(r"\bV100\b.*\b(SXM|DGX)", "NVLink 2", 150.0,
             "NVIDIA V100 SXM2 datasheet: NVLink 300 GB/s, both directions (DGX systems' V100s)"),
    LinkSpec(r"\bMI3(00|25)X\b", "Infinity Fabric", 448.0,
             "AMD Instinct MI300X datasheet: 7 Infinity Fabric links of 128 GB/s, both directions"),
    LinkSpec(r"\b(V100|T4|L4|L40S?|A10G?|A30|A40|RTX|GeForce|Quadro)\b", "PCIe 4.0 x16", 32.0,
             "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 32 GB/s per direction (the newest PCIe these "
             "cards share; older slots are slower)"),
)

NETWORK = LinkSpec(
    "", "network (assumed: 400 Gb/s per GPU)", 50.0,
    "no trace records the network: one 400 Gb/s NIC per GPU assumed (InfiniBand NDR or 400G "
    "Ethernet, as in NVIDIA DGX H100/H200 and AMD MI300X platforms)",
)


class Link(Record, frozen=True):
    """The link a process group's collectives run over: `kind`, `gbps` per direction, `source` of
    the figure, and `assumed` when the trace could not tell (the network's speed)."""

    kind: str
    gbps: float
    source: str
    assumed: bool


def link_for(device: str | None, visible_gpus: int, group_size: int | None) -> Link | None:
    """The link of a `group_size`-rank collective run by a `device` that saw `visible_gpus` GPUs.

    None when the device is unknown (a CPU trace, a GPU missing from `LINKS`).
    """
    if not device:
        return None
    if group_size is not None and group_size > max(visible_gpus, 1):
        return Link(NETWORK.kind, NETWORK.gbps, NETWORK.source, assumed=True)
    for spec in LINKS:
        if re.search(spec.pattern, device, re.IGNORECASE):
            return Link(spec.kind, spec.gbps, spec.source, assumed=False)
    return None
