"""On a GPU: the session's un-profiled steps time the loop as CUDA events do, and the profiler's slowdown
of a launch-bound loop is seen and leaves its verdict launch-bound."""

from __future__ import annotations

import time

import pytest
import torch

import trainprof

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_the_session_times_unprofiled_steps_as_cuda_events_do(tmp_path):
    device = torch.device("cuda")
    blocks = [(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.LayerNorm(256)) for _ in range(32)]
    model = torch.nn.Sequential(*[layer for block in blocks for layer in block]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, 256, device=device)

    def step() -> None:
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):  # whole iterations back to back, as the session's steps are
        step()
    torch.cuda.synchronize()
    iteration_ms = (time.perf_counter() - start) * 1e3 / 20
    with trainprof.session(log_dir=tmp_path, run_name="r", wait=1, warmup=1, active=2, console=False) as sess:
        for _ in range(12):  # steps 4-11 run after the window
            step()
    cost = sess.analysis.traces[0].profiler
    assert cost is not None and cost.unprofiled_steps == 8 and cost.timing == "cuda_events"
    assert cost.unprofiled_step_ms == pytest.approx(iteration_ms, rel=0.3)
    assert cost.slowed  # stacks, shapes and memory cost far more than this loop's 12 ms of launches
    assert sess.summary.verdict == "launch-bound"


def test_a_cuda_graph_captured_inside_a_session_still_captures(tmp_path):
    """The optimizer step inside `torch.cuda.graph` ends a session step on a capturing stream: the
    session must record nothing there (an event would invalidate the capture), and the graph replays."""
    device = torch.device("cuda")
    model = torch.nn.Linear(64, 64).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, capturable=True)
    x = torch.randn(8, 64, device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        optimizer.step()

    with trainprof.session(log_dir=tmp_path, run_name="r", wait=1, warmup=1, active=1, console=False) as sess:
        for _ in range(4):  # the window ends at step 3
            step()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            model(x).pow(2).mean().backward()
            optimizer.step()
        before = model.weight.detach().clone()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert not torch.equal(before, model.weight)  # the captured step ran
        for _ in range(2):
            step()
    assert sess.summary.verdict != "not-profiled"
    assert sess.unprofiled_timing == "cuda_events" and sess.unprofiled_step_ms
