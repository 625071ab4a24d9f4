"""Findings that fit the workload: the Python call behind the allocator's blocking calls, no optimizer
advice to an inference loop, the loop's thread never a sleeping helper, profiler start-up as profiler
overhead."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_idle_causes import MAIN, SIDE, STEP_US, TraceBuilder

from trainprof.analysis import Analysis, analyze
from trainprof.analysis.causes import Cause
from trainprof.analysis.timeline import build_timeline
from trainprof.trace import load_traces

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _empty_cache_steps(with_stack: bool) -> TraceBuilder:
    """Two steps: the loop calls torch.cuda.empty_cache() (30 ms of cudaFree, GPU idle), and the next
    forward allocates again (20 ms of cudaMalloc inside aten::mm)."""
    trace = TraceBuilder()
    for number, start in ((1, 0.0), (2, STEP_US)):
        trace.step(number, start)
        if with_stack:
            trace.py("train.py(20): train_step", start + 9_000, 82_000)
        trace.op("aten::mm", start + 10_000, 25_000)
        trace.call("cudaMalloc", start + 10_100, 20_000)
        if with_stack:
            trace.py("torch/cuda/memory.py(212): empty_cache", start + 50_000, 35_000)
            trace.py("<built-in function _cuda_emptyCache>", start + 50_010, 34_980)
        trace.call("cudaFree", start + 50_100, 30_000)
    return trace


def test_blocking_allocator_calls_name_empty_cache_at_the_users_line(tmp_path):
    result = analyze(_empty_cache_steps(with_stack=True).write(tmp_path))
    (finding,) = [f for f in result.findings if f.kind == "blocking_runtime_call"]
    assert "torch.cuda.empty_cache()" in finding.title and "train.py:20" in finding.title
    assert (finding.where.file, finding.where.line, finding.where.function) == ("train.py", 20, "train_step")
    assert finding.fix.startswith("Remove torch.cuda.empty_cache() from the loop")
    calls = finding.details.allocator
    assert calls.python_call == "torch.cuda.empty_cache()" and calls.api_steps == 2
    assert (calls.free_calls_per_step, calls.alloc_calls_per_step) == (1, 1)
    assert calls.gpu_idle_ms_per_step == pytest.approx(50.0, abs=0.1)
    assert finding.severity == "high"


def test_without_stacks_the_blocking_finding_names_the_call_as_before(tmp_path):
    result = analyze(_empty_cache_steps(with_stack=False).write(tmp_path))
    (finding,) = [f for f in result.findings if f.kind == "blocking_runtime_call"]
    assert "empty_cache" not in finding.title and "cudaFree" in finding.title
    assert finding.details.allocator.python_call is None


def test_empty_cache_fixture_names_the_call_predicts_the_gain_and_plain_is_silent(busy_run):
    result = analyze(FIXTURES / "busy/empty_cache/empty_cache")
    (finding,) = [f for f in result.findings if f.kind == "blocking_runtime_call"]
    assert "torch.cuda.empty_cache()" in finding.title
    assert finding.where.file == "benchmarks/busy_scenarios.py"
    step_ms = [busy_run("empty_cache", variant)["step_ms_median"] for variant in ("empty_cache", "plain")]
    measured = step_ms[0] - step_ms[1]
    assert finding.gpu_ms_per_step == pytest.approx(measured, rel=0.3)  # 5.27 vs 5.49 ms (H200)
    plain = analyze(FIXTURES / "busy/empty_cache/plain")
    assert not [f for f in plain.findings if f.kind == "blocking_runtime_call"]


def _launch_bound(training: bool) -> TraceBuilder:
    trace = TraceBuilder()
    trace.step(1, 0.0)
    for i in range(40):  # ops launching kernels shorter than their launches
        ts = 10_000 + i * 2_000
        trace.op("aten::add", ts, 1_990)
        trace.call("cudaLaunchKernel", ts + 1_900, 20, kernels=[(ts + 1_995, 4)])
    if training:
        trace.cpu("user_annotation", "Optimizer.step#AdamW.step", 89_900, 50)
    return trace


@pytest.mark.parametrize("training", [True, False])
def test_an_inference_loop_gets_no_optimizer_advice(tmp_path, training):
    result = analyze(_launch_bound(training).write(tmp_path))
    (launch,) = [f for f in result.findings if f.kind == "launch_overhead"]
    verdict = result.traces[0].verdict
    assert verdict.label == "launch-bound"
    assert ("optimizer" in launch.fix) == training
    assert ("optimizer" in verdict.fix) == training


@pytest.mark.parametrize(
    "folder", ["thirdparty/tl_h100_bert_small", "thirdparty/tl_b200_eager", "busy/inference/forward"]
)
def test_inference_fixtures_get_no_optimizer_advice(folder):
    result = analyze(FIXTURES / folder)
    assert not [f for f in result.findings if "optimizer" in (f.fix or "")]


def test_a_training_fixture_keeps_its_optimizer_advice():
    result = analyze(FIXTURES / "traces/gpt2_pathologies")
    (launch,) = [f for f in result.findings if f.kind == "launch_overhead"]
    assert "fused=True" in launch.fix


def test_without_steps_the_loop_is_the_launching_thread_not_a_sleeping_helper(tmp_path):
    # No ProfilerStep#: the loop's thread is found by its frames. A tqdm monitor asleep in
    # threading's wait spans more time than the server loop, but launches nothing.
    trace = TraceBuilder()
    trace.py("serve.py(3): serve", 0.0, 100_000)
    trace.call("cudaLaunchKernel", 100, 10, kernels=[(120, 9_880)])
    trace.py("serve.py(30): postprocess", 10_000, 80_000)
    trace.call("cudaLaunchKernel", 90_010, 10, kernels=[(90_030, 9_970)])
    trace.py("tqdm/_monitor.py(69): run", -100.0, 100_300, tid=SIDE)
    trace.py("threading.py(359): wait", -90.0, 100_280, tid=SIDE)
    result = analyze(trace.write(tmp_path))
    (host,) = [f for f in result.findings if f.kind == "host_bound"]
    assert "postprocess" in host.title and "tqdm" not in host.title and "wait" not in host.title


def test_bert_inference_without_its_step_ranges_still_names_the_launching_thread():
    (trace,) = load_traces(FIXTURES / "thirdparty/tl_h100_bert_small")
    annotations = trace.events["user_annotation"]
    is_step = np.array([trace.names[int(i)].startswith("ProfilerStep#") for i in annotations.name])
    trace.events["user_annotation"] = annotations.select(~is_step)
    timeline = build_timeline(trace)
    launching = set(timeline.calls.thread[timeline.call_is_launch].tolist())
    assert timeline.main_thread in launching  # the tqdm monitor's frames cover more time
    (host,) = [f for f in analyze([trace]).findings if f.kind == "host_bound"]
    assert "apply_chunking_to_forward" in host.title and "tqdm" not in host.title


def test_the_first_launch_after_profiler_start_up_is_profiler_overhead(tmp_path):
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0.0, STEP_US)
    trace.call("cudaLaunchKernel", 10.0, 300, kernels=[(320.0, 9_680)])  # CUPTI's first instrumented launch
    for i in range(30):
        ts = 10_000 + i * 3_000
        trace.op("aten::add", ts, 2_990, tid=MAIN)
        trace.call("cudaLaunchKernel", ts + 2_980, 8, kernels=[(ts + 2_990, 2_990)])
    result = analyze(trace.write(tmp_path))
    (step,) = result.steps
    assert step.idle.costs[Cause.PROFILER] == pytest.approx(0.3, abs=0.01)


def test_a_uniform_first_launch_stays_a_launch(tmp_path):
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0.0, STEP_US)
    for i in range(30):
        ts = 10.0 + i * 3_000
        trace.call("cudaLaunchKernel", ts, 8, kernels=[(ts + 10, 2_990)])
    (step,) = analyze(trace.write(tmp_path)).steps
    assert step.idle.costs[Cause.PROFILER] == 0.0


# ---- advice that fits where the trace came from ------------------------------------------------------

TRAINING_WORDS = ("DataLoader", "optimizer", "backward", "training loop", "gradient", "capture_syncs")


@pytest.mark.parametrize(
    "folder",
    ["thirdparty/tl_h100_bert_small", "thirdparty/tl_b200_eager", "thirdparty/tl_xdit_flux_aiter_sage",
     "busy/inference/forward"],
)
def test_inference_traces_get_no_training_advice_and_no_session_options(folder):
    """vLLM, diffusers and a BERT forward from other projects: no DataLoader, optimizer or training
    loop in any fix, and no option of trainprof's session (they were not recorded by one)."""
    result = analyze(FIXTURES / folder)
    fixes = [result.traces[0].verdict.fix or ""] + [f.fix or "" for f in result.findings]
    assert not [(word, fix) for fix in fixes for word in TRAINING_WORDS if word in fix]


