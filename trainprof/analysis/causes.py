"""The causes of GPU-idle time, and the tables that name them: what a piece of idle time is blamed on.

Every GPU-idle interval inside a step (no kernel, copy or memset running) is cut at every host
event boundary (`trainprof.analysis.idle`), and each piece takes the cause of what the host was
doing over it, read innermost first:

    GPU    |=k1===|                                    |=k2===|                          |=k3===|
    idle           [----------------------------------]        [------------------------]
    host   |aten::add-------|log_metrics()-|cudaLaunchKernel-| |DataLoader next--|aten::mm------|
    pieces         [launch  |host          |launch    ]        [input            |launch]

After k1 the host is still in `aten::add` on its way to a launch (`launch`), then runs the user's
`log_metrics()` (`host`), then launches k2 (`launch`); after k2 it waits for the next batch
(`input`) until `aten::mm` launches k3. In order of precedence:

1. A CUDA/HIP runtime call on the loop's thread decides by its kind (`runtime_calls`, table
   `CALL_CAUSES`): a launch is `launch`, a synchronize is `sync` (only while the host is inside the
   call: what follows it is classified on its own), an allocation, free, context or stream creation
   or a blocking copy is `blocking`. A launch longer than `long_launch_us` is the kernel's first use
   loading its code (`warmup`). Inside a library warm-up region every call but a context creation
   counts as `warmup` (cuDNN's algorithm search frees and allocates as part of the search).
2. Else the innermost frame (cpu_op, python_function, user_annotation) and its enclosing frames,
   innermost first, by the name rules of `FRAME_RULES` (`profiler`, `input`, `comm`, `warmup`) and
   one rule on op instances (a cuDNN/cuBLAS/MIOpen op of `WARMUP_OPS` whose call is its op's first
   or an outlier and lasts at least `warmup_call_min_ms`: `warmup`). A cpu_op chain that launches
   GPU work is `launch` (the host is in ATen's dispatch on the way to a launch); Python frames below
   it are not. A `profiler` frame (the modules of `PROFILER_MODULES`, torch.profiler's own code)
   holds only its own code and what that calls in the standard library: user or library code it
   calls (the original a wrapper calls through to, a user's callback) is classified as if the
   profiler's frame were not there.
3. Else, inside any other frame: `host`, named by the innermost Python function (file, function,
   user or library code), else the innermost op or annotation.
4. No frame on the loop's thread: `unknown`.

The loop's thread decides first. Where it is in `host`, `unknown` or `profiler` (e.g. waiting in
`loss.backward()` while autograd's thread launches the backward kernels), another thread that is
in a runtime call or a launching op decides instead (`LENT_BY_OTHER_THREADS`).

One-off costs (`warmup`, and context creation among `blocking`) and `profiler` time (the
profiler's own cost, which an un-profiled run does not pay) are reported as such and left out of
the steady-state verdict (`trainprof.analysis.verdict`). Numbers: `thresholds.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import IntEnum
from typing import cast

import msgspec

from trainprof.analysis.frames import PROFILER_FILES
from trainprof.analysis.kinds import CauseKey, VerdictLabel


class Cause(IntEnum):
    """A cause of GPU-idle time. Its value is its code in the classification's arrays and its
    position in a `CauseCosts` row; `key` is its name in JSON (`idle_<key>_ms`) and reports."""

    LAUNCH = 0
    SYNC = 1
    BLOCKING = 2
    WARMUP = 3
    INPUT = 4
    HOST = 5
    COMM = 6
    UNKNOWN = 7
    PROFILER = 8

    @property
    def key(self) -> CauseKey:
        """`"launch"`, `"sync"`, ...: the cause's name in JSON keys and reports."""
        return cast("CauseKey", self.name.lower())  # the members' names are CauseKey's, upper-cased


class CauseInfo(msgspec.Struct, frozen=True):
    """One cause of GPU idle time: what it means, the verdict it names, how to remove it."""

    cause: Cause
    verdict: VerdictLabel | None  # None: never the verdict (the profiler's own cost, not the training's)
    meaning: str
    fix: str
    one_off: bool = False  # a cost paid once (first use), never the steady-state verdict


