"""Each GPU-idle cause rule, pinned by a minimal synthetic trace written here (CPU only, no fixtures).

Every trace has steps of 100 ms: the GPU runs a kernel for the first and the last 10 ms, so each
step holds one 80 ms GPU-idle gap, and each test puts different host events over that gap.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainprof.analysis import analyze
from trainprof.analysis.causes import Cause
from trainprof.analysis.runtime_calls import call_kind, is_blocking_copy
from trainprof.analysis.thresholds import THRESHOLDS, Thresholds, parse_threshold_args
from trainprof.analysis.verdict import Verdict

MAIN, SIDE = 100, 200  # the loop's thread and autograd's backward thread
STEP_US = 100_000.0
GAP_MS = 80.0


class TraceBuilder:
    """A torch.profiler-shaped Chrome trace: host events on threads, kernels on one GPU stream."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.correlation = 0

    def cpu(self, cat: str, name: str, ts: float, dur: float, tid: int = MAIN, **args) -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.cpu("cpu_op", name, ts, dur, tid)

    def py(self, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.cpu("python_function", name, ts, dur, tid)

    def call(self, name: str, ts: float, dur: float, tid: int = MAIN, kernels: list[tuple] = ()) -> None:
        """A runtime call; `kernels` [(start, dur), ...] are the GPU work it launched (same correlation)."""
        self.correlation += 1
        self.cpu("cuda_runtime", name, ts, dur, tid, correlation=self.correlation)
        for start, length in kernels:
            self.events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k",
                    "pid": 0,
                    "tid": 7,
                    "ts": start,
                    "dur": length,
                    "args": {"correlation": self.correlation, "device": 0, "stream": 7},
                }
            )

    def step(self, number: int, start: float) -> None:
        """`ProfilerStep#number` over [start, start + 100 ms] with kernels over its first and last 10 ms."""
        self.cpu("user_annotation", f"ProfilerStep#{number}", start, STEP_US)
        self.op("aten::mul", start + 1, 20)
        self.call("cudaLaunchKernel", start + 5, 10, kernels=[(start + 30, 9_970)])
        self.op("aten::add", start + 89_970, 20)
        self.call("cudaLaunchKernel", start + 89_975, 10, kernels=[(start + 90_000, 10_000)])

    def write(self, folder: Path) -> Path:
        path = folder / "synthetic.pt.trace.json"
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": self.events}))
        return path


GAP = (10_000.0, 90_000.0)  # the idle gap inside the step starting at 0


def _one_step(tmp_path: Path, fill) -> dict:
    trace = TraceBuilder()
    trace.step(1, 0.0)
    fill(trace, 0.0)
    return analyze(trace.write(tmp_path))


def _idle(result) -> dict[str, float]:
    """The one step's steady-state idle ms by cause key."""
    (step,) = result.steps
    return {cause.key: ms for cause, ms in step.idle.costs.items()}


def _verdict(result) -> Verdict:
    return result.traces[0].verdict


def test_the_frame_gap_is_what_the_tests_assume(tmp_path):
    result = _one_step(tmp_path, lambda t, s: None)
    (step,) = result.steps
    # plus 30 µs before the first kernel
    assert step.times.gpu_idle_ms == pytest.approx(GAP_MS + 0.03, abs=1e-3)


def test_launch_is_time_inside_launching_ops_and_launch_calls(tmp_path):
    def fill(t, s):
        for i in range(40):  # 40 ops of 2 ms each, each launching a kernel shorter than its launch
            ts = s + 10_000 + i * 2_000
            t.op("aten::add", ts, 1_990)
            t.call("cudaLaunchKernel", ts + 1_900, 20, kernels=[(ts + 1_995, 4)])

    result = _one_step(tmp_path, fill)
    idle = _idle(result)
    assert idle["launch"] == pytest.approx(GAP_MS, rel=0.01)
    assert _verdict(result).label == "launch-bound"
    assert _verdict(result).cause == Cause.LAUNCH


