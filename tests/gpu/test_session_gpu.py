"""On a GPU: every planted sync in examples/planted_syncs.py is reported at its exact line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "planted_syncs.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("planted_syncs", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_planted_sync_is_reported_at_its_line(tmp_path):
    example = _load_example()
    device = torch.device("cuda")
    sess = example.train(steps=8, log_dir=str(tmp_path), device=device)
    result = example.check(sess, device)
    assert len(result["planted"]) == 10
    missed = [f"{p['kind']} (line {p['line']})" for p in result["planted"] if not p["found"]]
    assert not missed, f"not reported at their line: {missed}; findings: {sess.findings}"
    assert torch.cuda.get_sync_debug_mode() == 0  # restored after the recorded steps
