"""What kind of work each kernel does: its class (a GEMM and its math dtype, an attention kernel and
its implementation, a norm, an elementwise op, ...) from its name, else from the op that launched it.

Rules are data, first match wins: `NAME_RULES` (a regex searched in the kernel's name), then, for a
name they leave as `other`, `OP_RULES` (the launching op's name). `trainprof.analysis.busy` refines
the result with what a name cannot say: the launching op's recorded dtype for a GEMM whose name does
not carry it (cuBLASLt's `nvjet_*`), the attention op a kernel runs under, the optimizer step.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, NamedTuple

from trainprof.analysis.name_patterns import GuardedSearch


class Work(enum.Enum):
    """What bounds a class of kernels: arithmetic (`flops`, read against the matmul peak), memory
    traffic (`bytes`, read against the copy bandwidth), or neither measured here."""

    FLOPS = "flops"
    BYTES = "bytes"
    OTHER = "other"


class KernelClass(enum.Enum):
    """A kernel class: its JSON key, its label in reports, and what bounds it."""

    GEMM_FP32 = ("gemm_fp32", "GEMM fp32", Work.FLOPS)
    GEMM_TF32 = ("gemm_tf32", "GEMM TF32", Work.FLOPS)
    GEMM_16BIT = ("gemm_bf16_fp16", "GEMM bf16/fp16", Work.FLOPS)
    GEMM_FP8 = ("gemm_fp8", "GEMM fp8", Work.FLOPS)
    GEMM = ("gemm", "GEMM (dtype unknown)", Work.FLOPS)
    ATTENTION_FLASH = ("attention_flash", "attention: flash", Work.FLOPS)
    ATTENTION_MEM_EFFICIENT = ("attention_mem_efficient", "attention: memory-efficient", Work.FLOPS)
    ATTENTION_CUDNN = ("attention_cudnn", "attention: cuDNN", Work.FLOPS)
    ATTENTION_FUSED = ("attention_fused", "attention: fused (other)", Work.FLOPS)
    ATTENTION_UNFUSED = ("attention_unfused", "attention: unfused", Work.FLOPS)
    CONVOLUTION = ("convolution", "convolution", Work.FLOPS)
    NORM = ("norm", "norm", Work.BYTES)
    ELEMENTWISE = ("elementwise", "activation and elementwise", Work.BYTES)
    REDUCTION = ("reduction", "reduction and softmax", Work.BYTES)
    COPY = ("copy", "copy and cast", Work.BYTES)
    OPTIMIZER = ("optimizer", "optimizer", Work.BYTES)
    COMMUNICATION = ("communication", "communication", Work.OTHER)
    OTHER = ("other", "other", Work.OTHER)

    def __init__(self, key: str, label: str, work: Work) -> None:
        self.key = key
        self.label = label
        self.work = work

    @property
    def code(self) -> int:
        """The class's index in `CLASSES` (the per-kernel arrays hold codes)."""
        return _CODES[self]


CLASSES: tuple[KernelClass, ...] = tuple(KernelClass)
_CODES = {kernel_class: code for code, kernel_class in enumerate(CLASSES)}
GEMM_CLASSES = (
    KernelClass.GEMM_FP32,
    KernelClass.GEMM_TF32,
    KernelClass.GEMM_16BIT,
    KernelClass.GEMM_FP8,
    KernelClass.GEMM,
)
ATTENTION_CLASSES = (
    KernelClass.ATTENTION_FLASH,
    KernelClass.ATTENTION_MEM_EFFICIENT,
    KernelClass.ATTENTION_CUDNN,
    KernelClass.ATTENTION_FUSED,
    KernelClass.ATTENTION_UNFUSED,
)
GEMM_CLASS_OF_DTYPE = {
    "fp32": KernelClass.GEMM_FP32,
    "tf32": KernelClass.GEMM_TF32,
    "bf16": KernelClass.GEMM_16BIT,
    "fp16": KernelClass.GEMM_16BIT,
    "fp8": KernelClass.GEMM_FP8,
}


