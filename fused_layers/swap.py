"""Swap a model's layers for fused ones: one table (source -> fused factory) and one walker.

``swap(model)`` walks ``model.named_modules()`` once, replaces each module that a row of ``TABLE``
matches, in place, keeping its Parameter objects (so optimizer state, device and dtype are
unchanged), and returns a :class:`SwapRecord` of what it replaced and what it left and why.
``unswap(model)`` puts the original modules back; ``with swap(model): ...`` does it on exit.

Rotary embeddings are a module-level function of each Hugging Face modeling file
(``apply_rotary_pos_emb``), not a module: their rows name the attention class that calls it, and
swap reroutes the function to the fused op while that attention module's forward runs, for this
model only (``fused_layers.routing``); the module is not replaced.

Hugging Face classes are looked up in ``sys.modules`` only: a model that holds them has already
imported them, and a process without transformers swaps the torch modules alone.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from fused_layers import causal_lm, causal_mask, compile_choice, compile_probe, dispatch, routing
from fused_layers.modules import FusedGatedMLP, FusedGELU, FusedLayerNorm, FusedLMHead, FusedRMSNorm
from fused_layers.ops.rope import rope

__all__ = ["OPS", "ROPE_FUNCTION", "TABLE", "LeftModule", "Reroute", "SwapRecord", "swap", "unswap"]

logger = logging.getLogger(__name__)

#: The ops ``swap`` knows, each the ``op`` of rows of ``TABLE``.
OPS = ("layer_norm", "gelu", "rms_norm", "gated_mlp", "rope", "linear_cross_entropy", "causal_mask")

#: The function a RoPE row reroutes, in the modeling module of the attention class it names.
ROPE_FUNCTION = "apply_rotary_pos_emb"

#: Activation classes ("module:Class") -> the fused form: "tanh"/"none" (GELU) or "silu".
#: Used for plain activation modules and for a gated MLP's ``act_fn``.
ACTIVATIONS: dict[str, str | Callable[[nn.Module], str]] = {
    "torch.nn:GELU": lambda module: module.approximate,
    "torch.nn:SiLU": "silu",
    "transformers.activations:GELUActivation": "none",
    "transformers.activations:NewGELUActivation": "tanh",
    "transformers.activations:GELUTanh": "tanh",
    "transformers.activations:PytorchGELUTanh": "tanh",
    "transformers.activations:FastGELUActivation": "tanh",
    "transformers.activations:SiLUActivation": "silu",
}

_RECORDS_ATTR = "_fused_layers_swap_records"
# Names of modules that are listed as left (no row) when nothing replaced them: norms and GELUs.
_NEAR_MISS = re.compile(r"Norm|GELU|Gelu")


class _Leave(Exception):
    """Raised by a factory: the module looked like a match but must stay; the message says why."""


def _resolve(spec: str) -> type | None:
    """Return the class named by "module:Class", or None when its module is not imported or lacks it."""
    module_name, _, class_name = spec.partition(":")
    return getattr(sys.modules.get(module_name), class_name, None)


def _is_plain(module: nn.Module, spec: str) -> bool:
    """``module`` is an instance of ``spec`` whose class does not override ``forward``."""
    cls = _resolve(spec)
    return cls is not None and isinstance(module, cls) and type(module).forward is cls.forward


def _activation_kind(module: nn.Module) -> str | None:
    for spec, kind in ACTIVATIONS.items():
        if _is_plain(module, spec):
            return kind(module) if callable(kind) else kind
    return None


# ---- predicates ----------------------------------------------------------------------------------


def _is_gelu(module: nn.Module) -> bool:
    return _activation_kind(module) in ("tanh", "none")


def _rms_eps(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def _looks_like_rms_norm(module: nn.Module) -> bool:
    """An ``...RMSNorm`` with exactly one 1-D parameter ``weight``, an eps, and no submodules."""
    params = list(module.named_parameters())
    return (
        type(module).__name__.endswith("RMSNorm")
        and len(params) == 1
        and params[0][0] == "weight"
        and params[0][1].dim() == 1
        and _rms_eps(module) is not None
        and not list(module.children())
    )


def _looks_like_gated_mlp(module: nn.Module) -> bool:
    """Llama-style: ``gate_proj``, ``up_proj``, ``down_proj`` Linears and an ``act_fn`` module."""
    linears = ("gate_proj", "up_proj", "down_proj")
    return all(isinstance(getattr(module, name, None), nn.Linear) for name in linears) and isinstance(
        getattr(module, "act_fn", None), nn.Module
    )


# ---- factories: (module, backend) -> fused module, or raise _Leave(reason) -------------------------


def _fused_layer_norm(module: nn.Module, backend: str | None) -> nn.Module:
    if len(module.normalized_shape) != 1:
        raise _Leave(
            f"normalized_shape {tuple(module.normalized_shape)} spans more than the last dim; "
            "the fused kernel normalises the last dim only"
        )
    return FusedLayerNorm.from_layer_norm(module, backend)


def _fused_gelu(module: nn.Module, backend: str | None) -> nn.Module:
    return FusedGELU(_activation_kind(module), backend)


def _fused_rms_norm(module: nn.Module, backend: str | None) -> nn.Module:
    return FusedRMSNorm(module.weight, _rms_eps(module), backend)


def _fused_gated_mlp(module: nn.Module, backend: str | None) -> nn.Module:
    extra = sorted(set(dict(module.named_children())) - {"gate_proj", "up_proj", "down_proj", "act_fn"})
    if extra:
        raise _Leave(f"extra submodules {extra} that the fused forward would skip")
    activation = _activation_kind(module.act_fn)
    if activation is None:
        raise _Leave(f"act_fn {type(module.act_fn).__name__} has no fused gated kernel (SiLU or GELU only)")
    return FusedGatedMLP(module.gate_proj, module.up_proj, module.down_proj, activation, backend)


# Tolerances of the forward check: randn inputs, outputs of order 1.
_CHECK_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}


def _verified(factory: Callable[[nn.Module, str | None], nn.Module], width: Callable[[nn.Module], int]):
    """Wrap ``factory``: build the fused module on the plain-torch backend, compare its forward with
    the original's on a small seeded random input, and keep it only when they agree."""

    def build(module: nn.Module, backend: str | None) -> nn.Module:
        fused = factory(module, "torch")
        param = next(module.parameters())
        if param.device.type == "meta":
            raise _Leave("parameters on the meta device: its forward cannot be checked")
        # A private generator: the check must not move the caller's RNG streams.
        generator = torch.Generator(device=param.device).manual_seed(0)
        x = torch.randn(4, width(module), generator=generator, device=param.device, dtype=param.dtype)
        with torch.no_grad():
            expected, got = module(x), fused(x)
        atol, rtol = _CHECK_TOLERANCE.get(param.dtype, (1e-2, 1e-2))
        if not isinstance(expected, torch.Tensor) or expected.shape != got.shape:
            raise _Leave("forward returns something other than one tensor of the input's shape")
        if not torch.allclose(expected.float(), got.float(), atol=atol, rtol=rtol):
            diff = (expected.float() - got.float()).abs().max().item()
            raise _Leave(
                f"forward differs from the fused op's reference (max abs diff {diff:.3g} on a random "
                "input), e.g. a (1 + weight) scale or another variant"
            )
        fused.backend = backend
        return fused

    return build


