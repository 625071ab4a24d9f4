"""Issue 36's device evidence: out-of-memory errors explained, the memory headroom checked by running
the batch it predicts, and fragmentation with and without expandable segments.

    bash benchmarks/memory_on_gpu.sh                        # all parts, results in $OUT
    python -m benchmarks.memory_checks --part NAME --out FILE [--smoke]

Each part runs in its own process (an out-of-memory error or a fragmented cache must not colour the
next part; `PYTORCH_CUDA_ALLOC_CONF` must be set before CUDA starts) and writes one JSON file, again
after every stage, so a part stopped by its time limit still leaves what it had:

- `oom_issue`: the issue's run. A Llama (8 x 2048, bf16, a 128,256-token vocabulary, SDPA) trains
  under `trainprof.session()` at B2 x T2048 (window: steps 2-4); at step 6 a B64 x T4096 batch
  arrives and the loop runs out of memory.
- `oom_long_sequence`: activations of a long sequence. A Llama (4 x 2048, vocabulary 32,000, eager
  attention) at B1 x T2048 (window: steps 2-3); at step 5 a T32768 sequence: its [T, T] scores.
- `fragmentation`: a loop whose batch grows 3% a step (elementwise layers on fp32 activations of
  [B, 8192]: each step's blocks are too large for the cached ones); run once as the environment
  says (the shell runs it with and without `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`).
- `headroom`: a Llama (8 x 2048, vocabulary 32,000, SDPA, bf16, AdamW) profiled at B4 x T2048; the
  report's largest batch is checked against the largest that runs (a training step per probe,
  bracketed, then bisected).

Every JSON has `part`, `ok` (the part ran to its end), `checks` (name -> true/false: what the issue
asks of it), `elapsed_s`, `versions`, `errors` (stage -> the exception that stopped it), and the
part's figures (README of the fields: the docstring of each part's function). `--smoke` runs the
plumbing on a CPU with tiny models and an out-of-memory error raised by a forward hook once a batch
passes a token budget (no figure of it means anything).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

GIB = 2**30


class Result:
    """A part's JSON, written again after each change (`set`): a part killed by its time limit
    keeps every stage it finished."""

    def __init__(self, path: Path, part: str) -> None:
        self.path = path
        self.started = time.perf_counter()
        self.data: dict[str, Any] = {"part": part, "ok": False, "checks": {}, "errors": {},
                                     "versions": _versions()}
        self.write()

    def set(self, **fields: Any) -> None:
        self.data.update(fields)
        self.write()

    def check(self, name: str, passed: Any) -> None:
        self.data["checks"][name] = bool(passed)
        self.write()

    def error(self, stage: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.data["errors"][stage] = text[-2000:]
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.started, 2)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0],
                           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    try:
        import torch

        out["torch"] = torch.__version__
        out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        if torch.cuda.is_available():
            out["device_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
        import transformers

        out["transformers"] = transformers.__version__
    except Exception as exc:  # noqa: BLE001 - a version is a nicety
        out["versions_error"] = repr(exc)
    return out


# -- shared ----------------------------------------------------------------------------------------


def _device(smoke: bool) -> Any:
    import torch

    return torch.device("cpu" if smoke else "cuda")


def _llama(layers: int, vocab: int, attention: str, smoke: bool, max_positions: int = 8192) -> Any:
    """A Llama of `layers` x 2048 (tiny in smoke mode), built on the device in bf16."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if smoke:
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                             num_key_value_heads=2, num_hidden_layers=2, vocab_size=256,
                             max_position_embeddings=max_positions)
    else:
        config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=16,
                             num_key_value_heads=8, num_hidden_layers=layers, vocab_size=vocab,
                             max_position_embeddings=max_positions, tie_word_embeddings=False)
    with torch.device(_device(smoke)):
        model = LlamaForCausalLM._from_config(config, attn_implementation=attention)
    return model.to(torch.bfloat16 if not smoke else torch.float32)


