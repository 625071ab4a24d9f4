"""Inside a torch.compile graph, is each fused op's custom op or Inductor's code faster, at the
dtypes and shapes of the benchmark models? And what code does Inductor generate for each?

    python -m benchmarks.compile_choice --out DIR [--cases gpt2-124m,llama-1b,llama-1b-32k]

Needs a CUDA device. For each (op, dtype, dims) that ``fused_layers.swap(model, for_compile=True)``
asks for on the models of ``benchmarks.ab_models`` (their parameters' dtype and, for GPT-2's fp32
parameters, bf16 too), ``fused_layers.compile_probe.measure`` times the op's probe compiled both
ways and records the choice in the cache that swap reads (``FUSED_LAYERS_CACHE_DIR``). Before
that, the Inductor version is compiled once with its generated code captured
(``torch._inductor.utils.run_and_get_code``) and saved as ``DIR/inductor/<op>_<dtype>_<class>.txt``
(generated code kept as data, not as source), beside our kernels' sources, for a kernel writer to
start from. Writes ``DIR/compile_choice.json``
and ``DIR/compile_choice.md``; prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import asdict
from pathlib import Path

import torch

from fused_layers import compile_choice, compile_probe

BF16, FP32 = torch.bfloat16, torch.float32

#: What swap(for_compile=True) asks for on each model of benchmarks.ab_models: (op, dtype, dims).
CASES = {
    "gpt2-124m": [
        ("layer_norm", FP32, (768,)),
        ("layer_norm", BF16, (768,)),
        ("gelu", FP32, ()),
        ("gelu", BF16, ()),
        ("linear_cross_entropy", FP32, (768, 50257)),
        ("linear_cross_entropy", BF16, (768, 50257)),
    ],
    "llama-1b": [
        ("rms_norm", BF16, (2048,)),
        ("swiglu", BF16, (8192,)),
        ("linear_cross_entropy", BF16, (2048, 128256)),
    ],
    "llama-1b-32k": [("linear_cross_entropy", BF16, (2048, 32000))],
}


def inductor_code(op: str, dtype: torch.dtype, dims: tuple[int, ...], device: torch.device) -> str:
    """The code Inductor generates for the op's probe through the plain torch version, forward and
    backward (every module it wrote, joined)."""
    from torch._inductor.utils import run_and_get_code

    torch._inductor.config.fx_graph_cache = False  # a cached graph would skip the code generation
    compiled = torch.compile(compile_probe._PROBES[op], fullgraph=True, dynamic=False)
    inputs = compile_probe._inputs(op, dtype, dims, device)

    def forward_backward() -> None:
        outputs = compiled(*inputs, compile_choice.INDUCTOR)
        torch.autograd.backward(outputs, [torch.ones_like(o) if o.dim() == 0 else o for o in outputs])

    _, sources = run_and_get_code(forward_backward)
    return "\n\n# ---- next module ----\n\n".join(sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.compile_choice needs a CUDA device")
    device = torch.device("cuda")
    (args.out / "inductor").mkdir(parents=True, exist_ok=True)
    rows = []
    for case in args.cases.split(","):
        for op, dtype, dims in CASES[case]:
            shape_class = compile_choice.shape_class(op, dims)
            name = f"{op}_{str(dtype).removeprefix('torch.')}_{shape_class}"
            try:
                code = inductor_code(op, dtype, dims, device)
                (args.out / "inductor" / f"{name}.txt").write_text(code, encoding="utf-8")
                choice = compile_probe.measure(op, dtype, dims, device)
            except Exception as error:  # one op's failure must not lose the others' numbers
                print(f"{case} {name}: FAILED {type(error).__name__}: {error}"[:400], flush=True)
                continue
            rows.append({"case": case, "dims": list(dims), **asdict(choice)})
            print(f"{case:13s} {name:42s} {choice.describe()}", flush=True)
    report = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "tokens": compile_probe.TOKENS,
        "repeats": compile_probe.REPEATS,
        "cache": str(compile_choice.cache_path()),
        "rows": rows,
    }
    (args.out / "compile_choice.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    lines = [
        f"# Custom op or Inductor's code inside a compiled graph ({report['device']}, {report['date']})",
        "",
        f"Forward+backward of each op's probe (`fused_layers.compile_probe`), {compile_probe.TOKENS} rows, "
        f"median of {compile_probe.REPEATS} after {compile_probe.WARMUP} warm-up; torch {report['torch']}. "
        "`python -m benchmarks.compile_choice`.",
        "",
        "| model | op | dtype | class | custom op | custom ms | Inductor ms | chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        chosen = "Inductor" if row["backend"] == compile_choice.INDUCTOR else row["backend"]
        lines.append(
            f"| {row['case']} | {row['op']} | {row['dtype'].removeprefix('torch.')} | {row['shape_class']} | "
            f"{row['custom_backend']} | {row['custom_ms']:.3f} | {row['inductor_ms']:.3f} | {chosen} |"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "compile_choice.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