class Rule(NamedTuple):
    """Kernels whose name (or launching op's name) matches `pattern` are `kernel_class`; `why` says
    what the names are. Patterns are lowercase and searched in the lowercased name: the same match as
    `re.IGNORECASE`, a quarter of its time on ATen's long template names."""

    pattern: str
    kernel_class: KernelClass
    why: str


NAME_RULES: tuple[Rule, ...] = (
    Rule(
        r"nccl|rccl|multimem_all_reduce|cross_device_reduce|all_?reduce|all_?gather|reduce_scatter|"
        r"all_?to_?all|sendrecv",
        KernelClass.COMMUNICATION,
        "collectives (NCCL, RCCL, symmetric memory, vLLM)",
    ),
    Rule(
        r"adam|adagrad|rmsprop|adafactor|sgd_|fusedsgd|optimizer",
        KernelClass.OPTIMIZER,
        "fused and foreach optimizer kernels (FusedAdamMathFunctor, fbgemm's rowwise adagrad)",
    ),
    # `\blamb\b`, not `lamb`: every ATen elementwise kernel's name holds a `{lambda(float)#1}`.
    # A rule of their own: an alternative that starts with `\b` (or `^`) makes re try every position
    # of the name with every alternative instead of skipping to the alternatives' first letters
    # (gpt2_clean's 74 kernel names: 0.94 ms for the rule as one, 0.18 + 0.32 ms split; 2026-11-25).
    Rule(r"\blamb\b|\blion\b", KernelClass.OPTIMIZER, "LAMB and Lion optimizer kernels"),
    Rule(r"reshape_and_cache", KernelClass.COPY, "vLLM's KV-cache writes (named `*_flash_kernel` too)"),
    Rule(
        r"cudnn.*(sdpa|fmha|attn|attention)|cudnn::fusion::(compute_dot_do_o|convert_dq|fmha)",
        KernelClass.ATTENTION_CUDNN,
        "cuDNN's SDPA (`cudnn_generated_fort_native_sdpa_*`) and its helpers",
    ),
    Rule(
        r"fmha_cutlass|efficient_attention|mem_eff|attentionkernel|attentionbackwardkernel",
        KernelClass.ATTENTION_MEM_EFFICIENT,
        "xformers/PyTorch memory-efficient attention (`fmha_cutlassF/B`)",
    ),
    Rule(
        r"flash|fmha_(fwd|bwd)|attn_(fwd|bwd)",  # `_attn_fwd` too: a search, not a match
        KernelClass.ATTENTION_FLASH,
        "FlashAttention (`flash_fwd_kernel`, `pytorch_flash::`), CK/aiter FMHA, Triton `attn_fwd`",
    ),
    Rule(
        r"sage_(fwd|bwd)|paged_attention|attention",
        KernelClass.ATTENTION_FUSED,
        "other fused attention kernels (SageAttention, vLLM paged attention)",
    ),
    Rule(r"^triton_tem_.*conv", KernelClass.CONVOLUTION, "Inductor's convolution templates"),
    Rule(r"^triton_tem_", KernelClass.GEMM, "Inductor's GEMM templates (`triton_tem_fused_mm`)"),
    Rule(
        r"^triton_(red|per|poi)_\w*(layer_norm|rms_norm|group_norm|batch_norm)",
        KernelClass.NORM,
        "Inductor kernels that fuse a norm",
    ),
    Rule(r"^triton_(red|per)_\w*softmax", KernelClass.REDUCTION, "Inductor reductions fusing a softmax"),
    Rule(r"^triton_(red|per)_", KernelClass.REDUCTION, "Inductor reductions (persistent or looped)"),
    Rule(r"^triton_poi_", KernelClass.ELEMENTWISE, "Inductor pointwise kernels"),
    Rule(
        r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|bn_fw|bn_bw|gammabeta|cudnn::bn_",
        KernelClass.NORM,
        "norm kernels (ATen, cuDNN batch norm, Triton/Liger/vLLM norms)",
    ),
    Rule(
        r"conv(?!ert)|scudnn|wgrad|dgrad|winograd|fprop|implicit_?gemm|implicit_convolve|igemm|im2d?2?col|miopen",
        KernelClass.CONVOLUTION,
        "cuDNN/MIOpen/CK convolutions (before GEMMs: `implicit_convolve_sgemm`)",
    ),
    Rule(
        r"gemm|gemv|nvjet|xmma|splitkreduce|matmul|wvsplitk|cublas|cutlass",
        KernelClass.GEMM,
        "cuBLAS/cuBLASLt (`*gemm*`, `nvjet_*`), CUTLASS",
    ),
    Rule(r"^cijk_", KernelClass.GEMM, "hipBLASLt/Tensile (`Cijk_*`)"),
    Rule(r"\bbmm_", KernelClass.GEMM, "batched GEMMs named `bmm_*`"),
    Rule(
        r"softmax|reduce|cross_?entropy|nll|logsumexp|arg_?max|arg_?min|cumsum|scan|topk|sort|"
        r"amax|lpnorm|norm_?two|_sum_|sum_kernel|mean",
        KernelClass.REDUCTION,
        "softmax, loss and reduction kernels (ATen `reduce_kernel`, `cunn_SoftMax*`, Liger CE, CUB)",
    ),
    # `(?<!no)`: ATen's strided elementwise kernels are `gpu_kernel_impl_nocast<Functor>`, math (a
    # broadcast mul) and no cast: 3.3 of the 7.8 ms/step of "copies" on the H200 Llama sample.
    Rule(
        r"copy|(?<!no)cast|transpose|permute|catarray|cat_|contiguous|index_?select|index_elementwise|"
        r"index_put|gather|scatter|embedding|to_dense|memcpy",
        KernelClass.COPY,
        "copies, casts, transposes, concatenation, indexing",
    ),
    Rule(
        r"elementwise|functor|gelu|silu|relu|tanh|sigmoid|swiglu|geglu|gated|threshold|dropout|masked|"
        r"where|fill|clamp|pow|exp|log|sqrt|neg|abs|mul|add|div|sub|distribution|random|rope|rotary|"
        r"nan_to_num|compare|activation",
        KernelClass.ELEMENTWISE,
        "ATen elementwise kernels (`vectorized_elementwise_kernel<...Functor>`), activations, dropout",
    ),
)

