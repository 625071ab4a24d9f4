"""A/B runs: one training step in several variants (bare, fused, liger, compile, fused+compile),
timed side by side, with loss parity, MFU, peak memory, a profiled step each and their diff.

    import trainprof

    def factory(variant):                         # called once per variant
        torch.manual_seed(0)
        model = variant.apply(build_model())      # fused_layers.swap / Liger / torch.compile as named
        optimizer = torch.optim.AdamW(model.parameters())
        def step(i):                              # the i-th step: same data for every variant
            loss = model(batches[i % 4]).loss
            loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
            return loss
        return step                               # or (step, model): enables the fused prediction
    result = trainprof.ab.run(factory, variants=("bare", "fused"), steps=30)
    result.to_dict()

``trainprof.ab.run_model("gpt2-124m", ...)`` does the same over a Hugging Face model built from
a config (``trainprof ab --model``).

How it measures (every choice is stated in the result's ``method``):
- Variants run interleaved in blocks of ``block`` steps, the order rotated every round, after
  ``warmup`` untimed steps each (torch.compile compiles there). A block is timed between two
  CUDA events with no sync inside (host ``perf_counter`` on a CPU, and ``clock`` says so).
- ms/step: the median of the blocks' ms/step; its 95% CI is distribution-free (order statistics of
  the blocks, binomial coverage); with too few blocks for 95% the CI is [min, max] with its coverage
  (two blocks: 50%). A variant whose CI overlaps the reference's is reported as `cannot tell apart`
  (``VariantResult.vs_reference``).
- Loss parity: every variant's loss at every step against the first variant's (same seed, same
  data); the allowed relative difference is the precision's ``PARITY_RTOL`` or, where training
  compounds rounding further, ten times the drift of the reference run again with its weights moved
  by one rounding step before every step (``PARITY_NOISE_FACTOR``).
- MFU: the step's FLOPs (``model_flops_per_step``) over the median step time, over the datasheet's
  dense matmul peak of the step's dtype (``trainprof.analysis.peaks.KNOWN_DEVICES``, the table
  ``trainprof analyze`` reads); ``mfu_achievable`` over the peak ``trainprof.bench.measure_matmul_peak``
  measured in the same process (the only one for a device the table lacks).
- Peak memory (CUDA): the variant's resident tensors (parameters, gradients, optimizer state) plus
  the largest rise of allocated memory during its blocks.
- One step per variant is profiled; ``trainprof.analysis.diff`` compares each with the first.

Modules, one question each: ``variants`` (which variant, and Liger's patch), ``steps`` (how a
variant's step runs), ``runner`` (how fast is each), ``parity`` (is its loss the reference's),
``prediction`` (what would fusing gain), ``presets`` (which model), ``results`` (what was measured).
Importing this package imports no torch: each name below loads its module when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ABResult": "results",
    "DEFAULT_VARIANTS": "variants",
    "FUSED_BYTES_FACTOR": "prediction",
    "KEPT_RANGE": "prediction",
    "ModelNotFound": "presets",
    "PARITY_NOISE_FACTOR": "parity",
    "PARITY_RTOL": "parity",
    "PARTS": "variants",
    "PREDICTION_DIR": "prediction",
    "PRESETS": "presets",
    "REPLACED_RANGE": "prediction",
    "StepFactory": "steps",
    "StepFn": "steps",
    "Variant": "variants",
    "VariantResult": "results",
    "apply_liger": "variants",
    "clock_name": "runner",
    "hf_factory": "presets",
    "liger_available": "variants",
    "load_config": "presets",
    "median_ci": "runner",
    "model_flops_per_step": "presets",
    "run": "runner",
    "run_model": "presets",
}

__all__ = [
    "ABResult",
    "DEFAULT_VARIANTS",
    "FUSED_BYTES_FACTOR",
    "KEPT_RANGE",
    "ModelNotFound",
    "PARITY_NOISE_FACTOR",
    "PARITY_RTOL",
    "PARTS",
    "PREDICTION_DIR",
    "PRESETS",
    "REPLACED_RANGE",
    "StepFactory",
    "StepFn",
    "Variant",
    "VariantResult",
    "apply_liger",
    "clock_name",
    "hf_factory",
    "liger_available",
    "load_config",
    "median_ci",
    "model_flops_per_step",
    "run",
    "run_model",
]

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.ab.parity import PARITY_NOISE_FACTOR, PARITY_RTOL
    from trainprof.ab.prediction import FUSED_BYTES_FACTOR, KEPT_RANGE, PREDICTION_DIR, REPLACED_RANGE
    from trainprof.ab.presets import (
        PRESETS,
        ModelNotFound,
        hf_factory,
        load_config,
        model_flops_per_step,
        run_model,
    )
    from trainprof.ab.results import ABResult, VariantResult
    from trainprof.ab.runner import clock_name, median_ci, run
    from trainprof.ab.steps import StepFactory, StepFn
    from trainprof.ab.variants import DEFAULT_VARIANTS, PARTS, Variant, apply_liger, liger_available


def __getattr__(name: str) -> Any:
    submodule = _EXPORTS.get(name)
    if submodule is None:
        raise AttributeError(f"module 'trainprof.ab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trainprof.ab.{submodule}"), name)
    globals()[name] = value
    return value
