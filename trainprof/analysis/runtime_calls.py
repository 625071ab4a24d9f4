"""What each CUDA / HIP runtime or driver call does, as one table.

Kineto records host API calls by their vendor name: `cudaLaunchKernel` (runtime), `cuLaunchKernelEx`
(driver), `hipLaunchKernel` / `hipExtModuleLaunchKernel` (ROCm, written under the same `cuda_runtime`
category). The analyses ask one question of a name, "what kind of call is this?", and get the same
answer for every vendor: `call_kind("hipMemcpyWithStream") == call_kind("cudaMemcpy") == "copy"`.

The table below matches the name with its vendor prefix (`cuda`, `cu`, `hip`, `__hip`) removed, so
one row covers `cudaStreamSynchronize`, `hipStreamSynchronize` and the driver's `cuStreamSynchronize`.
Rows are tried in order and the first whose pattern matches the start of the stem wins, so a more
specific row comes before a more general one (`GraphLaunch` before `Launch`, `MemcpyAsync` is covered
by `Memcpy`). Each row says why its calls are that kind.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

KINDS = (
    "launch",
    "graph_launch",
    "sync",
    "copy",
    "memset",
    "alloc",
    "free",
    "context",
    "stream_create",
    "event",
    "query",
    "other",
)

# (stem prefix, kind, reason). First match wins: specific rows first.
RUNTIME_CALLS: tuple[tuple[str, str, str], ...] = (
    # --- work submission -----------------------------------------------------------------------
    ("GraphLaunch", "graph_launch", "replays a captured graph: many kernels, none with a launch of its own"),
    ("LaunchKernel", "launch", "cudaLaunchKernel(ExC), cuLaunchKernel(Ex), hipLaunchKernel: one kernel"),
    ("LaunchCooperativeKernel", "launch", "a cooperative kernel (grid-wide sync inside); one launch"),
    ("LaunchHostFunc", "launch", "enqueues a host callback on a stream; costs the host what a launch does"),
    ("ExtLaunchKernel", "launch", "ROCm's extended launch (hipExtLaunchKernel, used by hipBLASLt)"),
    ("ExtModuleLaunchKernel", "launch", "ROCm's launch of a code-object kernel (Triton, CK, aiter kernels)"),
    ("ModuleLaunchKernel", "launch", "hipModuleLaunchKernel: a code-object kernel, the driver-API launch"),
    ("HccModuleLaunchKernel", "launch", "older ROCm name of hipModuleLaunchKernel"),
    ("ExtLaunchMultiKernelMultiDevice", "launch", "ROCm: several kernels in one call"),
    ("Launch", "launch", "any other cudaLaunch*/cuLaunch*/hipLaunch* entry point submits a kernel"),
    # --- the host waits for the device ---------------------------------------------------------
    ("DeviceSynchronize", "sync", "blocks the host until all work on the device is done"),
    ("StreamSynchronize", "sync", "blocks the host until the stream is drained"),
    ("EventSynchronize", "sync", "blocks the host until the event's work is done"),
    ("CtxSynchronize", "sync", "driver API: blocks until the context's work is done"),
    ("ThreadSynchronize", "sync", "deprecated alias of cudaDeviceSynchronize"),
    # --- data movement -------------------------------------------------------------------------
    ("Memcpy", "copy", "cudaMemcpy*/cuMemcpy*/hipMemcpy*: copies; the non-Async ones block the host"),
    ("MemPrefetch", "copy", "moves managed memory to a device"),
    ("Memset", "memset", "fills device memory; the non-Async ones block the host"),
    # --- memory management (may synchronize the device) ----------------------------------------
    ("MallocFromPoolAsync", "alloc", "stream-ordered allocation from a pool"),
    ("Malloc", "alloc", "cudaMalloc(Async/Host/Managed/Pitch), hipMalloc: device or pinned allocation"),
    ("ExtMallocWithFlags", "alloc", "ROCm allocation with flags"),
    ("HostAlloc", "alloc", "pinned host allocation"),
    ("HostRegister", "alloc", "pins existing host memory"),
    ("MemAlloc", "alloc", "driver API allocation (cuMemAlloc, cuMemAllocHost, ...)"),
    ("MemCreate", "alloc", "virtual memory management: physical allocation (expandable segments)"),
    ("MemMap", "alloc", "virtual memory management: maps an allocation (expandable segments)"),
    ("MemAddressReserve", "alloc", "virtual memory management: reserves an address range"),
    ("MemSetAccess", "alloc", "virtual memory management: makes a mapping usable"),
    ("MemPoolCreate", "alloc", "creates a memory pool"),
    ("Free", "free", "cudaFree(Async/Host), hipFree: cudaFree synchronizes the whole device"),
    ("HostUnregister", "free", "unpins host memory"),
    ("MemFree", "free", "driver API free (cuMemFree, cuMemFreeHost)"),
    ("MemRelease", "free", "virtual memory management: releases a physical allocation"),
    ("MemUnmap", "free", "virtual memory management: unmaps"),
    ("MemAddressFree", "free", "virtual memory management: frees an address range"),
    ("MemPoolDestroy", "free", "destroys a memory pool"),
    ("MemPoolTrimTo", "free", "returns pool memory to the device; may synchronize"),
    ("DeviceReset", "free", "tears the context down with all its memory"),
    # --- context creation and code loading (first use of the device or of a kernel) ------------
    ("DeviceGetStreamPriorityRange", "context", "PyTorch's first call on a device: creates the CUDA context"),
    ("Init", "context", "cuInit / hipInit: driver initialisation"),
    ("CtxCreate", "context", "driver API: creates a context"),
    ("CtxDestroy", "context", "driver API: destroys a context"),
    ("DevicePrimaryCtx", "context", "retains/resets the primary context (created on first retain)"),
    ("SetDevice", "context", "binds the device; creates its primary context on first use (CUDA 12+)"),
    ("InitDevice", "context", "creates the device's primary context"),
    ("ModuleLoad", "context", "loads a code object into the context (a kernel's first use, lazy loading)"),
    ("LibraryLoad", "context", "loads a CUDA library's code into the context"),
    ("LinkCreate", "context", "JIT linking of device code"),
    ("ModuleUnload", "context", "unloads a code object"),
    ("StreamCreate", "stream_create", "cudaStreamCreate(WithFlags/WithPriority): may serialize the device"),
    ("StreamDestroy", "stream_create", "destroys a stream: the other half of a stream's lifecycle"),
    # --- events (cheap, asynchronous) ----------------------------------------------------------
    ("EventRecord", "event", "enqueues an event on a stream; does not wait"),
    ("EventCreate", "event", "creates an event"),
    ("EventDestroy", "event", "destroys an event"),
    ("StreamWaitEvent", "event", "makes a stream wait on the device; the host does not wait"),
    ("EventQuery", "query", "polls an event; never blocks (the caching allocator polls these)"),
    ("EventElapsedTime", "query", "reads two completed events' timestamps"),
    ("StreamQuery", "query", "polls a stream; never blocks"),
    # --- graph capture (library warm-up when it shows in a step) -------------------------------
    ("StreamBeginCapture", "other", "starts a graph capture"),
    ("StreamEndCapture", "other", "ends a graph capture"),
    ("GraphInstantiate", "other", "compiles a captured graph for replay"),
    ("Graph", "other", "graph construction and upload (cudaGraphUpload, cudaGraphAddNode, ...)"),
    # --- attribute reads and other bookkeeping -------------------------------------------------
    ("DeviceGet", "query", "reads a device attribute, limit or PCI id"),
    ("GetDevice", "query", "cudaGetDevice(Count/Properties/Flags), hipGetDevicePropertiesR0600"),
    ("DriverGetVersion", "query", "reads a version number"),
    ("RuntimeGetVersion", "query", "reads a version number"),
    ("PointerGetAttribute", "query", "reads where a pointer lives"),
    ("FuncGetAttribute", "query", "reads a kernel's attributes"),
    ("GetFuncBySymbol", "query", "looks a kernel up by host symbol"),
    ("GetSymbol", "query", "reads a device symbol's address or size"),
    ("HostGetDevicePointer", "query", "reads a pinned buffer's device address"),
    ("Occupancy", "query", "occupancy calculator, host-only arithmetic"),
    ("StreamGet", "query", "reads a stream's priority, flags, device or capture state"),
    ("StreamIsCapturing", "query", "reads whether a stream is capturing a graph"),
    ("MemGetInfo", "query", "reads free and total device memory"),
    ("CtxGet", "query", "reads the current context or its attributes"),
    ("GetErrorString", "query", "formats an error code"),
    ("GetErrorName", "query", "formats an error code"),
    ("GetLastError", "query", "reads and clears the last error"),
    ("PeekAtLastError", "query", "reads the last error"),
    ("FuncSetAttribute", "other", "sets a kernel attribute (e.g. its shared-memory limit) before launch"),
    ("ThreadExchangeStreamCaptureMode", "other", "graph-capture bookkeeping for the calling thread"),
    ("PushCallConfiguration", "other", "ROCm's <<<>>> bookkeeping before a launch; no kernel of its own"),
    ("PopCallConfiguration", "other", "ROCm's <<<>>> bookkeeping before a launch; no kernel of its own"),
)

# Vendor prefixes, longest first so `cuda` is not read as `cu` + `da...`.
_VENDOR_PREFIXES = ("__hip", "cuda", "hip", "cu")


def _stem(name: str) -> str | None:
    """The name without its vendor prefix, or None if it is not a CUDA/HIP API name."""
    for prefix in _VENDOR_PREFIXES:
        # The stem starts upper case (`cudaMalloc`, `cuInit`); this keeps `custom_op` out.
        if name.startswith(prefix) and len(name) > len(prefix) and name[len(prefix)].isupper():
            return name[len(prefix) :]
    return None


@lru_cache(maxsize=4096)
def call_kind(name: str) -> str:
    """The kind of a CUDA/HIP runtime or driver call, one of `KINDS` ("other" when unknown)."""
    stem = _stem(name)
    if stem is None:
        return "other"
    for prefix, kind, _reason in RUNTIME_CALLS:
        if stem.startswith(prefix):
            return kind
    return "other"


def call_reason(name: str) -> str | None:
    """Why `call_kind` gives `name` its kind (the table row's reason), None when no row matches."""
    stem = _stem(name)
    if stem is None:
        return None
    for prefix, _kind, reason in RUNTIME_CALLS:
        if stem.startswith(prefix):
            return reason
    return None


_COPY_KINDS = ("copy", "memset")


def _host_waits(copy_name: str) -> bool:
    return "Async" not in copy_name


def is_blocking_copy(name: str) -> bool:
    """A copy or memset the host waits for: no `Async` in the name, or ROCm's `hipMemcpyWithStream`.

    (`hipMemcpyWithStream` is what PyTorch's ROCm build calls for a synchronous `.to()`/`.item()`:
    it enqueues on a stream and then waits for that stream.)
    """
    return call_kind(name) in _COPY_KINDS and _host_waits(name)


def blocking_copies(names: list[str], name_kinds: np.ndarray) -> np.ndarray:
    """`is_blocking_copy` of each name of a trace's name table, given its `kind_codes`."""
    copies = np.zeros(len(names), dtype=bool)
    for kind in _COPY_KINDS:
        copies |= name_kinds == kind_code(kind)
    return copies & np.fromiter(map(_host_waits, names), dtype=bool, count=len(names))


def kind_codes(names: list[str]) -> np.ndarray:
    """For a trace's name table, the index into `KINDS` of each name's `call_kind` (int8)."""
    index = {kind: i for i, kind in enumerate(KINDS)}
    return np.fromiter((index[call_kind(n)] for n in names), dtype=np.int8, count=len(names))


def kind_code(kind: str) -> int:
    """The code of a kind in `kind_codes`' arrays."""
    return KINDS.index(kind)