def test_sync_counts_only_inside_the_sync_call(tmp_path):
    # A 17 µs cudaDeviceSynchronize followed by ~80 ms of the user's own Python: not sync-bound.
    def fill(t, s):
        t.call("cudaDeviceSynchronize", s + 10_000, 17)
        t.py("train.py(10): train", s + 10_001, 79_990)
        t.py("train.py(40): compute_metrics", s + 10_020, 79_960)

    result = _one_step(tmp_path, fill)
    idle = _idle(result)
    assert idle["sync"] == pytest.approx(0.016, abs=2e-3)
    assert idle["host"] == pytest.approx(GAP_MS - 0.016, abs=0.05)
    assert _verdict(result).label == "host-bound"


def test_a_long_sync_wait_is_sync_bound(tmp_path):
    def fill(t, s):
        t.op("aten::item", s + 9_990, 80_000)
        t.call("cudaStreamSynchronize", s + 10_000, 79_980)

    result = _one_step(tmp_path, fill)
    assert _idle(result)["sync"] == pytest.approx(GAP_MS - 0.02, abs=0.05)
    assert _verdict(result).label == "sync-bound"


@pytest.mark.parametrize("name", ["cudaFree", "cudaMalloc", "hipFree", "cudaStreamCreateWithFlags"])
def test_blocking_runtime_calls(tmp_path, name):
    def fill(t, s):
        t.op("aten::empty", s + 9_990, 80_000)
        t.call(name, s + 10_000, 79_980)

    result = _one_step(tmp_path, fill)
    assert _idle(result)["blocking"] == pytest.approx(GAP_MS - 0.02, abs=0.05)
    assert _verdict(result).label == "blocking-call-bound"
    (finding,) = [f for f in result.findings if f.kind == "blocking_runtime_call"]
    assert name in finding.title


def test_a_blocking_hip_copy_is_a_blocking_call_not_a_launch(tmp_path):
    def fill(t, s):
        t.op("aten::copy_", s + 9_990, 80_000)
        t.call("hipMemcpyWithStream", s + 10_000, 79_980)

    result = _one_step(tmp_path, fill)
    assert _idle(result)["blocking"] == pytest.approx(GAP_MS - 0.02, abs=0.05)
    assert _idle(result)["launch"] < 0.1


def _two_steps(tmp_path: Path, fill_first, fill_second=None):
    trace = TraceBuilder()
    trace.step(1, 0.0)
    trace.step(2, STEP_US)
    fill_first(trace, 0.0)
    if fill_second is not None:
        fill_second(trace, STEP_US)
    return analyze(trace.write(tmp_path))


def test_context_creation_in_one_step_is_a_one_off_not_the_verdict(tmp_path):
    def first(t, s):  # step 1: 80 ms inside context creation under the first .to()
        t.op("aten::to", s + 9_990, 80_000)
        t.call("cudaDeviceGetStreamPriorityRange", s + 10_000, 79_980)

    def second(t, s):  # step 2: the steady state, the user's Python
        t.py("train.py(10): train", s + 10_000, 80_000)

    result = _two_steps(tmp_path, first, second)
    assert sum(s.idle.one_off_ms for s in result.steps) == pytest.approx(GAP_MS - 0.02, abs=0.05)
    # left out of the steady-state causes
    assert sum(s.idle.costs[Cause.BLOCKING] for s in result.steps) < 0.1
    assert _verdict(result).label == "host-bound"
    (one_off,) = [f for f in result.findings if f.kind == "one_off"]
    assert "context creation" in one_off.title and "cudaDeviceGetStreamPriorityRange" in one_off.title
    assert one_off.details.steps == [1]
    assert "wait" in one_off.fix and "skip_first" in one_off.fix


def test_first_cudnn_convolution_is_warmup_and_absorbs_its_frees(tmp_path):
    def fill(t, s):
        t.op("aten::cudnn_convolution", s + 9_990, 80_005)
        t.call("cudaFree", s + 20_000, 30_000)  # freed for the search's workspace: part of the warm-up
        t.call("cudaLaunchKernel", s + 89_980, 10, kernels=[(s + 89_992, 3)])

    result = _one_step(tmp_path, fill)
    assert result.steps[0].idle.one_off_ms == pytest.approx(GAP_MS - 0.02, abs=0.05)
    assert _idle(result)["blocking"] == 0.0
    (one_off,) = [f for f in result.findings if f.kind == "one_off"]
    assert "warm-up" in one_off.title and "aten::cudnn_convolution" in one_off.title


