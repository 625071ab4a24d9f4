"""Test setup shared by tests/ and tests/gpu/.

Without CUDA, Triton kernels run under Triton's CPU interpreter and numba's under its CUDA
simulator, which must be switched on before any kernel is defined, i.e. before the first
``fused_layers`` import (importing torch to ask about CUDA is fine). Also provides
``fixtures_dir``, the one way a test reaches the checked-in traces, and ``op_case``: run one
fused op and its float64 reference on the same inputs and compare the output and every gradient.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # numba's kernels on the CPU too (before its import)

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test`) each worker is a process with torch's default of one intra-op
    thread per core; the workers' threads would then spin against each other (OpenMP threads wait
    spinning). Each worker gets its share of the cores instead."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


# The slow tier: `make test-fast` runs `-m "not slow"`, `make test` (what CI runs) everything. Whole
# modules by what they do, and single test functions of otherwise quick modules that took a second
# of CPU time or more (the process and its children; 2-core machine, 2026-11-29, measured one process
# over the quick modules). tests/test_tiers.py holds every name here to a module or function that exists.
SLOW_MODULES = {
    "test_ops.py": "every fused op, odd shapes and dtypes, forward and backward under Triton's interpreter",
    "test_rope.py": "the RoPE kernels under Triton's interpreter",
    "test_linear_cross_entropy.py": "the fused loss under Triton's interpreter",
    "test_causal_lm.py": "causal LMs' fused loss, trained under Triton's interpreter",
    "test_numba_gelu.py": "numba's CUDA simulator",
    "test_swap.py": "Hugging Face models swapped, trained and compiled under Triton's interpreter",
    "test_fuzz.py": "300 mutants through every report writer",
    "test_fuzz_structured.py": "300 generated mutants, each memory-checked",
    "test_browser.py": "headless Chromium and TensorBoard",
    "test_job_analysis.py": "torchrun jobs",
    "test_run.py": "`trainprof run` in subprocesses",
    "test_integrations.py": "Hugging Face Trainer, Lightning and accelerate runs under a session",
    "test_user_loops.py": "users' loops under a session, each in a subprocess",
    "test_session_faults.py": "sessions failing in subprocesses",
    "test_stragglers.py": "2- and 4-rank gloo jobs run as module fixtures (60 s)",
    "test_distributed.py": "DDP and FSDP2 gloo jobs run as module fixtures (30 s)",
    "test_memory_bound.py": "each input's peak memory measured in a fresh process",
}
SLOW_TESTS = {
    "test_partial_runs.py::test_a_run_being_written_is_analysed_as_it_stands",  # 31 s
    "test_bad_input.py::test_threads_in_linear_time",  # 14 s
    "test_native_scan.py::test_mutated_traces_give_msgspecs_result_or_its_error",  # 11 s
    "test_quiet.py::test_quiet_run_silences_trainprofs_warnings_and_report",  # 11 s
    "test_true_numbers.py::test_no_printed_efficiency_passes_100_percent",  # 10 s over 35 cases
    "test_bad_input.py::test_step_annotations_in_linear_time",  # 8 s
    "test_hardening.py::test_fused_layers_without_triton_swap_and_train_with_torch",  # 9 s
    "test_busy.py::test_guarded_rules_search_as_re_does_on_every_fixture_name",  # 7 s
    "test_quiet.py::test_torch_profiler_chatter_does_not_reach_stderr",  # 7 s
    "test_hardening.py::test_warnings_as_errors_never_end_the_loop",  # 6 s
    "test_hardening.py::test_nested_sessions_step_aside_instead_of_crashing",  # 6 s
    "test_severity.py::test_no_finding_is_high_unless_it_costs_the_gpu_a_fifth_of_its_step",  # 6 s
    "test_native_scan.py::test_every_fixture_trace_is_read_into_the_same_tables",  # 6 s
    "test_quiet.py::test_the_allocators_warning_stays_off_through_a_long_run",  # 6 s
    "test_forest.py::test_every_fixture_threads_frames_walk_alike",  # 5 s
    "test_ab.py::test_json_shape_and_host_clock",  # 5 s
    "test_comm.py::test_exposure_agrees_with_a_sweep_on_fixture_traces",  # 5 s
    "test_thirdparty.py::test_every_trace_loads_and_busy_pct_is_time_weighted",  # 16 s over 11 traces
    "test_cli.py::test_bad_input_exits_2_with_one_line_naming_the_file",  # 4 s
    "test_ab.py::test_cli_prints_its_phases_once_per_run_unless_quiet",  # 3 s
    "test_trace.py::test_every_third_party_trace_loads",  # 3 s
    "test_analysis.py::test_a_folder_is_analysed_by_forked_workers_where_forking_is_safe",  # 3 s
    "test_attribution.py::test_sequence_links_agree_with_kinetos_flows",  # 3 s
    "test_partial_runs.py::test_a_cut_or_empty_window_is_skipped_with_one_warning_each",  # 3 s
    "test_workload.py::test_inference_traces_get_no_training_advice_and_no_session_options",  # 3 s
    "test_hardening.py::test_repeat_zero_keeps_memory_bounded",  # 2 s
    "test_analysis.py::test_a_folder_numbers_each_process_windows_as_load_traces_does",  # 2 s
    "test_quiet.py::test_quiet_analyze_says_nothing_on_stderr",  # 2 s
    "test_readme.py::test_block_runs_on_a_cpu",  # each block a fresh interpreter, models trained
    # sweeps over every fixture, and single tests of about a second each
    "test_console.py::test_console_fits_the_terminal",  # 10 s over 102 cases
    "test_severity.py::test_the_findings_of_a_step_never_put_more_gpu_time_at_stake_than_it_has",  # 8 s
    "test_thirdparty.py::test_xdit_graph_replays_are_counted_and_never_tiny",  # 2 s
    "test_bad_input.py::test_times_near_the_largest_float_print_no_numpy_warning",  # 2 s
    "test_hostile_output.py::test_progress_bar_shows_file_names_as_text",
    "test_native_scan.py::test_every_trace_torch_wrote_is_read_by_the_scanner",
    "test_thirdparty.py::test_mi300_hip_launches_counted_and_comm_heavy",
    "test_compile_choice.py::test_under_compile_the_recorded_choice_runs_else_inductors_code",
    "test_compile.py::test_a_session_records_dynamos_graph_break_count_and_reasons",
    "test_ab.py::test_prediction_ranges_rope_forward_and_backward",
    "test_comm.py::test_every_communication_bound_fixture_has_a_finding_with_a_fix",
    "test_idle_causes.py::test_name_rules_at_once_agree_with_one_search_per_name",
    "test_session.py::test_failure_inside_trainprof_warns_once_and_training_goes_on",
    "test_cli.py::test_analyze_imports_only_what_it_needs",
    "test_out_of_memory.py::test_a_second_out_of_memory_session_in_the_process_reports_its_own",
    "test_cli.py::test_a_terminals_progress_bar_leaves_the_folder_to_forked_workers",
    "test_shared_folder.py::test_report_to_a_device_the_user_named_is_written_through",
    "test_hardening.py::test_analysis_runs_where_torch_cannot_be_imported",
    "test_profiler_cost.py::test_a_diff_of_two_runs_compares_their_unprofiled_steps",
}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m "not slow"` (`make test-fast`) a slow module is not even imported: each of its tests
    would be deselected, and its imports (transformers, Triton's interpreter, numba's simulator) are
    most of the collection's time."""
    if config.getoption("markexpr") == "not slow" and collection_path.name in SLOW_MODULES:
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the slow tier (SLOW_MODULES, SLOW_TESTS) `slow`."""
    for item in items:
        module = item.path.name
        if module in SLOW_MODULES or f"{module}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures`` (README.md there): ``traces/`` (H200 runs with planted problems),
    ``thirdparty/`` (other projects' public traces, source and licence in its README) and
    ``stacks/`` (Hugging Face Trainer, Lightning and accelerate runs)."""
    return FIXTURES_DIR