def _smoke_budget(model: Any, tokens: int) -> None:
    """Smoke mode: a forward with more than `tokens` tokens raises the allocator's error."""
    import torch

    def check(module: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.numel() > tokens:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {ids.numel() * 8 / GIB:.2f} GiB. GPU 0 has a "
                "total capacity of 1.00 GiB of which 0 bytes is free. Of the allocated memory 0.90 GiB "
                "is allocated by PyTorch, and 0.05 GiB is reserved by PyTorch but unallocated.")

    model.register_forward_pre_hook(check, with_kwargs=True)


def _train_step(model: Any, optimizer: Any, ids: Any) -> None:
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _summary_figures(run_dir: Path) -> dict[str, Any]:
    """What trainprof wrote into the run folder: file names, whether each report is whole, and the
    summary's findings (kind, severity, title) with the first finding's details."""
    names = sorted(p.name for p in run_dir.iterdir())
    summary_file = next((run_dir / n for n in names if n.startswith("summary") and n.endswith(".json")), None)
    out: dict[str, Any] = {"run_dir": str(run_dir), "files": names}
    html = next((run_dir / n for n in names if n.startswith("report") and n.endswith(".html")), None)
    md = next((run_dir / n for n in names if n.startswith("report") and n.endswith(".md")), None)
    out["report_html_whole"] = bool(html and html.read_text().rstrip().endswith("</html>"))
    out["report_md_bytes"] = md.stat().st_size if md else 0
    if summary_file is None:
        return out
    summary = json.loads(summary_file.read_text())
    out["summary_json_parses"] = True
    out["verdict"] = summary["trace"]["summary"].get("verdict")
    out["findings"] = [{"kind": f["kind"], "severity": f["severity"], "title": f["title"]}
                       for f in summary["findings"]]
    out["first_finding"] = summary["findings"][0] if summary["findings"] else None
    traces = summary["trace"]["traces"]
    if traces:
        trace = traces[-1]
        out["memory"] = {key: (trace.get("memory") or {}).get(key) for key in
                         ("peak_bytes", "peak_step", "by_category", "by_family", "reserved_peak_bytes",
                          "activations_by_module")}
        out["headroom"] = trace.get("headroom")
        out["fragmentation"] = trace.get("fragmentation")
    out["unprofiled_step_ms"] = summary["trace"]["summary"].get("unprofiled_step_ms")
    return out


def _oom_run(result: Result, log_dir: Path, name: str, model: Any, optimizer: Any,
             shapes: list[tuple[int, int]], vocab: int, smoke: bool, **schedule: Any) -> None:
    """A session over `shapes[i]` = (batch, seq_len) of step i, until the loop runs out of memory;
    records whether the error left unchanged and what trainprof wrote."""
    import torch

    import trainprof
    from trainprof.analysis import analyze

    device = _device(smoke)
    inside: dict[str, Any] = {}
    caught = None
    started = time.perf_counter()
    try:
        with trainprof.session(log_dir, name, console=False, **schedule) as sess:
            inside["session"] = sess
            for step, (batch, seq_len) in enumerate(shapes):
                ids = torch.randint(0, vocab, (batch, seq_len), device=device)
                try:
                    _train_step(model, optimizer, ids)
                except torch.OutOfMemoryError as error:
                    inside["error"], inside["tb"] = error, traceback.extract_tb(error.__traceback__)
                    inside["step"] = step
                    raise
    except torch.OutOfMemoryError as error:
        caught = error
    result.set(loop_s=round(time.perf_counter() - started, 2))
    result.check("ran_out_of_memory", caught is not None)
    if caught is None:
        return
    result.set(failing_step=inside.get("step"), message=str(caught)[:1500])
    result.check("same_exception_object", caught is inside.get("error"))
    # The traceback as it was when the loop caught it: the frames from this one down to the failing
    # allocation, none added or cut.
    inner, final = inside.get("tb") or [], traceback.extract_tb(caught.__traceback__)
    result.check("traceback_unchanged", bool(inner) and final[-len(inner):] == inner)
    result.check("no_notes_added", not hasattr(caught, "__notes__"))
    del caught, inside["error"]  # the frames hold the step's tensors
    sess = inside["session"]
    figures = _summary_figures(sess.run_dir)
    result.set(trainprof=figures, session_verdict=sess.summary.verdict)
    first = figures.get("first_finding") or {}
    details = first.get("details") or {}
    whole = figures.get("summary_json_parses") and figures["report_html_whole"] and figures["report_md_bytes"]
    result.check("reports_written_whole", whole)
    result.check("out_of_memory_finding_first", first.get("kind") == "out_of_memory")
    result.check("names_the_failing_allocation", details.get("requested_bytes") is not None)
    result.check("names_the_largest_holders_with_fixes", bool(details.get("held") and details.get("fixes")))
    kept = ("failing_step", "requested_bytes", "device_total_bytes", "device_free_bytes", "call", "module",
            "held", "failing_inputs", "failing_tokens", "profiled_tokens", "tokens_ratio",
            "predicted_peak_bytes", "usable_bytes", "largest_batch", "activations_by_module", "fixes",
            "allocator", "segments", "observed")
    result.set(out_of_memory={key: details.get(key) for key in kept}, where=first.get("where"),
               fix=first.get("fix"))
    if not smoke:
        result.check("observed_by_the_allocator_callback", details.get("observed"))
    offline = analyze(sess.run_dir)
    agrees = bool(offline.findings) and offline.findings[0].kind == "out_of_memory"
    result.check("trainprof_analyze_agrees", agrees)


