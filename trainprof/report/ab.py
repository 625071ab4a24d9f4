"""Render an A/B run (``ABResult.to_dict()``) and a trace diff (a ``TraceDiff``).

Console tables (laid out at the terminal's width, `trainprof.report.layout`) and Markdown sections
(`trainprof.report.markdown.table`, which escapes every cell); nothing here computes a metric:
every figure is a field of the result, only formatted. The two runs of a diff are named by their
names (the variants, the run folders), never `a` and `b` unless nothing better is known. Every
string from a trace, a path or a result passes through `trainprof.report.text.safe_text`.
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

from trainprof.report import _format
from trainprof.report._format import Column, Table
from trainprof.report.names import short_kernel_names, short_names

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.diff import RunSide, TraceDiff

_number = _format.number
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


def _name(text: Any) -> str:
    return _format.clean(text, _format.RUN_NAME_CHARS)


def _parity(variant: dict) -> str:
    if variant.get("parity_ok") is None:
        return "-"
    verdict = "ok" if variant["parity_ok"] else "FAILS"
    allowed = variant.get("parity_tolerance")
    allowed = f", allowed {_number(allowed, 6)}" if allowed is not None else ""
    return f"{verdict} (max rel diff {_number(variant.get('parity_max_rel_diff'), 6)}{allowed})"


def _ab_columns(reference: str) -> tuple[Column, ...]:
    return (
        Column("variant"),
        Column("ms/step", numeric=True),
        Column("CI of the median (coverage)", numeric=True, drop=2),
        Column("speedup", numeric=True),
        Column(f"vs {reference}"),
        Column("tokens/s", numeric=True, drop=4),
        Column("MFU %", numeric=True, drop=3),
        Column("peak memory", numeric=True, drop=5),
        Column("loss parity", drop=1),
    )


def ab_tables(result: dict[str, Any], limit: int = _format.AB_DIFF_ROWS) -> list[Table]:
    """Every table of an A/B report: variants, then each variant's diff against the first."""
    variants = result["variants"]
    reference = _name(variants[0]["name"]) if variants else "reference"
    rows: list[tuple[str, ...]] = []
    for v in variants:
        mfu = v.get("mfu")
        coverage = _number(100 * v["ci_coverage"], 0)
        ci = f"{_number(v['ci_low_ms'], 2)}-{_number(v['ci_high_ms'], 2)} ({coverage}%)"
        rows.append(
            (
                _name(v["name"]),
                _number(v["median_ms"], 2),
                ci,
                _number(v.get("speedup"), 2, "x"),
                _format.clean(v.get("vs_reference") or "-", _format.NAME_CHARS),
                _number(v.get("tokens_per_s"), 0),
                _number(100 * mfu, 1) if mfu is not None else "-",
                _format.size(v["peak_memory_bytes"]) if v.get("peak_memory_bytes") is not None else "-",
                _parity(v),
            )
        )
    from trainprof.analysis.diff import TraceDiff  # the diffs come as JSON, inside the result

    columns = _ab_columns(reference)
    if not any(v.get("peak_memory_bytes") is not None for v in variants):  # not measured (a CPU run)
        keep = [i for i, column in enumerate(columns) if column.name != "peak memory"]
        columns = tuple(columns[i] for i in keep)
        rows = [tuple(row[i] for i in keep) for row in rows]
    tables = [Table("Variants", columns, rows)]
    for name, diff in (result.get("diffs") or {}).items():
        diff = TraceDiff.from_dict(diff)
        diff.a.name, diff.b.name = variants[0]["name"], name  # older results carry no names
        for table in diff_tables(diff, limit):
            table.title = f"{reference} -> {_name(name)}: {table.title}"
            tables.append(table)
    return tables


def _op_names(names: list[str]) -> list[str]:
    readable = [name.replace(_AUTOGRAD_NODE, "backward of ") for name in names]
    return short_names(readable, _format.OP_NAME_CHARS)


