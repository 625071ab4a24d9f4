"""torch.compile's health (`trainprof.analysis.compile`): a compile in every step is a recompile to
stop, never a one-off warm-up, CUDA-graph or host-code advice; graph breaks are counted and placed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_idle_causes import SIDE, STEP_US, TraceBuilder

import trainprof
from trainprof.analysis import analyze

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _compiling_step(trace: TraceBuilder, number: int, start: float, compile_id: str) -> None:
    """A 100 ms step whose first 80 ms compile frame 0 again (Dynamo's ranges as a trace without
    stacks shows them, an autotuning synchronize and a 15 ms `aten::linear` traced inside), then the
    compiled region runs its kernel."""
    trace.cpu("user_annotation", f"ProfilerStep#{number}", start, STEP_US)
    trace.op("dynamo", start + 100, 79_800)
    trace.op("entire_frame_compile", start + 110, 79_780)
    trace.op("_compile.compile_inner (dynamo_timed)", start + 120, 79_760)
    trace.cpu("user_annotation", f"GraphLowering.run_data: compile_id={compile_id}", start + 130, 40)
    trace.op("aten::linear", start + 1_000, 15_000)
    trace.op("async_compile.wait (dynamo_timed)", start + 20_000, 40_000)
    trace.op("CachingAutotuner.benchmark_all_configs (dynamo_timed)", start + 60_000, 19_000)
    trace.call("cudaLaunchKernel", start + 60_010, 10, kernels=[(start + 60_030, 100)])
    trace.call("cudaDeviceSynchronize", start + 60_100, 200)
    trace.op(f"Torch-Compiled Region: {compile_id}", start + 80_000, 19_000)
    trace.call("cudaLaunchKernel", start + 80_010, 10, kernels=[(start + 80_030, 19_900)])


def test_a_compile_in_every_step_is_a_recompile_with_its_fix(tmp_path):
    trace = TraceBuilder()
    _compiling_step(trace, 1, 0.0, "0/3")
    _compiling_step(trace, 2, STEP_US, "0/4")
    result = analyze(trace.write(tmp_path))
    (recompile,) = [f for f in result.findings if f.kind == "recompile"]
    assert recompile.severity == "high"
    assert recompile.gpu_ms_per_step == pytest.approx(79.8, abs=0.5)  # GPU idle while compiling
    assert "0/3, 0/4" in recompile.title and "4th and 5th" in recompile.title
    assert all(words in recompile.fix for words in ("dynamic=True", "mark_dynamic", "pad"))
    stats = result.traces[0].compile
    assert stats.recompiles_every_step and stats.steps_compiling == 2
    assert stats.compile_ms_per_step == pytest.approx(79.8, abs=0.1)
    # Nothing else claims the compile: no one-off, no host code, no sync, no generic warm-up, no graphs.
    kinds = {f.kind for f in result.findings}
    assert not kinds & {"one_off", "host_bound", "sync_point", "recurring_warmup"}
    assert not any("CUDA graph" in (f.fix or "") for f in result.findings)
    assert result.traces[0].verdict.label == "warm-up-bound"


def test_one_first_compile_is_warm_up_not_a_recompile(tmp_path):
    trace = TraceBuilder()
    _compiling_step(trace, 1, 0.0, "0/0")
    trace.step(2, STEP_US)
    trace.op("Torch-Compiled Region: 0/0", STEP_US + 20_000, 1_000)
    result = analyze(trace.write(tmp_path))
    assert not [f for f in result.findings if f.kind == "recompile"]
    assert not result.traces[0].compile.recompiles_every_step
    assert [f for f in result.findings if f.kind == "one_off"]


def test_graph_breaks_are_counted_where_dynamo_resumes_with_the_gpu_idle_between(tmp_path):
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0.0, STEP_US)
    trace.py("train.py(5): forward", 10.0, STEP_US - 20)
    trace.op("Torch-Compiled Region: 0/0", 100.0, 9_000)
    trace.call("cudaLaunchKernel", 200.0, 10, kernels=[(220.0, 9_000)])
    trace.py("train.py(12): torch_dynamo_resume_in_forward_at_12", 40_000.0, 50_000)
    trace.op("Torch-Compiled Region: 1/0", 40_100.0, 9_000)
    trace.call("cudaLaunchKernel", 40_200.0, 10, kernels=[(40_220.0, 59_700)])
    result = analyze(trace.write(tmp_path))
    stats = result.traces[0].compile
    assert stats.graph_breaks == 1 and stats.graph_break_sites == ["train.py:12 forward"]
    assert stats.compiled_frames == [0, 1] and stats.compiled_regions_per_step == 2
    (breaks,) = [f for f in result.findings if f.kind == "graph_breaks"]
    # The eager gap between the regions: 9.1 to 40.1 ms, less the first kernel's last 0.12 ms.
    assert breaks.gpu_ms_per_step == pytest.approx(30.88, abs=0.01)
    assert "train.py:12 forward" in breaks.title and "explain" in breaks.fix


def test_no_torch_compile_no_compile_figures(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0.0)
    trace.py("torch/_dynamo/eval_frame.py(1240): _fn", 20_000, 1_000)  # any stack shows Dynamo's frames
    assert analyze(trace.write(tmp_path)).traces[0].compile is None


def test_autograd_threads_backward_compile_is_the_recompiles_too(tmp_path):
    trace = TraceBuilder()
    for number, start, compile_id in ((1, 0.0, "0/3"), (2, STEP_US, "0/4")):
        trace.step(number, start)
        backward = "autograd::engine::evaluate_function: CompiledFunctionBackward"
        trace.op(backward, start + 10_000, 70_000, tid=SIDE)
        trace.op("entire_backward_compile", start + 10_100, 69_800, tid=SIDE)
        annotation = f"entire_backward_compile_data: compile_id={compile_id}"
        trace.cpu("user_annotation", annotation, start + 10_150, 30, tid=SIDE)
    result = analyze(trace.write(tmp_path))
    (recompile,) = [f for f in result.findings if f.kind == "recompile"]
    assert recompile.gpu_ms_per_step == pytest.approx(69.8, abs=0.5)


@pytest.fixture(scope="module")
def recompile_run():
    return analyze(FIXTURES / "busy/compile_recompile/recompile")


def test_recompile_fixture_predicts_the_measured_gain(recompile_run, busy_run):
    (recompile,) = [f for f in recompile_run.findings if f.kind == "recompile"]
    assert recompile.severity == "high" and recompile_run.findings[0] is recompile
    step_ms = [busy_run("compile_recompile", v)["step_ms_median"] for v in ("recompile", "dynamic")]
    measured = step_ms[0] - step_ms[1]
    assert recompile.gpu_ms_per_step == pytest.approx(measured, rel=0.3)  # 1,715.8 vs 1,579.7 ms (H200)
    assert recompile_run.traces[0].compile.compile_ids == ["0/15", "0/16"]
    assert not [f for f in recompile_run.findings if f.kind in ("one_off", "host_bound", "recurring_warmup")]
    assert not any("CUDA graph" in (f.fix or "") for f in recompile_run.findings)


@pytest.mark.parametrize("variant", ["dynamic", "padded"])
def test_fixed_compile_variants_are_silent(variant):
    result = analyze(FIXTURES / "busy/compile_recompile" / variant)
    assert not [f for f in result.findings if f.kind in ("recompile", "graph_breaks", "one_off")]
    stats = result.traces[0].compile
    assert stats is not None and stats.steps_compiling == 0 and stats.compiled_regions_per_step == 1


def test_a_session_records_dynamos_graph_break_count_and_reasons(tmp_path):
    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        print("a graph break")  # noqa: T201 (Dynamo cannot trace print: the break under test)
        return y + 1

    compiled = torch.compile(step, backend="eager")
    with trainprof.session(log_dir=tmp_path, run_name="run", wait=0, warmup=1, active=1, console=False,
                           tensorboard_scalars=False) as sess:
        for _ in range(3):
            compiled(torch.ones(4))
            sess.step()
    stats = sess.analysis.traces[0].compile
    assert stats is not None and stats.graph_breaks >= 1
    assert any("print" in reason for reason in stats.graph_break_reasons)
    assert stats.frames_total >= 1 and stats.frames_compiled >= 1  # Dynamo's frame counters, live
    assert [f for f in sess.analysis.findings if f.kind == "graph_breaks"]


# ---- how much torch.compile compiled ------------------------------------------------------------------

BF16 = "c10::BFloat16"


def _wrapped_forward(tmp_path: Path, compiled: bool):
    """Two steps of a model behind torch.compile's wrapper (`OptimizedModule`): 20 elementwise kernels
    of 500 µs each moving 0.5 GB at 1 TB/s, inside a compiled region or eagerly."""
    from test_busy import TraceBuilder as BusyTrace

    trace = BusyTrace()
    x = [8192, 8192, 2]  # 128 Mi elements of bf16: 256 MiB in, 256 out
    for number, start in ((1, 0.0), (2, 20_000.0)):
        trace.step(number, start, 20_000)
        trace.cpu("python_function", "nn.Module: OptimizedModule_0", start + 10, 15_000)
        trace.cpu("python_function", "torch/_dynamo/eval_frame.py(1077): compile_wrapper", start + 20, 14_900)
        if compiled:
            trace.op("Torch-Compiled Region: 0/0", start + 30, 14_000)
        trace.module("MyModel_0", start + 40, 13_000)
        for i in range(20):
            at = start + 100 + i * 500
            trace.op("aten::gelu", at, 300, [x], [BF16], **{"Sequence number": i, "Fwd thread id": 0})
            trace.launch("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", at + 10,
                         start + 200 + i * 600, 500)
    return analyze(trace.write(tmp_path))


def test_a_compile_that_compiles_nothing_is_a_finding(tmp_path):
    result = _wrapped_forward(tmp_path, compiled=False)
    stats = result.traces[0].compile
    assert stats.wrapped_calls_per_step == 2 and stats.compiled_regions_per_step == 0
    assert stats.compiled_gpu_ms_per_step == 0 and stats.eager_gpu_ms_per_step == pytest.approx(10.0)
    (finding,) = [f for f in result.findings if f.kind == "compile_coverage"]
    assert "compiled nothing" in finding.title and "fullgraph=True" in finding.fix
    # Each kernel moves 0.5 GiB (read + write) in 500 µs; at the H200's measured 4.30 TB/s it would take
    # 125 µs: 375 µs a kernel, 20 a step, could go.
    moved = 2 * 8192 * 8192 * 2 * 2
    assert finding.gpu_ms_per_step == pytest.approx(20 * (0.5 - moved / 4.30e12 * 1e3), rel=1e-3)


def test_a_compile_that_compiles_the_model_is_no_finding(tmp_path):
    result = _wrapped_forward(tmp_path, compiled=True)
    stats = result.traces[0].compile
    assert stats.compiled_share == pytest.approx(1.0)
    assert not [f for f in result.findings if f.kind == "compile_coverage"]


def test_the_recorded_compile_fixtures_compile_the_model(fixtures_dir):
    for variant in ("padded", "dynamic"):
        result = analyze(fixtures_dir / "busy" / "compile_recompile" / variant)
        assert result.traces[0].compile.compiled_share > 0.95, variant
        assert not [f for f in result.findings if f.kind == "compile_coverage"]
