"""No printed efficiency passes 100% of a peak, on every checked-in trace and the demo's sample.

A share of a peak above 100% is physically impossible, and one such figure costs the reader's trust
in every other: counted work that a kernel would have done faster than the datasheet allows is a
miscount (or a cache hit) and counts as unknown; a kernel faster than the measured peak raises the
achievable peak (`busy.physical_work`); MFU is read against the datasheet's dense peak with the
achievable one beside it. Each trace is analysed once; its JSON form and its console and Markdown
reports are all checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainprof.analysis import analyze
from trainprof.analysis.peaks import datasheet_tflops
from trainprof.report.console import render_text
from trainprof.report.markdown import render_markdown

ROOT = Path(__file__).resolve().parents[1]
SHARE_KEYS = {
    "peak_pct", "flops_peak_pct", "bytes_peak_pct", "mfu_pct", "mfu_achievable_pct", "bandwidth_pct"
}
"""The JSON fields that are a share of a device's peak (`_pct` out of 100)."""
FOLDER_COUNT = 35
"""Run folders under tests/fixtures plus the demo's sample: a new fixture raises it."""
PRINTED_SHARE = re.compile(
    r"(\d[\d,]*(?:\.\d+)?) ?% of (?:the )?(?:\w+ )?"
    r"(?:datasheet|achievable|peak|copy bandwidth|\d[\d.,]* TB/s)"
)


def _folders(fixtures_dir: Path) -> list[Path]:
    """Every fixture run folder (one analysis each) and the demo's sample."""
    groups = [fixtures_dir / name for name in ("busy", "ranks", "stacks", "thirdparty", "traces")]
    folders = [leaf for group in groups for leaf in sorted(group.glob("*")) if leaf.is_dir()]
    folders = [inner for folder in folders
               for inner in ([folder] if any(folder.glob("*.json*")) else sorted(folder.glob("*")))
               if inner.is_dir()]
    return folders + [ROOT / "trainprof" / "samples" / "h200_llama"]


def _shares(value, path: str = "") -> list[tuple[str, float]]:
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            if key in SHARE_KEYS and isinstance(item, (int, float)):
                found.append((f"{path}.{key}", float(item)))
            found.extend(_shares(item, f"{path}.{key}"))
        return found
    if isinstance(value, list):
        return [share for i, item in enumerate(value) for share in _shares(item, f"{path}[{i}]")]
    return []


def test_every_fixture_folder_is_checked(fixtures_dir):
    folders = _folders(fixtures_dir)
    assert len(folders) == FOLDER_COUNT
    assert {"llama_swap", "tl_b200_eager", "tl_h100_bert_small", "h200_llama"} <= {
        part for folder in folders for part in folder.parts
    }


@pytest.mark.parametrize("index", range(FOLDER_COUNT))
def test_no_printed_efficiency_passes_100_percent(fixtures_dir, index):
    folder = _folders(fixtures_dir)[index]
    result = analyze(folder)
    shares = _shares(result.to_dict())
    assert [(path, value) for path, value in shares if value > 100.0] == [], folder
    for text in (render_text(result, width=200), render_markdown(result)):
        printed = [float(m.group(1).replace(",", "")) for m in PRINTED_SHARE.finditer(text)]
        assert all(value <= 100.0 for value in printed), (folder, [v for v in printed if v > 100])
        for line in text.splitlines():  # the class table's "% of achievable" column
            if "TFLOP/s" in line or "TB/s" in line:
                cells = [c for c in re.split(r"\s{2,}|\|", line.strip()) if c.strip()]
                if len(cells) >= 5 and re.fullmatch(r"\d+", cells[-1].strip()):
                    assert int(cells[-1]) <= 100, (folder, line)


def test_the_mfu_is_against_the_datasheet_with_the_achievable_peak_beside_it(fixtures_dir):
    """The demo's H200 Llama: 41% of the bf16 datasheet's 989 TFLOP/s dense, as torchtitan, Megatron
    and nanoGPT report MFU; the achievable peak (measured 804, raised to the trace's best GEMM)
    beside it; `trainprof ab` reads the same table (`peaks.datasheet_tflops`)."""
    summary = analyze(ROOT / "trainprof" / "samples" / "h200_llama").summary
    assert summary.mfu_dtype == "bf16" and summary.mfu_peak_tflops == datasheet_tflops("NVIDIA H200", "bf16")
    assert summary.mfu_peak_tflops == 989.4
    assert 804.0 <= summary.mfu_achievable_tflops < 989.4
    ratio = summary.mfu_achievable_pct / summary.mfu_pct
    assert ratio == pytest.approx(summary.mfu_peak_tflops / summary.mfu_achievable_tflops, rel=0.01)
    assert 35 < summary.mfu_pct < 50
