"""Which implementation a fused op runs inside a ``torch.compile`` graph: its custom op or
Inductor's own code for the plain torch version, whichever measured faster for that op, dtype and
shape class on this GPU; the measurements cached on disk.

Inductor generates kernels for the plain torch version of an op and fuses them with their
neighbours (the residual add before a norm, a cast); a custom op is opaque to it, and wins only
where its kernels are faster by more than the fusion saves. Which it is depends on the op, the
dtype and the shape, so it is measured (``fused_layers.compile_probe``, which ``fused_layers.swap``
runs with ``for_compile=True``) and read back here while Dynamo traces (``backend_under_compile``,
``fused_layers.dispatch``'s rule 1). An op, dtype and shape class never measured runs Inductor's
code, the choice measured for the fused layers as a whole before per-op measurement existed.

Shape classes (the dims an op's speed depends on, rounded up to a power of two)::

    layer_norm, rms_norm, geglu, swiglu   w<last dim>         e.g. w2048 for Llama-3.2-1B's norms
    gelu                                  any                 elementwise: one class
    linear_cross_entropy                  h<hidden>-v<vocab>  e.g. h2048-v131072

The cache is one JSON file, ``$FUSED_LAYERS_CACHE_DIR/compile_choice.json`` (default
``~/.cache/fused_layers``), keyed by GPU name, torch and Triton versions: another GPU or release
measures again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

__all__ = [
    "CHOICE_OPS",
    "Choice",
    "backend_under_compile",
    "cache_path",
    "call_dims",
    "environment",
    "lookup",
    "record",
    "shape_class",
]

logger = logging.getLogger(__name__)

#: The ops measured both ways. RoPE is not: a routed function runs Hugging Face's own code under
#: compile (``fused_layers.routing``), so Inductor's is the only one there.
CHOICE_OPS = ("layer_norm", "rms_norm", "gelu", "geglu", "swiglu", "linear_cross_entropy")

#: Backend name of "Inductor's code": the plain torch version, which Inductor compiles.
INDUCTOR = "torch"


@dataclass(frozen=True)
class Choice:
    """One measurement: which backend runs ``op`` at ``dtype`` and ``shape_class`` under compile."""

    op: str
    dtype: str
    """As torch names it: "torch.bfloat16"."""
    shape_class: str
    backend: str
    """The faster: ``custom_backend`` or "torch" (Inductor's code)."""
    custom_backend: str
    """The custom op that was timed: the op's eager default for a differentiated call."""
    custom_ms: float
    """Forward+backward of the probe (``fused_layers.compile_probe``) with the custom op, compiled; median."""
    inductor_ms: float
    """The same with Inductor's code for the op."""
    probe: str
    """What was timed: the probe's shapes and neighbours."""
    date: str

    def describe(self) -> str:
        """One phrase: which won, by how much."""
        winner = "Inductor" if self.backend == INDUCTOR else f"custom op ({self.backend})"
        loser_ms = self.custom_ms if self.backend == INDUCTOR else self.inductor_ms
        loser = self.custom_backend if self.backend == INDUCTOR else "Inductor"
        winner_ms = min(self.custom_ms, self.inductor_ms)
        return f"{winner}, {winner_ms:.3f} ms against {loser}'s {loser_ms:.3f}"


def _pow2(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


def shape_class(op: str, dims: tuple[int, ...]) -> str:
    """The class of ``op`` at ``dims`` (module docstring's table; ``call_dims`` gives the dims)."""
    if op == "gelu":
        return "any"
    if op == "linear_cross_entropy":
        hidden, vocab = dims
        return f"h{_pow2(hidden)}-v{_pow2(vocab)}"
    return f"w{_pow2(dims[0])}"


def call_dims(op: str, tensors: list[Tensor]) -> tuple[int, ...] | None:
    """The dims of a call that pick its shape class, from its tensors (None: not static ints)."""
    if op == "gelu":
        return ()
    dims: tuple[int, ...]
    if op == "linear_cross_entropy":
        dims = (tensors[0].shape[-1], tensors[1].shape[0])  # hidden (..., H), weight (V, H)
    else:
        dims = (tensors[0].shape[-1],)
    return dims if all(type(d) is int for d in dims) else None


def environment(device: torch.device) -> str:
    """The cache's key for what the timings depend on besides the op: GPU, torch, Triton."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{name} | torch {torch.__version__} | triton {triton_version}"


def cache_path() -> Path:
    """The JSON file of measured choices."""
    root = os.environ.get("FUSED_LAYERS_CACHE_DIR") or Path.home() / ".cache" / "fused_layers"
    return Path(root) / "compile_choice.json"


_lock = threading.Lock()
_table: dict[str, dict[str, dict]] | None = None  # environment -> key -> Choice as a dict


def _key(op: str, dtype: str, cls: str) -> str:
    return f"{op} | {dtype} | {cls}"


def _loaded() -> dict[str, dict[str, dict]]:
    """The cache file's table, read once per process (an unreadable file reads as empty)."""
    global _table
    if _table is None:
        try:
            _table = json.loads(cache_path().read_text(encoding="utf-8"))
            if not isinstance(_table, dict):
                _table = {}
        except (OSError, ValueError):
            _table = {}
    return _table


def lookup(op: str, dtype: torch.dtype | str, dims: tuple[int, ...], device: torch.device) -> Choice | None:
    """The measured choice for this op, dtype and shape class on ``device``'s environment, if any."""
    with _lock:
        entry = _loaded().get(environment(device), {}).get(_key(op, str(dtype), shape_class(op, dims)))
    try:
        return Choice(**entry) if entry else None
    except TypeError:  # a record of another layout: measure again
        return None


def record(choice: Choice, device: torch.device) -> None:
    """Keep ``choice`` for this process and in the cache file (a file that cannot be written is
    skipped with a log line: the choice still holds in this process)."""
    with _lock:
        table = _loaded()
        table.setdefault(environment(device), {})[_key(choice.op, choice.dtype, choice.shape_class)] = asdict(
            choice
        )
        path = cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(table, indent=1, sort_keys=True), encoding="utf-8")
            partial.replace(path)  # atomic: a reader sees the old file or the new one
        except OSError as error:
            logger.info("fused_layers: compile choices not saved to %s: %s", path, error)


def _chosen_backend(op: str, dtype: str, dims: tuple[int, ...], device: torch.device) -> str:
    """The backend of the measured choice, or "torch" (Inductor's code) where none was measured."""
    choice = lookup(op, dtype, dims, device)
    return choice.backend if choice is not None else INDUCTOR


# Dynamo runs it once while tracing and uses the result as a constant (what
# torch.compiler.assume_constant_result sets, without importing Dynamo here): a graph is compiled
# with the choice measured when it was traced.
_chosen_backend._dynamo_marked_constant = True  # type: ignore[attr-defined]


def backend_under_compile(op: str, tensors: list[Tensor]) -> str:
    """The backend ``op`` runs on inside a compiled graph, for a call on ``tensors``: the measured
    choice, else "torch" (Inductor's code); "torch" too for an op not in :data:`CHOICE_OPS` or
    dims that are not static."""
    dims = call_dims(op, tensors) if op in CHOICE_OPS and tensors else None
    if dims is None:
        return INDUCTOR
    return _chosen_backend(op, str(tensors[0].dtype), dims, tensors[0].device)
