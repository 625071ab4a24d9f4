"""GPU-busy time: kernel classes, work, peaks, MFU and the findings on busy waste (`trainprof.analysis.busy`,
`busy_findings`, `fusion`, `peaks`, `work`, `kernel_classes`), and the session's peaks measurement.

Each rule is pinned by a synthetic trace written here (a step of one or a few kernels whose names,
ops and recorded shapes are chosen so that the expected figures follow from the formulas), then
checked on the recorded H200 problem/fix pairs of `tests/fixtures/busy` against their unprofiled step
times (`timings.json`): each rule fires on its problem and is silent after its fix, and its predicted
gain is within 30% of the measured one.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from trainprof.analysis import Analysis, analyze
from trainprof.analysis.busy_findings import FUSED_ATTENTION_PEAK_SHARE, KERNEL_FLOOR_US
from trainprof.analysis.collectives import COMM_KERNELS
from trainprof.analysis.fusion import FORWARD_BYTES_FACTOR, FUSED_BYTES_FACTOR, SWAPPABLE, rope_bytes
from trainprof.analysis.kernel_classes import (
    GEMM_DTYPE_RULES,
    NAME_RULES,
    OP_RULES,
    KernelClass,
    classify_name,
)
from trainprof.analysis.name_patterns import GuardedSearch, required_literals
from trainprof.analysis.peaks import KNOWN_DEVICES, known_device, measured_peaks
from trainprof.analysis.work import op_work
from trainprof.report._format import headline
from trainprof.trace import TraceLoadError, load_trace

MAIN = 100
H200 = {"bf16": 804.0, "fp16": 773.0, "tf32": 404.0, "fp32": 50.5}  # the table's measured row
H200_COPY = 4.30e12
BUSY_KINDS = ("gemm_precision", "unfused_attention", "fusible_layers", "memory_bound_kernels", "gemm_shape")


class TraceBuilder:
    """A torch.profiler-shaped trace: ops with recorded inputs, module frames, kernels on one stream."""

    def __init__(self, device: str = "NVIDIA H200", memory: float = 150e9) -> None:
        self.events: list[dict] = []
        self.correlation = 0
        self.device = {"id": 0, "name": device, "totalGlobalMem": memory}

    def cpu(self, cat: str, name: str, ts: float, dur: float, tid: int = MAIN, **args) -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    def step(self, number: int, start: float, dur: float) -> None:
        self.cpu("user_annotation", f"ProfilerStep#{number}", start, dur)

    def module(self, name: str, ts: float, dur: float) -> None:
        self.cpu("python_function", f"nn.Module: {name}", ts, dur)

    def op(
        self, name: str, ts: float, dur: float, dims: list | None = None, types: list | None = None, **args
    ) -> None:
        if dims is not None:
            args["Input Dims"], args["Input type"] = dims, types
        self.cpu("cpu_op", name, ts, dur, **args)

    def launch(self, kernel: str, ts: float, start: float, dur: float) -> None:
        """A launch call at `ts` (inside whatever op is open there) and its kernel [start, start + dur]."""
        self.correlation += 1
        self.cpu("cuda_runtime", "cudaLaunchKernel", ts, 2, correlation=self.correlation)
        self.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": 7,
                "ts": start,
                "dur": dur,
                "args": {"correlation": self.correlation, "device": 0, "stream": 7},
            }
        )

    def op_kernel(
        self, op: str, dims: list, types: list, kernel: str, ts: float, start: float, dur: float, **args
    ) -> None:
        """An op at `ts` launching one kernel that runs [start, start + dur]."""
        self.op(op, ts, 10, dims, types, **args)
        self.launch(kernel, ts + 2, start, dur)

    def write(self, folder: Path, peaks: dict | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "w.1790000000000.pt.trace.json"
        path.write_text(
            json.dumps({"schemaVersion": 1, "deviceProperties": [self.device], "traceEvents": self.events})
        )
        if peaks is not None:
            (folder / "w.peaks.json").write_text(json.dumps(peaks))
        return path


def _findings(result: Analysis, kind: str) -> list:
    return [f for f in result.findings if f.kind == kind]


def _busy(result: Analysis):
    (trace,) = result.traces
    return trace.busy


def _class_row(result: Analysis, key: str):
    return next(row for row in _busy(result).classes if row.kernel_class == key)


# ---- kernel classes, work and peaks, as data ---------------------------------------------------------


@pytest.mark.parametrize(
    "name, kernel_class, dtype",
    [
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>("
            "cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)",
            KernelClass.GEMM_FP32,
            "fp32",
        ),
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
            "execute_kernel__5x_cublas",
            KernelClass.GEMM_FP32,
            "fp32",
        ),
        ("volta_sgemm_64x64_nt", KernelClass.GEMM_FP32, "fp32"),
        (
            "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_"
            "kernel__5x_cublas",
            KernelClass.GEMM_TF32,
            "tf32",
        ),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>(...)",
            KernelClass.GEMM_TF32,
            "tf32",
        ),
        (
            "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>(...)",
            KernelClass.GEMM_16BIT,
            "bf16",
        ),
        (
            "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x192x64_MI16x16x1_SN_LDSB1",
            KernelClass.GEMM_16BIT,
            "bf16",
        ),
        ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3", KernelClass.GEMM_FP8, "fp8"),
        ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", KernelClass.GEMM, None),  # dtype from its op
        (
            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
            KernelClass.ATTENTION_CUDNN,
            None,
        ),
        (
            "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128>>(...)",
            KernelClass.ATTENTION_FLASH,
            None,
        ),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", KernelClass.ATTENTION_MEM_EFFICIENT, None),
        ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>(...)", KernelClass.COPY, None),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(...)",
            KernelClass.NORM,
            None,
        ),
        ("_rms_norm_fwd_fused", KernelClass.NORM, None),
        ("triton_red_fused_add_addmm_mul_native_layer_norm_split_unsqueeze_view_5", KernelClass.NORM, None),
        ("triton_poi_fused_addmm_gelu_view_24", KernelClass.ELEMENTWISE, None),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
            KernelClass.ELEMENTWISE,
            None,
        ),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
            "at::TensorIteratorBase&)"
            "::{lambda()#3}::operator()() const::{lambda(float)#1}>(...)",
            KernelClass.COPY,
            None,
        ),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(...)",
            KernelClass.REDUCTION,
            None,
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
            "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::"
            "FusedAdamMathFunctor<float, 4>"
            ">(...)",
            KernelClass.OPTIMIZER,
            None,
        ),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", KernelClass.COMMUNICATION, None),
        (
            "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(...)",
            KernelClass.CONVOLUTION,
            None,
        ),
        (
            "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(...)",
            KernelClass.OTHER,
            None,
        ),
    ],
)
def test_kernel_names_classify(name, kernel_class, dtype):
    assert classify_name(name) == (kernel_class, dtype)
    # the rules match case-insensitively: the name's case changes nothing
    assert classify_name(name.upper().replace("VOID ", "void ", 1)) == (kernel_class, dtype)


def test_class_rules_are_lowercase_as_the_lowercased_names_they_search():
    patterns = [rule.pattern for rule in NAME_RULES + OP_RULES] + [p for _, p in GEMM_DTYPE_RULES]
    for pattern in patterns:
        literal = re.sub(r"\\.", "", pattern)  # an escape (\b, \w) is not a letter to match
        assert literal == literal.lower(), pattern


@pytest.mark.parametrize(
    "pattern, literals",
    [
        (r"all_?reduce|sendrecv", ("reduce", "sendrecv")),  # an optional character ends a run
        (r"\blamb\b|conv(?!ert)|^cijk_\w*_(bbs|hb)_", ("lamb", "conv", "cijk_")),  # zero-width goes on
        (r"cudnn.*(sdpa|fmha)|im2d?2?col", ("cudnn", "im2")),
        (r"gemm|.*", None),  # an alternative that needs no letter
        (r"a+b|x{2}|[ab]c", None),  # syntax not read: the regex alone decides
        (r"\(dynamo_timed\)$|^aten::(mm|bmm)$| to ", ("(dynamo_timed)", "aten::", " to ")),  # `\(`: a (
        (r"(^|/)(nccl|rccl)|ab+c", ("nccl", "rccl", "ab")),  # a group every match holds; `+` ends a run
        (r"(ab)*|cd", None),  # an optional group holds nothing required
        (r"ab(", None),  # an unclosed group
        (r"(?i)nccl", None),  # inline flags
        (r"(?P<lib>nccl|rccl)_kernel", ("_kernel",)),  # a named group
    ],
)
def test_required_literals(pattern, literals):
    assert required_literals(pattern) == literals


def test_guarded_rules_search_as_re_does_on_every_fixture_name(fixtures_dir):
    names = set()
    for path in sorted(fixtures_dir.glob("**/*.json*")):
        try:
            names.update(load_trace(path).names)
        except TraceLoadError:  # sidecars and sync sites files: not traces
            continue
    assert len(names) > 5000
    lowered = [name.lower() for name in names]
    patterns = [rule.pattern for rule in NAME_RULES + OP_RULES] + [p for _, p in GEMM_DTYPE_RULES]
    patterns += [family.pattern for family in COMM_KERNELS]
    for pattern in patterns:
        search, compiled = GuardedSearch(pattern), re.compile(pattern)
        assert search.literals is not None, pattern  # every rule has its prefilter
        for name in lowered:
            assert search.found_in(name) == (compiled.search(name) is not None), (pattern, name)


def test_op_work_counts_flops_as_torch_does_and_bytes_read_and_written():
    bf16, f32 = "c10::BFloat16", "float"
    mm = op_work("aten::mm", [[8192, 768], [768, 50257]], [bf16, bf16])
    assert mm.flops == 2 * 8192 * 768 * 50257 and mm.gemm == (1, 8192, 50257, 768) and mm.dtype == "bf16"
    addmm = op_work(
        "aten::addmm", [[3072], [8192, 768], [768, 3072], [], []], [f32, bf16, f32, "Scalar", "Scalar"]
    )
    assert addmm.gemm == (1, 8192, 3072, 768) and addmm.dtype == "fp32"  # its first tensor's dtype
    assert (
        op_work("aten::bmm", [[48, 2048, 64], [48, 64, 2048]], [bf16, bf16]).flops
        == 2 * 48 * 2048 * 2048 * 64
    )
    assert op_work("aten::matmul", [[4, 2048, 768], [768, 50257]], [bf16, bf16]).gemm == (4, 2048, 50257, 768)
    assert op_work("aten::linear", [[4, 2048, 768], [3072, 768], [3072]], [bf16] * 3).gemm == (
        1,
        8192,
        3072,
        768,
    )
    assert math.isnan(
        op_work("aten::mm", [[8192, 768], [512, 3072]], [bf16, bf16]).flops
    )  # shapes that do not fit
    # Attention: 4 B H Tq Tk D forward, twice that backward; the [B, T, H, D] layout of the _flash ops.
    q = [4, 12, 2048, 64]
    assert (
        op_work("aten::_scaled_dot_product_flash_attention", [q, q, q], [bf16] * 3).flops
        == 4 * 4 * 12 * 2048**2 * 64
    )
    grad = op_work("aten::_scaled_dot_product_cudnn_attention_backward", [q, q, q, q, q], [bf16] * 5)
    assert grad.flops == 8 * 4 * 12 * 2048**2 * 64
    assert (
        op_work("aten::_flash_attention_forward", [[4, 2048, 12, 64]] * 3, [bf16] * 3).flops
        == 4 * 4 * 12 * 2048**2 * 64
    )
    # Bytes: inputs read, an output the size of the largest; in place and copy_ write their first.
    assert op_work("aten::add", [[1024, 1024], [1024, 1024]], [f32, f32]).bytes == 3 * 4 * 2**20
    assert op_work("aten::add_", [[1024, 1024], [1024]], [f32, f32]).bytes == 4 * 2**20 * 2 + 4 * 1024
    copy = op_work("aten::copy_", [[1024, 1024], [1024, 1024]], [f32, bf16])
    assert copy.bytes == 6 * 2**20 and copy.first_input == ([1024, 1024], bf16)  # reads its source
    # A score matrix [.., T, T]; a square weight is not one.
    assert op_work("aten::_softmax", [[4, 12, 2048, 2048], [], []], [f32, "Scalar", "Scalar"]).scores
    assert op_work("aten::bmm", [[48, 2048, 64], [48, 64, 2048]], [bf16, bf16]).scores  # makes one
    assert not op_work("aten::mm", [[2048, 2048], [2048, 2048]], [bf16, bf16]).scores


@pytest.mark.parametrize(
    "name, memory_gib, label",
    [
        ("NVIDIA H200", 141, "NVIDIA H200"),
        ("NVIDIA H100 80GB HBM3", 80, "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", 80, "NVIDIA H100 PCIe"),
        ("NVIDIA A100-SXM4-80GB", 80, "NVIDIA A100 80GB SXM"),
        ("NVIDIA A100-PG509-200", 39.4, "NVIDIA A100 40GB"),
        ("NVIDIA A100 80GB PCIe", 80, "NVIDIA A100 80GB PCIe"),
        ("NVIDIA B200", 180, "NVIDIA B200"),
        ("AMD Instinct MI300X", 192, "AMD Instinct MI300X"),
        ("Tesla V100-DGXS-32GB", 32, "NVIDIA V100 SXM2"),
        ("NVIDIA GeForce RTX 2080 Ti", 11, "NVIDIA GeForce RTX 2080 Ti"),
        ("NVIDIA L4", 24, "NVIDIA L4"),
        ("NVIDIA L40S", 48, "NVIDIA L40S"),
    ],
)
def test_known_devices_match_their_rows(name, memory_gib, label):
    assert known_device(name, memory_gib * 2**30).label == label


def test_known_devices_rows_are_consistent():
    for row in KNOWN_DEVICES:
        for rates in [row.matmul_tflops] + ([row.measured.matmul_tflops] if row.measured else []):
            assert row.origin and row.memory_tb_s > 0 and rates["fp32"] > 0
            # Tensor-core rates beat plain fp32 where the device has them; TF32 is half the 16-bit
            # rate or less.
            assert all(rates[d] > rates["fp32"] for d in rates if d != "fp32")
            if "tf32" in rates:
                assert rates["tf32"] <= 0.55 * rates["bf16"]
        if row.measured is not None:  # a measurement reaches no datasheet figure
            assert row.measured.copy_tb_s < row.memory_tb_s
            assert all(rate < row.matmul_tflops[d] for d, rate in row.measured.matmul_tflops.items())
    assert known_device("Mystery GPU") is None
    h200 = known_device("NVIDIA H200")  # the datasheet the field reads MFU against
    assert (h200.matmul_tflops["bf16"], h200.matmul_tflops["tf32"], h200.matmul_tflops["fp8"]) == (
        989.4, 494.7, 1978.9
    ) and h200.memory_tb_s == 4.8


def test_measured_peaks_are_read_and_must_be_of_the_traces_device():
    document = {
        "device": "NVIDIA H200",
        "torch": "2.11",
        "date": "2026-11-25",
        "matmul_tflops": {"bf16": 800.0, "fp32": "fast", "tf32": -1},
        "copy_tb_s": 4.2,
    }
    peaks = measured_peaks(document, "NVIDIA H200")
    assert peaks.source == "measured" and peaks.matmul_tflops == {"bf16": 800.0} and peaks.copy_tb_s == 4.2
    assert "2026-11-25" in peaks.label
    assert measured_peaks(document, "NVIDIA H100 80GB HBM3") is None
    assert measured_peaks({"device": "NVIDIA H200", "matmul_tflops": {}}, "NVIDIA H200") is None


# ---- the busy breakdown on synthetic traces ------------------------------------------------------------

BF16, F32 = "c10::BFloat16", "float"
NVJET = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN"


def test_a_gemm_gets_its_flops_dtype_share_and_the_mfu(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.op_kernel("aten::mm", [[4096, 4096], [4096, 4096]], [BF16, BF16], NVJET, 100, 200, 400)
    trace.op_kernel(
        "aten::add",
        [[4096, 4096], [4096, 4096]],
        [BF16, BF16],
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>",
        150,
        700,
        100,
    )
    result = analyze(trace.write(tmp_path))
    flops = 2 * 4096**3
    gemm = _class_row(result, "gemm_bf16_fp16")
    assert gemm.gpu_ms_per_step == pytest.approx(0.4)
    assert gemm.step_pct == pytest.approx(4.0)  # of the 10 ms window
    assert gemm.achieved_tflops == pytest.approx(flops / 400e-6 / 1e12, rel=1e-3)
    assert gemm.peak_pct == pytest.approx(100 * flops / 400e-6 / 804e12, abs=0.1)
    add = _class_row(result, "elementwise")
    assert add.achieved_tb_s == pytest.approx(3 * 2 * 4096**2 / 100e-6 / 1e12, rel=1e-3)
    assert add.peak_pct == pytest.approx(100 * 3 * 2 * 4096**2 / 100e-6 / H200_COPY, abs=0.1)
    busy = _busy(result)
    # MFU against the datasheet's dense bf16 peak, as the field reports it; the measured one beside it.
    assert busy.mfu_pct == pytest.approx(100 * flops / 989.4e12 / 10e-3, abs=0.01)
    assert busy.mfu_dtype == "bf16"
    assert busy.mfu_achievable_pct == pytest.approx(100 * flops / 804e12 / 10e-3, abs=0.01)
    assert (busy.mfu_peak_tflops, busy.mfu_achievable_tflops) == (989.4, 804.0)
    assert result.summary.mfu_pct == busy.mfu_pct
    assert result.summary.mfu_achievable_pct == busy.mfu_achievable_pct
    assert busy.peaks.source == "table" and "H200" in result.summary.peaks_source
    assert busy.model_tflop_per_step == pytest.approx(flops / 1e12, abs=1e-4)


CONV = "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(...)"


@pytest.mark.parametrize("conv_us", [3_600, 40])
def test_the_mfu_is_unknown_when_kernels_of_unknown_flops_hold_most_of_the_compute(tmp_path, conv_us):
    # A bf16 GEMM of known FLOPs (400 µs) beside a convolution whose FLOPs no one recorded.
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.op_kernel("aten::mm", [[4096, 4096], [4096, 4096]], [BF16, BF16], NVJET, 100, 200, 400)
    trace.op_kernel("aten::cudnn_convolution", [[64, 3, 224, 224]], [F32], CONV, 150, 700, conv_us)
    result = analyze(trace.write(tmp_path))
    busy = _busy(result)
    known_pct = 100 * 400 / (400 + conv_us)
    assert busy.flops_known_pct == pytest.approx(known_pct, abs=0.01)
    assert result.summary.mfu_flops_known_pct == pytest.approx(known_pct, abs=0.01)
    (mfu,) = [value for label, value in headline(result) if label == "MFU"]
    if conv_us > 400:  # 10% known: no misleading 0.x %
        assert busy.mfu_pct is None and result.summary.mfu_pct is None
        assert all(step.mfu_pct is None for step in busy.steps)
        assert mfu == "unknown: FLOPs known for only 10% of the compute time"
    else:
        assert busy.mfu_pct == pytest.approx(100 * 2 * 4096**3 / 989.4e12 / 10e-3, abs=0.01)
        assert mfu.endswith("(counts the FLOPs of 91% of the compute time)")


def test_the_step_is_the_gpu_time_of_its_kernels_when_the_host_runs_ahead(tmp_path):
    # Host windows of 2 ms; each step launches 10 ms of kernels, which queue behind the previous step's.
    trace = TraceBuilder()
    for i in range(3):
        start = i * 2_000
        trace.step(i + 1, start, 2_000)
        trace.op_kernel(
            "aten::mm",
            [[4096, 4096], [4096, 4096]],
            [BF16, BF16],
            NVJET,
            start + 100,
            100 + 10_000 * i,
            10_000,
        )
    result = analyze(trace.write(tmp_path))
    busy = _busy(result)
    assert [s.window_ms for s in busy.steps] == pytest.approx([2.0] * 3)
    assert [s.step_ms for s in busy.steps] == pytest.approx([10.0] * 3)
    assert busy.step_ms == pytest.approx(10.0) and result.summary.gpu_step_ms == pytest.approx(10.0)
    assert result.summary.mean_step_ms == pytest.approx(2.0)  # the host's view is unchanged
    shares = [row.step_pct for row in busy.classes]
    assert max(shares) == pytest.approx(100.0) and sum(shares) <= 100.0 + 1e-6
    assert busy.mfu_pct == pytest.approx(100 * 2 * 4096**3 / 989.4e12 / 10e-3, abs=0.01)


def test_a_peaks_file_beside_the_trace_wins_over_the_table(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.op_kernel("aten::mm", [[4096, 4096], [4096, 4096]], [BF16, BF16], NVJET, 100, 200, 400)
    peaks = {
        "version": 1,
        "device": "NVIDIA H200",
        "torch": "2.99",
        "date": "2026-12-01",
        "how": "a test",
        "matmul_tflops": {"bf16": 500.0},
        "copy_tb_s": 4.0,
    }
    result = analyze(trace.write(tmp_path, peaks))
    busy = _busy(result)
    assert busy.peaks.source == "measured" and busy.peaks.matmul_tflops == {"bf16": 500.0}
    assert busy.peaks.datasheet_tflops["bf16"] == 989.4  # the table's row for the measured device
    assert busy.mfu_achievable_pct == pytest.approx(100 * 2 * 4096**3 / 500e12 / 10e-3, abs=0.01)
    assert busy.mfu_pct == pytest.approx(100 * 2 * 4096**3 / 989.4e12 / 10e-3, abs=0.01)
    assert "2026-12-01" in result.summary.peaks_source


@pytest.mark.parametrize(
    "device, short",
    [("NVIDIA H100 80GB HBM3", "H100 SXM datasheet"), ("AMD Instinct MI300X", "Instinct MI300X datasheet")],
)
def test_table_peaks_have_a_short_label_and_their_source_in_full(tmp_path, device, short):
    trace = TraceBuilder(device=device)
    trace.step(1, 0, 10_000)
    trace.op_kernel("aten::mm", [[4096, 4096], [4096, 4096]], [BF16, BF16], NVJET, 100, 200, 400)
    summary = analyze(trace.write(tmp_path)).summary
    assert summary.peaks_label == short
    assert summary.peaks_source.startswith("table: ") and "datasheet, dense" in summary.peaks_source


def test_a_damaged_peaks_file_is_ignored_with_a_warning(tmp_path, caplog):
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.op_kernel("aten::mm", [[4096, 4096], [4096, 4096]], [BF16, BF16], NVJET, 100, 200, 400)
    path = trace.write(tmp_path)
    (tmp_path / "w.peaks.json").write_text("[1, 2")
    with caplog.at_level("WARNING", logger="trainprof"):
        result = analyze(path)
    assert _busy(result).peaks.source == "table"
    assert "not a peaks file" in caplog.text


def test_an_unknown_device_has_no_throughput_figures_and_no_busy_findings(tmp_path):
    trace = TraceBuilder(device="Mystery GPU")
    trace.step(1, 0, 30_000)
    trace.op_kernel(
        "aten::mm", [[8192, 8192], [8192, 8192]], [F32, F32], "volta_sgemm_128x64_nn", 100, 200, 25_000
    )
    result = analyze(trace.write(tmp_path))
    busy = _busy(result)
    assert busy.peaks is None and busy.mfu_pct is None
    assert _class_row(result, "gemm_fp32").achieved_tflops == pytest.approx(
        2 * 8192**3 / 25e-3 / 1e12, rel=1e-3
    )
    assert _class_row(result, "gemm_fp32").peak_pct is None
    assert not [f for f in result.findings if f.kind in BUSY_KINDS]


# ---- findings ------------------------------------------------------------------------------------------


def _fp32_gemm_trace(tmp_path: Path, kernel: str, device: str = "NVIDIA H200") -> Analysis:
    trace = TraceBuilder(device=device)
    trace.step(1, 0, 25_000)
    trace.module("Linear_0", 50, 200)
    trace.op_kernel("aten::mm", [[8192, 8192], [8192, 8192]], [F32, F32], kernel, 100, 200, 22_000)
    return analyze(trace.write(tmp_path))


def test_precision_predicts_each_fix_from_the_peaks(tmp_path):
    result = _fp32_gemm_trace(tmp_path, "volta_sgemm_128x64_nn")
    (finding,) = _findings(result, "gemm_precision")
    flops = 2 * 8192**3
    bf16_ms = max(22.0 * H200["fp32"] / H200["bf16"], flops / (H200["bf16"] * 1e12) * 1e3)
    tf32_ms = max(22.0 * H200["fp32"] / H200["tf32"], flops / (H200["tf32"] * 1e12) * 1e3)
    assert finding.gpu_ms_per_step == pytest.approx(22.0 - bf16_ms, rel=1e-3)
    assert finding.severity == "high"
    best, second = finding.details.predictions
    assert (best.dtype, second.dtype) == ("bf16", "tf32")
    assert best.predicted_step_ms == pytest.approx(25.0 - (22.0 - bf16_ms), rel=1e-3)
    assert second.predicted_gpu_ms_per_step == pytest.approx(tf32_ms, rel=1e-3)
    assert "torch.autocast" in finding.fix and 'set_float32_matmul_precision("high")' in finding.fix
    assert finding.where.function == "Linear"


def test_precision_is_silent_for_tf32_gemms(tmp_path):
    kernel = "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute_kernel"
    assert not _findings(_fp32_gemm_trace(tmp_path, kernel), "gemm_precision")


def test_precision_on_a_gpu_without_bf16_or_tf32_names_fp16_and_a_grad_scaler(tmp_path):
    result = _fp32_gemm_trace(tmp_path, "volta_sgemm_128x64_nn", device="Tesla V100-SXM2-32GB")
    (finding,) = _findings(result, "gemm_precision")
    (prediction,) = finding.details.predictions
    assert prediction.dtype == "fp16" and "float16" in finding.fix and "GradScaler" in finding.fix
    assert "set_float32_matmul_precision" not in finding.fix


def test_an_opaque_fp32_gemm_is_tf32_only_when_it_beats_the_fp32_peak(tmp_path):
    # nvjet's name carries no dtype: its op's float inputs say fp32, its speed says whether TF32 ran.
    flops = 2 * 8192**3
    for ms, expected in ((flops / 300e12 * 1e3, "gemm_tf32"), (flops / 45e12 * 1e3, "gemm_fp32")):
        trace = TraceBuilder()
        trace.step(1, 0, 30_000)
        trace.op_kernel("aten::mm", [[8192, 8192], [8192, 8192]], [F32, F32], NVJET, 100, 200, ms * 1e3)
        result = analyze(trace.write(tmp_path / expected))
        assert [row.kernel_class for row in _busy(result).classes] == [expected]


def _attention_trace(
    tmp_path: Path,
    scores_seq: int = 1024,
    module: str = "MyAttention_0",
    wrap: tuple[str, list, list] | None = None,
) -> Analysis:
    """B1 H16 T1024 D64 eager attention: QK^T (bmm), softmax over [1, 16, T, Tk], PV (bmm), 2 ms each."""
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.module(module, 10, 500)
    if wrap is not None:
        trace.op(wrap[0], 20, 400, wrap[1], wrap[2])
    gemm = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>"
    trace.op_kernel("aten::bmm", [[16, 1024, 64], [16, 64, scores_seq]], [BF16, BF16], gemm, 30, 100, 2_000)
    trace.op_kernel(
        "aten::_softmax",
        [[1, 16, 1024, scores_seq], [], []],
        [F32, "Scalar", "Scalar"],
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 11>",
        60,
        2_100,
        2_000,
    )
    trace.op_kernel(
        "aten::bmm", [[16, 1024, scores_seq], [16, scores_seq, 64]], [BF16, BF16], gemm, 90, 4_100, 2_000
    )
    return analyze(trace.write(tmp_path))


def test_unfused_attention_predicts_a_fused_kernel_from_its_flops(tmp_path):
    result = _attention_trace(tmp_path)
    (finding,) = _findings(result, "unfused_attention")
    flops = 2 * (2 * 16 * 1024 * 1024 * 64)
    fused_ms = flops / (FUSED_ATTENTION_PEAK_SHARE * H200["bf16"] * 1e12) * 1e3
    assert finding.gpu_ms_per_step == pytest.approx(6.0 - fused_ms, rel=1e-3)
    assert finding.details.score_shape == [1, 16, 1024, 1024] and finding.details.modules == ["MyAttention"]
    assert finding.details.sdpa_math_calls_per_step == 0 and "scaled_dot_product_attention" in finding.fix
    assert _class_row(result, "attention_unfused").gpu_ms_per_step == pytest.approx(6.0)


def test_unfused_attention_needs_a_softmax_over_square_scores_in_an_attention_module(tmp_path):
    assert not _findings(_attention_trace(tmp_path / "a", scores_seq=512), "unfused_attention")
    assert not _findings(_attention_trace(tmp_path / "b", module="MyMLP_0"), "unfused_attention")


def test_sdpa_math_fallback_says_why_from_its_inputs(tmp_path):
    q = [1, 16, 1024, 64]
    wrap = (
        "aten::_scaled_dot_product_attention_math",
        [q, q, q, [1, 1, 1024, 1024], [], []],
        [F32, F32, F32, "bool", "Scalar", "Scalar"],
    )
    result = _attention_trace(tmp_path, wrap=wrap)
    (finding,) = _findings(result, "unfused_attention")
    assert finding.title.startswith("SDPA ran its math fallback") and finding.op.endswith("attention_math")
    reasons = " ".join(finding.details.fallback_reasons)
    assert "fp32" in reasons and "attn_mask [1, 1, 1024, 1024]" in reasons
    assert finding.details.sdpa_math_calls_per_step == 1


def test_fused_attention_kernels_take_their_ops_flops_and_class(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    q = [4, 12, 2048, 64]
    trace.op("aten::_scaled_dot_product_flash_attention", 20, 400, [q, q, q], [BF16] * 3)
    trace.launch("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", 30, 100, 1_000)
    result = analyze(trace.write(tmp_path))
    row = _class_row(result, "attention_flash")
    assert row.achieved_tflops == pytest.approx(4 * 4 * 12 * 2048**2 * 64 / 1e-3 / 1e12, rel=1e-3)
    assert not _findings(result, "unfused_attention")


def _norm_trace(tmp_path: Path, norm: str = "LlamaRMSNorm_0") -> Analysis:
    """A forward-only step: an RMSNorm (two 1 ms kernels on x [4, 1024, 2048] bf16) and a Llama MLP whose
    Linears (kept by the fused MLP) run 3 ms of GEMMs and whose SiLU and product run 1 ms each."""
    trace = TraceBuilder()
    trace.step(1, 0, 12_000)
    x = [4, 1024, 2048]
    trace.module(norm, 10, 100)
    trace.op_kernel(
        "aten::copy_",
        [x, x],
        [F32, BF16],
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>",
        20,
        100,
        1_000,
    )
    trace.op_kernel(
        "aten::mul",
        [x, [2048]],
        [F32, BF16],
        "void at::native::vectorized_elementwise_kernel"
        "<4, at::native::BinaryFunctor<float, float, float, MulFunctor<float>>>",
        60,
        1_100,
        1_000,
    )
    gate = [4, 1024, 8192]
    trace.module("LlamaMLP_0", 200, 300)
    trace.module("Linear_0", 210, 40)
    trace.op_kernel("aten::mm", [[4096, 2048], [2048, 8192]], [BF16, BF16], NVJET, 215, 2_100, 3_000)
    trace.module("SiLUActivation_0", 260, 40)
    trace.op_kernel(
        "aten::silu",
        [gate],
        [BF16],
        "void at::native::vectorized_elementwise_kernel<8, at::native::silu_kernel>",
        265,
        5_100,
        1_000,
    )
    trace.op_kernel(
        "aten::mul",
        [gate, gate],
        [BF16, BF16],
        "void at::native::vectorized_elementwise_kernel"
        "<8, at::native::BinaryFunctor<c10::BFloat16, MulFunctor<float>>>",
        320,
        6_100,
        1_000,
    )
    return analyze(trace.write(tmp_path))


def test_fusible_layers_predict_swaps_saving_without_the_kept_linears(tmp_path):
    result = _norm_trace(tmp_path)
    (finding,) = _findings(result, "fusible_layers")
    swap = finding.details.swap
    norm, mlp = swap.rows
    assert (norm.op, norm.modules, norm.calls_per_step) == ("rms_norm", ["LlamaRMSNorm"], 1.0)
    assert norm.replaced_ms_per_step == pytest.approx(2.0)
    # Forward only (no backward ran): the norm reads x (bf16, the copy's source) and writes y.
    x_bytes = 4 * 1024 * 2048 * 2
    assert norm.fused_ms_per_step == pytest.approx(
        FORWARD_BYTES_FACTOR["rms_norm"] * x_bytes / H200_COPY * 1e3, rel=1e-3
    )
    assert (mlp.op, mlp.replaced_ms_per_step) == ("gated_mlp", pytest.approx(2.0))  # the Linear's 3 ms stay
    gate_bytes = 4 * 1024 * 8192 * 2
    assert mlp.fused_ms_per_step == pytest.approx(
        FORWARD_BYTES_FACTOR["gated_mlp"] * gate_bytes / H200_COPY * 1e3, rel=1e-3
    )
    assert finding.gpu_ms_per_step == pytest.approx(
        4.0 - norm.fused_ms_per_step - mlp.fused_ms_per_step, abs=1e-3
    )
    assert "fused_layers.swap(model)" in finding.fix


def test_fusible_layers_are_silent_once_swapped(tmp_path):
    result = _norm_trace(tmp_path, norm="FusedRMSNorm_0")
    (finding,) = _findings(result, "fusible_layers")  # the MLP is still Llama's
    assert [row.op for row in finding.details.swap.rows] == ["gated_mlp"]


def test_rope_bytes_count_q_k_their_outputs_and_the_tables():
    q, k = [4, 32, 2048, 64], [4, 8, 2048, 64]
    activations = 2 * (math.prod(q) + math.prod(k)) * 2
    tables = 2 * 2 * (4 * 2048 * 64) * 2
    assert rope_bytes(q, k, 2) == FUSED_BYTES_FACTOR["rope"] * activations + tables
    assert rope_bytes(q, k, 2, backward=False) == FORWARD_BYTES_FACTOR["rope"] * activations + tables / 2


def _slow_elementwise_trace(tmp_path: Path, kernel_us: float) -> Analysis:
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.module("Scaler_0", 10, 200)
    for i in range(8):
        trace.op_kernel(
            "aten::add",
            [[1024, 1024], [1024, 1024]],
            [F32, F32],
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
            20 + 10 * i,
            100 + i * kernel_us,
            kernel_us,
        )
    return analyze(trace.write(tmp_path))


def test_memory_bound_kernels_far_below_the_copy_bandwidth(tmp_path):
    result = _slow_elementwise_trace(tmp_path, 500)
    (finding,) = _findings(result, "memory_bound_kernels")
    floor_us = max(3 * 4 * 2**20 / H200_COPY * 1e6, KERNEL_FLOOR_US)
    assert finding.gpu_ms_per_step == pytest.approx(8 * (500 - floor_us) / 1e3, rel=1e-3)
    (module,) = finding.details.modules
    assert module.module == "Scaler" and module.bandwidth_pct == pytest.approx(
        100 * 12 * 2**20 / 500e-6 / H200_COPY, abs=0.1
    )
    assert "torch.compile" in finding.fix
    assert not _findings(_slow_elementwise_trace(tmp_path / "fast", 4), "memory_bound_kernels")


def _gemm_shape_trace(tmp_path: Path, vocab: int, head_us: float | None = None) -> Analysis:
    trace = TraceBuilder()
    trace.step(1, 0, 40_000)
    healthy = 2 * 8192 * 768 * 3072
    trace.op_kernel(
        "aten::mm", [[8192, 768], [768, 3072]], [BF16, BF16], NVJET, 10, 100, healthy / 600e12 * 1e6
    )
    head = 2 * 8192 * 768 * vocab
    trace.module("Linear_0", 50, 50)
    trace.op_kernel(
        "aten::mm",
        [[8192, 768], [768, vocab]],
        [BF16, BF16],
        "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>",
        60,
        1_000,
        head / 95e12 * 1e6 if head_us is None else head_us,
    )
    return analyze(trace.write(tmp_path))


def test_gemm_shape_names_the_unaligned_dim_and_the_padding(tmp_path):
    result = _gemm_shape_trace(tmp_path, 50257)
    (finding,) = _findings(result, "gemm_shape")
    (shape,) = finding.details.shapes
    assert (shape.m, shape.n, shape.k, shape.unaligned, shape.skinny) == (8192, 50257, 768, [50257], False)
    assert shape.reference_tflops == pytest.approx(600, rel=1e-3)
    head = 2 * 8192 * 768 * 50257
    assert finding.gpu_ms_per_step == pytest.approx((head / 95e12 - head / 600e12) * 1e3, rel=1e-3)
    assert "50,304" in finding.fix and finding.where.function == "Linear"
    assert not _findings(_gemm_shape_trace(tmp_path / "padded", 50304), "gemm_shape")


def test_a_gemm_kernel_of_zero_duration_has_no_rate_to_judge(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's divide-by-zero warning included
        result = _gemm_shape_trace(tmp_path, 50257, head_us=0)
    assert not _findings(result, "gemm_shape")


# ---- the loader keeps what the analysis reads -----------------------------------------------------------


def test_the_loader_keeps_recorded_inputs_and_flops_but_not_those_of_views(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 1_000)
    trace.op("aten::mm", 10, 50, [[8, 16], [16, 4]], [F32, F32], flops=1024.0)
    trace.op("aten::view", 70, 5, [[8, 16], []], [F32, "ScalarList"])
    trace.op("aten::add", 80, 5)  # recorded nothing
    loaded = load_trace(trace.write(tmp_path))
    ops = loaded.events["cpu_op"]
    by_name = {loaded.names[n]: i for i, n in enumerate(ops.name.tolist())}
    assert ops.inputs[by_name["aten::view"]] == -1
    dims, types = loaded.op_inputs.decode(
        ops.inputs[[by_name["aten::mm"], by_name["aten::add"], by_name["aten::view"]]]
    )
    assert dims == [[[8, 16], [16, 4]], None, None] and types == [[F32, F32], None, None]
    assert ops.value[by_name["aten::mm"]] == 1024.0 and np.isnan(ops.value[by_name["aten::add"]])


def test_the_lenient_loader_keeps_recorded_inputs_too(tmp_path):
    # A string timestamp fails the typed decoding: the lenient path reads the file, inputs included.
    trace = TraceBuilder()
    trace.step(1, 0, 1_000)
    trace.op("aten::mm", 10, 50, [[8, 16], [16, 4]], [F32, F32])
    trace.events[-1]["ts"] = "10"
    loaded = load_trace(trace.write(tmp_path))
    ops = loaded.events["cpu_op"]
    assert loaded.op_inputs.decode(ops.inputs)[0] == [[[8, 16], [16, 4]]]


def test_recorded_inputs_that_are_not_utf8_read_as_not_recorded(tmp_path):
    # The loader keeps an op's inputs as raw JSON, decoded when an analysis asks: bytes that are not
    # UTF-8 there must not fail the analysis.
    trace = TraceBuilder()
    trace.step(1, 0, 1_000)
    trace.op("aten::mm", 10, 50, [[8, 16], [16, 4]], ["MARKER", F32])
    trace.op("aten::mm", 70, 50, [[8, 16], [16, 4]], [F32, F32])
    path = trace.write(tmp_path)
    path.write_bytes(path.read_bytes().replace(b"MARKER", b"\xed\xa0\x80"))
    loaded = load_trace(path)
    ops = loaded.events["cpu_op"]
    dims, types = loaded.op_inputs.decode(ops.inputs)
    assert dims == [[[8, 16], [16, 4]]] * 2 and types == [None, [F32, F32]]
    analyze(path)


# ---- the swap table is fused_layers.swap's ----------------------------------------------------------------


def test_swappable_is_what_fused_layers_swap_replaces():
    """Every class of SWAPPABLE is replaced (or, RoPE, rerouted) by `fused_layers.swap` with the same op,
    and every row of swap's TABLE that names a class is in SWAPPABLE."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers import activations

    from fused_layers.swap import TABLE

    ops_of = {name: row.op for row in SWAPPABLE for name in row.classes}
    for rule in TABLE:
        # The loss and causal-mask rows save memory and attention time, not memory-bound kernel time:
        # the memory_peak and attention findings speak for them, not the fusible_layers prediction.
        if isinstance(rule.source, str) and rule.op in FUSED_BYTES_FACTOR:
            assert ops_of.get(rule.source.partition(":")[2]) == rule.op, rule.source

    import importlib

    import fused_layers

    found: dict[str, torch.nn.Module] = {"LayerNorm": torch.nn.LayerNorm(32), "GELU": torch.nn.GELU()}
    found.update(
        {
            name: getattr(activations, name)()
            for name in (
                "GELUActivation",
                "NewGELUActivation",
                "GELUTanh",
                "PytorchGELUTanh",
                "FastGELUActivation",
            )
            if hasattr(activations, name)
        }
    )
    # Llama's classes, and Gemma's (whose norm swap leaves); Mistral's and Qwen's norms and MLPs are
    # generated from Llama's (transformers' modular files), and importing them costs a second each.
    for family in ("Llama", "Gemma"):
        modeling = importlib.import_module(f"transformers.models.{family.lower()}.modeling_{family.lower()}")
        config = getattr(transformers, f"{family}Config")(
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_hidden_layers=1,
            vocab_size=64,
        )
        found[f"{family}RMSNorm"] = getattr(modeling, f"{family}RMSNorm")(32)
        found[f"{family}MLP"] = getattr(modeling, f"{family}MLP")(config)
        found[f"{family}Attention"] = getattr(modeling, f"{family}Attention")(config, layer_idx=0)
    for row in SWAPPABLE:
        for name in row.classes:
            if name not in found:
                continue
            holder = torch.nn.Sequential(found[name])
            record = fused_layers.swap(holder)
            try:
                assert record.replaced_ops.get("0") == row.op, (name, record.replaced_ops, record.left)
            finally:
                fused_layers.unswap(holder, record)
    # Gemma's RMSNorm scales by (1 + weight): swap leaves it, and so does the table.
    assert "GemmaRMSNorm" in found and "GemmaRMSNorm" not in ops_of