def test_a_short_steady_cudnn_call_is_not_warmup(tmp_path):
    # Below warmup_call_min_ms (10 ms) a cuDNN call is ordinary launch work.
    def fill(t, s):
        for i in range(20):
            ts = s + 10_000 + i * 4_000
            t.op("aten::cudnn_convolution", ts, 3_990)
            t.call("cudaLaunchKernel", ts + 3_900, 20, kernels=[(ts + 3_995, 4)])

    result = _one_step(tmp_path, fill)
    assert _idle(result)["launch"] == pytest.approx(GAP_MS, rel=0.01)
    assert result.steps[0].idle.one_off_ms == 0.0


def test_warmup_in_every_step_is_a_steady_cost(tmp_path):
    def search(t, s):  # cuDNN searching again in each step (a new input shape every step) ...
        t.op("aten::cudnn_convolution", s + 9_990, 70_005)
        for i in range(5):  # ... while its calls at known shapes take 0.1 ms
            ts = s + 80_000 + i * 2_000
            t.op("aten::cudnn_convolution", ts, 100)
            t.call("cudaLaunchKernel", ts + 50, 20, kernels=[(ts + 80, 1_900)])

    result = _two_steps(tmp_path, search, search)
    assert all(s.idle.one_off_ms == 0.0 for s in result.steps)
    assert all(s.idle.costs[Cause.WARMUP] == pytest.approx(70.0 - 0.01, abs=0.05) for s in result.steps)
    assert _verdict(result).label == "warm-up-bound"
    assert [f for f in result.findings if f.kind == "recurring_warmup"]


def test_a_very_long_launch_is_module_loading_not_launch_overhead(tmp_path):
    def fill(t, s):
        t.op("aten::add", s + 9_990, 80_005)
        t.call("cudaLaunchKernel", s + 10_000, 79_990, kernels=[(s + 89_992, 3)])

    result = _one_step(tmp_path, fill)
    assert _idle(result)["launch"] < 0.1
    assert result.steps[0].idle.one_off_ms == pytest.approx(GAP_MS, abs=0.05)


def test_compilation_is_warmup(tmp_path):
    def fill(t, s):
        t.py("torch/_inductor/compile_fx.py(1500): compile_fx", s + 10_000, 80_000)
        t.py("torch/_inductor/codecache.py(300): load", s + 20_000, 10_000)

    result = _one_step(tmp_path, fill)
    assert result.steps[0].idle.one_off_ms == pytest.approx(GAP_MS, abs=0.05)


def test_dataloader_wait_is_input_even_inside_its_threading_frames(tmp_path):
    def fill(t, s):
        t.cpu(
            "user_annotation",
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            s + 10_000,
            80_000,
        )
        t.py("torch/utils/data/dataloader.py(700): __next__", s + 10_010, 79_980)
        t.py("threading.py(320): wait", s + 10_020, 79_960)

    result = _one_step(tmp_path, fill)
    assert _idle(result)["input"] == pytest.approx(GAP_MS, abs=0.05)
    assert _verdict(result).label == "input-bound"
    (finding,) = [f for f in result.findings if f.kind == "input_bound"]
    assert "DataLoader" in finding.title
    assert "num_workers" in finding.fix


def test_users_data_preparation_is_input(tmp_path):
    def fill(t, s):
        t.py("train.py(10): train", s + 10_000, 80_000)
        t.py("train.py(90): get_batch", s + 10_010, 79_980)

    assert _idle(_one_step(tmp_path, fill))["input"] == pytest.approx(GAP_MS - 0.02, abs=0.05)