_CAUSE_ROWS: tuple[CauseInfo, ...] = (
    CauseInfo(
        Cause.LAUNCH,
        "launch-bound",
        "the host is issuing short kernel launches (ATen dispatch and the launch calls) and the GPU "
        "finishes each kernel before the next arrives",
        "Fewer, larger launches: capture the step with CUDA graphs or torch.compile(mode="
        "'reduce-overhead'), use fused/foreach optimizers, and replace Python loops over tensors with "
        "one batched op.",
    ),
    CauseInfo(
        Cause.SYNC,
        "sync-bound",
        "the host is inside a synchronize call, waiting for the device",
        "Remove the host-device syncs from the step (see the sync findings): keep values on the GPU "
        "and read them every N steps; use pinned memory and non_blocking copies.",
    ),
    CauseInfo(
        Cause.BLOCKING,
        "blocking-call-bound",
        "the host is inside a runtime call that blocks: allocation or free, context or stream "
        "creation, a synchronous copy",
        "Keep blocking runtime calls out of the loop: let the caching allocator stay warm (no "
        "torch.cuda.empty_cache(), stable shapes, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "
        "create streams and events once, and copy from pinned memory with non_blocking=True.",
    ),
    CauseInfo(
        Cause.WARMUP,
        "warm-up-bound",
        "a library warms up: cuDNN/cuBLAS algorithm search or handle creation, a kernel's first "
        "launch loading its module, torch.compile or Triton compilation, CUDA graph capture",
        "A one-off warm-up: start the profiler after a few steps (schedule(wait=..., warmup=...) or "
        "skip_first). Warm-up that recurs in every step is a steady cost to remove: keep input shapes "
        "fixed under cudnn.benchmark, and stop torch.compile recompiling (dynamic=True, "
        "torch._dynamo.mark_dynamic, padding to fixed lengths; see the recompile finding).",
        one_off=True,
    ),
    CauseInfo(
        Cause.INPUT,
        "input-bound",
        "the loop waits for its next batch (DataLoader __next__) or prepares it on the training thread",
        "Feed the GPU faster: DataLoader(num_workers>0, pin_memory=True, persistent_workers=True, "
        "prefetch_factor=...), move decoding and augmentation off the training thread or onto the "
        "GPU, and prefetch the next batch while the current step runs.",
    ),
    CauseInfo(
        Cause.HOST,
        "host-bound",
        "the host runs other Python (named below) with no GPU work queued",
        "Make the named host code cheaper or move it out of the step: cache what is recomputed every "
        "step, drop per-step module walks, logging and introspection, or run it every N steps.",
    ),
    CauseInfo(
        Cause.COMM,
        "communication-bound",
        "the host is inside a collective or barrier, waiting for other ranks",
        "Overlap communication with compute (DDP bucket_cap_mb, FSDP prefetch), keep host-side "
        "collectives (barrier, *_object collectives, gloo) out of the step, and balance work between "
        "ranks.",
    ),
    CauseInfo(
        Cause.UNKNOWN,
        "host-bound",
        "the host is in code the trace does not record (no python_function or op event on any thread)",
        "Profile with with_stack=True (or py-spy) to name the host code; common culprits are "
        "time.sleep, Python without stacks, C extensions and the GIL.",
    ),
    CauseInfo(
        Cause.PROFILER,
        None,
        "the host runs the profiler's own code while it records: trainprof's hooks (sync call-site "
        "capture, step detection) or torch.profiler's",
        "Nothing to change in the training code: an un-profiled run does not pay this. To shrink it "
        "while profiling, record fewer steps (a smaller `active` in torch.profiler.schedule) or "
        "record less: with_stack=False drops the Python stacks (and with them the names of host "
        "code), record_shapes=False the input shapes.",
    ),
)
CAUSES: dict[Cause, CauseInfo] = {row.cause: row for row in _CAUSE_ROWS}
"""Every cause's meaning, verdict and fix, in `Cause` order."""

