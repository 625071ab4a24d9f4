"""Hostile text from a trace reaches no output raw: `trainprof diff`, `ab --markdown`, the progress
bar, the console, report.md, `--json` and summary.json all go through one sanitiser; `--json` is
written in pieces with long names cut; multi-megabyte names cost the console nothing."""

from __future__ import annotations

import gzip
import io
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainprof.analysis.kernels import KernelTime, OpTime, TopKernelsDetails
from trainprof.analysis.result import Analysis, Finding, Summary, Where
from trainprof.cli import main
from trainprof.report import ab as ab_report
from trainprof.report.console import print_report
from trainprof.report.json import JSON_TEXT_CHARS, WRITE_BYTES, dumps, write_json, write_json_to
from trainprof.report.markdown import render_markdown

ROOT = Path(__file__).resolve().parents[1]
MARKUP = "gemm[/x] [link=https://evil.example]click[/link] [bold red]loud"
ESCAPES = "\x1b]0;owned\x07\x1b[2J\r"
# Characters a terminal or an editor must not get raw (issue 21 item 9), one of each class.
FORMAT_CHARS = "\u061c\u2028\u2029\x9b\x85\u202e\u2066\u200b"
WEB = "<script>alert(1)</script> <img src=x onerror=alert(1)> [c](javascript:alert(1))"


def _event(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _trace(folder: Path, kernel: str, op: str, worker: str = "worker") -> Path:
    """One profiled step: an op whose launch runs one kernel, both named as given."""
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 1000),
        _event(op, "cpu_op", 110, 200),
        _event("cudaLaunchKernel", "cuda_runtime", 150, 10, correlation=1),
        {"ph": "X", "name": kernel, "cat": "kernel", "ts": 170, "dur": 50, "pid": 0, "tid": 7,
         "args": {"correlation": 1, "device": 0, "stream": 7}},
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{worker}.1.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


def _raw_chars(text: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in set(FORMAT_CHARS + "\x1b\x07\r") if c in text]


# -- trainprof diff and ab --markdown -----------------------------------------------------------------


def test_diff_shows_markup_and_escapes_as_text(tmp_path, capsys, monkeypatch):
    """rich read trace names as markup (`[/x]`: MarkupError, exit 1) and let escape sequences through."""
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for the names' column (a pipe's width is $COLUMNS)
    a = _trace(tmp_path / f"a{ESCAPES}", kernel=f"{MARKUP}{ESCAPES}{FORMAT_CHARS}", op=f"aten::{MARKUP}")
    b = _trace(tmp_path / "b", kernel="plain_kernel", op="aten::plain")
    markdown = tmp_path / "diff.md"
    assert main(["diff", str(a), str(b), "--markdown", str(markdown)]) == 0
    out, err = capsys.readouterr()
    assert not _raw_chars(out + err), _raw_chars(out + err)
    assert "gemm[/x]" in out and "[link=https://evil.example]click[/link]" in out and "[bold red]loud" in out
    text = markdown.read_text()
    assert not _raw_chars(text) and "[/x]" not in text and "gemm\\[/x\\]" in text


def test_diff_markdown_escapes_html_and_links(tmp_path):
    a = _trace(tmp_path / "a", kernel=WEB, op=WEB)
    b = _trace(tmp_path / "b", kernel="k", op="aten::k")
    markdown = tmp_path / "diff.md"
    assert main(["diff", str(a), str(b), "--markdown", str(markdown)]) == 0
    text = markdown.read_text()
    assert "<script>" not in text and "<img" not in text and not re.search(r"(?<!\\)\]\(", text)
    assert "&lt;script&gt;" in text


