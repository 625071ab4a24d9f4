"""How a variant's step runs: the step factory's contract, and a variant's run (its step function,
model, next step index and the losses and timing marks it has gathered) stepped forward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trainprof.ab.variants import Variant

StepFn = Callable[[int], torch.Tensor]
StepFactory = Callable[[Variant], "StepFn | tuple[StepFn, torch.nn.Module]"]


@dataclass
class VariantRun:
    """One variant's step, model and what its steps have gathered so far."""

    variant: Variant
    step: StepFn
    model: torch.nn.Module | None
    next_index: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)
    marks: list[tuple[int, int, int]] = field(default_factory=list)  # (first mark, second mark, steps)
    peak_rise_bytes: int = 0


def build(factory: StepFactory, variant: Variant) -> tuple[StepFn, torch.nn.Module | None]:
    """The variant's step function, and its model when the factory returns `(step, model)`."""
    built = factory(variant)
    return built if isinstance(built, tuple) else (built, None)


def run_steps(run: VariantRun, count: int) -> None:
    """Run the next ``count`` steps of ``run``, keeping each loss on its device (no sync)."""
    for _ in range(count):
        loss = run.step(run.next_index)
        run.losses.append(loss.detach().float().reshape(()))
        run.next_index += 1
