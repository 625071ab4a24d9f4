"""Measure whether a fused op's custom op or Inductor's code is faster inside a compiled graph,
for ``fused_layers.compile_choice`` (which keeps and reads the result). Needs a CUDA device.

Each op is timed inside a small compiled function, a probe, with the neighbours Inductor would
fuse it with in a model, forward and backward, once through the custom op (the op's eager default
for a differentiated call: what the fused layers run outside compile) and once through the plain
torch version, which Inductor compiles::

    layer_norm, rms_norm   h = x + r; (h, norm(h, w[, b]))   the residual add before every norm
    gelu                   gelu(x), x (TOKENS, 4096)          GPT-2's MLP: an addmm on each side
    geglu, swiglu          act(a) * b                         matmuls on each side
    linear_cross_entropy   loss(hidden, weight, labels)       the end of the graph

at :data:`TOKENS` rows (B4 x T2048, B8 x T1024), fresh random inputs, two sets used in turn, the
median of :data:`REPEATS` timed calls (CUDA events) after :data:`WARMUP`. Compiling both versions
of one op takes seconds; ``swap(model, for_compile=True)`` runs it once per op, dtype and shape
class the model has that the cache lacks.
"""

from __future__ import annotations

import datetime
import logging
import statistics
from collections.abc import Callable

import torch
from torch import Tensor

from fused_layers import compile_choice, dispatch
from fused_layers.ops.gated import geglu, swiglu
from fused_layers.ops.gelu import gelu
from fused_layers.ops.layer_norm import layer_norm
from fused_layers.ops.linear_cross_entropy import linear_cross_entropy
from fused_layers.ops.rms_norm import rms_norm

__all__ = ["REPEATS", "TOKENS", "WARMUP", "measure", "measure_missing"]

logger = logging.getLogger(__name__)

#: Rows of every probe: the tokens of one step of the benchmarks' models (B4 x T2048, B8 x T1024).
TOKENS = 8192
#: Width of the GELU probe (its class is every shape): GPT-2 124M's MLP is 3072 wide, Llama's 8192.
GELU_WIDTH = 4096
WARMUP = 3
REPEATS = 20
#: Enough compiled versions of each probe for both backends at every dtype and class of a process.
_RECOMPILE_LIMIT = 64


# One probe function per op: Dynamo keeps compiled versions per function, guarded on ``backend``.
def _layer_norm_probe(x: Tensor, r: Tensor, w: Tensor, b: Tensor, backend: str) -> tuple[Tensor, Tensor]:
    h = x + r
    return h, layer_norm(h, w, b, 1e-5, backend=backend)


def _rms_norm_probe(x: Tensor, r: Tensor, w: Tensor, backend: str) -> tuple[Tensor, Tensor]:
    h = x + r
    return h, rms_norm(h, w, 1e-6, backend=backend)


def _gelu_probe(x: Tensor, backend: str) -> tuple[Tensor]:
    return (gelu(x, "tanh", backend=backend),)


def _geglu_probe(a: Tensor, b: Tensor, backend: str) -> tuple[Tensor]:
    return (geglu(a, b, "tanh", backend=backend),)


def _swiglu_probe(a: Tensor, b: Tensor, backend: str) -> tuple[Tensor]:
    return (swiglu(a, b, backend=backend),)


def _linear_cross_entropy_probe(h: Tensor, w: Tensor, labels: Tensor, backend: str) -> tuple[Tensor]:
    return (linear_cross_entropy(h, w, labels, backend=backend),)


_PROBES: dict[str, Callable[..., tuple[Tensor, ...]]] = {
    "layer_norm": _layer_norm_probe,
    "rms_norm": _rms_norm_probe,
    "gelu": _gelu_probe,
    "geglu": _geglu_probe,
    "swiglu": _swiglu_probe,
    "linear_cross_entropy": _linear_cross_entropy_probe,
}


def _inputs(op: str, dtype: torch.dtype, dims: tuple[int, ...], device: torch.device) -> list:
    """Fresh random inputs of the probe (leaves requiring grad; labels with 5% ignored)."""

    def leaf(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, device=device) * scale).to(dtype).requires_grad_()

    if op in ("layer_norm", "rms_norm"):
        width = dims[0]
        params = [leaf(width), leaf(width)] if op == "layer_norm" else [leaf(width)]
        return [leaf(TOKENS, width), leaf(TOKENS, width), *params]
    if op == "gelu":
        return [leaf(TOKENS, GELU_WIDTH)]
    if op in ("geglu", "swiglu"):
        return [leaf(TOKENS, dims[0]), leaf(TOKENS, dims[0])]
    hidden, vocab = dims
    labels = torch.randint(0, vocab, (TOKENS,), device=device)
    labels[torch.rand(TOKENS, device=device) < 0.05] = -100
    return [leaf(TOKENS, hidden), leaf(vocab, hidden, scale=2 / hidden**0.5), labels]