def diff_tables(diff: TraceDiff, limit: int = _format.DIFF_ROWS) -> list[Table]:
    """The tables of a trace diff: headline, changed ops, changed kernels, findings; each figure of
    the two runs under the run's name, then the change and the ratio."""
    a, b = _name(diff.a.name or "a"), _name(diff.b.name or "b")
    gpu = _has_gpu_work(diff)
    headline = [
        (row.metric, _value(row.metric, row.a), _value(row.metric, row.b), _change(row.metric, row.delta),
         _format.ratio(row.ratio))
        for row in diff.headline
        # only what was measured: no GPU figure of two CPU runs, no row that neither run has
        if (gpu or row.metric not in _GPU_METRICS) and (row.a is not None or row.b is not None)
    ]
    changed_ops = [r for r in diff.ops if r.status != "same"][:limit]
    ops: list[tuple[str, ...]] = [
        (
            name, r.status,
            _number(r.gpu_ms_a, 3), _number(r.gpu_ms_b, 3), _format.signed(r.gpu_ms_delta, 3),
            _format.ratio(r.gpu_ms_ratio),
            _number(r.host_ms_a, 3), _number(r.host_ms_b, 3), _format.signed(r.host_ms_delta, 3),
            _number(r.calls_a, 1), _number(r.calls_b, 1),
        )
        for name, r in zip(_op_names([r.name for r in changed_ops]), changed_ops, strict=True)
    ]
    changed_kernels = [r for r in diff.kernels if r.status != "same"][:limit]
    kernels = [
        (
            name, r.kind, r.status,
            _number(r.gpu_ms_a, 3), _number(r.gpu_ms_b, 3), _format.signed(r.gpu_ms_delta, 3),
            _format.ratio(r.gpu_ms_ratio),
            _number(r.count_a, 1), _number(r.count_b, 1),
        )
        for name, r in zip(
            short_kernel_names([r.name for r in changed_kernels], _format.KERNEL_NAME_CHARS), changed_kernels,
            strict=True,
        )
    ]
    titles = short_names(
        [c.title_b or c.title_a or c.kind for c in diff.findings], _format.FINDING_TITLE_CHARS
    )
    findings = [
        (
            title, c.status,
            _number(c.cost_ms_per_step_a, 2), _number(c.cost_ms_per_step_b, 2),
            _format.signed(c.cost_ms_per_step_delta, 2),
            _number(c.per_step_a, 1), _number(c.per_step_b, 1),
        )
        for title, c in zip(titles, diff.findings, strict=True)
    ]
    op_columns: tuple[Column, ...] = (
        Column("op"), Column("status", drop=1),
        Column(f"GPU ms {a}", numeric=True, drop=3), Column(f"GPU ms {b}", numeric=True, drop=3),
        Column("GPU ms change", numeric=True), Column("GPU ms ratio", numeric=True, drop=2),
        Column(f"host ms {a}", numeric=True, drop=5), Column(f"host ms {b}", numeric=True, drop=5),
        Column("host ms change", numeric=True, drop=4),
        Column(f"calls {a}", numeric=True, drop=6), Column(f"calls {b}", numeric=True, drop=6),
    )
    if not gpu:  # two CPU runs: the ops' GPU columns would be zeros that were never measured
        op_columns = op_columns[:2] + op_columns[6:]
        ops = [row[:2] + row[6:] for row in ops]
    tables = [
        Table("per step", (Column("metric"), Column(a, numeric=True), Column(b, numeric=True),
                           Column("change", numeric=True), Column("ratio", numeric=True, drop=1)), headline),
        Table("ops that changed (per step)", op_columns, ops),
    ]
    if kernels:
        tables.append(Table("kernels and copies that changed (per step)", (
            Column("kernel / copy"), Column("kind", drop=4), Column("status", drop=1),
            Column(f"GPU ms {a}", numeric=True, drop=3), Column(f"GPU ms {b}", numeric=True, drop=3),
            Column("GPU ms change", numeric=True), Column("GPU ms ratio", numeric=True, drop=2),
            Column(f"count {a}", numeric=True, drop=5), Column(f"count {b}", numeric=True, drop=5),
        ), kernels))
    if findings:
        tables.append(Table("findings", (
            Column("finding"), Column("status"),
            Column(f"cost ms/step {a}", numeric=True, drop=2),
            Column(f"cost ms/step {b}", numeric=True, drop=2),
            Column("cost change", numeric=True),
            Column(f"per step {a}", numeric=True, drop=1), Column(f"per step {b}", numeric=True, drop=1),
        ), findings))
    return tables


_GPU_METRICS = frozenset({"GPU busy %", "kernel GPU ms / step", "kernels / step", "launches / step",
                          "memcpys / step", "syncs / step"})
"""Headline figures of a diff that only a run with GPU work measures (`diff._headline`)."""


def _has_gpu_work(diff: TraceDiff) -> bool:
    """Whether either run of a diff recorded GPU work (a GPU figure of its headline is not zero)."""
    return any(row.metric in _GPU_METRICS and (row.a or row.b) for row in diff.headline)


def _value(metric: str, value: Any) -> str:
    if value is not None and "bytes" in metric:
        return _format.size(value)
    return _number(value, 2)