@pytest.fixture
def cpu_only_trace(fixtures_dir, tmp_path) -> Path:
    """``busy/llama_swap/bare`` with its GPU events removed, in ``tmp_path``: what a CPU run records."""
    import gzip
    import json

    source = next((fixtures_dir / "busy" / "llama_swap" / "bare").glob("*.pt.trace.json.gz"))
    document = json.loads(gzip.decompress(source.read_bytes()))
    gpu = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_runtime", "cuda_driver"}
    document["traceEvents"] = [e for e in document["traceEvents"] if e.get("cat") not in gpu]
    path = tmp_path / "cpu.1.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode(), 1))
    return path


@pytest.fixture(scope="session")
def busy_run():
    """`busy_run(scenario, variant)`: what ``fixtures/busy/timings.json`` measured for one variant of a
    problem/fix pair without the profiler (H200, 2026-11-25): `step_ms_median`, `peak_memory_bytes`, ..."""
    runs = json.loads((FIXTURES_DIR / "busy" / "timings.json").read_text())["runs"]
    by_name = {(run["scenario"], run["variant"]): run for run in runs}
    return lambda scenario, variant: by_name[(scenario, variant)]


# (atol, rtol) for outputs and gradients against a float64 reference computed from the same
# (already rounded) inputs: about a few units of the dtype's last place at the values' scale.
TOLERANCES = {
    torch.float32: (2e-5, 1e-4),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 2e-2),
}

