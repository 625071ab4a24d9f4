"""On a GPU: a real out-of-memory error inside a session is explained and leaves unchanged; the
allocator's history is written and drawn; the headroom's batch runs; fragmentation is found without
expandable segments and not with them (`benchmarks/memory_checks.py` has the larger runs)."""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainprof
from trainprof.capture.memory import parse_message
from trainprof.trace import memory_file

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cache_given_back():
    """After each test, the memory its tensors left in this process's cache goes back to the device: the
    headroom test fills the GPU, and the fragmentation check's own process needs nearly all of it (H200,
    2026-11-29: 136.75 GiB still cached here made that process run out of memory)."""
    yield
    gc.collect()
    torch.cuda.empty_cache()


class _Greedy(torch.nn.Module):
    """An MLP whose forward asks for more memory than the device has once told to."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 1))
        self.greedy = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.greedy:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=x.device)
        return self.net(x)


def test_a_real_out_of_memory_error_is_explained_and_raised_unchanged(tmp_path):
    model = _Greedy().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    seen = {}
    with pytest.raises(torch.OutOfMemoryError) as raised:
        with trainprof.session(tmp_path, "run", wait=1, warmup=1, active=2, console=False) as sess:
            for step in range(8):
                model.greedy = step == 5
                try:
                    model(torch.randn(64, 256, device="cuda")).pow(2).mean().backward()
                except torch.OutOfMemoryError as error:
                    seen["error"], seen["tb"] = error, error.__traceback__
                    raise
                optimizer.step()
                optimizer.zero_grad()
    assert raised.value is seen["error"]
    tb = raised.value.__traceback__
    while tb is not None and tb is not seen["tb"]:
        tb = tb.tb_next
    assert tb is seen["tb"]  # the traceback as it was raised is still the error's, extended only upward
    finding = sess.findings[0]
    assert finding.kind == "out_of_memory" and finding.severity == "high"
    details = finding.details
    assert details.observed  # the allocator's callback read the state at the failing allocation
    asked = parse_message(str(raised.value)).requested_bytes
    total = torch.cuda.get_device_properties(0).total_memory
    assert details.requested_bytes == asked and asked >= 2 * total * 0.99
    held = {h.category: h.bytes for h in details.held}
    assert held["parameters"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert held["optimizer_state"] >= 2 * held["parameters"]
    assert details.module == "_Greedy" and details.failing_inputs[0].shape == [64, 256]
    document = memory_file.decode((sess.run_dir / f"{sess.worker}.memory.json").read_bytes())
    assert document.out_of_memory.observed and document.windows  # a window's state, then the error's
    assert document.out_of_memory.state.stats.num_ooms >= 1
    assert json.loads((sess.run_dir / "summary.json").read_text())["findings"][0]["kind"] == "out_of_memory"
    assert (sess.run_dir / "report.html").read_text().rstrip().endswith("</html>")


def test_the_allocator_history_is_written_for_pytorchs_viewer_and_drawn(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with trainprof.session(tmp_path, "run", wait=1, warmup=1, active=2, console=False,
                           memory_history=True) as sess:
        for _ in range(6):
            model(torch.randn(128, 512, device="cuda")).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    with open(sess.run_dir / f"{sess.worker}.memory_history.pickle", "rb") as file:
        snapshot = pickle.load(file)  # our own file, just written: what PyTorch's viewer opens
    assert any(entry["action"] == "alloc" for entry in snapshot["device_traces"][0])
    history = sess.analysis.traces[0].memory_history
    assert history is not None and history.entries > 0 and set(history.step_marks) >= {2, 3}
    assert "Allocator history" in (sess.run_dir / "report.html").read_text()


def test_the_headroom_batch_runs_and_fifteen_percent_more_does_not(tmp_path):
    """An MLP whose activations grow with its rows: the rows the headroom says fit run."""
    width, rows = 8192, 16_384
    with torch.device("cuda"):
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                      for _ in range(4)]).to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(n: int) -> None:
        model(torch.randn(n, width, device="cuda", dtype=torch.bfloat16)).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with trainprof.session(tmp_path, "run", wait=1, warmup=1, active=2, console=False) as sess:
        for _ in range(5):
            step(rows)
    room = sess.analysis.traces[0].headroom
    assert room is not None and room.tokens is None  # no token ids: a factor, not a batch
    predicted = int(rows * room.fits_times)
    torch.cuda.empty_cache()
    step(predicted)  # fits
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    with pytest.raises(torch.OutOfMemoryError):
        step(int(predicted * 1.15) + 1)


@pytest.mark.parametrize("expandable", [False, True])
def test_fragmentation_is_found_without_expandable_segments_and_not_with_them(tmp_path, expandable):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "fragmentation.json"
    command = [sys.executable, "-m", "benchmarks.memory_checks", "--part", "fragmentation", "--out", str(out),
               "--log-dir", str(tmp_path / "log")]
    subprocess.run(command, cwd=ROOT, env=env, timeout=600, check=False)
    result = json.loads(out.read_text())
    assert result["ok"], result["errors"]
    assert result["expandable_segments"] == expandable
    assert result["finding_fired"] == (not expandable), result["trainprof"]["fragmentation"]