def test_ab_prediction_reads_the_same_byte_factors():
    prediction = pytest.importorskip("trainprof.ab.prediction")
    assert prediction.FUSED_BYTES_FACTOR is FUSED_BYTES_FACTOR
    assert set(FORWARD_BYTES_FACTOR) == set(FUSED_BYTES_FACTOR)
    assert all(FORWARD_BYTES_FACTOR[op] < FUSED_BYTES_FACTOR[op] for op in FUSED_BYTES_FACTOR)


# ---- the session's measurement of the device's peaks ---------------------------------------------------


class _FakeTorch:
    """Enough of torch for `trainprof.capture.peaks.measure`: matmuls and copies advance a GPU clock at
    set rates (fp32 matmuls at the TF32 rate only under precision "high"), CUDA events read it."""

    RATES = {"bfloat16": 800e12, "float16": 700e12, "tf32": 400e12, "float32": 50e12}
    COPY = 4e12

    bfloat16, float16, float32, uint8 = "bfloat16", "float16", "float32", "uint8"
    __version__ = "9.9"

    def __init__(self, free_bytes: float = 80e9) -> None:
        self.clock = 0.0
        self.precision = "highest"
        self.measured = 0
        torch = self

        class CudaEvent:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0.0

            def record(self) -> None:
                self.at = torch.clock

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return (end.at - self.at) * 1e3

        class Cuda:
            Event = CudaEvent

            @staticmethod
            def is_available() -> bool:
                return True

            @staticmethod
            def mem_get_info() -> tuple[float, float]:
                return free_bytes, 141e9

            @staticmethod
            def get_device_capability() -> tuple[int, int]:
                return 9, 0

            @staticmethod
            def is_bf16_supported() -> bool:
                return True

            @staticmethod
            def get_device_name() -> str:
                torch.measured += 1
                return "Fake GPU"

        self.cuda = Cuda()

    def get_float32_matmul_precision(self) -> str:
        return self.precision

    def set_float32_matmul_precision(self, precision: str) -> None:
        self.precision = precision

    def randn(self, n, m, device, dtype):
        return (dtype, n)

    def mm(self, a, b):
        dtype, n = a
        rate = self.RATES["tf32" if dtype == "float32" and self.precision == "high" else dtype]
        self.clock += 2 * n**3 / rate

    def empty(self, nbytes, device, dtype):
        return _FakeBuffer(self, nbytes)

    def empty_like(self, buffer):
        return _FakeBuffer(self, buffer.nbytes)


