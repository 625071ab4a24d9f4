"""A loop with synchronizing calls planted on known lines, and a check that trainprof finds each.

    python examples/planted_syncs.py [--out results.json] [--log-dir log] [--steps 8]

Every planted line ends in a `# PLANT:<kind>` tag. The script finds its own tagged lines by reading
its source, trains under a session (on the GPU; without one the syncs do not exist and the check
says so), and reports for each planted line whether a finding points at exactly that file:line.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import trainprof

PLANT_RE = re.compile(r"^\s+[^#\s].*#\s*PLANT:(?P<kind>[\w-]+)\s*$")


def planted_lines() -> list[dict]:
    """The tagged lines of this file: [{"kind", "line", "code"}]."""
    planted = []
    for number, text in enumerate(Path(__file__).read_text().splitlines(), start=1):
        match = PLANT_RE.match(text)
        if match:
            planted.append({"kind": match["kind"], "line": number, "code": text.split("#")[0].strip()})
    return planted


def train(steps: int, log_dir: str, device: torch.device) -> trainprof.Session:
    on_gpu = device.type == "cuda"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10))
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    printed = io.StringIO()
    with trainprof.session(log_dir=log_dir, run_name="planted_syncs", wait=1, warmup=1, active=3,
                           console=False) as sess:
        for _ in range(steps):
            host_batch = torch.randn(64, 256)
            x = host_batch.to(device)  # PLANT:h2d-pageable
            labels = torch.randint(0, 10, (64,), device=device)
            logits = model(x)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = loss.item()  # PLANT:item
            predictions = logits.argmax(-1).tolist()  # PLANT:tolist
            first_row = logits[0].detach().cpu()  # PLANT:cpu
            print(logits[0, :4].detach(), file=printed)  # PLANT:print
            positives = logits.detach()[logits.detach() > 0]  # PLANT:mask-index
            nonzero = torch.nonzero(labels)  # PLANT:nonzero
            if on_gpu:
                torch.cuda.synchronize()  # PLANT:cuda-synchronize
                event = torch.cuda.Event()
                event.record()
                event.synchronize()  # PLANT:event-synchronize
                torch.cuda.current_stream().synchronize()  # PLANT:stream-synchronize
            del loss_value, predictions, first_row, positives, nonzero
    return sess


def check(sess: trainprof.Session, device: torch.device) -> dict:
    """For each planted line: is there a finding at exactly this file:line?"""
    this_file = str(Path(__file__).resolve())
    results = []
    for plant in planted_lines():
        hits = [
            f for f in sess.findings
            if f.where.line == plant["line"] and str(Path(f.where.file or "/").resolve()) == this_file
        ]
        results.append({**plant, "found": bool(hits), "findings": [h.title for h in hits]})
    return {"file": this_file, "device": str(device), "run_dir": str(sess.run_dir),
            "all_found": all(r["found"] for r in results), "planted": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--log-dir", default="log")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = check(train(args.steps, args.log_dir, device), device)
    for plant in result["planted"]:
        mark = "found " if plant["found"] else "MISSED"
        print(f"{mark} line {plant['line']:>3} {plant['kind']:<20} {plant['code']}")
    if device.type != "cuda":
        print("(no GPU: these calls do not synchronize on the CPU, so nothing is expected to be found)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if result["all_found"] or device.type != "cuda" else 1


if __name__ == "__main__":
    sys.exit(main())
