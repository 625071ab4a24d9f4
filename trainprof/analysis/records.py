"""The base records of the analysis: `Record` (a record whose JSON form is its fields), a finding's
`Where` and `Via`, the `Finding` itself, and `plain`. Every analysis module builds on these; this
module imports none of them (the top-level result, naming every module's types, is
`trainprof.analysis.result`, whose docstring documents the JSON form).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from trainprof.analysis.figures import figures_of
from trainprof.analysis.kinds import KINDS, FindingKind, Severity


class Record(msgspec.Struct, frozen=True):
    """A result record whose JSON form is its fields in order, under their names (or those its class
    renames them to); a record whose JSON differs from its fields writes its own `to_dict`."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the fields by name, nested records likewise."""
        return msgspec.to_builtins(self)


class Where(Record, frozen=True):
    """The innermost frame of the user's code behind a finding (any field may be unknown: None).

    From a trace alone `line` is the function's first line at best; the live capture gives the line.
    """

    file: str | None = None
    line: int | None = None
    function: str | None = None


class Via(Record, frozen=True):
    """The library frame that made the call behind a finding: the frame a library's setting is about.

    `library` is the top-level package (`transformers`, `accelerate`, `lightning`, `torch`, ...);
    `version` is its version when the run recorded it (None otherwise).
    """

    file: str | None = None
    line: int | None = None
    function: str | None = None
    library: str | None = None
    version: str | None = None


class Details(Protocol):
    """A finding's evidence: one record type per kind of finding, built by the module that finds it."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the finding's `details`)."""


class Finding(msgspec.Struct):
    """One problem (or fact) found in a trace, with its evidence.

    `where` is the user's code; `via` the library frame that made the call, when a library did;
    `cause` the concrete cause in words (`"`.item()` of a CUDA tensor"`); `cost_ms` is the CPU or
    GPU time it costs over all profiled steps; `per_step` is `count` / number of steps. `details`
    is the kind's evidence record (e.g. `idle_findings.IdleCauseDetails`); JSON: module docstring.
    `gpu_ms_per_step` is the GPU time per step the fix could win back (idle time it removes, busy
    time it saves), None where not estimated; `severity.severity_for` turns it into the severity.
    """

    kind: FindingKind
    """One of `kinds.KINDS` (any other is refused)."""
    title: str
    severity: Severity
    op: str | None
    where: Where
    count: int
    per_step: float
    cost_ms: float
    fix: str | None
    rank: int | None = None
    details: Details | None = None
    via: Via | None = None
    cause: str | None = None
    gpu_ms_per_step: float | None = None
    window: int | None = None
    """Which profiling window of its process the finding is from (0, 1, ...: `Trace.window`), so the
    findings of two windows of one process are told apart; None for findings over all traces."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unregistered finding kind {self.kind!r} (trainprof.analysis.kinds.KINDS)")
        self.count, self.per_step, self.cost_ms = plain((self.count, self.per_step, self.cost_ms))
        self.gpu_ms_per_step = plain(self.gpu_ms_per_step)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the `findings` entries of `Analysis.to_dict()`)."""
        return {
            "kind": self.kind,
            "title": self.title,
            "severity": self.severity,
            "op": self.op,
            "where": self.where.to_dict(),
            "via": self.via.to_dict() if self.via is not None else None,
            "cause": self.cause,
            "count": self.count,
            "per_step": self.per_step,
            "cost_ms": self.cost_ms,
            "fix": self.fix,
            "rank": self.rank,
            "details": self.details.to_dict() if self.details is not None else {},
            "gpu_ms_per_step": self.gpu_ms_per_step,
            "window": self.window,
            "count_of": figures_of(self.kind).count_of,
            "cost_of": figures_of(self.kind).cost_of,
        }


def plain(value: Any) -> Any:
    """`value` with numpy scalars and arrays (in dicts, lists, tuples) as Python numbers and lists.

    The Python API hands out plain floats and ints: `np.float64` prints as `np.float64(2.5)` and
    surprises `json.dumps` and `type(x) is float` checks.
    """
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    return value