def _describe_probe(op: str, dtype: torch.dtype, dims: tuple[int, ...]) -> str:
    shapes = {
        "layer_norm": f"h = x + r; (h, layer_norm(h, w, b)); x, r ({TOKENS}, {dims[0] if dims else 0})",
        "rms_norm": f"h = x + r; (h, rms_norm(h, w)); x, r ({TOKENS}, {dims[0] if dims else 0})",
        "gelu": f"gelu(x, 'tanh'); x ({TOKENS}, {GELU_WIDTH})",
        "geglu": f"geglu(a, b); a, b ({TOKENS}, {dims[0] if dims else 0})",
        "swiglu": f"swiglu(a, b); a, b ({TOKENS}, {dims[0] if dims else 0})",
        "linear_cross_entropy": f"loss(hidden ({TOKENS}, {dims[0]}), weight ({dims[-1]}, {dims[0]}), labels)"
        if op == "linear_cross_entropy"
        else "",
    }
    return f"{shapes[op]}; {str(dtype).removeprefix('torch.')}; forward+backward"


def _time_ms(op: str, backend: str, dtype: torch.dtype, dims: tuple[int, ...], device: torch.device) -> float:
    """Median ms of the compiled probe's forward+backward through ``backend`` (CUDA events)."""
    if device.type != "cuda":
        raise ValueError(f"fused_layers.compile_probe: timing needs a CUDA device, got {device}")
    compiled = torch.compile(_PROBES[op], fullgraph=True, dynamic=False)
    sets = [_inputs(op, dtype, dims, device) for _ in range(2)]

    def call(inputs: list) -> None:
        for tensor in inputs:
            tensor.grad = None
        outputs = compiled(*inputs, backend)
        torch.autograd.backward(outputs, [torch.ones_like(out) if out.dim() == 0 else out for out in outputs])

    times = []
    with torch.cuda.device(device):
        for index in range(WARMUP):  # compiles on the first
            call(sets[index % 2])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for index in range(REPEATS):
            start.record()
            call(sets[index % 2])
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def custom_backend(op: str, dtype: torch.dtype, dims: tuple[int, ...], device: torch.device) -> str:
    """The custom op a call of ``op`` would run outside compile, differentiated, on ``device``."""
    # The rule reads only where the tensors are and whether autograd differentiates them.
    stand_in = torch.empty(1, device=device, dtype=dtype, requires_grad=True)
    return dispatch.choose_backend(op, None, stand_in)


def measure(
    op: str,
    dtype: torch.dtype,
    dims: tuple[int, ...],
    device: torch.device,
    timer: Callable[[str, str, torch.dtype, tuple[int, ...], torch.device], float] | None = None,
) -> compile_choice.Choice:
    """Time ``op``'s probe compiled both ways on ``device`` (CUDA), record and return the choice.

    ``timer(op, backend, dtype, dims, device)`` gives the ms of one way (default: the compiled
    probe timed with CUDA events).
    """
    timer = timer or _time_ms
    backend = custom_backend(op, dtype, dims, device)
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    with torch._dynamo.config.patch(**{limit: _RECOMPILE_LIMIT}):
        custom_ms = timer(op, backend, dtype, dims, device) if backend != compile_choice.INDUCTOR else None
        inductor_ms = timer(op, compile_choice.INDUCTOR, dtype, dims, device)
    custom_ms = inductor_ms if custom_ms is None else custom_ms
    choice = compile_choice.Choice(
        op=op,
        dtype=str(dtype),
        shape_class=compile_choice.shape_class(op, dims),
        backend=backend if custom_ms < inductor_ms else compile_choice.INDUCTOR,
        custom_backend=backend,
        custom_ms=round(custom_ms, 4),
        inductor_ms=round(inductor_ms, 4),
        probe=_describe_probe(op, dtype, dims),
        date=datetime.date.today().isoformat(),
    )
    compile_choice.record(choice, device)
    return choice


def measure_missing(
    requests: list[tuple[str, torch.dtype, tuple[int, ...]]], device: torch.device
) -> dict[tuple[str, str, str], compile_choice.Choice | str]:
    """The choice for each (op, dtype, dims), measured where the cache lacks it; keyed by
    (op, dtype name, shape class). A measurement that fails gives its error as a string (that op
    then runs Inductor's code under compile) and never stops the caller."""
    results: dict[tuple[str, str, str], compile_choice.Choice | str] = {}
    for op, dtype, dims in requests:
        key = (op, str(dtype), compile_choice.shape_class(op, dims))
        if key in results:
            continue
        choice = compile_choice.lookup(op, dtype, dims, device)
        if choice is None and device.type == "cuda":
            try:
                choice = measure(op, dtype, dims, device)
            except Exception as error:  # a failed probe must not stop the swap: Inductor's code stays
                logger.warning("fused_layers: measuring %s under compile failed: %r", key, error)
                results[key] = f"measurement failed: {type(error).__name__}: {error}"[:200]
                continue
        results[key] = choice if choice is not None else "not measured: not on a CUDA device"
    return results