# -- the parts -------------------------------------------------------------------------------------


def oom_issue(result: Result, log_dir: Path, smoke: bool) -> None:
    """The issue's run (module docstring). Fields: `loop_s`, `failing_step`, `message` (PyTorch's),
    `trainprof` (the run folder's files, the findings, the window's memory/headroom/fragmentation),
    `out_of_memory` (the finding's details: `held` = what held the device at the error by category
    in bytes, `fixes` = [{fix, saves_bytes, basis}], `tokens_ratio` = failing over profiled tokens,
    `predicted_peak_bytes` vs `usable_bytes`, `largest_batch` at the failing sequence length,
    `observed` = read by the allocator's callback at the failing allocation), `where` and `fix`."""
    import torch

    vocab = 256 if smoke else 128_256
    model = _llama(8, vocab, "sdpa", smoke)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    if smoke:
        _smoke_budget(model, 2 * 64)
    small, large = ((2, 64), (64, 128)) if smoke else ((2, 2048), (64, 4096))
    _oom_run(result, log_dir, "oom_issue", model, optimizer, [small] * 6 + [large] + [small], vocab, smoke,
             wait=1, warmup=1, active=3)
    details = result.data.get("out_of_memory") or {}
    result.check("failing_step_is_64x_the_profiled_tokens", details.get("tokens_ratio") == 64)


def oom_long_sequence(result: Result, log_dir: Path, smoke: bool) -> None:
    """Activations of a long sequence (module docstring); the fields of `oom_issue`. The finding is
    expected to name the attention module and the fused-attention fix (its [T, T] scores grow 256x
    for a 16x longer sequence)."""
    import torch

    vocab = 256 if smoke else 32_000
    model = _llama(4, vocab, "eager", smoke, max_positions=32_768)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    if smoke:
        _smoke_budget(model, 64)
    short, long = ((1, 64), (1, 1024)) if smoke else ((1, 2048), (1, 32_768))
    _oom_run(result, log_dir, "oom_long_sequence", model, optimizer, [short] * 5 + [long] + [short], vocab,
             smoke, wait=1, warmup=1, active=2)
    details = result.data.get("out_of_memory") or {}
    fixes = [fix.get("fix") for fix in details.get("fixes") or []]
    result.check("fused_attention_among_the_fixes", "fused_attention" in fixes)
    result.check("failing_step_is_16x_longer", details.get("tokens_ratio") == 16)