OPS = ("gelu_tanh", "gelu_erf", "layer_norm", "rms_norm", "geglu", "swiglu")


def _reference(op: str, inputs: dict[str, torch.Tensor | None]) -> torch.Tensor:
    """The op written plainly in torch; called on float64 copies."""
    import torch.nn.functional as F

    x = inputs["x"]
    if op == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if op == "gelu_erf":
        return F.gelu(x)
    if op == "layer_norm":
        return F.layer_norm(x, (x.shape[-1],), inputs.get("weight"), inputs.get("bias"), 1e-5)
    if op == "rms_norm":
        x_normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        w = inputs.get("weight")
        return w * x_normed if w is not None else x_normed
    if op == "geglu":
        return F.gelu(x, approximate="tanh") * inputs["b"]
    if op == "swiglu":
        return F.silu(x) * inputs["b"]
    raise ValueError(op)


def _ours(op: str, inputs: dict[str, torch.Tensor | None], backend: str | None) -> torch.Tensor:
    from fused_layers.ops import geglu, gelu, layer_norm, rms_norm, swiglu

    x = inputs["x"]
    if op == "gelu_tanh":
        return gelu(x, "tanh", backend=backend)
    if op == "gelu_erf":
        return gelu(x, "none", backend=backend)
    if op == "layer_norm":
        return layer_norm(x, inputs.get("weight"), inputs.get("bias"), 1e-5, backend=backend)
    if op == "rms_norm":
        return rms_norm(x, inputs.get("weight"), 1e-6, backend=backend)
    if op == "geglu":
        return geglu(x, inputs["b"], "tanh", backend=backend)
    if op == "swiglu":
        return swiglu(x, inputs["b"], backend=backend)
    raise ValueError(op)