INFERENCE_FIXES: dict[Cause, str] = {
    Cause.LAUNCH: "Fewer, larger launches: capture the forward with CUDA graphs or torch.compile(mode="
    "'reduce-overhead'), replace Python loops over tensors with one batched op, and batch more "
    "requests or tokens per forward.",
    Cause.INPUT: "Have the next inputs ready before the forward needs them: prepare (tokenize, batch, "
    "pin) the next requests or batches on other threads or processes while the current forward runs "
    "(a DataLoader: num_workers>0, pin_memory=True), and copy them with non_blocking=True.",
}
"""The fixes that differ for an inference loop (no backward, no optimizer: `workload.is_inference`)."""

SESSION_FIXES: dict[Cause, str] = {
    Cause.PROFILER: "Nothing to change in the training code: an un-profiled run does not pay this. To "
    "shrink it while profiling, record fewer steps (a smaller `active`) or turn off what is not "
    "needed: capture_syncs=False drops the sync call-site capture, with_stack=False the Python "
    "stacks (and with them the names of host code).",
}
"""The fixes that name trainprof's own session options: only for a trace a trainprof session
recorded (`workload.recorded_by_session`); a trace from elsewhere gets `CAUSES`' fix."""


def fix_for(cause: Cause, inference: bool, session: bool) -> str:
    """A cause's fix for this trace: the inference loop's where it differs (`INFERENCE_FIXES`), the
    session's where the trace is a session's (`SESSION_FIXES`), else `CAUSES`'."""
    if inference and cause in INFERENCE_FIXES:
        return INFERENCE_FIXES[cause]
    if session and cause in SESSION_FIXES:
        return SESSION_FIXES[cause]
    return CAUSES[cause].fix


class CauseCosts(msgspec.Struct, frozen=True):
    """Milliseconds per cause: a row indexed by `Cause`, as kineto tb_plugin's `Costs` is by
    `ProfileRole`. `costs[Cause.HOST]` reads one cause; `items()` walks them in `Cause` order."""

    ms: tuple[float, ...]

    def __getitem__(self, cause: Cause) -> float:
        return self.ms[cause]

    def items(self) -> Iterator[tuple[Cause, float]]:
        """(cause, ms) in `Cause` order."""
        return zip(Cause, self.ms, strict=True)


# Causes another thread may lend the loop's thread when that one is only in `host`/`unknown`/`profiler`,
# strongest first (the GPU waits on what that thread is doing).
LENT_BY_OTHER_THREADS = (Cause.SYNC, Cause.BLOCKING, Cause.WARMUP, Cause.COMM, Cause.LAUNCH)


class FrameRule(msgspec.Struct, frozen=True):
    """A frame name pattern that sets the cause of the time spent inside that frame."""

    cause: Cause
    pattern: str
    reason: str
    # The thread only waits here while another thread works: what another thread does decides
    # first (as for `host`/`unknown` time), and `cause` holds only where no other thread is busy.
    waits_on_other_threads: bool = False


# trainprof's modules that run inside a recorded step on the profiler's behalf: the session's step
# hooks, the sync call-site capture, the framework callbacks that end steps, and what they call
# there (the schedule in config.py, the code layout in user_code.py). trainprof's drivers of a
# training loop (the demo, `trainprof ab`, `trainprof.bench`, `trainprof run`) are not among them:
# there they hold the loop, as a user's script would. A folder (ending in `/`) names all its modules;
# `session.py` is the session of traces recorded before it became the `session/` package.
PROFILER_MODULES = ("session.py", "session/", "config.py", "user_code.py", "capture/", "integrations/")
_PROFILER_MODULE_PATTERN = "|".join(
    re.escape(module) + r"[\w/]+\.py" if module.endswith("/") else re.escape(module)
    for module in PROFILER_MODULES
)

