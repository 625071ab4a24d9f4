"""The README's Python blocks run as written, on a CPU, so that they stay true.

A block runs when the line before it is a marker, `<!-- readme-test: cpu -->`, or
`<!-- readme-test: cpu, needs: NAME -->` where NAME is a prelude below: the reader's own model,
data or tensors that the README leaves to them. Each runs in a fresh interpreter in a temporary
folder; it must exit 0 with no traceback. Also: the README names every verdict and finding kind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MARKER = re.compile(r"<!-- readme-test: cpu(?:, needs: (\w+))? -->\n```python\n(.*?)```", re.S)

_TINY_GPT2 = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                   bos_token_id=0, eos_token_id=0))
ids = torch.randint(0, 128, (48, 16))
dataset = [{"input_ids": row, "labels": row.clone()} for row in ids]
batch = {"input_ids": ids[:4], "labels": ids[:4]}
"""

PRELUDES = {
    "hf_model": _TINY_GPT2,
    "hf_loop": _TINY_GPT2 + """
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loader = torch.utils.data.DataLoader(dataset, batch_size=4)
""",
    "lightning_model": _TINY_GPT2 + """
import pytorch_lightning


class LitGPT2(pytorch_lightning.LightningModule):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def training_step(self, batch, batch_idx):
        return self.inner(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


model = LitGPT2(model)
loader = torch.utils.data.DataLoader(dataset, batch_size=4)
""",
    "tensors": """
import torch

x = torch.randn(4, 64, 256)
weight, bias = torch.randn(256), torch.randn(256)
gate, up = torch.randn(4, 64, 256), torch.randn(4, 64, 256)
q, k = torch.randn(2, 4, 16, 32), torch.randn(2, 4, 16, 32)
cos, sin = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
hidden, lm_head = torch.randn(2, 16, 64), torch.nn.Linear(64, 1000, bias=False)
labels = torch.randint(0, 1000, (2, 16))
""",
}

BLOCKS = [(needs, code) for needs, code in MARKER.findall(README)]


def test_the_readme_marks_its_runnable_blocks():
    assert len(BLOCKS) >= 6
    assert all(needs in PRELUDES for needs, _ in BLOCKS if needs)


BLOCK_IDS = [f"{index}-{needs or 'plain'}" for index, (needs, _) in enumerate(BLOCKS)]


@pytest.mark.parametrize(("needs", "code"), BLOCKS, ids=BLOCK_IDS)
def test_readme_block_runs_on_a_cpu(tmp_path, needs, code):
    source = textwrap.dedent(PRELUDES.get(needs, "")) + "\n" + code
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]


def test_the_readme_names_every_verdict_and_finding_kind():
    """Every kind of the registry (`trainprof.analysis.kinds`, which `Finding` holds its kind to) and
    every verdict the type allows."""
    from trainprof.analysis.kinds import KINDS, VerdictLabel

    assert len(KINDS) == 33
    missing = sorted(kind for kind in KINDS if f"`{kind}`" not in README)
    assert not missing
    verdicts = set(typing.get_args(VerdictLabel)) | {"straggler: rank R"}
    assert not sorted(v for v in verdicts if f"| `{v}` |" not in README)
