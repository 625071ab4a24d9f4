"""The console report of every checked-in trace at 80, 120 and 200 columns, by its properties: no
line wider than the terminal, no table cell squeezed to nothing, no two rows or findings that read
alike, the "where the step went" line on top; and every verdict comes with a finding."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len

from trainprof.analysis import analyze
from trainprof.analysis.result import Analysis, Finding, Summary, Where
from trainprof.report import _format
from trainprof.report.console import print_report, render_lines, render_text
from trainprof.report.layout import table_lines
from trainprof.report.names import short_kernel_names
from trainprof.trace import load_traces

pytestmark = pytest.mark.xdist_group("console")  # one worker loads the traces once

_ROOT = Path(__file__).resolve().parent / "fixtures"
FOLDERS = sorted({str(p.parent.relative_to(_ROOT)) for p in _ROOT.rglob("*.json.gz")})
WIDTHS = (80, 120, 200)


@pytest.fixture(scope="module")
def traces(fixtures_dir):
    """Every fixture folder's traces, loaded once (folder name -> traces)."""
    return {folder: load_traces(fixtures_dir / folder) for folder in FOLDERS}


@pytest.fixture(scope="module")
def analyses(traces):
    cache: dict[str, Analysis] = {}

    def get(folder: str) -> Analysis:
        if folder not in cache:
            cache[folder] = analyze(traces[folder])
        return cache[folder]

    return get


def _squeezed(text: str) -> str:
    return re.sub(r"\s", "", text)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("folder", FOLDERS)
def test_console_fits_the_terminal(analyses, folder, width):
    analysis = analyses(folder)
    lines = [line for line, _ in render_lines(analysis, _format.CONSOLE_FINDINGS, width)]
    assert max(cell_len(line) for line in lines) <= width
    after_title = next(line for line in lines if not line.startswith(("trainprof: ", " ")))
    assert after_title.startswith("where the step went: ")
    for table in _format.tables(analysis, per_kind=_format.CONSOLE_TABLES_PER_KIND):
        rendered = table_lines(table, width)
        names = [row[0] for row in table.rows]
        assert len(set(names)) == len(names), names
        note = _left_out_note(rendered)
        left_out = set(note.partition(": ")[2].rstrip(")").split(", ")) if note else set()
        kept = [i for i, column in enumerate(table.columns) if column.name not in left_out]
        assert 0 in kept  # the name column is never the one to go
        for row, row_lines in zip(table.rows, _row_lines(rendered), strict=True):
            # every kept cell is whole on its row: none squeezed to nothing or cut
            values = _squeezed(" ".join(row_lines))
            assert all(_squeezed(row[i]) in values for i in kept[1:]), (row, row_lines)
            assert _squeezed(row[0]) == _squeezed(_name_of(row_lines, rendered)), (row[0], row_lines)


def _left_out_note(rendered: list[str]) -> str:
    """The "(left out at N columns: ...)" note under a table, its wrapped lines joined ("" if none)."""
    lines = [line.strip() for line in rendered]
    start = next((i for i, line in enumerate(lines) if line.startswith("(left out at")), None)
    if start is None:
        return ""
    end = next(i for i in range(start, len(lines)) if lines[i].endswith(")"))
    return " ".join(lines[start : end + 1])


def _row_lines(rendered: list[str]) -> list[list[str]]:
    """A rendered table's lines per row: a row's first line and the continuation lines of its name
    (table layout), or its name and value lines (stacked layout)."""
    body = rendered[1:]
    rule = next((i for i, line in enumerate(body) if set(line.strip()) <= {"-", " "} and line.strip()), None)
    rows: list[list[str]] = []
    for line in body[rule + 1 :] if rule is not None else body:
        if line.strip().startswith("(left out at"):
            break
        starts_row = len(line) - len(line.lstrip()) == 2  # rows (and stacked names) start 2 in
        if starts_row and rule is not None and rows and _name_only(line, body[rule]):
            starts_row = False  # a wrapped name's next line
        if starts_row or not rows:
            rows.append([line])
        else:
            rows[-1].append(line)
    return rows


