"""Render an A/B run (``ABResult.to_dict()``) and a trace diff (a ``TraceDiff``).

Console tables (rich when installed, plain text otherwise) and Markdown sections; nothing here
computes a metric: every figure is a field of the result, only formatted.
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

from trainprof.report import _format

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.diff import RunSide, TraceDiff

_number = _format.number


def _short(text: str, limit: int) -> str:
    text = _format.clean(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


AB_COLUMNS = ("variant", "ms/step", "95% CI", "speedup", "tokens/s", "MFU %", "peak memory", "loss parity")
OP_COLUMNS = ("op", "status", "calls a", "calls b", "host ms a", "host ms b", "GPU ms a", "GPU ms b")
GPU_COLUMNS = ("kernel / copy", "kind", "status", "count a", "count b", "GPU ms a", "GPU ms b")
FINDING_COLUMNS = ("finding", "status", "per step a", "per step b", "cost ms/step a", "cost ms/step b")
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


def _parity(variant: dict) -> str:
    if variant.get("parity_ok") is None:
        return "-"
    verdict = "ok" if variant["parity_ok"] else "FAILS"
    allowed = variant.get("parity_tolerance")
    allowed = f", allowed {_number(allowed, 6)}" if allowed is not None else ""
    return f"{verdict} (max rel diff {_number(variant.get('parity_max_rel_diff'), 6)}{allowed})"


def ab_tables(
    result: dict[str, Any], limit: int = _format.AB_DIFF_ROWS
) -> list[tuple[str, tuple[str, ...], list[tuple[str, ...]]]]:
    """(title, columns, rows) of every table of an A/B report: variants, then each diff."""
    rows = []
    for v in result["variants"]:
        mfu = v.get("mfu")
        coverage = _number(100 * v["ci_coverage"], 0)
        ci = f"{_number(v['ci_low_ms'], 2)}-{_number(v['ci_high_ms'], 2)} ({coverage}%)"
        rows.append(
            (
                v["name"],
                _number(v["median_ms"], 2),
                ci,
                _number(v.get("speedup"), 2, "x"),
                _number(v.get("tokens_per_s"), 0),
                _number(100 * mfu, 1) if mfu is not None else "-",
                _format.size(v["peak_memory_bytes"]) if v.get("peak_memory_bytes") is not None else "-",
                _parity(v),
            )
        )
    from trainprof.analysis.diff import TraceDiff  # the diffs come as JSON, inside the result

    tables = [("Variants", AB_COLUMNS, rows)]
    for name, diff in (result.get("diffs") or {}).items():
        reference = result["variants"][0]["name"]
        tables += [
            (f"{reference} -> {name}: {title}", columns, table_rows)
            for title, columns, table_rows in diff_tables(TraceDiff.from_dict(diff), limit)
        ]
    return tables


def _op_name(name: str) -> str:
    return _short(name.replace(_AUTOGRAD_NODE, "backward of "), _format.OP_NAME_CHARS)


def diff_tables(
    diff: TraceDiff, limit: int = _format.DIFF_ROWS
) -> list[tuple[str, tuple[str, ...], list[tuple[str, ...]]]]:
    """(title, columns, rows) of a trace diff: headline, changed ops, changed kernels, findings."""
    headline = [(row.metric, _value(row.metric, row.a), _value(row.metric, row.b)) for row in diff.headline]
    ops = [
        (
            _op_name(r.name),
            r.status,
            _number(r.calls_a, 1),
            _number(r.calls_b, 1),
            _number(r.host_ms_a, 3),
            _number(r.host_ms_b, 3),
            _number(r.gpu_ms_a, 3),
            _number(r.gpu_ms_b, 3),
        )
        for r in diff.ops
        if r.status != "same"
    ][:limit]
    kernels = [
        (
            _format.kernel_name(r.name),
            r.kind,
            r.status,
            _number(r.count_a, 1),
            _number(r.count_b, 1),
            _number(r.gpu_ms_a, 3),
            _number(r.gpu_ms_b, 3),
        )
        for r in diff.kernels
        if r.status != "same"
    ][:limit]
    findings = [
        (
            _short(c.title_b or c.title_a or c.kind, _format.FINDING_TITLE_CHARS),
            c.status,
            _number(c.per_step_a, 1),
            _number(c.per_step_b, 1),
            _number(c.cost_ms_per_step_a, 2),
            _number(c.cost_ms_per_step_b, 2),
        )
        for c in diff.findings
    ]
    tables = [("per step", ("metric", "a", "b"), headline), ("ops that changed (per step)", OP_COLUMNS, ops)]
    if kernels:
        tables.append(("kernels and copies that changed (per step)", GPU_COLUMNS, kernels))
    if findings:
        tables.append(("findings", FINDING_COLUMNS, findings))
    return tables


def _value(metric: str, value: Any) -> str:
    if value is not None and "bytes" in metric:
        return _format.size(value)
    return _number(value, 2)


def _header_lines(result: dict[str, Any]) -> list[str]:
    config = result.get("config") or {}
    lines = [
        f"model {result['model']} on {result['device']}; clock: {result['clock']}"
        + ("  (a CPU run: every time is host time)" if result["clock"] == "host" else "")
    ]
    shape = ", ".join(
        f"{key} {config[key]}"
        for key in ("batch", "seq", "dtype", "autocast", "steps", "warmup", "block", "precision")
        if key in config
    )
    lines.append(shape)
    if result.get("matmul_peak_flops"):
        lines.append(
            f"matmul peak measured: {result['matmul_peak_flops'] / 1e12:.3g} TFLOP/s; copy bandwidth "
            f"measured: {(result.get('copy_bytes_per_s') or 0) / 1e9:.3g} GB/s"
        )
    floor = result.get("parity_noise_floor")
    reference = result["variants"][0]["name"] if result["variants"] else "reference"
    lines.append(
        f"loss parity noise floor: {reference} with its weights moved by one rounding step each step drifts "
        f"{_number(floor, 6)} (max rel diff)"
        if floor is not None
        else "loss parity noise floor: not measured (the step factory gives no model); fixed tolerance"
    )
    for name, reason in (result.get("skipped") or {}).items():
        lines.append(f"skipped {name}: {reason}")
    for variant in result["variants"]:
        for note in variant.get("notes") or []:
            lines.append(f"{variant['name']}: {note}")
    return lines


def _prediction_lines(result: dict[str, Any]) -> list[str]:
    prediction = result.get("prediction")
    if not prediction:
        return []
    if "replaced_modules" not in prediction:  # the annotated step itself failed
        return [f"no fused prediction: {prediction.get('reason')}"]
    lines = [
        f"fused prediction from the {result['variants'][0]['name']} trace: {prediction['replaced_modules']} "
        f"modules swap replaces, {_number(prediction['kernels_per_step'], 0)} kernels / "
        f"{_number(prediction['gpu_ms_per_step'], 3)} GPU ms / {_number(prediction['host_ms_per_step'], 2)} "
        f"host ms per step; fused kernels expected {_number(prediction['fused_expected_gpu_ms_per_step'], 3)}"
        " GPU ms"
    ]
    if prediction.get("available"):
        lines.append(
            f"predicted: {_number(prediction.get('predicted_saved_ms'), 2)} ms saved, "
            f"{_number(prediction.get('predicted_speedup'), 3, 'x')}; measured: "
            f"{_number(prediction.get('measured_saved_ms'), 2)} ms saved, "
            f"{_number(prediction.get('measured_speedup'), 3, 'x')}"
        )
    else:
        lines.append(f"no prediction: {prediction.get('reason')}")
    lines.append(f"model: {prediction['model']}")
    return lines


def render_ab_markdown(result: dict[str, Any], limit: int = _format.AB_DIFF_ROWS) -> str:
    """An A/B run as a Markdown section (``## A/B: <model>``)."""
    lines = [f"## A/B: {result['model']}", ""]
    lines += [f"- {line}" for line in _header_lines(result)]
    lines += [f"- {line}" for line in _prediction_lines(result)]
    for title, columns, rows in ab_tables(result, limit):
        lines += ["", f"### {title}", ""] + _markdown_table(columns, rows)
    lines += ["", "How measured:", ""] + [
        f"- {key}: {text}" for key, text in (result.get("method") or {}).items()
    ]
    return "\n".join(lines) + "\n"


def render_diff_markdown(diff: TraceDiff, limit: int = _format.DIFF_ROWS) -> str:
    """A trace diff as a Markdown section."""
    lines = ["## Diff", "", f"- a: {_run_line(diff.a)}", f"- b: {_run_line(diff.b)}"]
    for title, columns, rows in diff_tables(diff, limit):
        lines += ["", f"### {title}", ""] + _markdown_table(columns, rows)
    return "\n".join(lines) + "\n"


def _markdown_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(cell(c) for c in row) + " |" for row in rows
    ]