def test_other_host_python_is_named_by_its_innermost_function(tmp_path):
    def fill(t, s):
        t.py("train.py(10): train", s + 10_000, 80_000)
        t.py("train.py(40): compute_metrics", s + 10_010, 60_000)
        t.py("inspect.py(3300): signature", s + 10_020, 50_000)  # stdlib: rolled up to its caller
        t.py("transformers/utils/generic.py(50): to_py_obj", s + 70_020, 19_970)

    result = _one_step(tmp_path, fill)
    assert _idle(result)["host"] == pytest.approx(GAP_MS, abs=0.05)
    (host,) = [f for f in result.findings if f.kind == "host_bound"]
    functions = {(f.file, f.function): f for f in host.details.functions}
    metrics = functions[("train.py", "compute_metrics")]
    assert metrics.code == "user"
    assert metrics.idle_ms_per_step == pytest.approx(60.0 - 0.01, abs=0.05)
    library = functions[("transformers/utils/generic.py", "to_py_obj")]
    assert library.code == "library"
    assert library.idle_ms_per_step == pytest.approx(19.97, abs=0.05)
    assert host.where.function == "compute_metrics"
    assert "compute_metrics" in host.title


def test_host_collective_is_communication(tmp_path):
    def fill(t, s):
        t.op("gloo:all_reduce", s + 10_000, 80_000)

    result = _one_step(tmp_path, fill)
    assert _idle(result)["comm"] == pytest.approx(GAP_MS, abs=0.05)
    assert [f for f in result.findings if f.kind == "communication_wait"]


def test_nothing_recorded_is_unknown_and_host_bound(tmp_path):
    result = _one_step(tmp_path, lambda t, s: None)
    assert _idle(result)["unknown"] == pytest.approx(GAP_MS, abs=0.05)
    assert _verdict(result).label == "host-bound"
    (host,) = [f for f in result.findings if f.kind == "host_bound"]
    assert "does not name" in host.title


def test_backward_thread_lends_its_cause_to_the_waiting_loop(tmp_path):
    # The loop waits in backward; autograd's thread frees memory (blocking), then launches (launch);
    # in between no thread records anything: the engine scheduling, counted as launch work.
    def fill(t, s):
        t.py("train.py(10): train", s + 9_000, 82_000)
        t.py("torch/autograd/graph.py(800): _engine_run_backward", s + 9_500, 81_000)
        t.op("autograd::engine::evaluate_function: MulBackward0", s + 10_000, 30_000, tid=SIDE)
        t.call("cudaFree", s + 10_000, 30_000, tid=SIDE)
        t.op("autograd::engine::evaluate_function: AddBackward0", s + 50_000, 30_000, tid=SIDE)
        t.op("aten::add", s + 50_000, 30_000, tid=SIDE)
        t.call("cudaLaunchKernel", s + 79_990, 10, tid=SIDE, kernels=[(s + 89_995, 2)])

    idle = _idle(_one_step(tmp_path, fill))
    assert idle["blocking"] == pytest.approx(30.0, abs=0.05)
    assert idle["launch"] == pytest.approx(50.0, abs=0.05)
    assert idle["host"] == 0.0


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("trainprof/capture/syncs.py(62): current_stack", "profiler"),
        ("/venv/lib/python3.12/site-packages/trainprof/session.py(377): _advance", "profiler"),
        ("/venv/lib/python3.12/site-packages/trainprof/session/hooks.py(60): _advance", "profiler"),
        ("torch/profiler/profiler.py(884): step", "profiler"),
        ("torch/autograd/profiler.py(854): __enter__", "profiler"),
        ("trainprof/demo.py(60): train_loop", "host"),  # the demo's loop is the user's code
        ("mytrainprof/train.py(5): train_loop", "host"),
    ],
)
def test_the_profilers_own_frames_are_profiler_overhead(tmp_path, name, cause):
    def fill(t, s):
        t.py("train.py(10): train", s + 10_000, 80_000)
        t.py(name, s + 10_010, 79_980)
        t.py("posixpath.py(400): realpath", s + 20_000, 30_000)  # the stdlib it calls: its cost too

    idle = _idle(_one_step(tmp_path, fill))
    assert idle[cause] == pytest.approx(GAP_MS - 0.02, abs=0.05)


