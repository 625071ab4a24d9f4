"""On a GPU: the session times each un-profiled step's start to its first forward as the GPU ran it
(`trainprof.capture.arrival`), without a sync in the loop, and leaves no global hook behind."""

from __future__ import annotations

import time

import pytest
import torch

import trainprof

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SLEEP_MS = 30.0


def test_the_gpu_waits_the_input_s_sleep_before_each_un_profiled_forward(tmp_path):
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with trainprof.session(log_dir=tmp_path, run_name="r", wait=1, warmup=1, active=2,
                           console=False, tensorboard_scalars=False) as sess:
        for _ in range(12):
            time.sleep(SLEEP_MS / 1e3)  # the input: the GPU has nothing queued meanwhile
            model(torch.randn(256, 1024, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert sess.unprofiled_timing == "cuda_events"
    marks = sess.unprofiled_pre_forward_ms
    assert len(marks) >= 6
    # the GPU reaches each forward the sleep after the step began (the previous step's work is
    # done by then: a few ms of kernels), never before it
    assert min(marks) >= 0.8 * SLEEP_MS and sorted(marks)[len(marks) // 2] < 1.5 * SLEEP_MS
    assert not torch.nn.modules.module._global_forward_pre_hooks