def print_ab(result: dict[str, Any], file: IO[str] | None = None, limit: int = _format.AB_DIFF_ROWS) -> None:
    """An A/B run as console tables."""
    _print(_header_lines(result) + _prediction_lines(result), ab_tables(result, limit), file)


def print_diff(diff: TraceDiff, file: IO[str] | None = None, limit: int = _format.DIFF_ROWS) -> None:
    """A trace diff as console tables."""
    _print([f"a: {_run_line(diff.a)}", f"b: {_run_line(diff.b)}"], diff_tables(diff, limit), file)


def _run_line(run: RunSide) -> str:
    return f"{', '.join(run.files)} ({run.steps} steps)"


def _print(lines: list[str], tables: list, file: IO[str] | None) -> None:
    file = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        file.write("\n".join(lines) + "\n")
        for title, columns, rows in tables:
            file.write(f"\n{title}\n" + "\n".join("  ".join(row) for row in [columns, *rows]) + "\n")
        return
    width = None if (hasattr(file, "isatty") and file.isatty()) else _format.PIPE_WIDTH
    console = Console(file=file, highlight=False, soft_wrap=False, width=width)
    for line in lines:
        console.print(line)
    for title, columns, rows in tables:
        table = Table(title=title, title_justify="left")
        for index, column in enumerate(columns):
            table.add_column(column, justify="left" if index == 0 else "right", overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
