"""On a GPU: the session measures the device's peaks, writes them beside its trace, and the analysis
reads the achieved throughput and MFU against them."""

from __future__ import annotations

import pytest
import torch

import trainprof
from trainprof.analysis.peaks import known_device
from trainprof.capture import peaks as capture

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_measured_peaks_are_near_the_table_and_the_users_precision_stays(tmp_path, monkeypatch):
    monkeypatch.setenv(capture.CACHE_DIR_ENV, str(tmp_path / "cache"))
    torch.set_float32_matmul_precision("medium")
    peaks = capture.current_device_peaks()
    assert torch.get_float32_matmul_precision() == "medium"
    torch.set_float32_matmul_precision("highest")
    rates = peaks["matmul_tflops"]
    assert rates["fp32"] < rates["fp16"] and peaks["copy_tb_s"] > 0.1
    row = known_device(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory)
    if row is not None:  # near the table's figures (a datasheet's are an upper bound)
        for dtype, rate in rates.items():
            if dtype in row.matmul_tflops:
                assert 0.3 * row.matmul_tflops[dtype] < rate < 1.3 * row.matmul_tflops[dtype], dtype


def test_a_session_reads_its_own_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv(capture.CACHE_DIR_ENV, str(tmp_path / "cache"))
    layers = (torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    model = torch.nn.Sequential(*layers).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 1024, device="cuda")
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=1, warmup=1, active=2, console=False,
                           tensorboard_scalars=False) as sess:
        for _ in range(5):
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert (tmp_path / "run" / f"{sess.worker}.peaks.json").is_file()
    (trace,) = sess.analysis.traces
    assert trace.busy.peaks.source == "measured"
    assert sess.summary.mfu_pct is not None and "measured" in sess.summary.peaks_source
