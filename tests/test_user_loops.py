"""The loop as users write it (issue #33): an optimizer built mid-run, several optimizers in one
iteration, names with quotes, `repeat=0` re-analysed, a forked child, a trace without host launches.
Each case failed before its fix."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import trainprof

session_module = importlib.import_module("trainprof.session")
ROOT = Path(__file__).resolve().parents[1]
FAST = {"console": False, "tensorboard_scalars": False}
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _iteration(model, *optimizers) -> None:
    model(torch.randn(16, 32)).pow(2).mean().backward()
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))


# -- optimizers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("old_one", ["dropped", "kept"])
def test_an_optimizer_built_mid_run_counts_its_steps(tmp_path, old_one):
    """Stage-wise fine-tuning (a new optimizer per stage) was counted for 1 step of 10: only the
    first optimizer ever seen ended steps, and the report said "not-profiled"."""
    model = _model()
    kept = []
    with trainprof.session(log_dir=tmp_path, run_name="run", **FAST) as sess:
        for stage in range(2):
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3 * (stage + 1))
            if old_one == "kept":
                kept.append(optimizer)  # (a scheduler or a checkpoint callback holding on to it)
            for _ in range(5):
                _iteration(model, optimizer)
            del optimizer
            gc.collect()
    # A replaced optimizer that is gone ends no more steps: its successor's first step ends one. One
    # still alive may yet step again: the successor's first step joins the last one's iteration.
    assert sess.steps_ended == (10 if old_one == "dropped" else 9)
    assert sess.summary.verdict == "cpu-only" and len(sess.analysis.steps) == 3


def test_several_optimizers_in_one_iteration_count_it_once(tmp_path):
    """A GAN's generator and discriminator step in every iteration: one step each iteration."""
    model = _model()
    generator = torch.optim.SGD(model[0].parameters(), lr=1e-3)
    discriminator = torch.optim.SGD(model[2].parameters(), lr=1e-3)
    with trainprof.session(log_dir=tmp_path, run_name="run", **FAST) as sess:
        for _ in range(8):
            _iteration(model, generator, discriminator)
    assert sess.steps_ended == 8 and len(sess.analysis.steps) == 3