# torch.compile's ranges as cpu_ops (stacks on or off): `dynamo` and `entire_frame_compile` around a
# frame's compilation, `entire_backward_compile` around its backward's, and each phase inside as
# `<phase> (dynamo_timed)` (`bytecode_tracing`, `GraphLowering.run`, `async_compile.wait`,
# `CachingAutotuner.benchmark_all_configs`, ...). Steady-state calls of a compiled region show none
# of them (only `Torch-Compiled Region: F/C` and `TorchDynamo Cache Lookup`).
COMPILE_FRAMES = r"^(dynamo|entire_frame_compile|entire_backward_compile)$| \(dynamo_timed\)$"

# Frame names: python_function `file(line): function`, cpu_op `aten::x`, annotations as recorded.
# First match wins. These hold for everything nested inside the frame unless something more inner
# (a runtime call, a launching op, an inner rule) decides; `profiler` frames hold only their own
# code and the standard library they call (`idle._through_profiler`).
FRAME_RULES: tuple[FrameRule, ...] = (
    FrameRule(
        Cause.PROFILER,
        r"(^|/)trainprof/(" + _PROFILER_MODULE_PATTERN + r")\(\d+\): ",
        "trainprof's own code inside a recorded step (`PROFILER_MODULES`): sync call-site capture, "
        "step detection, the framework callbacks, its wrappers",
    ),
    FrameRule(
        Cause.PROFILER,
        r"(^|/)(" + "|".join(re.escape(file) for file in PROFILER_FILES) + ")",
        "torch.profiler's own code: its step, record_function's enter and exit (`frames.PROFILER_FILES`)",
    ),
    FrameRule(Cause.INPUT, r"^enumerate\(DataLoader\)#", "torch.profiler's range around DataLoader.__next__"),
    FrameRule(
        Cause.INPUT,
        r"torch/utils/data/dataloader\.py\(\d+\): (__next__|_next_data|_get_data|_try_get_data)$",
        "the DataLoader fetching the next batch (waiting on workers when num_workers>0)",
    ),
    FrameRule(
        Cause.INPUT,
        r"torch/utils/data/_utils/(collate|fetch|pin_memory)\.py\(",
        "collation, in-process fetching (num_workers=0) and pinning of a batch",
    ),
    FrameRule(
        Cause.INPUT, r"(^|/)datasets/(arrow_dataset|formatting/)", "a Hugging Face dataset's __getitem__"
    ),
    FrameRule(Cause.INPUT, r"transformers/data/data_collator\.py\(", "a transformers data collator"),
    FrameRule(
        Cause.INPUT,
        r"transformers/tokenization_utils\w*\.py\(\d+\): (__call__|_call_one|batch_encode_plus|"
        r"_batch_encode_plus|encode_plus|_encode_plus|pad)$",
        "tokenizing inputs on the training thread",
    ),
    FrameRule(
        Cause.INPUT, r"(^|/)(torchvision/transforms|torchvision/io|PIL)/", "image decoding and augmentation"
    ),
    FrameRule(
        Cause.INPUT,
        r"\): (get_batch|next_batch|load_batch|prepare_batch|make_batch|collate\w*|preprocess\w*)$",
        "a function named for preparing data (the user's data preparation)",
    ),
    FrameRule(
        Cause.LAUNCH,
        r"torch/autograd/graph\.py\(\d+\): _engine_run_backward$",
        "the loop's thread waits while autograd's engine issues the backward ops on its own thread; "
        "between the engine's ops (its scheduling, no op recorded) the host is issuing backward work",
        waits_on_other_threads=True,
    ),
    FrameRule(Cause.COMM, r"^gloo:", "a gloo collective runs on the host: it waits for the other ranks"),
    FrameRule(Cause.COMM, r"^c10d::(barrier|monitored_barrier)", "a barrier: the host waits for every rank"),
    FrameRule(
        Cause.COMM,
        r"^(c10d::wait|aten::wait|_?c10d_functional::wait_tensor)",
        "the host waits for an asynchronous collective",
    ),
    FrameRule(
        Cause.COMM,
        r"torch/distributed/distributed_c10d\.py\(\d+\): (barrier|monitored_barrier|all_gather_object|"
        r"gather_object|broadcast_object_list|scatter_object_list|send|recv|wait)$",
        "a host-side collective or point-to-point call",
    ),
    FrameRule(
        Cause.COMM,
        r"^(record_param_comms|nccl:|c10d::)",
        "the host inside a collective's enqueue (process-group bookkeeping around the NCCL launch)",
    ),
    FrameRule(
        Cause.WARMUP,
        r"torch/_dynamo/(convert_frame|symbolic_convert|output_graph)\.py\(",
        "torch.compile tracing a frame (Dynamo)",
    ),
    FrameRule(
        Cause.WARMUP,
        r"torch/_inductor/(compile_fx|codecache|async_compile|graph|codegen/\w+)\.py\(",
        "torch.compile generating and compiling code (Inductor)",
    ),
    FrameRule(Cause.WARMUP, r"torch/_functorch/aot_autograd\.py\(", "torch.compile building the joint graph"),
    FrameRule(
        Cause.WARMUP,
        COMPILE_FRAMES,
        "torch.compile's own ranges (Dynamo's `dynamo_timed` record_functions): what a trace without "
        "Python stacks shows of tracing, lowering, code generation and autotuning",
    ),
    FrameRule(Cause.WARMUP, r"(^|/)triton/compiler/", "Triton compiling a kernel"),
    FrameRule(
        Cause.WARMUP,
        r"torch/cuda/graphs\.py\(\d+\): "
        r"(capture_begin|capture_end|__enter__|__exit__|make_graphed_callables)$",
        "CUDA graph capture",
    ),
    FrameRule(
        Cause.WARMUP,
        r"torch/_inductor/cudagraph_trees\.py\(\d+\): (record_function|run_eager|_record)$",
        "torch.compile's CUDA graph trees recording or warming up a graph",
    ),
)