def run_op_case(
    op: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str = "cpu",
    *,
    weight: bool = True,
    bias: bool = True,
    layout: str = "contiguous",
    backend: str | None = "triton",
) -> None:
    """Check ``op`` on fresh random inputs of ``shape`` against float64: output and all gradients.

    ``layout`` "transposed" builds x as the transpose of a (W, ..., rows) tensor; "strided"
    takes x as every other column of a twice-as-wide buffer (a non-unit column stride) and
    "row_strided" as the left half of one (a row stride larger than the width).
    """
    width = shape[-1]

    def make(s: tuple[int, ...]) -> torch.Tensor:
        if layout == "transposed":
            return torch.randn(s[::-1], device=device).to(dtype).permute(*reversed(range(len(s))))
        if layout == "strided":
            return torch.randn(*s[:-1], 2 * s[-1], device=device).to(dtype)[..., ::2]
        if layout == "row_strided":
            return torch.randn(*s[:-1], 2 * s[-1], device=device).to(dtype)[..., : s[-1]]
        return torch.randn(s, device=device).to(dtype)

    inputs: dict[str, torch.Tensor | None] = {"x": make(shape)}
    if op in ("geglu", "swiglu"):
        inputs["b"] = make(shape)
    if op in ("layer_norm", "rms_norm") and weight:
        inputs["weight"] = (1 + 0.5 * torch.randn(width, device=device)).to(dtype)
    if op == "layer_norm" and bias:
        inputs["bias"] = torch.randn(width, device=device).to(dtype)
    if layout != "contiguous" and shape[0] > 0 and width > 1:
        assert not inputs["x"].is_contiguous()
    leaves = {k: v.detach().requires_grad_() for k, v in inputs.items() if v is not None}
    leaves64 = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    out = _ours(op, leaves, backend)
    ref = _reference(op, leaves64)
    assert out.shape == ref.shape and out.dtype == dtype
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), ref.detach(), atol=atol, rtol=rtol)
    dy = torch.randn(shape, device=device).to(dtype)
    names = list(leaves)
    grads = torch.autograd.grad(out, [leaves[k] for k in names], dy)
    grads64 = torch.autograd.grad(ref, [leaves64[k] for k in names], dy.double())
    for name, grad, grad64 in zip(names, grads, grads64, strict=True):
        assert grad.dtype == leaves[name].dtype and grad.shape == leaves[name].shape, name
        # dweight/dbias sum over rows: scale the tolerance by the row count's square root
        rows = out.numel() // max(width, 1)
        scale = max(1.0, rows**0.5) if name in ("weight", "bias") else 1.0
        torch.testing.assert_close(
            grad.double(), grad64, atol=atol * scale, rtol=rtol, msg=lambda m, n=name: f"grad of {n}: {m}"
        )


@pytest.fixture
def op_case():
    """``run_op_case`` as a fixture, for tests/test_ops.py and tests/gpu/test_ops_gpu.py."""
    return run_op_case


class HostileTrace:
    """A real trace whose names are markup: where it lands as HTML, it must show as text."""

    kernel = "<img src=x onerror=alert(1)>"
    """The name of the trace's kernel with the most GPU time (it tops every kernel table)."""
    op = "<script>alert(2)</script>"
    """The name of every `aten::mm` op."""
    python = "model.py(1): </script><script>alert(3)</script>"
    """The name of the Python frame of the loop's first forward call."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder


@pytest.fixture(scope="session")
def hostile_trace(tmp_path_factory, fixtures_dir) -> HostileTrace:
    """``busy/llama_swap/bare`` (an H200 trace) renamed as `HostileTrace` says, in a run folder."""
    import gzip
    import json

    source = next((fixtures_dir / "busy" / "llama_swap" / "bare").glob("*.pt.trace.json.gz"))
    document = json.loads(gzip.decompress(source.read_bytes()))
    events = document["traceEvents"]
    kernel_us: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "kernel":
            kernel_us[event["name"]] = kernel_us.get(event["name"], 0.0) + event.get("dur", 0.0)
    top_kernel = max(kernel_us, key=kernel_us.get)
    forward = next(e["name"] for e in events if e.get("cat") == "python_function"
                   and e["name"].endswith(": forward") and "modeling_llama" in e["name"])
    renames = {top_kernel: HostileTrace.kernel, "aten::mm": HostileTrace.op, forward: HostileTrace.python}
    for event in events:
        event["name"] = renames.get(event.get("name"), event.get("name"))
    folder = tmp_path_factory.mktemp("hostile") / "run-hostile"
    folder.mkdir()
    (folder / "hostile.1.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(document).encode(), 1))
    return HostileTrace(folder)