def test_stack_capture_after_a_sync_is_profiler_overhead_not_the_users_host_time(tmp_path):
    # After an .item(), trainprof's warning hook records the Python stack (60 ms in its frames and
    # the stdlib and builtins they call); then the user's own Python runs for 20 ms.
    def fill(t, s):
        t.py("train.py(10): train", s + 9_000, 82_000)
        t.py("<built-in method item of Tensor object at 0x7f00>", s + 9_980, 60_040)
        t.op("aten::item", s + 9_985, 30)
        t.call("cudaStreamSynchronize", s + 9_990, 25)
        t.py("warnings.py(100): _showwarnmsg", s + 10_015, 60_000)
        t.py("trainprof/capture/syncs.py(193): showwarning", s + 10_020, 59_990)
        t.py("trainprof/capture/syncs.py(141): _guarded_record", s + 10_025, 59_980)
        t.py("trainprof/capture/syncs.py(62): current_stack", s + 10_030, 40_000)
        t.py("<built-in function _getframe>", s + 10_035, 100)
        t.py("posixpath.py(400): realpath", s + 50_100, 19_800)
        t.py("train.py(40): compute_metrics", s + 70_030, 19_960)

    result = _one_step(tmp_path, fill)
    idle = _idle(result)
    assert idle["profiler"] == pytest.approx(59.99, abs=0.01)
    assert idle["host"] == pytest.approx(GAP_MS - 59.99, abs=0.05)
    verdict = _verdict(result)
    assert verdict.idle.by_cause[Cause.PROFILER] == pytest.approx(59.99, abs=0.01)
    assert verdict.label == "host-bound" and verdict.cause == Cause.HOST  # the user's 20 ms
    assert "profiler" not in verdict.why
    (host,) = [f for f in result.findings if f.kind == "host_bound"]
    assert [f.function for f in host.details.functions] == ["compute_metrics", "train"]
    (overhead,) = [f for f in result.findings if f.kind == "profiler_overhead"]
    assert overhead.severity == "low"
    assert "un-profiled" in overhead.title
    assert overhead.op == "trainprof/capture/syncs.py(62): current_stack"  # the largest holder
    assert "capture_syncs=False" in overhead.fix


def test_a_profiler_frame_calling_through_leaves_the_called_code_its_own_cause(tmp_path):
    # trainprof's explicit-sync wrapper records the stack (10 ms), then calls the original
    # torch.cuda.synchronize: its sync wait is `sync`, its Python around the wait torch's host time.
    # Then a trainprof frame calls back into the user's code, which holds the host for 30 ms.
    def fill(t, s):
        t.py("train.py(10): train", s + 9_000, 82_000)
        t.py("trainprof/capture/syncs.py(165): wrapper", s + 10_000, 40_000)
        t.py("trainprof/capture/syncs.py(141): _guarded_record", s + 10_000, 10_000)
        t.py("torch/cuda/__init__.py(990): synchronize", s + 20_000, 30_000)
        t.call("cudaDeviceSynchronize", s + 20_000, 20_000)
        t.py("trainprof/session.py(366): _on_optimizer_step", s + 50_000, 40_000)
        t.py("train.py(70): on_step_end", s + 60_000, 30_000)
        t.py("json/encoder.py(200): encode", s + 70_000, 10_000)  # the stdlib the user's code calls

    result = _one_step(tmp_path, fill)
    idle = _idle(result)
    assert idle["sync"] == pytest.approx(20.0, abs=0.01)
    assert idle["profiler"] == pytest.approx(20.0, abs=0.01)  # the stack capture, the hook's own 10 ms
    assert idle["host"] == pytest.approx(40.0, abs=0.05)
    (host,) = [f for f in result.findings if f.kind == "host_bound"]
    functions = {f.function: f.idle_ms_per_step for f in host.details.functions}
    assert functions == {
        "on_step_end": pytest.approx(30.0, abs=0.05),
        "synchronize": pytest.approx(10.0, abs=0.01),
    }


def test_code_a_profiler_frame_calls_keeps_the_rule_outside_that_frame(tmp_path):
    # The user's data preparation (input) runs a trainprof frame that calls back into the user's
    # decoding: the decoding is still input, as it would be without trainprof's frame between.
    def fill(t, s):
        t.py("train.py(90): get_batch", s + 10_000, 80_000)
        t.py("trainprof/capture/syncs.py(165): wrapper", s + 10_010, 79_980)
        t.py("data.py(5): decode", s + 30_000, 59_960)

    idle = _idle(_one_step(tmp_path, fill))
    assert idle["input"] == pytest.approx(GAP_MS - 20.0, abs=0.05)
    assert idle["profiler"] == pytest.approx(20.0, abs=0.01)