class _FakeBuffer:
    def __init__(self, torch: _FakeTorch, nbytes: int) -> None:
        self.torch, self.nbytes = torch, nbytes

    def fill_(self, value):
        return self

    def copy_(self, source):
        self.torch.clock += 2 * self.nbytes / self.torch.COPY


def test_peaks_are_measured_per_dtype_and_the_users_matmul_precision_restored():
    from trainprof.capture.peaks import measure

    torch = _FakeTorch()
    torch.precision = "medium"
    peaks = measure(torch)
    assert peaks["matmul_tflops"] == {"bf16": 800.0, "fp16": 700.0, "fp32": 50.0, "tf32": 400.0}
    assert peaks["copy_tb_s"] == pytest.approx(4.0) and peaks["device"] == "Fake GPU"
    assert "8192^3" in peaks["how"] and torch.precision == "medium"
    assert measured_peaks(peaks, "Fake GPU").matmul_tflops["tf32"] == 400.0
    # Short of free memory: smaller sizes, then nothing.
    assert "4096^3" in measure(_FakeTorch(free_bytes=1e9))["how"]
    assert measure(_FakeTorch(free_bytes=1e8)) is None


def test_peaks_are_measured_once_per_device_and_torch_then_cached(tmp_path, monkeypatch):
    import sys

    from trainprof.capture import peaks as capture

    monkeypatch.setenv(capture.CACHE_DIR_ENV, str(tmp_path / "cache"))
    torch = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    first = capture.current_device_peaks()
    clock = torch.clock
    second = capture.current_device_peaks()
    assert first == second and torch.clock == clock  # the second came from the cache
    cache = json.loads((tmp_path / "cache" / "peaks.json").read_text())
    assert list(cache) == ["Fake GPU | torch 9.9"]