def _change(metric: str, value: float | None) -> str:
    if value is not None and "bytes" in metric:
        return ("+" if value >= 0 else "-") + _format.size(abs(value))
    return _format.signed(value)


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
        datasheet = result.get("datasheet_peak_flops")
        lines.append(
            (f"MFU against the datasheet's dense matmul peak, {datasheet / 1e12:.4g} TFLOP/s; " if datasheet
             else "MFU against the measured matmul peak (no datasheet for this device); ")
            + f"matmul peak measured: {result['matmul_peak_flops'] / 1e12:.3g} TFLOP/s; copy bandwidth "
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
    return [_format.clean(line) for line in lines]


def _prediction_lines(result: dict[str, Any]) -> list[str]:
    prediction = result.get("prediction")
    if not prediction:
        return []
    if "replaced_modules" not in prediction:  # the annotated step itself failed
        return [_format.clean(f"no fused prediction: {prediction.get('reason')}")]
    lines = [
        f"fused prediction from the {result['variants'][0]['name']} trace: {prediction['replaced_modules']} "
        f"modules swap replaces, {_number(prediction['kernels_per_step'], 0)} kernels / "
        f"{_number(prediction['gpu_ms_per_step'], 3)} GPU ms / {_number(prediction['host_ms_per_step'], 2)} "
        f"host ms per step; fused kernels expected {_number(prediction['fused_expected_gpu_ms_per_step'], 3)}"
        " GPU ms"
    ]
    if not prediction.get("available") and not prediction.get("gpu_ms_per_step"):
        # Nothing to predict from (a CPU run): the reason alone, not a model of GPU time it cannot use.
        return [_format.clean(f"no fused prediction: {prediction.get('reason')}")]
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
    return [_format.clean(line) for line in lines]


def render_ab_markdown(result: dict[str, Any], limit: int = _format.AB_DIFF_ROWS) -> str:
    """An A/B run as a Markdown section (``## A/B: <model>``)."""
    from trainprof.report.markdown import escape

    lines = [f"## A/B: {escape(result['model'])}", ""]
    lines += [f"- {escape(line)}" for line in _header_lines(result) + _prediction_lines(result)]
    lines += _markdown_tables(ab_tables(result, limit))
    lines += ["", "How measured:", ""] + [
        f"- {escape(key)}: {escape(text)}" for key, text in (result.get("method") or {}).items()
    ]
    return "\n".join(lines) + "\n"


def render_diff_markdown(diff: TraceDiff, limit: int = _format.DIFF_ROWS) -> str:
    """A trace diff as a Markdown section."""
    from trainprof.report.markdown import escape

    lines = ["## Diff", ""] + [f"- {escape(line)}" for line in _run_lines(diff)]
    return "\n".join(lines + _markdown_tables(diff_tables(diff, limit))) + "\n"


def _markdown_tables(tables: list[Table]) -> list[str]:
    from trainprof.report.markdown import escape, table

    lines = []
    for report_table in tables:
        lines += ["", f"### {escape(report_table.title)}", ""]
        lines += table(report_table.columns, report_table.rows)
    return lines


def print_ab(
    result: dict[str, Any],
    file: IO[str] | None = None,
    limit: int = _format.AB_DIFF_ROWS,
    width: int | None = None,
) -> None:
    """An A/B run as console tables, laid out at `width` (default: the terminal's)."""
    _print(_header_lines(result) + _prediction_lines(result), ab_tables(result, limit), file, width)


def print_diff(
    diff: TraceDiff, file: IO[str] | None = None, limit: int = _format.DIFF_ROWS, width: int | None = None
) -> None:
    """A trace diff as console tables, laid out at `width` (default: the terminal's)."""
    _print(_run_lines(diff), diff_tables(diff, limit), file, width)


def _run_lines(diff: TraceDiff) -> list[str]:
    return [_run_line(side) for side in (diff.a, diff.b)]


def _run_line(run: RunSide) -> str:
    files = ", ".join(_format.clean(file, _format.NAME_CHARS) for file in run.files[:_format.KERNEL_ROWS])
    more = f" and {len(run.files) - _format.KERNEL_ROWS} more" if len(run.files) > _format.KERNEL_ROWS else ""
    return f"{_name(run.name or '-')}: {files}{more} ({run.steps} steps)"


def _print(lines: list[str], tables: list[Table], file: IO[str] | None, width: int | None) -> None:
    from trainprof.report.console import terminal_width, write_lines
    from trainprof.report.layout import block, table_lines

    file = file or sys.stdout
    width = terminal_width(file, width)
    out: list[tuple[str, bool]] = []
    for line in lines:
        out += [(text, False) for text in block("", line, width)]
    for report_table in tables:
        rendered = table_lines(report_table, width)
        out += [(rendered[0], True)] + [(text, False) for text in rendered[1:]]
    write_lines(out, file)