def fragmentation(result: Result, log_dir: Path, smoke: bool) -> None:
    """A batch 3% larger each step (module docstring), under the allocator settings of the environment
    (`versions.alloc_conf`). Fields: `expandable_segments` (the setting), `batches` (per step),
    `allocator` (`torch.cuda.memory_stats` at the end: reserved and allocated peaks, retries, OOMs),
    `trainprof` (its `fragmentation` figures: reserved and allocated peaks over the recorded window,
    `cached_pct`, retries; its findings), `finding_fired` (`memory_fragmentation` in the report),
    `step_ms` (median of the un-profiled steps, the session's timing). The shell runs it twice;
    `checks.finding_as_expected` is true when the finding fires without expandable segments and not
    with them."""
    import torch

    import trainprof

    expandable = "expandable_segments:true" in (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "").lower()
    result.set(expandable_segments=expandable)
    if smoke or not torch.cuda.is_available():
        result.set(skipped="needs CUDA")
        return
    width, first_batch, growth, steps = 8192, 49_152, 1.03, 26

    class Layer(torch.nn.Module):  # elementwise: activations without matmul time
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x * self.weight)

    with torch.device("cuda"):
        model = torch.nn.Sequential(*[Layer() for _ in range(8)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [int(first_batch * growth**i) for i in range(steps)]
    result.set(batches=batches, tensor_bytes_first_last=[b * width * 4 for b in (batches[0], batches[-1])])
    started = time.perf_counter()
    name = "fragmentation_expandable" if expandable else "fragmentation_default"
    with trainprof.session(log_dir, name, console=False, skip_first=18, wait=0, warmup=1, active=2) as sess:
        for batch in batches:
            x = torch.randn(batch, width, device="cuda")
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del x
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    result.set(loop_s=round(time.perf_counter() - started, 2), allocator={
        key: stats.get(key) for key in ("reserved_bytes.all.peak", "allocated_bytes.all.peak",
                                        "num_alloc_retries", "num_ooms", "segment.all.peak")})
    figures = _summary_figures(sess.run_dir)
    fired = any(f["kind"] == "memory_fragmentation" for f in figures.get("findings") or [])
    result.set(trainprof={k: figures.get(k) for k in ("fragmentation", "findings", "memory", "files")},
               finding_fired=fired, step_ms=figures.get("unprofiled_step_ms"))
    result.check("finding_as_expected", fired != expandable)


def headroom(result: Result, log_dir: Path, smoke: bool) -> None:
    """The headroom's largest batch, run (module docstring). Fields: `profiled_batch`, `seq_len`,
    `headroom` (trainprof's record: `fixed_bytes`, `scaling_bytes`, `usable_bytes`, `fits_times`,
    `largest_batch`, `longest_seq_len`, `bytes_per_token`), `predicted_largest_batch`, `probes`
    ([{batch, fits, s}] in order), `measured_largest_batch` (the largest that ran) and
    `first_failing_batch` (the smallest that did not, above it), `error_pct` ((predicted - measured) /
    measured x 100), `checks.prediction_within_15pct`."""
    import torch

    import trainprof

    vocab, batch, seq_len = (256, 4, 64) if smoke else (32_000, 4, 2048)
    model = _llama(8, vocab, "sdpa", smoke)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=not smoke)
    if smoke:
        _smoke_budget(model, 40 * 64)
    device = _device(smoke)
    with trainprof.session(log_dir, "headroom", console=False, wait=1, warmup=1, active=2) as sess:
        for _ in range(4):
            _train_step(model, optimizer, torch.randint(0, vocab, (batch, seq_len), device=device))
    figures = _summary_figures(sess.run_dir)
    room = figures.get("headroom") or {}
    predicted = room.get("largest_batch")
    result.set(profiled_batch=batch, seq_len=seq_len, headroom=room, memory=figures.get("memory"),
               predicted_largest_batch=predicted)
    if predicted is None:
        result.set(skipped="no headroom in the report (no memory recorded: a CPU run)")
        if not smoke:
            return
        predicted = 40
    probes: list[dict[str, Any]] = []
    deadline = time.perf_counter() + (20 if smoke else 35)

    def fits(b: int) -> bool:
        began = time.perf_counter()
        ok = True
        try:  # a whole training step: forward, backward and the optimizer's update
            _train_step(model, optimizer, torch.randint(0, vocab, (b, seq_len), device=device))
            if not smoke:
                torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            ok = False
        optimizer.zero_grad(set_to_none=True)
        if not smoke:
            torch.cuda.empty_cache()  # each probe starts from the same cache: the model and its state
        probes.append({"batch": b, "fits": ok, "s": round(time.perf_counter() - began, 2)})
        result.set(probes=probes)
        return ok

    lo, hi = 0, None  # lo: the largest that ran; hi: the smallest that did not
    b = max(predicted, 1)
    while hi is None and time.perf_counter() < deadline:  # bracket
        if fits(b):
            lo, b = b, max(b + 1, math.ceil(b * 1.15))
        else:
            hi = b
            if lo == 0:
                b = max(b * 3 // 4, 1)
                while lo == 0 and time.perf_counter() < deadline:
                    if fits(b):
                        lo = b
                    else:
                        hi, b = b, max(b * 3 // 4, 1)
                        if hi == 1:
                            break
    while hi is not None and hi - lo > 1 and lo > 0 and time.perf_counter() < deadline:  # bisect
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    result.set(measured_largest_batch=lo or None, first_failing_batch=hi,
               bracket_closed=hi is not None and hi - lo == 1)
    if lo:
        error = 100.0 * (predicted - lo) / lo
        result.set(error_pct=round(error, 2))
        result.check("prediction_within_15pct", abs(error) <= 15.0)


PARTS = {"oom_issue": oom_issue, "oom_long_sequence": oom_long_sequence, "fragmentation": fragmentation,
         "headroom": headroom}


def summarise(folder: Path) -> dict[str, Any]:
    """`summary.json` of a results folder: per part file its `ok`, `checks`, `errors` and
    `elapsed_s`, every check in one list (`failed_checks`), and the figures the issue asks for."""
    parts: dict[str, Any] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == "summary.json":
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parts[path.stem] = {"unreadable": repr(exc)}
            continue
        parts[path.stem] = {key: data.get(key) for key in ("ok", "checks", "errors", "elapsed_s")}
        if data.get("part") == "headroom":
            parts[path.stem].update({key: data.get(key) for key in (
                "predicted_largest_batch", "measured_largest_batch", "first_failing_batch", "error_pct")})
        if data.get("part") == "fragmentation":
            parts[path.stem].update(expandable_segments=data.get("expandable_segments"),
                                    finding_fired=data.get("finding_fired"), allocator=data.get("allocator"),
                                    fragmentation=(data.get("trainprof") or {}).get("fragmentation"),
                                    step_ms=data.get("step_ms"))
        if data.get("part", "").startswith("oom"):
            title = (((data.get("trainprof") or {}).get("findings")) or [{}])[0].get("title")
            parts[path.stem].update(first_finding_title=title)
    failed = [f"{part}.{name}" for part, data in parts.items() for name, passed in
              ((data.get("checks") or {}).items()) if not passed]
    missing = [part for part in ("oom_issue", "oom_long_sequence", "fragmentation_default",
                                 "fragmentation_expandable", "headroom") if part not in parts]
    return {"parts": parts, "failed_checks": failed, "missing_parts": missing,
            "all_passed": not failed and not missing and all(p.get("ok") for p in parts.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=sorted(PARTS))
    parser.add_argument("--out", type=Path, help="the part's JSON file")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/trainprof-memory-checks"))
    parser.add_argument("--smoke", action="store_true", help="tiny models on a CPU: the plumbing only")
    parser.add_argument("--summarise", type=Path, metavar="DIR", help="write DIR/summary.json from the parts")
    args = parser.parse_args(argv)
    if args.summarise is not None:
        summary = summarise(args.summarise)
        (args.summarise / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(json.dumps({"all_passed": summary["all_passed"], "failed_checks": summary["failed_checks"],
                          "missing_parts": summary["missing_parts"]}))
        return 0
    if args.part is None or args.out is None:
        parser.error("--part and --out (or --summarise)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = Result(args.out, args.part)
    try:
        PARTS[args.part](result, args.log_dir, args.smoke)
        result.set(ok=True)
    except BaseException as exc:  # noqa: BLE001 - every part leaves its JSON, whatever stopped it
        result.error("part", exc)
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