def _name_only(line: str, rule: str) -> bool:
    """Whether a table line holds text in the name column only (a wrapped name's continuation)."""
    name_end = len(rule) - len(rule.lstrip()) + len(rule.split()[0])
    return not line[name_end:].strip()


def _name_of(row_lines: list[str], rendered: list[str]) -> str:
    """The row's name: its first line's name column and its continuation lines (table layout)."""
    rule = next((line for line in rendered[1:] if line.strip() and set(line.strip()) <= {"-", " "}), None)
    if rule is None:  # stacked: the name lines come before the value lines (indented 6)
        return " ".join(line for line in row_lines if not line.startswith(" " * 6))
    name_end = len(rule) - len(rule.lstrip()) + len(rule.split()[0])
    return "".join(line[:name_end] for line in row_lines)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_finding_reads_like_another(analyses, folder):
    """Two windows of one process (kineto_resnet50_num_workers_4) found the same problems: each
    finding says which window it is from."""
    text = render_text(analyses(folder), limit=100, width=10_000)
    heads = [re.sub(r"^\s*\d+\. ", "", line) for line in text.splitlines() if re.match(r"^\s*\d+\. \[", line)]
    assert len(set(heads)) == len(heads), heads


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_verdict_but_gpu_bound_comes_with_a_finding(analyses, folder):
    analysis = analyses(folder)
    findings = _format.top_findings(analysis, limit=len(analysis.findings))
    for trace in analysis.traces:
        if trace.verdict.label == "gpu-bound":
            continue
        own = [f for f in findings if (f.rank, f.window) == (trace.rank, trace.window)]
        assert own, f"{trace.file}: {trace.verdict.label} with no finding"


def test_every_fixture_kernel_gets_a_distinct_short_name(traces):
    """All ~660 kernel names of the checked-in traces at once: distinct, within the limit, never a
    return type (`std::enable_if`) and never cut inside an argument list."""
    names = {
        trace.names[i] for folder in traces.values() for trace in folder
        for i in set(trace.events["kernel"].name.tolist())
    }
    shown = short_kernel_names(sorted(names), _format.KERNEL_NAME_CHARS)
    assert len(names) > 600 and len(set(shown)) == len(names)
    assert all(len(name) <= _format.KERNEL_NAME_CHARS for name in shown)
    assert not any(name.startswith(("std::enable_if", "enable_if", "void ")) for name in shown)
    assert not any("(ncclDevKernelArgsStorage" in name for name in shown)


def test_where_the_step_went_adds_up(analyses):
    analysis = analyses("stacks/hf_trainer")
    line = _format.step_split(analysis)
    shares = [float(pct) for pct in re.findall(r"([\d.]+)%", line)]
    assert line.startswith(f"where the step went: GPU busy {analysis.summary.gpu_busy_pct:.1f}%")
    assert 98 <= sum(shares) <= 100.5  # busy + the named idle causes (under 0.5% each left out)
    assert "launch" in line and "host code" in line


def test_wrapped_titles_sit_under_their_text():
    words = " ".join(f"word{i:02d}" for i in range(40))
    finding = Finding(kind="launch_overhead", severity="medium", title=words, op="aten::mm", where=Where(),
                      count=1, per_step=1.0, cost_ms=2.0, fix=words)
    analysis = Analysis(summary=Summary(verdict="launch-bound"), findings=[finding])
    lines = render_text(analysis, width=80).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(" 1. [medium] "))
    assert lines[head + 1].startswith(" " * len(" 1. [medium] ") + "word")
    fix = next(i for i, line in enumerate(lines) if line.startswith("    fix: "))
    assert lines[fix + 1].startswith(" " * len("    fix: ") + "word")


def test_a_pipe_gets_the_wide_layout_and_no_escape_codes(analyses, capsys):
    print_report(analyses("traces/gpt2_clean"))  # capsys: not a terminal
    out = capsys.readouterr().out
    assert "\x1b" not in out and max(cell_len(line) for line in out.splitlines()) <= _format.PIPE_WIDTH