OP_RULES: tuple[Rule, ...] = (
    Rule(
        r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_scaled_mm|_int_mm|_grouped_mm|addmv|mv|"
        r"_addmm_activation)$",
        KernelClass.GEMM,
        "ATen matrix products",
    ),
    Rule(
        r"^aten::(_?convolution|cudnn_convolution|miopen_convolution|conv\w*)(_backward)?",
        KernelClass.CONVOLUTION,
        "ATen convolutions",
    ),
    Rule(
        r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm",
        KernelClass.NORM,
        "ATen and custom norms (`native_layer_norm`, `RMSNormFunction`)",
    ),
    Rule(
        r"softmax|cross_entropy|nll_loss|sum|mean|norm|max|min",
        KernelClass.REDUCTION,
        "ATen reductions and losses (`linalg_vector_norm` of gradient clipping too)",
    ),
    Rule(
        r"copy|_to_copy|\bto\b|cat|clone|contiguous|index|gather|scatter|embedding",
        KernelClass.COPY,
        "ATen copies and indexing",
    ),
)

# A GEMM's math dtype from its kernel name, first match wins (the name of cuBLASLt's `nvjet_*` and
# hipBLASLt's generic kernels carries none: the launching op's dtype decides, in busy.py).
GEMM_DTYPE_RULES: tuple[tuple[str, str], ...] = (
    ("fp8", r"e4m3|e5m2|fp8|f8f8|_f8_|mxe4|mxe2"),
    ("tf32", r"tf32|xf32|tensorop_s1688gemm|tensorop_s16816gemm_tf32"),
    ("bf16", r"bf16|bfloat|^cijk_\w*_(bbs|bss|bbh)_"),
    ("fp16", r"f16|fp16|hgemm|h1688|h16816|h884|_half|^cijk_\w*_(hhs|hss|hb)_"),
    ("fp32", r"sgemm|ffma|f32f32_f32f32|simt|^cijk_\w*_s_b|^cijk_\w*_sb_"),
)