def test_another_thread_decides_where_the_loops_thread_is_in_the_profilers_code(tmp_path):
    # As for host time: while the loop's thread records a stack, autograd's thread frees memory.
    def fill(t, s):
        t.py("trainprof/capture/syncs.py(62): current_stack", s + 10_000, 80_000)
        t.op("aten::empty", s + 10_000, 30_000, tid=SIDE)
        t.call("cudaFree", s + 10_000, 30_000, tid=SIDE)

    idle = _idle(_one_step(tmp_path, fill))
    assert idle["blocking"] == pytest.approx(30.0, abs=0.01)
    assert idle["profiler"] == pytest.approx(GAP_MS - 30.0, abs=0.05)


def test_a_step_held_by_the_profiler_is_not_host_bound(tmp_path):
    # 70 ms of trainprof's stack capture and 10 ms of launch work: the launches are what an
    # un-profiled run would wait on; the profiler's time is reported beside the verdict.
    def fill(t, s):
        t.py("train.py(10): train", s + 9_000, 82_000)
        t.py("trainprof/capture/syncs.py(62): current_stack", s + 10_000, 70_000)
        for i in range(5):
            ts = s + 80_000 + i * 2_000
            t.op("aten::add", ts, 2_000)
            t.call("cudaLaunchKernel", ts + 1_900, 20, kernels=[(ts + 1_995, 4)])

    result = _one_step(tmp_path, fill)
    verdict = _verdict(result)
    assert verdict.label == "launch-bound"
    assert verdict.idle.by_cause[Cause.PROFILER] == pytest.approx(70.0, abs=0.01)
    assert verdict.idle.ranked[0].idle_ms_per_step == pytest.approx(10.0, abs=0.01)  # profiler's left out
    assert not [f for f in result.findings if f.kind == "host_bound"]
    assert [f.severity for f in result.findings if f.kind == "profiler_overhead"] == ["low"]
    quiet = analyze(result.files[0], thresholds={"profiler_overhead_min_share": 0.9})
    assert not [f for f in quiet.findings if f.kind == "profiler_overhead"]


def test_all_idle_in_the_profiler_names_no_verdict(tmp_path):
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0, STEP_US)
    trace.call("cudaLaunchKernel", -100, 10, kernels=[(0, 10_000)])  # launched before the step
    trace.py("torch/profiler/profiler.py(884): step", 10_000, 90_000)
    verdict = _verdict(analyze(trace.write(tmp_path)))
    assert verdict.label == "unknown"
    assert verdict.idle.by_cause[Cause.PROFILER] == pytest.approx(90.0)
    assert verdict.why == "GPU idle time is all profiler overhead"


def test_graph_replays_are_counted_never_tiny_and_graphs_are_not_advised_for_them(tmp_path):
    def fill(t, s):
        # One graph launch replays 30 kernels, each far shorter than the launch call.
        t.call("cudaGraphLaunch", s + 10_000, 50, kernels=[(s + 10_100 + 100 * i, 5) for i in range(30)])
        for i in range(40):  # and eager tiny kernels launched one by one
            ts = s + 20_000 + i * 1_500
            t.op("aten::add", ts, 1_490)
            t.call("cudaLaunchKernel", ts + 1_400, 20, kernels=[(ts + 1_495, 3)])

    result = _one_step(tmp_path, fill)
    (step,) = result.steps
    assert step.launch.graph_replay_kernel_count == 30
    assert step.launch.graph_launch_count == 1
    assert step.launch.graph_launch_ms == pytest.approx(0.05)
    assert step.launch.tiny_kernel_count == 40  # the eager ones only
    (launch,) = [f for f in result.findings if f.kind == "launch_overhead"]
    assert "already replay" in launch.fix
    assert launch.details.graph_replay_kernels_per_step == 30