def _profiler_held_steps(tmp_path: Path, sidecar: bool) -> Path:
    """Two steps whose GPU idles 80 ms inside torch.profiler's own frames: profiler overhead."""
    trace = TraceBuilder()
    for number, start in ((1, 0.0), (2, STEP_US)):
        trace.step(number, start)
        trace.py("torch/profiler/profiler.py(884): step", start + 10_000, 80_000)
    path = trace.write(tmp_path)
    if sidecar:  # what a trainprof session leaves beside its traces
        sites = '{"version": 2, "worker": "synthetic", "sites": []}'
        (tmp_path / "synthetic.syncsites.json").write_text(sites)
    return path


@pytest.mark.parametrize("sidecar", [False, True])
def test_session_options_are_fixes_only_for_a_sessions_trace(tmp_path, sidecar):
    result = analyze(_profiler_held_steps(tmp_path, sidecar))
    (finding,) = [f for f in result.findings if f.kind == "profiler_overhead"]
    assert ("capture_syncs=False" in finding.fix) == sidecar
    assert "with_stack=False" in finding.fix  # torch.profiler's own option, for any trace


def _optimizer_steps(tmp_path: Path, on_gpu: bool) -> Analysis:
    """Two steps whose GPU idles 60 ms while `_single_tensor_adam` runs its per-tensor math ops
    (on CPU tensors: no launch; on GPU tensors: each op launches a kernel)."""
    trace = TraceBuilder()
    for number, start in ((1, 0.0), (2, STEP_US)):
        trace.step(number, start)
        trace.py("train.py(30): train", start + 9_000, 82_000)
        trace.cpu("user_annotation", "Optimizer.step#AdamW.step", start + 15_000, 70_000)
        trace.py("torch/optim/adamw.py(300): _single_tensor_adamw", start + 15_010, 69_980)
        for i in range(30):
            ts = start + 16_000 + i * 2_200
            trace.op("aten::lerp_", ts, 2_000)
            if on_gpu:
                trace.call("cudaLaunchKernel", ts + 1_990, 5, kernels=[(ts + 2_000, 150)])
    return analyze(trace.write(tmp_path))


def test_an_optimizer_on_the_cpu_is_named_with_its_own_fix(tmp_path):
    (finding,) = [f for f in _optimizer_steps(tmp_path, on_gpu=False).findings if f.kind == "host_bound"]
    assert "the optimizer steps on the CPU" in finding.title and "_single_tensor_adamw" in finding.title
    assert "fused=True" in finding.fix and "DeepSpeedCPUAdam" in finding.fix
    assert "on the host" in finding.cause


def test_an_optimizer_on_gpu_tensors_is_not_called_a_host_optimizer(tmp_path):
    result = _optimizer_steps(tmp_path, on_gpu=True)
    assert not [f for f in result.findings if "steps on the CPU" in f.title]