class AttentionOp(NamedTuple):
    """A fused attention op of ATen: which implementation runs its kernels, and where its FLOPs are.

    `query` and `key` index its inputs; `seq_axis` is the key's sequence axis (-2 for the
    `[B, H, T, D]` layout of the SDPA ops, 1 for the `[B, T, H, D]` layout of the `_flash_*` /
    `_efficient_*` ops); `backward` for the gradient ops.
    """

    kernel_class: KernelClass
    query: int
    key: int
    seq_axis: int
    backward: bool


ATTENTION_OPS: dict[str, AttentionOp] = {
    "aten::_scaled_dot_product_flash_attention": AttentionOp(KernelClass.ATTENTION_FLASH, 0, 1, -2, False),
    "aten::_scaled_dot_product_flash_attention_backward": AttentionOp(
        KernelClass.ATTENTION_FLASH, 1, 2, -2, True
    ),
    "aten::_flash_attention_forward": AttentionOp(KernelClass.ATTENTION_FLASH, 0, 1, 1, False),
    "aten::_flash_attention_backward": AttentionOp(KernelClass.ATTENTION_FLASH, 1, 2, 1, True),
    "aten::_scaled_dot_product_efficient_attention": AttentionOp(
        KernelClass.ATTENTION_MEM_EFFICIENT, 0, 1, -2, False
    ),
    "aten::_scaled_dot_product_efficient_attention_backward": AttentionOp(
        KernelClass.ATTENTION_MEM_EFFICIENT, 1, 2, -2, True
    ),
    "aten::_efficient_attention_forward": AttentionOp(KernelClass.ATTENTION_MEM_EFFICIENT, 0, 1, 1, False),
    "aten::_efficient_attention_backward": AttentionOp(KernelClass.ATTENTION_MEM_EFFICIENT, 1, 2, 1, True),
    "aten::_scaled_dot_product_cudnn_attention": AttentionOp(KernelClass.ATTENTION_CUDNN, 0, 1, -2, False),
    "aten::_scaled_dot_product_cudnn_attention_backward": AttentionOp(
        KernelClass.ATTENTION_CUDNN, 1, 2, -2, True
    ),
    "aten::_cudnn_attention_forward": AttentionOp(KernelClass.ATTENTION_CUDNN, 0, 1, -2, False),
    "aten::_cudnn_attention_backward": AttentionOp(KernelClass.ATTENTION_CUDNN, 1, 2, -2, True),
}
_DTYPE_RULES = tuple((pattern, dtype) for dtype, pattern in GEMM_DTYPE_RULES)
SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"
"""SDPA's fallback: attention as plain matmuls and a softmax (its kernels are unfused attention)."""


@functools.cache
def _searches(rules: tuple) -> tuple[tuple[GuardedSearch, Any], ...]:
    """The rules' patterns as `GuardedSearch`es, made once, on first use (not at import).
    gpt2_clean's 66 kernel names, first classification in a fresh process: 3.2 ms, against 4.2
    with re alone (medians of 7, 2-core machine, 2026-11-25)."""
    return tuple((GuardedSearch(pattern), value) for pattern, value, *_ in rules)


@functools.lru_cache(maxsize=8192)
def classify_name(name: str) -> tuple[KernelClass, str | None]:
    """A kernel's class from its name alone, and a GEMM's math dtype when the name says it (else None).

    Cached: the windows and ranks of one run share their kernel names.
    """
    short = name.removeprefix("void ").lower()
    kernel_class = next(
        (cls for search, cls in _searches(NAME_RULES) if search.found_in(short)), KernelClass.OTHER
    )
    dtype: str | None = None
    if kernel_class is KernelClass.GEMM:
        dtype = next((d for search, d in _searches(_DTYPE_RULES) if search.found_in(short)), None)
        kernel_class = GEMM_CLASS_OF_DTYPE.get(dtype, KernelClass.GEMM) if dtype else KernelClass.GEMM
    return kernel_class, dtype


@functools.lru_cache(maxsize=4096)
def classify_op(name: str) -> KernelClass:
    """The class an op's kernels have when their names say nothing (`OTHER` when the op does not either)."""
    lowered = name.lower()
    return next((cls for search, cls in _searches(OP_RULES) if search.found_in(lowered)), KernelClass.OTHER)