def test_hip_launches_and_syncs_are_counted(tmp_path):
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0, STEP_US)
    for i, name in enumerate(["hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel"]):
        trace.op("aten::add", 100 + i * 1_000, 500)
        trace.call(name, 200 + i * 1_000, 20, kernels=[(300 + i * 1_000, 100)])
    trace.op("aten::item", 10_000, 5_000)
    trace.call("hipMemcpyWithStream", 10_100, 4_000, kernels=[])
    trace.call("hipDeviceSynchronize", 20_000, 100)
    result = analyze(trace.write(tmp_path))
    (step,) = result.steps
    assert step.times.launch_count == 3
    assert step.times.kernel_count == 3
    assert step.syncs.count >= 1


def test_busy_pct_is_time_weighted_over_steps(tmp_path):
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0, 1_000)  # 1 ms step, 0.9 ms busy
    trace.op("aten::mul", 5, 20)
    trace.call("cudaLaunchKernel", 10, 10, kernels=[(50, 900)])
    trace.cpu("user_annotation", "ProfilerStep#2", 1_000, 9_000)  # 9 ms step, 0.9 ms busy
    trace.op("aten::mul", 1_005, 20)
    trace.call("cudaLaunchKernel", 1_010, 10, kernels=[(1_050, 900)])
    result = analyze(trace.write(tmp_path))
    assert result.summary.gpu_busy_pct == pytest.approx(18.0)  # 1.8 of 10 ms; a plain mean says 50
    assert _verdict(result).gpu_busy_pct == pytest.approx(18.0)


def test_cpu_only_trace_has_no_gpu_idle_split(tmp_path):
    trace = TraceBuilder()
    trace.cpu("user_annotation", "ProfilerStep#1", 0, STEP_US)
    trace.op("aten::mm", 100, 90_000)
    result = analyze(trace.write(tmp_path))
    (step,) = result.steps
    assert _verdict(result).label == "cpu-only"
    assert step.times.gpu_idle_ms is None
    assert step.idle is None and not [k for k in step.to_dict() if k.startswith("idle_")]
    assert not [f for f in result.findings if f.kind in ("host_bound", "launch_overhead", "one_off")]


def test_dominant_cause_needs_the_margin(tmp_path):
    def fill(t, s):  # 45 ms of user Python, then 35 ms of DataLoader wait: 45/35 < 1.5
        t.py("train.py(40): compute_metrics", s + 10_000, 45_000)
        t.cpu(
            "user_annotation",
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            s + 55_000,
            35_000,
        )

    result = _one_step(tmp_path, fill)
    verdict = _verdict(result)
    assert verdict.label == "mixed"
    assert "host-bound" in verdict.why and "input-bound" in verdict.why
    loose = analyze(result.files[0], thresholds={"dominant_cause_margin": 1.2})
    assert _verdict(loose).label == "host-bound"
    assert loose.summary.thresholds_overridden == {"dominant_cause_margin": 1.2}


def test_thresholds_table_and_overrides():
    assert all(t.reason and t.value > 0 for t in THRESHOLDS)
    assert len({t.name for t in THRESHOLDS}) == len(THRESHOLDS)
    assert Thresholds({"gpu_bound_busy_pct": 90}).gpu_bound_busy_pct == 90.0
    with pytest.raises(ValueError, match="unknown threshold"):
        Thresholds({"gpu_bound": 90})
    assert parse_threshold_args(["gpu_bound_busy_pct=70", "long_launch_us = 500"]) == {
        "gpu_bound_busy_pct": 70.0,
        "long_launch_us": 500.0,
    }
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_threshold_args(["gpu_bound_busy_pct"])


