"""Every Python and shell block of README.md and docs/*.md is checked, so that they stay true.

Each block carries a marker on the line before it:
- `<!-- docs-test: cpu -->`: run as written, on a CPU, in a fresh interpreter (Python) or bash (shell)
  in a temporary folder that holds `tests/fixtures` (a link to this checkout's), as a clone would;
  it must exit 0 with no traceback. `<!-- docs-test: cpu, needs: NAME -->` runs PRELUDES[NAME]
  first: the reader's own model, data or tensors that the docs leave to them. In shell blocks
  `trainprof` is this checkout's (`python -m trainprof`).
- `<!-- docs-test: gpu -->` (needs a GPU) or `<!-- docs-test: syntax -->` (needs what a test cannot
  have: several machines, your own script or run folder): only parsed (`compile`, `bash -n`).
A block without a marker fails. Also: the docs name every verdict, finding kind and threshold.
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
DOC_PATHS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS = {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8") for path in DOC_PATHS}
README = DOCS["README.md"]
ALL_TEXT = "\n".join(DOCS.values())
BLOCK = re.compile(r"(?:<!-- docs-test: (\w+)(?:, needs: (\w+))? -->\n)?```(python|sh)\n(.*?)```", re.S)
MARKS = ("cpu", "gpu", "syntax")

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

# The shell blocks' `trainprof`: this checkout's, whatever is installed.
SHELL_PRELUDE = f'set -e\ntrainprof() {{ "{sys.executable}" -m trainprof "$@"; }}\n'


def _blocks() -> list[tuple[str, str | None, str | None, str, str]]:
    """(where, mark, needs, language, code) of every Python and shell block."""
    found = []
    for name, text in DOCS.items():
        for match in BLOCK.finditer(text):
            mark, needs, language, code = match.groups()
            line = text.count("\n", 0, match.start(3)) + 1
            found.append((f"{name}:{line}", mark, needs, language, code))
    return found


BLOCKS = _blocks()
# A block written twice (the README's and its docs page's) runs once, under its first place.
RUN: list = []
for _block in BLOCKS:
    if _block[1] == "cpu" and _block[2:] not in [run[2:] for run in RUN]:
        RUN.append(_block)
PARSE = [block for block in BLOCKS if block[1] in ("gpu", "syntax")]


def test_every_block_is_marked():
    unmarked = [where for where, mark, *_ in BLOCKS if mark not in MARKS]
    assert not unmarked, f"blocks without a docs-test marker: {unmarked}"
    assert all(needs in PRELUDES for _, _, needs, _, _ in BLOCKS if needs)
    assert len(RUN) >= 10 and {language for *_, language, _ in RUN} == {"python", "sh"}


def _scratch(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    return tmp_path


@pytest.mark.parametrize(("where", "mark", "needs", "language", "code"), RUN, ids=[b[0] for b in RUN])
def test_block_runs_on_a_cpu(tmp_path, where, mark, needs, language, code):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    if language == "python":
        argv = [sys.executable, "-c", textwrap.dedent(PRELUDES.get(needs, "")) + "\n" + code]
    else:
        argv = ["bash", "-c", SHELL_PRELUDE + code]
    result = subprocess.run(argv, cwd=_scratch(tmp_path), capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize(("where", "mark", "needs", "language", "code"), PARSE, ids=[b[0] for b in PARSE])
def test_block_parses(where, mark, needs, language, code):
    if language == "python":
        compile(code, where, "exec")
    else:
        result = subprocess.run(["bash", "-n", "-c", code], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_the_readme_is_a_front_door():
    """Under 250 lines, installed from a clone, with links into docs/ that resolve."""
    assert len(README.splitlines()) < 250
    assert "pip install trainprof" not in ALL_TEXT  # no package index has it
    for name, text in DOCS.items():
        base = ROOT if name == "README.md" else ROOT / "docs"
        for target in re.findall(r"\]\(((?!https?:|#)[^)#\s]+)", text):
            if target.startswith("img/") or target.startswith("docs/img/"):
                continue  # screenshots, written by tests/test_browser.py
            assert (base / target).exists(), target


def test_the_docs_name_every_verdict_and_finding_kind():
    """Every kind of the registry (`trainprof.analysis.kinds`, which `Finding` holds its kind to) in
    the docs, and every verdict the type allows in the README's verdict table."""
    from trainprof.analysis.kinds import KINDS, VerdictLabel

    assert len(KINDS) == 33
    missing = sorted(kind for kind in KINDS if f"`{kind}`" not in ALL_TEXT)
    assert not missing
    verdicts = set(typing.get_args(VerdictLabel)) | {"straggler: rank R"}
    assert not sorted(v for v in verdicts if f"| `{v}` |" not in README)


def test_the_thresholds_doc_lists_every_threshold_with_its_default():
    from trainprof.analysis.thresholds import THRESHOLDS

    rows = dict(re.findall(r"^\| `(\w+)` \| ([-\d.e]+) \|", DOCS["docs/thresholds.md"], re.M))
    assert {name: float(value) for name, value in rows.items()} == {t.name: t.value for t in THRESHOLDS}