# cpu_ops whose first (or an outlier) call is library warm-up when it lasts `warmup_call_min_ms`:
# cuDNN/MIOpen algorithm search, cuBLAS/cuBLASLt handle and workspace creation, attention backends.
WARMUP_OPS = re.compile(
    r"^aten::(_?cudnn_\w+|_?miopen_\w+|mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|"
    r"_?convolution\w*|conv\w+|_scaled_dot_product_\w+|_flash_attention_\w+|_efficient_attention_\w+)$"
)
# Runtime calls that belong to graph capture (warm-up), whatever their kind.
CAPTURE_CALLS = re.compile(
    r"^(cuda|hip|cu)(StreamBeginCapture|StreamEndCapture|GraphInstantiate|GraphUpload)"
)
# Runtime call kind -> cause (on the loop's thread). Launch-like bookkeeping (event records, queries,
# attribute reads) is the host on its way to a launch.
CALL_CAUSES: dict[str, Cause] = {
    "launch": Cause.LAUNCH,
    "graph_launch": Cause.LAUNCH,
    "sync": Cause.SYNC,
    "copy": Cause.LAUNCH,  # asynchronous copies; blocking ones (is_blocking_copy) are BLOCKING
    "memset": Cause.LAUNCH,
    "alloc": Cause.BLOCKING,
    "free": Cause.BLOCKING,
    "context": Cause.BLOCKING,
    "stream_create": Cause.BLOCKING,
    "event": Cause.LAUNCH,
    "query": Cause.LAUNCH,
    "other": Cause.LAUNCH,
}
# Call kinds another thread's calls can lend (its event queries and attribute reads are bookkeeping,
# e.g. NCCL's watchdog polling events, not what the GPU waits for).
LENDING_KINDS = frozenset(
    {"launch", "graph_launch", "sync", "copy", "memset", "alloc", "free", "context", "stream_create"}
)
# Call kinds that put work on the GPU (a cpu_op chain around one of them is launching).
GPU_WORK_KINDS = frozenset({"launch", "graph_launch", "copy", "memset"})
