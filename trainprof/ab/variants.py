"""Which variant: a name such as ``"fused+compile"`` parsed into the parts it applies
(``fused_layers.swap``, Liger-Kernel's patch as users run it or matched to swap's ops,
``torch.compile``), and applying them to a model."""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field

import torch

#: ``liger``: Liger-Kernel as users run it, its family patch with its defaults (RoPE, RMSNorm,
#: SwiGLU/GeGLU and fused linear cross-entropy on Llama-like models; nothing on GPT-2, which it has
#: no patch for). ``liger-matched``: Liger's kernel for each op ``fused_layers.swap`` replaces and
#: only those (the family patch with the loss fused where it has one, and LigerLayerNorm for the
#: LayerNorms).
PARTS = ("fused", "liger", "liger-matched", "compile")
DEFAULT_VARIANTS = ("bare", "fused", "compile", "fused+compile")
_KERNEL_PARTS = ("fused", "liger", "liger-matched")  # one at most per variant
ON_CPU_NOTE = ("on the CPU the swapped modules run fused_layers' plain torch versions (its Triton and CUDA "
               "kernels need a CUDA device): this variant times torch code, not fused kernels")
"""A fused variant's note when the model is not on a CUDA device (instead of fused_layers' warning)."""


@dataclass
class Variant:
    """One variant: which of fused_layers.swap, Liger's patch and torch.compile it applies."""

    name: str
    fused: bool = False
    liger: bool = False
    compile: bool = False
    liger_matched: bool = False
    """With ``liger``: Liger on swap's ops only (``liger-matched``), not its defaults."""
    notes: list[str] = field(default_factory=list)
    """What ``apply`` did (e.g. the swap record's summary), for the report."""

    @classmethod
    def parse(cls, name: str) -> Variant:
        """``"bare"`` or parts of ``PARTS`` joined by ``+``: ``"fused+compile"``."""
        name = name.strip()
        parts = [] if name == "bare" else name.split("+")
        unknown = [p for p in parts if p not in PARTS]
        kernels = [p for p in parts if p in _KERNEL_PARTS]
        if not name or unknown or len(set(parts)) != len(parts) or len(kernels) > 1:
            raise ValueError(
                f"variant {name!r}: expected 'bare' or some of {PARTS} joined by '+' "
                "(fused, liger and liger-matched exclusive)"
            )
        matched = "liger-matched" in parts
        return cls(name, "fused" in parts, "liger" in parts or matched, "compile" in parts, matched)

    @property
    def slug(self) -> str:
        """The name as a file name: no '+' or '.' (trace worker names end at the first dot)."""
        return self.name.replace("+", "-")

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Apply this variant to ``model`` (in place for swap/Liger); returns the model to call."""
        if self.fused:
            import fused_layers

            # Under compile, each op runs the faster of its custom op and Inductor's code there,
            # measured now where the cache lacks it; the summary says which.
            record = fused_layers.swap(model, for_compile=self.compile)
            self.notes.append(f"fused_layers.swap: {record.summary(under_compile=self.compile)}")
            if not any(p.is_cuda for p in model.parameters()):
                self.notes.append(ON_CPU_NOTE)
        if self.liger:
            self.notes.append(f"liger: {apply_liger(model, matched=self.liger_matched)}")
        if self.compile:
            model = torch.compile(model)
            self.notes.append("torch.compile(model) (default mode); the optimizer step runs eager")
        return model


def liger_available() -> bool:
    """Whether liger-kernel can be imported here."""
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception:
        return False
    return True


def apply_liger(model: torch.nn.Module, matched: bool = False) -> str:
    """Liger-Kernel's patch on this instance only: as users run it, or matched to swap's ops.

    Both go through ``_apply_liger_kernel_to_instance`` (the model families Liger knows; its
    fused linear cross-entropy becomes the instance's forward, which returns ``logits=None`` in
    training with labels). Default (``matched=False``): Liger's defaults, what
    ``apply_liger_kernel_to_<family>(model=model)`` does. ``matched``: RoPE, RMSNorm, SwiGLU/GeGLU
    MLPs and the fused linear cross-entropy (cross-entropy alone off), then any
    ``torch.nn.LayerNorm`` left becomes ``LigerLayerNorm`` sharing its Parameters (GPT-2: Liger
    has LayerNorm only, no plain GELU and no GPT-2 loss). Liger's family patch also rebinds classes
    and functions in the ``transformers`` modeling module; they are restored, so later models are
    built unpatched and other models keep Hugging Face's functions. Its RoPE (a rebound
    ``apply_rotary_pos_emb``) is then routed to this model's modules whose forward calls it, the
    way swap routes the fused one (``fused_layers.routing``; eager only: under torch.compile
    Hugging Face's function runs).
    """
    from liger_kernel.transformers import LigerLayerNorm
    from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

    modeling = sys.modules.get(type(model).__module__)
    saved = dict(vars(modeling)) if modeling is not None else {}
    before = {name: type(m).__name__ + m._get_name() for name, m in model.named_modules()}
    rebound_functions = {}
    matched_ops = dict(
        rope=True,
        cross_entropy=False,
        fused_linear_cross_entropy=True,
        rms_norm=True,
        swiglu=True,
        geglu=True,
        layer_norm=True,
    )
    try:
        _apply_liger_kernel_to_instance(model=model, **(matched_ops if matched else {}))
    finally:
        for key, value in saved.items():
            if vars(modeling).get(key) is not value:
                if callable(value) and not isinstance(value, type):
                    rebound_functions[key] = vars(modeling).get(key)
                setattr(modeling, key, value)
    routed = _route_functions(model, modeling, rebound_functions) if modeling is not None else 0
    patched = sum(
        1 for name, m in model.named_modules() if before.get(name) != type(m).__name__ + m._get_name()
    )
    layer_norms = 0
    for path, module in list(model.named_modules()) if matched else ():
        if (
            type(module) is torch.nn.LayerNorm
            and len(module.normalized_shape) == 1
            and module.weight is not None
        ):
            liger = LigerLayerNorm(module.normalized_shape[0], eps=module.eps, bias=module.bias is not None)
            liger.weight = module.weight
            # Liger's kernel always adds a bias: a LayerNorm without one gets a frozen zero bias.
            liger.bias = (
                module.bias
                if module.bias is not None
                else torch.nn.Parameter(torch.zeros_like(module.weight), requires_grad=False)
            )
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent), name, liger)
            layer_norms += 1
    family_loss = "forward" in vars(model)  # the fused linear cross-entropy: an instance forward
    return (
        f"{'matched to swap' if matched else 'defaults'}: patched {patched} modules by family, "
        f"LayerNorm -> LigerLayerNorm x{layer_norms}, "
        f"{', '.join(sorted(rebound_functions)) or 'no function'} routed to Liger's in {routed} modules, "
        f"{'fused linear cross-entropy forward' if family_loss else 'loss unchanged'}"
    )


def _route_functions(model: torch.nn.Module, modeling, functions: dict) -> int:
    """Route each rebound global of ``modeling`` to its replacement in the modules of ``model``
    whose class's forward (defined in ``modeling``) calls it by name; returns how many modules.

    A forward under decorators (transformers 5.24 wraps ``LlamaAttention.forward`` in
    ``deprecate_kwarg``) is read through its ``__wrapped__`` chain: the wrapper's own code names none
    of the body's globals.
    """
    from fused_layers import routing

    routed = set()
    for module in model.modules():
        forward = inspect.unwrap(type(module).forward)
        if getattr(forward, "__module__", None) != modeling.__name__:
            continue
        for name, replacement in functions.items():
            if callable(replacement) and name in forward.__code__.co_names:
                routing.route_function(module, modeling, name, replacement)
                routed.add(id(module))
    return len(routed)