def test_diff_has_analyzes_error_boundary(tmp_path, capsys, monkeypatch):
    """Any error inside the diff was a traceback and exit 1; now one line and exit 2 (`--debug` raises)."""
    a = _trace(tmp_path / "a", kernel="k", op="aten::k")

    def broken(*args, **kwargs):
        raise RuntimeError("boom\x1b[2J")

    monkeypatch.setattr("trainprof.analysis.diff.diff_traces", broken)
    assert main(["diff", str(a), str(a)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error: ") and err.count("\n") == 1 and "internal error" in err
    assert "\x1b" not in err
    with pytest.raises(RuntimeError):
        main(["diff", str(a), str(a), "--debug"])


def test_diff_error_lines_drop_escapes_from_file_names(tmp_path, capsys):
    assert main(["diff", str(tmp_path / f"missing{ESCAPES}"), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error: ") and err.count("\n") == 1 and not _raw_chars(err)


def test_ab_markdown_escapes_everything():
    """`trainprof ab --markdown` escaped only `|` and newlines."""
    variant = {"name": f"fused{WEB}", "notes": [WEB + ESCAPES], "median_ms": 1.0, "ci_low_ms": 0.9,
               "ci_high_ms": 1.1, "ci_coverage": 0.5, "speedup": 1.0, "mfu": None, "tokens_per_s": None,
               "peak_memory_bytes": None, "parity_ok": None}
    result = {"model": WEB, "device": "cpu", "clock": "host", "config": {}, "variants": [variant],
              "skipped": {WEB: WEB}, "diffs": {}, "prediction": None, "method": {WEB: WEB + FORMAT_CHARS}}
    text = ab_report.render_ab_markdown(result)
    assert "<script>" not in text and "<img" not in text and not re.search(r"(?<!\\)\]\(", text)
    assert not _raw_chars(text)


# -- the progress bar on a terminal ---------------------------------------------------------------


def test_progress_bar_shows_file_names_as_text(tmp_path, fixtures_dir):
    """On a terminal, `analyze` showed file names raw in its progress bar (an OSC title, a clear-screen)
    and read markup in them. Here stderr is a pty, so the bar is drawn."""
    (source,) = (fixtures_dir / "traces/gpt2_clean").glob("*.pt.trace.json.gz")
    run = tmp_path / "run"
    run.mkdir()
    for index in range(4):  # long enough for the bar to redraw (10 times a second) with these names
        shutil.copy(source, run / f"r{index}\x1b]0;owned\x07[bold]seen\x1b[2J.{index}.pt.trace.json.gz")
    main_fd, child_fd = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "TERM": "xterm"}
    process = subprocess.Popen([sys.executable, "-m", "trainprof", "analyze", str(run)],
                               stdout=subprocess.DEVNULL, stderr=child_fd, env=env)
    os.close(child_fd)
    drawn = b""
    while True:
        ready, _, _ = select.select([main_fd], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    os.close(main_fd)
    assert process.wait(timeout=60) == 0
    assert b"[bold]seen" in drawn  # the bar was drawn with the names, as text
    assert b"\x1b]0;owned" not in drawn and b"\x1b[2J" not in drawn


# -- every renderer, the format characters of issue 21 item 9 -------------------------------------------


def _hostile_analysis(name: str) -> Analysis:
    kernels = [KernelTime(name=f"{name}_{i}", count=1, total_ms=1.0, mean_us=1.0, pct=10.0) for i in range(3)]
    details = TopKernelsDetails(kernels=kernels, ops=[OpTime(op=name, kernels=1, total_ms=1.0, pct=10.0)],
                                top_kernel=name, kernel_ms_per_step=1.0)
    return Analysis(
        summary=Summary(verdict="sync-bound", mean_step_ms=41.25, gpu_busy_pct=50.0,
                        verdict_by_trace={name: "sync-bound"}, idle_ms_per_step={"sync": 20.0}),
        files=[f"/runs/{name}.pt.trace.json.gz"],
        findings=[
            Finding(kind="sync_point", severity="high", title=f"sync in {name}", op=name,
                    where=Where(f"/x/{name}.py", 3, name), count=1, per_step=1.0, cost_ms=1.0, fix=name),
            Finding(kind="top_kernels", severity="info", title=f"Top GPU time: {name}", op=name,
                    where=Where(), count=1, per_step=1.0, cost_ms=1.0, fix=None, details=details),
        ],
    )


def test_format_characters_reach_no_output(tmp_path):
    name = f"k{FORMAT_CHARS}{ESCAPES}x"
    analysis = _hostile_analysis(name)
    console = io.StringIO()
    print_report(analysis, file=console, width=120)
    summary = write_json(analysis, tmp_path / "summary.json").read_text(encoding="utf-8")
    for output in (console.getvalue(), render_markdown(analysis), dumps(analysis), summary):
        assert not _raw_chars(output), _raw_chars(output)
    # JSON keeps the data: the characters are escaped, not dropped
    assert json.loads(summary)["findings"][0]["op"] == name
    assert json.loads(dumps(analysis))["trace"]["summary"]["verdict_by_trace"] == {name: "sync-bound"}


# -- size: --json in pieces, long names cut, the console's cost -------------------------------------------


class _RecordingStdout(io.TextIOWrapper):
    """A text stdout whose binary buffer records the size of every write."""

    def __init__(self) -> None:
        self.raw_bytes = io.BytesIO()
        self.sizes: list[int] = []
        recorder = self

        class Buffer(io.BufferedWriter):
            def write(self, data):  # noqa: D102
                recorder.sizes.append(len(data))
                return super().write(data)

        super().__init__(Buffer(self.raw_bytes), encoding="utf-8")


def test_json_is_written_in_pieces():
    """`--json` was one `sys.stdout.write` of the whole document (cut at 2,147,479,552 bytes on Linux)."""
    row = {"step": 1, "duration_ms": 1.5, "name": "x" * 100}
    document = {"schema_version": 1, "steps": [dict(row, step=i) for i in range(40_000)]}
    out = _RecordingStdout()
    write_json_to(document, out)
    out.flush()
    assert sum(out.sizes) > 4 * WRITE_BYTES and max(out.sizes) <= WRITE_BYTES
    assert json.loads(out.raw_bytes.getvalue()) == document


def test_long_names_are_cut_in_json(tmp_path, monkeypatch):
    """A 1 MB kernel and op name was copied 16-38 times into `--json`; each copy is cut now."""
    huge = "k" * 1_000_000
    trace = _trace(tmp_path / "run", kernel=huge, op=huge)
    out = _RecordingStdout()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["analyze", str(trace), "--json"]) == 0
    out.flush()
    text = out.raw_bytes.getvalue().decode()
    assert len(text) < 40 * JSON_TEXT_CHARS * 2  # ~16-38 copies of a cut name, not of a whole one
    document = json.loads(text)
    assert document["findings"] and huge[: JSON_TEXT_CHARS - 1] + "…" in text


def test_console_cost_does_not_grow_with_name_length():
    """The console laid out multi-megabyte names whole: ~1.1 s of CPU per MB and 27 MB of output."""
    analysis = _hostile_analysis("n" * 4_000_000)
    out = io.StringIO()
    start = time.process_time()
    print_report(analysis, file=out, width=120)
    assert time.process_time() - start < 0.5
    assert len(out.getvalue()) < 50_000
