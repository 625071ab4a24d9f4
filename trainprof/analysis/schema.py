"""The JSON form of an analysis (`summary.json`, `trainprof analyze --json`) as types, and its JSON
Schema generated from them (docs/schema/analysis.schema.json).

`Analysis.to_dict()` writes the form (its fields: `trainprof.analysis.result`'s docstring); these
types describe what it writes, down to the vocabulary (`kinds`): a finding's kind and severity, a
verdict, an idle cause. The envelope, a step row, a trace's entry, its verdict and a finding refuse
a field they do not name, so a new field is a change to this module and to the checked-in schema
(`python -m trainprof.analysis.schema > docs/schema/analysis.schema.json`); the objects each module
writes on its own (a finding's `details`, `gpu_busy`, `memory`, ...) are objects here, described in
result.py's docstring. tests/test_schema.py holds the schema current and decodes every fixture's
output with these types (`validate`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from trainprof.analysis.kinds import CauseKey, FindingKind, Severity, VerdictLabel
from trainprof.analysis.records import Via, Where
from trainprof.analysis.result import Summary

Object = dict[str, Any]
"""A JSON object whose fields its module documents (result.py's docstring)."""


class Strict(msgspec.Struct, forbid_unknown_fields=True):
    """An object of the form whose fields are all named here."""


class FindingJSON(Strict):
    """`findings[]`."""

    kind: FindingKind
    title: str
    severity: Severity
    op: str | None
    where: Where
    via: Via | None
    cause: str | None
    count: int
    per_step: float
    cost_ms: float
    fix: str | None
    rank: int | None
    details: Object
    gpu_ms_per_step: float | None
    window: int | None
    count_of: str | None
    cost_of: str | None
    gpu_step_pct: float | None = None


class RankedVerdictJSON(Strict):
    verdict: VerdictLabel
    idle_ms_per_step: float


class VerdictJSON(Strict):
    """`trace.traces[].verdict`; a `cpu-only` one has only `verdict`, `gpu_busy_pct`, `cause`, `why`
    and the last four."""

    verdict: VerdictLabel
    cause: CauseKey | None
    why: str
    gpu_busy_pct: float
    step_ms: float
    comm_ms_per_step: float
    kernels_per_step: float
    tiny_kernel_pct: float
    fix: str | None = None
    gpu_idle_ms_per_step: float | None = None
    idle_ms_per_step: dict[CauseKey, float] | None = None
    idle_one_off_ms_per_step: float | None = None
    idle_profiler_ms_per_step: float | None = None
    idle_launch_ms_per_step: float | None = None
    idle_sync_ms_per_step: float | None = None
    idle_host_ms_per_step: float | None = None
    ranked: list[RankedVerdictJSON] | None = None


class IdleHolderJSON(Strict):
    """`trace.traces[].gpu_idle_holders[]` and `gpu_idle_one_off[]`."""

    cause: CauseKey
    event: str | None
    source: str | None
    op: str | None
    idle_ms: float
    idle_ms_per_step: float
    steps: list[int] | None = None


class TraceJSON(Strict):
    """`trace.traces[]`."""

    file: str
    worker: str
    rank: int | None
    window: int
    device: str | None
    steps: list[int]
    has_step_annotations: bool
    sync_sites_file: str | None
    sync_sites_matched: int
    verdict: VerdictJSON
    peak_memory_bytes: int | None
    launch: Object
    gpu_idle_holders: list[IdleHolderJSON]
    gpu_idle_host_functions: list[Object]
    gpu_idle_one_off: list[IdleHolderJSON]
    compile: Object | None
    memory: Object | None
    communication: Object | None
    gpu_busy: Object | None
    profiler: Object | None
    step_basis: Object | None
    work: Object | None
    profiler_estimate: Object | None
    headroom: Object | None
    fragmentation: Object | None
    memory_history: Object | None
    copies: Object | None
    attention: list[Object]
    recompute: Object | None


class StepJSON(Strict):
    """`steps[]`: one flat row per step of each trace; the idle split is absent without GPU work,
    the communication's fields without a communication record."""

    step: int
    rank: int | None
    start_ms: float
    duration_ms: float
    gpu_busy_ms: float
    gpu_busy_pct: float
    gpu_idle_ms: float | None
    kernel_ms: float
    comm_ms: float
    memcpy_ms: float
    memset_ms: float
    kernel_count: int
    kernels_launched_before_trace: int
    comm_kernel_count: int
    cpu_op_ms: float
    cuda_runtime_ms: float
    launch_count: int
    launch_ms: float
    sync_count: int
    sync_blocked_ms: float
    tiny_kernel_count: int
    tiny_kernel_pct: float
    median_kernel_us: float | None
    graph_replay_kernel_count: int
    graph_launch_count: int
    graph_launch_ms: float
    peak_memory_bytes: int | None
    idle_launch_ms: float | None = None
    idle_sync_ms: float | None = None
    idle_blocking_ms: float | None = None
    idle_warmup_ms: float | None = None
    idle_input_ms: float | None = None
    idle_host_ms: float | None = None
    idle_comm_ms: float | None = None
    idle_unknown_ms: float | None = None
    idle_profiler_ms: float | None = None
    idle_one_off_ms: float | None = None
    idle_gap_count: int | None = None
    comm_exposed_ms: float | None = None
    comm_hidden_pct: float | None = None


class TraceSectionJSON(Strict):
    """`trace`."""

    files: list[str]
    traces: list[TraceJSON]
    ranks: list[Object]
    step_count: int
    summary: Summary
    cross_rank: Object | None


class AnalysisJSON(Strict):
    """The whole object: `{"schema_version", "trace", "steps", "findings"}`."""

    schema_version: Literal[2]
    trace: TraceSectionJSON
    steps: list[StepJSON]
    findings: list[FindingJSON]


def json_schema() -> str:
    """docs/schema/analysis.schema.json: the JSON Schema of `AnalysisJSON`, keys sorted."""
    schema = msgspec.json.schema(AnalysisJSON)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "trainprof analysis (summary.json, trainprof analyze --json)"
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def validate(text: str | bytes) -> AnalysisJSON:
    """`text` (an analysis's JSON) decoded into the types, strictly; raises `msgspec.ValidationError`
    naming the first field that does not fit."""
    return msgspec.json.decode(text, type=AnalysisJSON, strict=True)


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.stdout.write(json_schema())