@dataclass(frozen=True)
class Reroute:
    """What a factory returns for a function its module's forward calls, instead of a new module:
    ``namespace.function`` runs ``implementation`` while this module's forward runs."""

    namespace: ModuleType
    function: str
    implementation: Callable


# Hugging Face's signature; the fused op takes the same arguments (plus backend).
_ROPE_PARAMETERS = ("q", "k", "cos", "sin", "unsqueeze_dim")


def _fused_rope(module: nn.Module, backend: str | None) -> Reroute:
    """Reroute the attention forward's ``apply_rotary_pos_emb`` after checking that it is
    Hugging Face's formula: its signature, and its output against the fused op's torch version on
    a small seeded random input (GQA shapes, (1, T, D) cos/sin)."""
    namespace = sys.modules.get(type(module).forward.__module__)
    if namespace is None or not callable(getattr(namespace, ROPE_FUNCTION, None)):
        raise _Leave(f"its forward's module has no {ROPE_FUNCTION}")
    if routing.is_routed(module, namespace, ROPE_FUNCTION):
        raise _Leave(f"its {ROPE_FUNCTION} is already rerouted by an earlier swap")
    original = routing.original_function(namespace, ROPE_FUNCTION)
    try:
        parameters = tuple(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        parameters = ()
    if parameters != _ROPE_PARAMETERS:
        raise _Leave(f"{ROPE_FUNCTION} takes {parameters}, not Hugging Face's {_ROPE_PARAMETERS}")
    param = next(module.parameters(), None)
    if param is None or param.device.type == "meta":
        raise _Leave("no parameters off the meta device to check its rotary embedding on")
    generator = torch.Generator(device=param.device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=param.device, dtype=param.dtype)

    q, k, cos, sin = randn(2, 4, 3, 8), randn(2, 2, 3, 8), randn(1, 3, 8), randn(1, 3, 8)
    with torch.no_grad():
        expected, got = original(q, k, cos, sin), rope(q, k, cos, sin, backend="torch")
    atol, rtol = _CHECK_TOLERANCE.get(param.dtype, (1e-2, 1e-2))
    same = isinstance(expected, tuple) and len(expected) == 2
    for want, have in zip(expected if same else (), got, strict=False):
        same = same and isinstance(want, torch.Tensor) and want.shape == have.shape
        same = same and torch.allclose(want.float(), have.float(), atol=atol, rtol=rtol)
    if not same:
        raise _Leave(f"{ROPE_FUNCTION} differs from the fused op's reference (e.g. partial or interleaved)")
    return Reroute(namespace, ROPE_FUNCTION, functools.partial(rope, backend=backend))


def _fused_loss(module: nn.Module, backend: str | None) -> causal_lm.HeadRoute:
    """The causal LM's lm_head and loss as one fused op while it is called with labels
    (``fused_layers.causal_lm``); the model module stays."""
    try:
        return causal_lm.head_route(module, backend)
    except causal_lm.LeaveReason as reason:
        raise _Leave(str(reason)) from None


def _skip_causal_mask(module: nn.Module, backend: str | None) -> causal_mask.MaskRoute:
    """The base model's SDPA runs causal with no mask under compile where Hugging Face's eager
    code does (``fused_layers.causal_mask``); the module stays."""
    try:
        return causal_mask.mask_route(module)
    except causal_mask.LeaveReason as reason:
        raise _Leave(str(reason)) from None


@dataclass(frozen=True)
class Rule:
    """One row of ``TABLE``: modules matching ``source`` become ``factory(module, backend)``.

    ``source`` is "module:Class" (instances of that class that keep its forward) or a predicate.
    The factory returns the fused module, or a :class:`Reroute` for a function the module calls.
    """

    op: str
    source: str | Callable[[nn.Module], bool]
    factory: Callable[[nn.Module, str | None], nn.Module | Reroute]

    def matches(self, module: nn.Module) -> bool:
        """Whether this row applies to ``module``."""
        return _is_plain(module, self.source) if isinstance(self.source, str) else self.source(module)


#: The causal LM families whose loss (`_fused_loss`) and causal mask (`_skip_causal_mask`) swap
#: replaces: (modeling module under transformers.models, causal LM class, its base model class).
_CAUSAL_LMS = (
    ("gpt2.modeling_gpt2", "GPT2LMHeadModel", "GPT2Model"),
    ("llama.modeling_llama", "LlamaForCausalLM", "LlamaModel"),
    ("mistral.modeling_mistral", "MistralForCausalLM", "MistralModel"),
    ("qwen2.modeling_qwen2", "Qwen2ForCausalLM", "Qwen2Model"),
    ("qwen3.modeling_qwen3", "Qwen3ForCausalLM", "Qwen3Model"),
    ("gemma.modeling_gemma", "GemmaForCausalLM", "GemmaModel"),
    ("gemma2.modeling_gemma2", "Gemma2ForCausalLM", "Gemma2Model"),
    ("gemma3.modeling_gemma3", "Gemma3ForCausalLM", "Gemma3TextModel"),
)


#: The swap table, first match wins.
TABLE: tuple[Rule, ...] = (
    Rule("layer_norm", "torch.nn:LayerNorm", _fused_layer_norm),
    Rule("gelu", _is_gelu, _fused_gelu),
    Rule("rms_norm", "transformers.models.llama.modeling_llama:LlamaRMSNorm", _fused_rms_norm),
    Rule("rms_norm", _looks_like_rms_norm, _verified(_fused_rms_norm, lambda m: m.weight.shape[0])),
    Rule("gated_mlp", _looks_like_gated_mlp, _verified(_fused_gated_mlp, lambda m: m.gate_proj.in_features)),
    # Attention classes whose modeling module's apply_rotary_pos_emb is Hugging Face's rotate_half
    # formula (transformers 5.23: identical in these four files; checked again at swap time).
    Rule("rope", "transformers.models.llama.modeling_llama:LlamaAttention", _fused_rope),
    Rule("rope", "transformers.models.mistral.modeling_mistral:MistralAttention", _fused_rope),
    Rule("rope", "transformers.models.qwen2.modeling_qwen2:Qwen2Attention", _fused_rope),
    Rule("rope", "transformers.models.qwen3.modeling_qwen3:Qwen3Attention", _fused_rope),
    # Causal LMs whose forward is lm_head, Gemma's optional final_logit_softcapping, then
    # self.loss_function (ForCausalLMLoss) (transformers 5.17-5.24); fused_layers.causal_lm.
    *(
        Rule("linear_cross_entropy", f"transformers.models.{family}:{lm}", _fused_loss)
        for family, lm, _ in _CAUSAL_LMS
    ),
    # Their base models, whose create_causal_mask (or sliding-window one) reads the config's
    # attention implementation (transformers 5.17-5.24); fused_layers.causal_mask.
    *(
        Rule("causal_mask", f"transformers.models.{family}:{base}", _skip_causal_mask)
        for family, _, base in _CAUSAL_LMS
    ),
)


@dataclass(frozen=True)
class LeftModule:
    """A module ``swap`` looked at and did not replace."""

    path: str
    class_name: str
    reason: str


@dataclass
class _Replacement:
    path: str
    parent: nn.Module | None
    name: str
    original: nn.Module
    fused: nn.Module | None
    # a rerouted function, the causal LM's hooked loss or its attention's mask, instead of a new module
    route: routing.FunctionRoute | causal_lm.HeadHandle | causal_mask.MaskHandle | None = None


@dataclass
class SwapRecord:
    """What one ``swap`` call did.

    ``replaced``: source class name -> count ("LlamaAttention.apply_rotary_pos_emb" where a
    function the module calls was rerouted); ``replaced_paths``: module paths replaced (or
    rerouted), in walk order; ``replaced_ops``: path -> op (a name of ``OPS``); ``left``: modules
    that matched a row (or look like a norm/GELU) but stayed, with why; ``under_compile``: for each
    op, dtype and shape class swapped in (``"rms_norm torch.bfloat16 w2048"``), what runs inside a
    ``torch.compile`` graph and why (``fused_layers.compile_choice``). Also a context manager:
    leaving the ``with`` block restores the original modules and functions.
    """

    replaced: dict[str, int] = field(default_factory=dict)
    replaced_paths: list[str] = field(default_factory=list)
    replaced_ops: dict[str, str] = field(default_factory=dict)
    left: list[LeftModule] = field(default_factory=list)
    under_compile: dict[str, str] = field(default_factory=dict)
    _replacements: list[_Replacement] = field(default_factory=list, repr=False)
    _model: nn.Module | None = field(default=None, repr=False)

    def summary(self, under_compile: bool = True) -> str:
        """One line: counts replaced per class, how many modules were left and, with
        ``under_compile``, what runs inside a compiled graph."""
        counts = ", ".join(f"{name} x{count}" for name, count in sorted(self.replaced.items())) or "nothing"
        if not under_compile:
            return f"replaced {counts}; left {len(self.left)}"
        # Measured choices one by one; the rest (rope's routing aside) counted by why not measured.
        unmeasured = Counter(
            what for key, what in self.under_compile.items() if what.startswith(_UNMEASURED) and key != "rope"
        )
        compiled = [
            f"{key}: {what}"
            for key, what in self.under_compile.items()
            if not what.startswith(_UNMEASURED) or key == "rope"
        ]
        compiled += [
            f"Inductor for {count} op/dtype/shape classes ({what.removeprefix(_UNMEASURED)[:-1]})"
            for what, count in unmeasured.items()
        ]
        compiled_text = f"; under torch.compile: {'; '.join(compiled)}" if compiled else ""
        return f"replaced {counts}; left {len(self.left)}{compiled_text}"

    def __enter__(self) -> SwapRecord:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._model is not None:
            unswap(self._model, self)


def _ancestors(path: str) -> Iterable[str]:
    while "." in path:
        path = path.rpartition(".")[0]
        yield path


def swap(
    model: nn.Module, ops: Iterable[str] = OPS, backend: str | None = None, for_compile: bool = False
) -> SwapRecord:
    """Replace ``model``'s layers by fused ones in place and return the record of what changed.

    ``ops`` picks rows of ``TABLE`` by op name (``OPS``); ``backend`` is passed to every fused op
    (None: each op's default; "cuda" applies to layer_norm and rms_norm, the others keep their
    default). A module whose factory fails unexpectedly is left with a warning, never half-replaced.
    RoPE rows leave the attention module in place and reroute its modeling module's
    ``apply_rotary_pos_emb`` for this model only (other models in the process keep Hugging Face's).
    The loss rows (causal LMs) keep the model and put a fused loss behind its ``lm_head`` while it
    is called with labels: it then returns ``logits=None`` (``fused_layers.causal_lm``).

    ``for_compile``: the model will run under ``torch.compile``; measure, for each op, dtype and
    shape class swapped in that the cache lacks, whether its custom op or Inductor's code is faster
    inside a compiled graph (seconds per op, on a CUDA device; ``fused_layers.compile_probe``).
    The dtypes measured are the parameters' and, for fp32 parameters, bf16 (autocast's). Without
    it, cached measurements still apply; ``SwapRecord.under_compile`` says what runs.
    """
    ops = tuple(ops)
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise ValueError(f"fused_layers.swap: unknown ops {unknown}; expected some of {OPS}")
    record = SwapRecord(_model=model)
    fused_by_original: dict[int, nn.Module] = {}  # a module registered under two paths gets one fused
    counts: Counter[str] = Counter()
    replaced: set[str] = set()
    for path, module in list(model.named_modules(remove_duplicate=False)):
        if any(ancestor in replaced for ancestor in _ancestors(path)):
            continue  # inside a block that was replaced as a whole
        class_name = type(module).__name__
        rule = next((row for row in TABLE if row.matches(module)), None)
        if rule is None:
            if _NEAR_MISS.search(class_name) and not class_name.startswith("Fused"):
                record.left.append(LeftModule(path, class_name, "no row in fused_layers.swap.TABLE"))
            continue
        if rule.op not in ops:
            record.left.append(LeftModule(path, class_name, f"op {rule.op!r} not in ops"))
            continue
        if not path and rule.op not in ("linear_cross_entropy", "causal_mask"):  # these keep their module
            record.left.append(LeftModule(path, class_name, "the root module cannot be replaced in place"))
            continue
        fused = fused_by_original.get(id(module))
        if fused is None:
            # The CUDA C++ backend has layer_norm and rms_norm only; other ops keep their default.
            cuda_lacks_op = backend == "cuda" and not dispatch.has_implementation(rule.op, "cuda")
            rule_backend = None if cuda_lacks_op else backend
            try:
                fused = rule.factory(module, rule_backend)
            except _Leave as reason:
                record.left.append(LeftModule(path, class_name, str(reason)))
                continue
            except Exception as error:  # a failure must not stop the user's run: leave it, say so
                warnings.warn(
                    f"fused_layers.swap: left {path} ({class_name}): {error!r}", RuntimeWarning, stacklevel=2
                )
                record.left.append(LeftModule(path, class_name, f"fused factory failed: {error!r}"))
                continue
            fused_by_original[id(module)] = fused
        if isinstance(fused, causal_mask.MaskRoute):
            # The module stays; its config names the attention implementation whose mask is skipped.
            record._replacements.append(_Replacement(path, None, "", module, None, causal_mask.attach(fused)))
            counts[f"{class_name}.causal_mask"] += 1
        elif isinstance(fused, causal_lm.HeadRoute):
            # The model stays; its lm_head becomes the fused head, and hooks hand it the labels.
            handle = causal_lm.attach(module, fused)
            record._replacements.append(_Replacement(path, None, "", module, None, handle))
            replaced.add(f"{path}.{causal_lm.HEAD}" if path else causal_lm.HEAD)
            counts[f"{class_name}.{causal_lm.HEAD}"] += 1
        elif isinstance(fused, Reroute):
            # The module stays (its children too); its calls of the function go to the fused op.
            if not routing.is_routed(module, fused.namespace, fused.function):  # once if under two paths
                route = routing.route_function(module, fused.namespace, fused.function, fused.implementation)
                record._replacements.append(_Replacement(path, None, "", module, None, route))
            counts[f"{class_name}.{fused.function}"] += 1
        else:
            parent_path, _, name = path.rpartition(".")
            parent = model.get_submodule(parent_path)
            setattr(parent, name, fused)
            record._replacements.append(_Replacement(path, parent, name, module, fused))
            replaced.add(path)
            counts[class_name] += 1
        record.replaced_paths.append(path)
        record.replaced_ops[path] = rule.op
    record.replaced = dict(counts)
    record.under_compile = _under_compile(record, model, measure=for_compile)
    model.__dict__.setdefault(_RECORDS_ATTR, []).append(record)
    logger.info("fused_layers.swap: %s", record.summary())
    return record


def _compile_requests(
    record: SwapRecord, model: nn.Module
) -> list[tuple[str, torch.dtype, tuple[int, ...], torch.device]]:
    """(op, dtype, dims, device) of each fused module of ``record``, for the compile choice: the
    dtypes its calls will likely see (its parameters'; also bf16 for fp32 ones, which autocast casts)."""
    first = next(model.parameters(), None)
    requests = []
    for replacement in record._replacements:
        fused = replacement.fused
        if isinstance(replacement.route, causal_lm.HeadHandle):
            fused = getattr(replacement.original, causal_lm.HEAD)
        if isinstance(fused, FusedLayerNorm) and fused.weight is not None:
            op, dims, param = "layer_norm", (fused.weight.shape[0],), fused.weight
        elif isinstance(fused, FusedRMSNorm):
            op, dims, param = "rms_norm", (fused.weight.shape[0],), fused.weight
        elif isinstance(fused, FusedGELU) and first is not None:
            op, dims, param = "gelu", (), first
        elif isinstance(fused, FusedGatedMLP):
            op = "swiglu" if fused.activation == "silu" else "geglu"
            dims, param = (fused.gate_proj.out_features,), fused.gate_proj.weight
        elif isinstance(fused, FusedLMHead):
            op, dims, param = "linear_cross_entropy", (fused.in_features, fused.out_features), fused.weight
        else:
            continue
        dtypes = [param.dtype] + ([torch.bfloat16] if param.dtype == torch.float32 else [])
        requests += [(op, dtype, dims, param.device) for dtype in dtypes]
    return requests


_UNMEASURED = "Inductor ("  # what under_compile says of a choice not measured: "Inductor (why)"
_NOT_MEASURED = "Inductor (not measured)"


def _under_compile(record: SwapRecord, model: nn.Module, measure: bool) -> dict[str, str]:
    """What runs inside a compiled graph for each op, dtype and shape class of ``record``."""
    what: dict[str, str] = {}
    for op, dtype, dims, device in _compile_requests(record, model):
        key = f"{op} {str(dtype).removeprefix('torch.')} {compile_choice.shape_class(op, dims)}"
        if key in what:
            continue
        if measure:
            choice = compile_probe.measure_missing([(op, dtype, dims)], device).popitem()[1]
        else:
            choice = compile_choice.lookup(op, dtype, dims, device)
        if isinstance(choice, compile_choice.Choice):
            what[key] = choice.describe()
        else:
            what[key] = _NOT_MEASURED if choice is None else f"Inductor ({choice})"
    if any(op == "rope" for op in record.replaced_ops.values()):
        what["rope"] = "Inductor (a routed function runs Hugging Face's code under compile)"
    if any(op == "causal_mask" for op in record.replaced_ops.values()):
        what["causal_mask"] = "none where Hugging Face skips it eagerly: SDPA's causal kernel"
    return what


def unswap(model: nn.Module, record: SwapRecord | None = None) -> None:
    """Put back the original modules of ``record`` (default: of every ``swap`` on ``model``, newest first),
    and the original functions where no other swapped model still routes them.

    A slot whose module was changed after the swap is left as it is, with a warning; so is a
    function that something else rebound after the swap.
    """
    records: list[SwapRecord] = model.__dict__.get(_RECORDS_ATTR, [])
    chosen = list(reversed(records)) if record is None else [r for r in records if r is record]
    for current in chosen:
        for replacement in reversed(current._replacements):
            if replacement.route is not None:
                replacement.route.remove()
                continue
            slot = replacement.parent._modules.get(replacement.name)
            if slot is replacement.fused:
                setattr(replacement.parent, replacement.name, replacement.original)
            else:
                warnings.warn(
                    f"fused_layers.unswap: {replacement.path} was changed after the swap; left as it is",
                    RuntimeWarning,
                    stacklevel=2,
                )
        records.remove(current)
