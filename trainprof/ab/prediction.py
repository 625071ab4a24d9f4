"""What would fusing gain? A prediction from the reference variant's trace: the GPU time of the
kernels inside what ``fused_layers.swap`` would replace (profiler ranges from module hooks), minus
the fused kernels' fewest bytes at the measured copy bandwidth, put beside the measured gain."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainprof.ab.results import VariantResult
from trainprof.analysis.fusion import FUSED_BYTES_FACTOR  # one table for this and the session analysis

#: Named when the fused prediction is computed: profiler ranges around what swap would replace.
REPLACED_RANGE = "trainprof.ab.replaced"
KEPT_RANGE = "trainprof.ab.kept"
#: Folder (under the log dir) of the first variant's annotated step that the prediction reads.
PREDICTION_DIR = "_prediction"


@dataclass
class Swappable:
    """What swap would replace in the reference model, seen during its profiled step."""

    paths: dict[str, str] = field(default_factory=dict)  # module path -> op ("layer_norm", ...)
    bytes_per_call: list[float] = field(default_factory=list)  # fused op's fewest bytes, fwd + bwd


_KEPT_CHILDREN = {"gated_mlp": ("gate_proj", "up_proj", "down_proj")}


def _rope_bytes(inputs: tuple, output: tuple) -> float:
    """The fused RoPE's fewest bytes, forward + backward, for a call (q, k, cos, sin) -> (q_embed, k_embed).

    q is (B, H, T, D) (unsqueeze_dim 1, as every caller of the swap table's rows passes), so a
    position's cos row has q.numel() / H elements; cos and sin are read in each of the two passes.
    """
    q, k, cos = inputs[:3]
    activations = sum(t.numel() * t.element_size() for t in (q, k, *output))
    tables = 2 * 2 * (q.numel() // max(q.shape[1], 1)) * cos.element_size()
    return FUSED_BYTES_FACTOR["rope"] * activations + tables


#: Ops swap replaces that the prediction leaves out: the fused loss is bound by its three matrix
#: products, not by bytes, so FUSED_BYTES_FACTOR's model does not price it, and the causal-mask
#: row changes nothing outside torch.compile; their gain shows in the measured figure only.
UNPREDICTED_OPS = ("linear_cross_entropy", "causal_mask")


def _swappable_paths(model: torch.nn.Module) -> dict[str, str]:
    """Module path -> op, for what ``fused_layers.swap`` would replace (swapped, read, unswapped),
    less :data:`UNPREDICTED_OPS`."""
    import fused_layers

    record = fused_layers.swap(model)
    try:
        return {path: op for path, op in record.replaced_ops.items() if op not in UNPREDICTED_OPS}
    finally:
        fused_layers.unswap(model, record)


class _CallModule(torch.nn.Module):
    """A function as a module, so module hooks can range its forward and backward."""

    def __init__(self, function: Callable) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args, **kwargs):
        return self.function(*args, **kwargs)


@contextlib.contextmanager
def annotate_swappable(model: torch.nn.Module) -> Iterator[Swappable]:
    """Profiler ranges around the forward and backward of each module swap would replace.

    ``REPLACED_RANGE`` wraps a replaced module's forward and backward (module hooks),
    ``KEPT_RANGE`` the children the fused module keeps (a gated MLP's Linears), so kernels can be
    attributed to what swap replaces. For RoPE, where swap reroutes the attention's
    ``apply_rotary_pos_emb`` rather than replacing a module, the same route sends this model's
    calls through a module around Hugging Face's function, whose hooks range it. Sizes for the
    fused cost are read in the forward hooks.
    """
    from torch.autograd.profiler import record_function

    from fused_layers import routing
    from fused_layers.swap import ROPE_FUNCTION

    seen = Swappable(paths=_swappable_paths(model))
    handles = []
    routes = []
    rope_calls: dict[str, _CallModule] = {}  # modeling module name -> its ranged function

    def ranged(module: torch.nn.Module, name: str, on_output: Callable | None = None) -> None:
        open_ranges: list = []

        def enter(*_args) -> None:
            rf = record_function(name)
            rf.__enter__()
            open_ranges.append(rf)

        def leave() -> None:
            if open_ranges:
                open_ranges.pop().__exit__(None, None, None)

        def leave_forward(_module, inputs, output) -> None:
            if on_output is not None:
                on_output(inputs, output)
            leave()

        handles.append(module.register_forward_pre_hook(lambda m, args: enter()))
        handles.append(module.register_forward_hook(leave_forward))
        handles.append(module.register_full_backward_pre_hook(lambda m, grad_out: enter()))
        handles.append(module.register_full_backward_hook(lambda m, grad_in, grad_out: leave()))

    def on_rope(inputs, output) -> None:
        seen.bytes_per_call.append(_rope_bytes(inputs, output))

    try:  # a hook or route that fails to install must not stay behind
        for path, op in seen.paths.items():
            module = model.get_submodule(path)
            factor = FUSED_BYTES_FACTOR.get(op)
            if op == "rope":
                namespace = sys.modules[type(module).forward.__module__]
                call = rope_calls.get(namespace.__name__)
                if call is None:
                    call = rope_calls[namespace.__name__] = _CallModule(
                        routing.original_function(namespace, ROPE_FUNCTION)
                    )
                    ranged(call, REPLACED_RANGE, on_rope)
                routes.append(routing.route_function(module, namespace, ROPE_FUNCTION, call))
            elif op == "gated_mlp":

                def on_gate(_inputs, output, factor=factor) -> None:
                    seen.bytes_per_call.append(factor * output.numel() * output.element_size())

                ranged(module, REPLACED_RANGE)
                for child in _KEPT_CHILDREN[op]:
                    ranged(getattr(module, child), KEPT_RANGE, on_gate if child == "gate_proj" else None)
            else:

                def on_norm(inputs, _output, factor=factor) -> None:
                    if factor and inputs and isinstance(inputs[0], torch.Tensor):
                        seen.bytes_per_call.append(factor * inputs[0].numel() * inputs[0].element_size())

                ranged(module, REPLACED_RANGE, on_norm)
        yield seen
    finally:
        for handle in handles:
            handle.remove()
        for route in routes:
            route.remove()


def predict(
    reference_dir: Path, seen: Swappable, copy_bandwidth: float, results: list[VariantResult]
) -> dict:
    """The predicted gain of ``fused`` from the reference trace, beside the measured one."""
    from trainprof.analysis.diff import range_cost

    cost = range_cost(reference_dir, REPLACED_RANGE, KEPT_RANGE)
    calls = len(seen.bytes_per_call) / 2  # two profiled steps (one warm-up) ran the forward hooks
    fused_bytes_per_step = sum(seen.bytes_per_call) / 2
    fused_gpu_ms = fused_bytes_per_step / copy_bandwidth * 1e3
    reference = results[0]
    fused = next((r for r in results if r.name == "fused"), None)
    out = {
        "model": "GPU-bound step: the GPU time of the kernels inside what swap replaces (forward and "
        "backward, module hooks), minus the fused kernels' expected time (their fewest bytes, "
        "FUSED_BYTES_FACTOR, at the copy bandwidth measured in this run), is wall time saved",
        "replaced_modules": len(seen.paths),
        "not_predicted": list(UNPREDICTED_OPS),
        "replaced_calls_per_step": calls,
        **cost,
        "fused_expected_gpu_ms_per_step": round(fused_gpu_ms, 4),
        "fused_launches_per_step": 2 * calls,
    }
    if cost["kernels_per_step"] == 0:
        out.update(available=False, reason="no GPU kernels in the reference trace (a CPU run)")
        return out
    saved_ms = cost["gpu_ms_per_step"] - fused_gpu_ms
    predicted_ms = reference.median_ms - saved_ms
    out.update(
        available=True,
        predicted_saved_ms=round(saved_ms, 4),
        predicted_fused_ms=round(predicted_ms, 4),
        predicted_speedup=round(reference.median_ms / predicted_ms, 4) if predicted_ms > 0 else None,
    )
    if fused is not None:
        measured_saved = reference.median_ms - fused.median_ms
        out.update(
            measured_saved_ms=round(measured_saved, 4),
            measured_speedup=fused.speedup,
            saved_ratio=round(saved_ms / measured_saved, 3) if measured_saved else None,
        )
    return out