def test_gpu_bound_threshold_is_overridable(tmp_path):
    def fill(t, s):
        t.op("aten::add", s + 10_000, 80_000)
        t.call("cudaLaunchKernel", s + 10_010, 10, kernels=[(s + 10_100, 75_000)])

    trace = TraceBuilder()
    trace.step(1, 0.0)
    fill(trace, 0.0)
    path = trace.write(tmp_path)
    assert _verdict(analyze(path)).label == "gpu-bound"  # 95% busy
    assert _verdict(analyze(path, thresholds={"gpu_bound_busy_pct": 99})).label != "gpu-bound"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("cudaLaunchKernel", "launch"),
        ("cuLaunchKernelEx", "launch"),
        ("hipLaunchKernel", "launch"),
        ("hipExtModuleLaunchKernel", "launch"),
        ("hipModuleLaunchKernel", "launch"),
        ("cudaGraphLaunch", "graph_launch"),
        ("hipGraphLaunch", "graph_launch"),
        ("hipDeviceSynchronize", "sync"),
        ("hipStreamSynchronize", "sync"),
        ("cudaEventSynchronize", "sync"),
        ("hipMemcpyWithStream", "copy"),
        ("hipMemcpyAsync", "copy"),
        ("cudaMemsetAsync", "memset"),
        ("hipMalloc", "alloc"),
        ("hipFree", "free"),
        ("cudaDeviceGetStreamPriorityRange", "context"),
        ("cudaStreamCreateWithFlags", "stream_create"),
        ("cudaEventRecord", "event"),
        ("cudaEventQuery", "query"),
        ("cudaFuncSetAttribute", "other"),
        ("custom_op", "other"),
    ],
)
def test_call_kinds(name, kind):
    assert call_kind(name) == kind


def test_blocking_copies():
    assert is_blocking_copy("hipMemcpyWithStream") and is_blocking_copy("cudaMemcpy")
    assert not is_blocking_copy("cudaMemcpyAsync") and not is_blocking_copy("cudaLaunchKernel")


def test_name_rules_at_once_agree_with_one_search_per_name(fixtures_dir):
    """`idle._name_rules` scans all names joined by newlines (`name_patterns`); it must give what one
    `search` per name and rule (first match wins), `WARMUP_OPS.match` and the step pattern's `match` give."""
    import re

    from trainprof.analysis import idle
    from trainprof.analysis.causes import FRAME_RULES, WARMUP_OPS
    from trainprof.trace import load_traces

    names = [
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
        "x enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        "torch/utils/data/dataloader.py(733): __next__",
        "/venv/lib/python3.12/site-packages/datasets/arrow_dataset.py(1): __getitem__",
        "datasets/formatting/formatting.py(3): format_row",
        "mydatasets/arrow_dataset.py(1): f",
        "PIL/Image.py(1): open",
        "a/torchvision/transforms/functional.py(1): resize",
        "train.py(5): get_batch",
        "train.py(5): get_batch_size",
        "gloo:all_reduce",
        "c10d::barrier",
        "aten::wait",
        "record_param_comms",
        "nccl:all_reduce",
        "triton/compiler/compiler.py(1): compile",
        "x/triton/compiler/y.py(2): z",
        "torch/autograd/graph.py(825): _engine_run_backward",
        "aten::mm",
        "aten::mm_out",
        "aten::linear\n",
        "aten::cudnn_convolution",
        "ProfilerStep#12",
        "ProfilerStep#12\nx",
        "x\ngloo:all_reduce",
        "",
        "x/datasets/formatting/\ntriton/compiler/",
        "trainprof/capture/syncs.py(62): current_stack",
        "/src/trainprof/trainprof/session.py(377): _advance",
        "trainprof/demo.py(60): train_loop",
        "mytrainprof/x.py(1): f",
        "torch/autograd/profiler_util.py(1): f",
    ]
    for kind in ("traces", "busy", "stacks"):  # compile, data loading and framework frames among them
        for folder in sorted(p for p in (fixtures_dir / kind).iterdir() if p.is_dir()):
            for trace in load_traces(folder):
                names += trace.names

    def one_by_one(name: str) -> tuple[int, bool, bool]:
        codes = [code for code, rule in zip(idle._FRAME_RULE_CODES, FRAME_RULES, strict=True)
                 if re.search(rule.pattern, name)]
        return (
            codes[0] if codes else -1,
            WARMUP_OPS.match(name) is not None,
            idle._STEP_ANNOTATION.match(name) is not None,
        )

    rule, warm_op, step_mark = idle._name_rules(names)
    assert [(int(r), bool(w), bool(s)) for r, w, s in zip(rule, warm_op, step_mark, strict=True)] == [
        one_by_one(name) for name in names
    ]
    assert rule[:3].tolist() == [Cause.INPUT, -1, Cause.INPUT]  # the anchored rule holds at the start only
