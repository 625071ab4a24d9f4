"""Is a variant's loss the reference's, up to rounding? The tolerance per precision, the noise
floor each run measures on a twin of its reference, and the per-step drift judged against both."""

from __future__ import annotations

import itertools
import logging

import torch

from trainprof.ab.steps import StepFactory, VariantRun, build, run_steps

logger = logging.getLogger(__name__)

#: Allowed relative difference of a variant's loss from the reference variant's, at every step, at
#: the least. fp32: the fused kernels reduce in another order (differences ~1e-7 per op); over tens
#: of Adam steps these compound but stay far below 1e-3. bf16 (parameters or autocast): 8
#: significand bits, a rounding step of 2^-8 = 0.4% per value; two correct implementations round
#: differently, so 2e-2 (about five bf16 rounding steps).
PARITY_RTOL = {"fp32": 1e-3, "bf16": 2e-2}

#: Training compounds rounding differences, and with bf16 *parameters* far beyond PARITY_RTOL: on an
#: H200 (2026-11-22/23, Llama 1B, 50 steps) Liger drifted 0.076 from the bare run and torch.compile
#: 0.070-0.076. So each run also measures its own noise floor: the reference variant again, with
#: every parameter moved by one rounding step of the precision (a relative 2^-8 in bf16, 2^-23 in
#: fp32, random signs) before every step. A variant is at parity when, at every step, its drift
#: from the reference stays within PARITY_RTOL or PARITY_NOISE_FACTOR times the largest drift of
#: that twin up to that step: a wrong kernel stands out in the first steps, before the twin moves.
#: An order of magnitude, because another rounding order at every step drifted 2-3x as fast as the
#: twin in a chaotic test (tests/test_ab.py, the logistic map), while a wrong op differs by far more
#: than rounding from its first step on.
PARITY_NOISE_FACTOR = 10.0
_ROUNDING_STEP = {"fp32": 2.0**-23, "bf16": 2.0**-8}


def rel_diffs(losses: list[float], reference: list[float]) -> list[float]:
    """Per step, ``|loss - reference loss| / |reference loss|``."""
    return [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True)]


def allowed_drift(twin_drift: list[float] | None, steps: int, precision: str) -> list[float]:
    """Per step, the largest relative loss difference at parity (PARITY_NOISE_FACTOR's comment)."""
    floor = PARITY_RTOL[precision]
    if twin_drift is None:
        return [floor] * steps
    envelope = itertools.accumulate(twin_drift, max)
    return [max(floor, PARITY_NOISE_FACTOR * d) for d in envelope]


def measure_twin_drift(
    factory: StepFactory, reference: VariantRun, losses: list[float], precision: str
) -> list[float] | None:
    """Per step, how far the reference drifts from itself when its weights move by one rounding step
    before every step (as a different implementation rounds differently at every step).

    None when the factory gives no model to perturb, or the twin fails (the fixed tolerance holds).
    """
    try:
        step, model = build(factory, reference.variant)
        if model is None:
            return None
        generators: dict[torch.device, torch.Generator] = {}  # drawn where the weights are: a 1B
        # model's signs drawn on the host and copied over cost seconds per step

        def nudged_step(i: int) -> torch.Tensor:
            with torch.no_grad():
                for param in model.parameters():
                    if param.device not in generators:
                        generators[param.device] = torch.Generator(param.device).manual_seed(0)
                    signs = torch.randint(
                        0, 2, param.shape, generator=generators[param.device], device=param.device,
                        dtype=torch.int8,
                    )
                    param.copy_(param.float() * (1 + (signs * 2 - 1) * _ROUNDING_STEP[precision]))
            return step(i)

        twin = VariantRun(reference.variant, nudged_step, model)
        run_steps(twin, len(losses))
        return rel_diffs(torch.stack(twin.losses).cpu().tolist(), losses)
    except Exception as error:  # the fixed tolerance still judges parity; say why there is no floor
        logger.warning("trainprof.ab: no parity noise floor: %r", error)
        return None