def test_no_cuda_no_peaks_and_never_an_error(tmp_path, monkeypatch):
    from trainprof.capture import peaks as capture

    monkeypatch.setenv(capture.CACHE_DIR_ENV, str(tmp_path))
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA build measures")
    assert capture.current_device_peaks() is None

    class Broken(_FakeTorch):
        def mm(self, a, b):
            raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setitem(__import__("sys").modules, "torch", Broken())
    assert capture.current_device_peaks() is None


def test_the_session_writes_the_peaks_beside_its_traces(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import trainprof
    from trainprof.capture import peaks as capture
    from trainprof.trace import load_traces

    measured = {"version": 1, "device": "Fake GPU", "matmul_tflops": {"bf16": 1.0}, "copy_tb_s": 1.0}
    monkeypatch.setattr(capture, "current_device_peaks", lambda: measured)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for measure, run in ((True, "on"), (False, "off")):
        with trainprof.session(
            log_dir=tmp_path,
            run_name=run,
            wait=0,
            warmup=1,
            active=1,
            analyze=False,
            console=False,
            measure_peaks=measure,
        ) as sess:
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
        written = tmp_path / run / f"{sess.worker}.peaks.json"
        assert written.is_file() == measure
    assert load_traces(tmp_path / "on")[0].device_peaks == measured


# ---- the recorded H200 problem/fix pairs (tests/fixtures/busy) --------------------------------------------

# Loops that keep the GPU busy: their unprofiled step time is the GPU time of a step's kernels.
GPU_BOUND = [
    ("fp32_mlp", "fp32"),
    ("fp32_mlp", "tf32"),
    ("fp32_mlp", "bf16"),
    ("gpt2_attention", "eager"),
    ("gpt2_attention", "sdpa"),
    ("llama_swap", "bare"),
    ("llama_swap", "fused"),
    ("vocab_head", "bare"),
    ("vocab_head", "liger_flce"),
    ("inference", "forward"),
]
# rule -> (scenario, the problem, its fixes)
RULES = {
    "gemm_precision": ("fp32_mlp", "fp32", ("tf32", "bf16")),
    "unfused_attention": ("gpt2_attention", "eager", ("sdpa",)),
    "fusible_layers": ("llama_swap", "bare", ("fused",)),
    "gemm_shape": ("gpt2_attention", "sdpa", ("sdpa_vocab64",)),
}


@pytest.fixture(scope="module")
def busy_run(fixtures_dir):
    """(analysis, unprofiled median step ms) of one `<scenario>/<variant>` of tests/fixtures/busy, each
    analysed once per module."""
    timings = json.loads((fixtures_dir / "busy" / "timings.json").read_text())
    medians = {(r["scenario"], r["variant"]): r["step_ms_median"] for r in timings["runs"]}
    cache: dict[tuple[str, str], Analysis] = {}

    def run(scenario: str, variant: str) -> tuple[Analysis, float]:
        if (scenario, variant) not in cache:
            cache[scenario, variant] = analyze(fixtures_dir / "busy" / scenario / variant)
        return cache[scenario, variant], medians[scenario, variant]

    return run


@pytest.mark.parametrize("kind", list(RULES))
def test_each_rule_fires_on_its_problem_and_is_silent_after_its_fix(busy_run, kind):
    scenario, problem, fixes = RULES[kind]
    (finding,) = _findings(busy_run(scenario, problem)[0], kind)
    assert finding.severity == "high"
    for fix in fixes:
        assert not _findings(busy_run(scenario, fix)[0], kind), fix


def test_precision_predicts_bf16_and_tf32_within_30_percent(busy_run):
    result, fp32_ms = busy_run("fp32_mlp", "fp32")
    (finding,) = _findings(result, "gemm_precision")
    predicted = {p.dtype: p.saved_ms_per_step for p in finding.details.predictions}
    for dtype in ("bf16", "tf32"):
        measured = fp32_ms - busy_run("fp32_mlp", dtype)[1]
        assert predicted[dtype] == pytest.approx(measured, rel=0.3), dtype


def test_attention_predicts_sdpa_within_30_percent(busy_run):
    result, eager_ms = busy_run("gpt2_attention", "eager")
    (finding,) = _findings(result, "unfused_attention")
    assert finding.details.score_shape == [4, 12, 2048, 2048] and finding.details.modules == ["GPT2Attention"]
    assert 'attn_implementation="sdpa"' in finding.fix
    measured = eager_ms - busy_run("gpt2_attention", "sdpa")[1]
    assert finding.gpu_ms_per_step == pytest.approx(measured, rel=0.3)


def test_swap_predicts_fused_layers_within_30_percent(busy_run):
    result, bare_ms = busy_run("llama_swap", "bare")
    (finding,) = _findings(result, "fusible_layers")
    assert [row.op for row in finding.details.swap.rows] == ["rms_norm", "gated_mlp", "rope"]
    assert [row.instances for row in finding.details.swap.rows] == [9, 4, 4]  # as swap replaced in the run
    measured = bare_ms - busy_run("llama_swap", "fused")[1]
    assert finding.gpu_ms_per_step == pytest.approx(measured, rel=0.3)


def test_gemm_shape_predicts_the_padded_vocabulary_within_30_percent(busy_run):
    result, sdpa_ms = busy_run("gpt2_attention", "sdpa")
    (finding,) = _findings(result, "gemm_shape")
    measured = sdpa_ms - busy_run("gpt2_attention", "sdpa_vocab64")[1]  # 61.8 -> 49.1 ms
    assert finding.gpu_ms_per_step == pytest.approx(measured, rel=0.3)


def test_gpt2s_vocabulary_is_a_slow_gemm_shape_and_llamas_are_not(busy_run):
    for scenario, variant in (
        ("gpt2_attention", "eager"),
        ("gpt2_attention", "sdpa"),
        ("inference", "forward"),
    ):
        (finding,) = _findings(busy_run(scenario, variant)[0], "gemm_shape")
        assert {
            s.n if s.unaligned == [s.n] else s.k if s.unaligned == [s.k] else s.m
            for s in finding.details.shapes
        } == {50257}
        assert "50,304" in finding.fix
    for scenario, variant in (("llama_swap", "bare"), ("vocab_head", "bare")):  # 32,000 and 128,256
        assert not _findings(busy_run(scenario, variant)[0], "gemm_shape")


@pytest.mark.parametrize("scenario, variant", GPU_BOUND)
def test_the_gpu_step_time_is_the_unprofiled_step_time(busy_run, scenario, variant):
    """A GPU-bound loop's step takes the GPU time of its kernels, also where the host's profiled window
    is far shorter (vocab_head: 20.8 ms windows for 50.5 ms steps)."""
    result, measured_ms = busy_run(scenario, variant)
    assert result.summary.gpu_step_ms == pytest.approx(measured_ms, rel=0.1)
    busy = _busy(result)
    assert sum(row.step_pct for row in busy.classes) <= 100.0 + 1e-6
    assert busy.mfu_pct is not None and busy.peaks.source == "table"


def test_the_host_window_alone_would_miss_most_of_vocab_heads_step(busy_run):
    result, measured_ms = busy_run("vocab_head", "bare")
    assert result.summary.mean_step_ms < 0.5 * measured_ms < result.summary.gpu_step_ms


def test_a_trace_without_ops_or_shapes_still_has_kernel_classes(tmp_path):
    trace = TraceBuilder()
    trace.step(1, 0, 10_000)
    trace.launch("volta_sgemm_128x64_nn", 100, 200, 5_000)
    trace.launch(
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
        150,
        5_300,
        1_000,
    )
    result = analyze(trace.write(tmp_path))
    busy = _busy(result)
    assert [(row.kernel_class, row.gpu_ms_per_step) for row in busy.classes] == [
        ("gemm_fp32", 5.0),
        ("elementwise", 1.0),
    ]
    assert busy.mfu_pct is None and busy.classes[0].achieved_tflops is None
    # Without FLOPs the fp32 GEMMs keep their share of the peak in bf16: a prediction all the same.
    (finding,) = [f for f in result.findings if f.kind in BUSY_KINDS]
    assert finding.kind == "gemm_precision"
    assert finding.gpu_ms_per_step == pytest.approx(5.0 - 5.0 * H200["fp32"] / H200["bf16"], rel=1e-3)


def _numpy_values(value, path: str = "") -> list[str]:
    """Where a record holds numpy scalars instead of Python numbers (the API hands out plain ones)."""
    import msgspec

    if isinstance(value, msgspec.Struct):
        return [p for f in value.__struct_fields__ for p in _numpy_values(getattr(value, f), f"{path}.{f}")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numpy_values(v, f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _numpy_values(v, f"{path}[{i}]")]
    return [path] if type(value).__module__ == "numpy" else []


def test_busy_records_hold_plain_numbers(busy_run, tmp_path):
    results = [
        busy_run("gpt2_attention", "eager")[0],
        busy_run("fp32_mlp", "fp32")[0],
        _slow_elementwise_trace(tmp_path, 500),
    ]
    for result in results:
        for trace in result.traces:
            assert _numpy_values(trace.busy) == []
        for finding in result.findings:
            assert _numpy_values(finding.details) == [], finding.kind
        assert _numpy_values(result.summary) == []


def test_the_headline_says_when_the_host_runs_ahead_of_the_gpu(busy_run):
    from trainprof.report._format import headline

    ahead, measured = busy_run("llama_swap", "bare")  # 29.1 ms windows, 41.2 ms GPU steps
    step = dict(headline(ahead))["step time"]
    assert step.startswith(f"{ahead.summary.gpu_step_ms:.1f} ms as the GPU ran it; ")
    assert f"{ahead.summary.mean_step_ms:.1f} ms in the host's step windows" in step
    assert step.endswith("(the host runs ahead of the GPU)")
    assert abs(ahead.summary.gpu_step_ms - measured) < abs(ahead.summary.mean_step_ms - measured)
    level, _ = busy_run("fp32_mlp", "fp32")  # syncs every step: the windows are the steps
    assert dict(headline(level))["step time"] == f"{level.summary.gpu_step_ms:.1f} ms"  # one length
    assert "GPU step time" not in dict(headline(level))
