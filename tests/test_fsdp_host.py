"""FSDP2's own host time (`trainprof.analysis.fsdp_host`): its hooks' host time and the GPU-idle time
inside them, by hook, on a trace written here with figures worked out below; and the fix it names."""

from __future__ import annotations

import pytest
from test_comm import BACKWARD, MAIN, Trace

from trainprof.analysis import analyze

UNITS = 4
STEP_US = 60_000.0


def _fsdp2_trace(path, reshard: bool):
    """Three 60 ms steps. Each unit's forward: a 2 ms `FSDP::pre_forward` hook that launches a 0.3 ms
    copy at its end, then 4 ms of compute. Each unit's backward (on autograd's thread): with
    resharding, a 1.5 ms `FSDP::pre_backward` hook launching a 0.4 ms copy-in and all-gather, then
    5 ms of compute. The GPU idles inside the hooks except while their copies run."""
    trace = Trace()
    for number in range(3):
        start = 1_000.0 + number * STEP_US
        trace.step(number + 1, start, STEP_US)
        t = start + 100.0
        for unit in range(UNITS):
            trace.host("user_annotation", f"FSDP::pre_forward (layers.{unit})", t, 2_000)
            trace.kernel("copy_in", t + 1_690, t + 1_700, 300)
            trace.kernel("gemm_forward", t + 2_010, t + 2_010, 4_000)
            t += 6_100
        for unit in reversed(range(UNITS)):
            if reshard:
                trace.host("user_annotation", f"FSDP::pre_backward (layers.{unit})", t, 1_500, tid=BACKWARD)
                trace.kernel("all_gather_copy", t + 1_090, t + 1_100, 400, tid=BACKWARD)
                t += 1_500
            trace.kernel("gemm_backward", t + 10, t + 10, 5_000, tid=BACKWARD)
            t += 5_050
    return trace.write(path)


def _finding(analysis):
    found = [f for f in analysis.findings if f.kind == "fsdp_host"]
    return found[0] if found else None


def test_the_hooks_gpu_idle_and_what_resharding_less_would_win(tmp_path):
    analysis = analyze(_fsdp2_trace(tmp_path / "t.json", reshard=True))
    finding = _finding(analysis)
    hooks = {row.hook: row for row in finding.details.hooks}
    # per step: 4 pre_forward hooks of 2 ms with 0.3 ms of copy inside each (the copy's last 0.3 ms:
    # 1.7-2.0 ms of the hook); 4 pre_backward hooks of 1.5 ms with 0.4 ms of copy inside each
    assert hooks["pre_forward"].host_ms_per_step == pytest.approx(UNITS * 2.0)
    assert hooks["pre_forward"].gpu_idle_ms_per_step == pytest.approx(UNITS * (2.0 - 0.3), abs=0.01)
    assert hooks["pre_backward"].gpu_idle_ms_per_step == pytest.approx(UNITS * (1.5 - 0.4), abs=0.01)
    assert hooks["pre_backward"].kernel_ms_per_step == pytest.approx(UNITS * 0.4)
    assert finding.details.units == UNITS
    # without the backward's all-gathers their hook's idle time and their copies go
    assert finding.gpu_ms_per_step == pytest.approx(UNITS * 1.5, abs=0.01)
    assert "reshard_after_forward=False" in finding.fix and finding.op == "FSDP::pre_backward"
    assert finding.details.gpu_idle_ms_per_step == pytest.approx(UNITS * (1.7 + 1.1), abs=0.01)


def test_a_backward_that_gathers_nothing_is_not_told_to_reshard_less(tmp_path):
    finding = _finding(analyze(_fsdp2_trace(tmp_path / "t.json", reshard=False)))
    assert finding is not None and finding.gpu_ms_per_step == 0.0
    assert "gathers next to nothing already" in finding.fix
    assert "pre_backward" not in {row.hook for row in finding.details.hooks}


def test_a_trace_without_fsdp2_has_no_such_finding(tmp_path):
    trace = Trace()
    trace.step(1, 0.0, 10_000)
    trace.host("user_annotation", "DistributedDataParallel.forward", 100, 2_000, tid=MAIN)
    trace.kernel("gemm", 200, 300, 8_000)
    assert _finding(analyze(trace.write(tmp_path / "t.json"))) is None
